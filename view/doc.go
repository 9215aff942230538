// Package view keeps a typed, consistent copy of a range of etcd keys
// current on an [etcdwatch.Stream]: it lists the range at one revision,
// watches from there, applies whole revisions, and when its history is
// compacted lists again and reports exactly what changed. Get, All and
// Snapshot read one revision's state without holding it up; Subscribe
// follows its changes from a bounded history; Sync reads your writes.
//
//	v, err := view.New(ctx, s, etcdwatch.Prefix("config/"), view.DecodeJSON[Config])
//	if err != nil { ... }
//	defer v.Close()
//	e, ok := v.Get("config/web")
//
// A View is a wing of the Stream: it uses only the Stream's exported API,
// as listed by Source, and ends with the Stream's Context. Share gives
// another View of the same state and server-side watch.
//
// # Concurrency
//
// Every method of View and Snapshot is safe for concurrent use; a
// Subscription's Next and Batches are for one goroutine at a time, its
// Close and Err for any. A View's state runs one goroutine (one more with
// WithIntegrityCheck, one more with WithStateFile, one while it asks for a
// bookmark, one while a warm restart waits for the server to say how far
// to catch up, and, on servers before etcd 3.7, one while it reads a page
// of its listing); Done is closed once they have returned.
package view

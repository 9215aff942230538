// Package etcdwatch is a client for etcd v3 watch streams.
//
// etcd serves any number of watches over one bidirectional gRPC Watch stream:
// the client writes create, cancel and progress requests, and reads a single
// interleaved stream of responses for all of them. A Stream owns one such
// gRPC stream through one dispatcher goroutine that matches created responses
// to creates by order and routes everything else by watch id, so a watch
// being created is never confused with another watch's events.
//
// # Use
//
//	conn, err := grpc.NewClient("127.0.0.1:2379", grpc.WithTransportCredentials(insecure.NewCredentials()))
//	if err != nil { ... }
//	s, err := etcdwatch.Open(conn)
//	if err != nil { ... }
//	defer s.Close()
//	w, err := s.Watch(ctx, etcdwatch.Prefix("app/"))
//	for r := range w.Responses() {
//		for _, e := range r.Events { ... }
//	}
//	// w.Err() says why the watch ended.
//
// Watch waits for the server to confirm each watch; WatchAll opens many with
// their creates sent back to back, in about one round trip.
//
// # Guarantees
//
//   - Each watch delivers whole revisions, in order, each event once.
//   - A watch whose history was compacted ends with *CompactedError; events
//     are never skipped silently.
//   - Delivery never blocks the dispatcher: a consumer that stops reading is
//     buffered for (WithBufferLimit), briefly waited for (WithStallBudget),
//     then paused on the server and resumed from its next revision.
//   - After Watch.Cancel returns, nothing more is delivered (to a Handler's
//     watch, at most the one call already under way).
//   - Watches outlive gRPC streams: a stream that fails, or goes silent, is
//     replaced and every watch re-created from its next revision.
//
// # Views
//
// Views, typed and consistent copies of a range, are in package [github.com/etcdwatch/etcdwatch/view].
//
// # Concurrency
//
// Every method of Stream and Watch is safe for concurrent use. A Watch's
// Responses channel has one sender at a time and is closed exactly once.
package etcdwatch

package view_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/etcdwatch/etcdwatch"
	"github.com/etcdwatch/etcdwatch/view"
)

// A service's configuration as a live table: every key under config/,
// decoded from JSON, read locally, and followed change by change. The
// etcdwatchtest module has a runnable view example, and examples/configwatch
// a whole program.
func ExampleNew() {
	type Config struct {
		Replicas int    `json:"replicas"`
		Image    string `json:"image"`
	}
	var s *etcdwatch.Stream // opened as in etcdwatch's package example
	ctx := context.Background()
	v, err := view.New(ctx, s, etcdwatch.Prefix("config/"), view.DecodeJSON[Config])
	if err != nil {
		log.Fatal(err)
	}
	defer v.Close()

	// Reads are local: no round trip, the state of one revision.
	if e, ok := v.Get("config/web"); ok && e.Err == nil {
		fmt.Println("web:", e.Value.Replicas, "replicas of", e.Value.Image)
	}
	// A snapshot, to list the table and follow it from the same revision.
	snap := v.Snapshot()
	for k, e := range snap.All() { // key order
		if e.Err != nil { // the key is there, its value is not JSON of a Config
			fmt.Printf("%s: cannot decode: %v\n", k, e.Err)
			continue
		}
		fmt.Printf("%s: %+v (revision %d)\n", k, e.Value, e.ModRevision)
	}

	// The subscription starts from the snapshot's revision: every change
	// after it, in order, whole revisions at a time.
	sub := v.Subscribe(ctx, snap.Revision())
	defer sub.Close()
	for b := range sub.Batches() {
		switch b.Kind {
		case view.Resync:
			// The whole state at b.Revision, every key Created: start over
			// from it (it comes to a subscriber that fell too far behind).
			fmt.Println("resync at", b.Revision)
		case view.Relisted:
			// The view's watch was compacted away and it listed again:
			// Changes is exactly what differs between b.From and b.Revision.
			fmt.Println("relisted at", b.Revision)
		}
		for _, ch := range b.Changes {
			switch ch.Kind {
			case view.Created, view.Updated:
				fmt.Printf("%s %s: %+v\n", ch.Kind, ch.Key, ch.Entry.Value)
			case view.Deleted:
				fmt.Printf("deleted %s (was %+v)\n", ch.Key, ch.Prev.Value)
			}
		}
		// b.Revision is the state held now, changes or not: saved, it is
		// where to subscribe again after a restart.
	}
	// The subscription ended: ctx, its Close, the view's Close (ErrClosed),
	// or the server's refusal of the view (v.Err).
	if err := sub.Err(); !errors.Is(err, view.ErrClosed) && !errors.Is(err, etcdwatch.ErrClosed) {
		log.Fatal(err)
	}
}

// Read your own write: a write made through any client is in the view once
// Sync returns, since Sync waits until the view is at least as fresh as a
// linearizable read made when it was called.
func ExampleView_Sync() {
	var v *view.View[[]byte] // from view.New(ctx, s, etcdwatch.Prefix("config/"), view.DecodeBytes)
	ctx := context.Background()
	// ... put config/mode = "maintenance" with any etcd client ...
	if err := v.Sync(ctx); err != nil {
		log.Fatal(err)
	}
	e, _ := v.Get("config/mode")
	fmt.Printf("mode %s since revision %d\n", e.Value, e.ModRevision)
}

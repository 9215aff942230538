package view

import (
	"context"
	"sync/atomic"
	"testing"
)

// TestNextAfterItsContextEnded: once the context a subscription was made
// with has ended, Next says so (Subscribe: "it ends with ctx"; Next: "once
// the subscription has ended, ... the cause of the context it was made
// with"), and Err is set. Catches the end left to context.AfterFunc's
// goroutine: until it runs, Next goes on handing out batches and Err is nil.
func TestNextAfterItsContextEnded(t *testing.T) {
	const runs = 200
	late := 0
	for range runs {
		c := &core[string]{}
		c.hist.init(1 << 20)
		c.hist.floor = 1
		c.hist.publish(&c.snap, &Snapshot[string]{rev: 1}, nil)
		var resyncs atomic.Uint64
		ctx, cancel := context.WithCancel(context.Background())
		sub := c.subscribe(ctx, 1, &resyncs, nil)
		c.hist.publish(&c.snap, &Snapshot[string]{rev: 2}, []Batch[string]{{Kind: Events, From: 1, Revision: 2}})
		cancel()
		_, err := sub.Next(context.Background())
		if err == nil || sub.Err() == nil {
			late++
		}
		sub.Close()
	}
	if late > 0 {
		t.Fatalf("%d of %d subscriptions gave a batch (or no Err) after their context was canceled", late, runs)
	}
}

package view

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/etcdwatch/etcdwatch"
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

// firstCore is a core whose first state is at rev 1, with a history of limit
// bytes, as the runner leaves it after its first publication.
func firstCore(t *testing.T, limit int64) *core[string] {
	t.Helper()
	c := &core[string]{}
	c.hist.init(limit)
	c.hist.floor = 1
	c.hist.publish(&c.snap, &Snapshot[string]{m: table[string]{}.Edit().Map(), rev: 1}, nil)
	return c
}

// mutStep is an Events batch from-1 -> rev changing one key.
func mutStep(rev int64) Batch[string] {
	k := "k"
	return Batch[string]{Kind: Events, From: rev - 1, Revision: rev, Changes: []Change[string]{
		{Kind: Updated, Key: k, Revision: rev, Entry: &Entry[string]{Key: k, Value: "v", ModRevision: rev, size: 2}},
	}}
}

// TestSubscriberFromTheFirstStateThatFellBehindIsCounted: a subscriber
// that holds the view's first state (its origin) and whose next changes
// the history has since dropped has fallen behind: its Resync counts in
// Stats' Resyncs. Only a revision before the origin is not a fall behind.
func TestSubscriberFromTheFirstStateThatFellBehindIsCounted(t *testing.T) {
	c := firstCore(t, 2*(2*changeWeight+2))
	for rev := int64(2); rev <= 5; rev++ {
		c.hist.publish(&c.snap, &Snapshot[string]{m: table[string]{}.Edit().Map(), rev: rev}, []Batch[string]{mutStep(rev)})
	}
	require.EqualValues(t, 1, c.hist.origin)
	require.Greater(t, c.hist.floor, int64(1), "the history dropped the changes after revision 1")
	var resyncs atomic.Uint64
	sub := c.subscribe(context.Background(), 1, &resyncs, nil)
	defer sub.Close()
	b, err := sub.Next(context.Background())
	require.NoError(t, err)
	require.Equal(t, Resync, b.Kind)
	require.EqualValues(t, 5, b.Revision)
	require.EqualValues(t, 1, resyncs.Load(), "a subscriber at the origin that fell behind is counted")
}

// TestSubscribeAtTheEndOfARelist: a subscriber that holds the state a
// Relisted batch ended at (the view's, read just after the relist) is not
// given that relist again, nor a Resync: its first batch is the next step.
func TestSubscribeAtTheEndOfARelist(t *testing.T) {
	c := firstCore(t, 1<<20)
	c.hist.publish(&c.snap, &Snapshot[string]{m: table[string]{}.Edit().Map(), rev: 2}, []Batch[string]{mutStep(2)})
	e := &Entry[string]{Key: "x", Value: "1", ModRevision: 6, size: 2}
	relist := Batch[string]{Kind: Relisted, From: 2, Revision: 8, same: 2, Changes: []Change[string]{{Kind: Created, Key: "x", Revision: 6, Entry: e}}}
	c.hist.publish(&c.snap, &Snapshot[string]{m: table[string]{}.Edit().Map(), rev: 8}, []Batch[string]{relist})
	var resyncs atomic.Uint64
	sub := c.subscribe(context.Background(), 8, &resyncs, nil)
	defer sub.Close()
	c.hist.publish(&c.snap, &Snapshot[string]{m: table[string]{}.Edit().Map(), rev: 9}, []Batch[string]{mutStep(9)})
	b, err := sub.Next(context.Background())
	require.NoError(t, err)
	require.Equal(t, Events, b.Kind, "not the relist it holds, nor a Resync")
	require.EqualValues(t, 8, b.From)
	require.EqualValues(t, 9, b.Revision)
	require.Len(t, b.Changes, 1)
	require.Zero(t, resyncs.Load())
}

// TestHistoryWeighsWhatAChangeReplaced: an update or delete keeps the
// entry it replaced (Prev) as well, and the history's bound counts its
// bytes too, so that WithHistoryBytes bounds what the history holds.
func TestHistoryWeighsWhatAChangeReplaced(t *testing.T) {
	var h history[string]
	h.init(1 << 20)
	h.floor = 1
	prev := &Entry[string]{Key: "k", Value: "old", size: 1000}
	h.push(Batch[string]{Kind: Events, From: 1, Revision: 2, Changes: []Change[string]{{Kind: Deleted, Key: "k", Revision: 2, Prev: prev}}})
	require.EqualValues(t, 2*changeWeight+1000, h.size())
	next := &Entry[string]{Key: "k", Value: "new", size: 10}
	h.push(Batch[string]{Kind: Events, From: 2, Revision: 3, Changes: []Change[string]{{Kind: Updated, Key: "k", Revision: 3, Entry: next, Prev: prev}}})
	require.EqualValues(t, 2*(2*changeWeight)+1000+10+1000, h.size())
}

// TestHoldStepBookmarkExtendsTheLast: a step without changes held after
// another extends it to its revision, without a batch of its own, so that
// the next step joined or held starts where the held ones end.
func TestHoldStepBookmarkExtendsTheLast(t *testing.T) {
	held := holdStep(nil, Batch[string]{Kind: Events, From: 1, Revision: 2, Changes: make([]Change[string], 1)})
	held = holdStep(held, Batch[string]{Kind: Events, From: 2, Revision: 5})
	require.Equal(t, []Batch[string]{{Kind: Events, From: 1, Revision: 5, Changes: make([]Change[string], 1)}}, held)

	big := holdStep(nil, Batch[string]{Kind: Events, From: 1, Revision: 2, Changes: make([]Change[string], etcdwatch.JoinLimit+1)})
	big = holdStep(big, Batch[string]{Kind: Events, From: 2, Revision: 5})
	require.Len(t, big, 1, "a bookmark extends even a step too large to join")
	require.EqualValues(t, 5, big[0].Revision)
}

// TestCheckReportsAtMostMaxReportedKeys: a check that finds many keys
// differing logs the first maxReported of them, in key order, not all.
func TestCheckReportsAtMostMaxReportedKeys(t *testing.T) {
	var cmp comparison[string]
	for i := range 2 * maxReported {
		cmp.stateOnly(string(rune('a'+i)), Entry[string]{})
	}
	require.Len(t, cmp.diff, maxReported)
	require.Equal(t, "a", cmp.diff[0])
	require.Equal(t, string(rune('a'+maxReported-1)), cmp.diff[maxReported-1])
}

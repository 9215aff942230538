package e2e

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/etcdwatch/etcdwatch"
	"github.com/etcdwatch/etcdwatch/etcdwatchtest"
)

// TestProgressAfterACompactedWatch: etcd keeps a watcher it canceled for
// a compaction on its stream until the client cancels it, and answers no
// stream-wide progress request while it is there. Catches a client that
// never canceled it: RequestProgress on that stream waited for ever.
func TestProgressAfterACompactedWatch(t *testing.T) {
	leakCheck(t)
	s, kv, c := open(t), client(t), ctx(t)
	prefix := unique("compacted-progress")
	_, err := s.Watch(c, etcdwatch.Key(prefix+"live"))
	require.NoError(t, err)
	var revs []int64
	for range 3 {
		revs = append(revs, put(t, kv, prefix+"old", "v"))
	}
	_, err = kv.Compact(c, revs[2])
	require.NoError(t, err)
	old, err := s.Watch(c, etcdwatch.Key(prefix+"old").FromRevision(revs[0]))
	require.NoError(t, err)
	for range old.Responses() {
	}
	var ce *etcdwatch.CompactedError
	require.ErrorAs(t, old.Err(), &ce)
	pctx, cancel := context.WithTimeout(c, 10*time.Second)
	defer cancel()
	_, err = s.RequestProgress(pctx)
	require.NoError(t, err, "the stream-wide progress after a watch on the stream was compacted")
}

// TestTrapCompactedJustPastItsRevision: a watch at the stream's head is
// re-created, after a cut, from its own revision r (so that etcd answers
// progress at once). When the store was written and compacted at r+1
// meanwhile, etcd cancels that create as compacted although nothing the
// watch needs is gone: it goes on from r+1. Catches a watch ended with
// "needs revision r+1, compacted up to r+1".
func TestTrapCompactedJustPastItsRevision(t *testing.T) {
	leakCheck(t)
	proxy := etcdwatchtest.NewProxy(t, etcd.Endpoint)
	s, kv, c := openOn(t, []string{proxy.Addr()}), client(t), ctx(t)
	prefix := unique("trap")
	w, err := s.Watch(c, etcdwatch.Key(prefix+"k"))
	require.NoError(t, err)
	r := put(t, kv, prefix+"k", "1")
	require.Equal(t, r, nextEvents(t, w)[0].ModRevision)
	require.Equal(t, r+1, put(t, kv, prefix+"other", "1"), "a write the watch does not see")
	_, err = kv.Compact(c, r+1)
	require.NoError(t, err)
	require.Positive(t, proxy.Cut())
	after := put(t, kv, prefix+"k", "2")
	for {
		select {
		case resp, ok := <-w.Responses():
			require.True(t, ok, "the watch ended: %v", w.Err())
			if !resp.IsProgress() {
				require.Equal(t, after, resp.Events[0].ModRevision)
				return
			}
		case <-c.Done():
			t.Fatal("no event after the cut")
		}
	}
}

// TestProgressAnswerRacingAnOldCreate: a RequestProgress, then a watch
// from an old revision, while a neighbour keeps the stream busy. etcd
// takes the request before the create, but its sender may put the created
// response out first; the answer, computed before the watch existed, then
// reaches the client after it. Catches the answer taken as the new watch's
// bookmark, which made it drop its catch-up event as a duplicate (69 of
// some 256 creates on etcd 3.7, when found).
func TestProgressAnswerRacingAnOldCreate(t *testing.T) {
	leakCheck(t)
	s, kv, c := open(t), client(t), ctx(t)
	prefix := unique("progress-race")
	busy, err := s.Watch(c, etcdwatch.Key(prefix+"busy"))
	require.NoError(t, err)
	drained := make(chan struct{})
	go func() { // until busy ends, with the Stream
		defer close(drained)
		for range busy.Responses() {
		}
	}()
	t.Cleanup(func() { busy.Cancel(); <-drained })
	from := put(t, kv, prefix+"old", "v")
	put(t, kv, prefix+"other", "v")
	wctx, stop := context.WithCancel(c)
	writers := make(chan struct{})
	go func() { // keeps etcd's sender busy with busy's events, until stop
		defer close(writers)
		for wctx.Err() == nil {
			_, _ = kv.Put(wctx, prefix+"busy", "v")
		}
	}()
	defer func() { stop(); <-writers }()
	for i := range 100 {
		answered := make(chan error, 1)
		go func() { // returns with the answer, or after 10 s
			pctx, cancel := context.WithTimeout(c, 10*time.Second)
			defer cancel()
			_, err := s.RequestProgress(pctx)
			answered <- err
		}()
		// A jitter of 0, 20 or 40 µs between the request and the create,
		// to meet etcd's sender at different moments: not synchronisation.
		time.Sleep(time.Duration(i%3) * 20 * time.Microsecond)
		w, err := s.Watch(c, etcdwatch.Key(prefix+"old").FromRevision(from))
		require.NoError(t, err)
		first := next(t, w)
		require.False(t, first.IsProgress(), "create %d: a bookmark at %d came before its event at %d", i, first.Revision, from)
		require.Equal(t, from, first.Events[0].ModRevision)
		w.Cancel()
		if err := <-answered; err != nil && !errors.Is(err, context.DeadlineExceeded) {
			require.NoError(t, err)
		}
	}
}

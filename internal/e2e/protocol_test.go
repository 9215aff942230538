package e2e

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	"github.com/etcdwatch/etcdwatch"
	"github.com/etcdwatch/etcdwatch/dial"
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
// "needs revision r+1; history starts at r+1".
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

// sendCounter counts the messages sent on the connection's streams, through
// an interceptor.
type sendCounter struct{ n atomic.Int64 }

func (c *sendCounter) stream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	cs, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		return nil, err
	}
	return &countedStream{ClientStream: cs, n: &c.n}, nil
}

type countedStream struct {
	grpc.ClientStream
	n *atomic.Int64
}

func (s *countedStream) SendMsg(m any) error {
	s.n.Add(1)
	return s.ClientStream.SendMsg(m)
}

// TestProgressAfterAHoldNotHeldByAWatchFromNow: a watch from a future
// revision keeps etcd from answering any progress request on its stream,
// so a call's requests go unanswered, one each retry. Then a watch from now
// is opened, the hold ends, and a call waits for that watch: it is
// answered within a request or two. Catches the call asking again once for
// each request etcd ignored, back to back (answers are counted off oldest
// first, and those requests were sent before the watch's create).
func TestProgressAfterAHoldNotHeldByAWatchFromNow(t *testing.T) {
	leakCheck(t)
	var sent sendCounter
	conn, err := dial.New([]string{etcd.Endpoint}, dial.WithInsecure(), dial.WithGRPCOptions(grpc.WithStreamInterceptor(sent.stream)))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, conn.Close()) })
	s, err := etcdwatch.Open(conn, etcdwatch.WithProgressRetry(20*time.Millisecond, 20*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	kv, c := client(t), ctx(t)
	prefix := unique("progress-hold")
	head := put(t, kv, prefix+"b", "0")
	hold, err := s.Watch(c, etcdwatch.Key(prefix+"future").FromRevision(head+1000))
	require.NoError(t, err)
	first := make(chan error, 1)
	go func() { // returns once the hold ends
		_, err := s.RequestProgress(c)
		first <- err
	}()
	const ignored = 30
	base := sent.n.Load()
	require.Eventually(t, func() bool { return sent.n.Load() >= base+ignored }, wait, time.Millisecond, "requests asked again")
	b, err := s.Watch(c, etcdwatch.Key(prefix+"b")) // from now, after every request
	require.NoError(t, err)
	var writes []int64
	for i := range 3 {
		writes = append(writes, put(t, kv, prefix+"b", fmt.Sprint(i+1)))
	}
	hold.Cancel()
	before := sent.n.Load()
	rev, err := s.RequestProgress(c)
	require.NoError(t, err)
	asked := sent.n.Load() - before // requests, and the hold's cancel
	require.NoError(t, <-first)
	require.GreaterOrEqual(t, rev, writes[2])
	require.Less(t, asked, int64(ignored/3), "the call asked again for requests etcd ignored")
	after := put(t, kv, prefix+"b", "after") // once the call returned: after the bookmark it promised
	var got []int64
	var bookmarked int64 // the last bookmark before the write made after the call
	for len(got) == 0 || got[len(got)-1] < after {
		r := next(t, b)
		if r.IsProgress() {
			bookmarked = r.Revision
		}
		for _, e := range r.Events {
			got = append(got, e.ModRevision)
		}
	}
	require.Equal(t, append(writes, after), got)
	require.GreaterOrEqual(t, bookmarked, rev, "b bookmarked at the revision the call returned, before the next write")
}

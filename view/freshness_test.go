package view_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"

	"github.com/etcdwatch/etcdwatch"
	ws "github.com/etcdwatch/etcdwatch/internal/watchserver"
	"github.com/etcdwatch/etcdwatch/view"
)

// The freshness of views (issue 18): WaitForRevision asks, Sync moves the
// view's revision on every path, subscribers hear progress and can come
// back from a saved revision.

// callAsync runs f in a goroutine; its error arrives on the channel.
func callAsync(f func() error) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- f() }()
	return ch
}

// TestWaitForRevisionAsks: a revision written outside the view's range,
// with nothing in the range to bring the view there, is reached by asking
// the server for progress on the view's watch, whose answer moves the
// view; WaitForRevision then returns, and a subscriber hears of it in a
// batch without changes.
func TestWaitForRevisionAsks(t *testing.T) {
	h := newHarness(t)
	kv := h.server.KV()
	vh := openView(h, view.DecodeBytes)
	sub := vh.v.Subscribe(t.Context(), vh.v.Revision())
	from := vh.v.Revision()
	rev := kv.Put("elsewhere", "x")
	done := callAsync(func() error { return vh.v.WaitForRevision(context.Background(), rev) })
	require.NotNil(t, vh.srv.Recv(t).GetProgressRequest(), "WaitForRevision did not ask")
	vh.srv.Send(t, ws.Progress(-1, rev))
	require.NoError(t, recv(t, done, "WaitForRevision"))
	require.Equal(t, rev, vh.v.Revision())
	b := nextBatch(t, sub)
	require.Equal(t, view.Events, b.Kind)
	require.Empty(t, b.Changes)
	require.Equal(t, [2]int64{from, rev}, [2]int64{b.From, b.Revision}, "a progress batch from where the last one ended")
}

// TestWaitForRevisionBeyondTheStore: while the store has not reached the
// revision waited for, the view asks again, at a steady cadence, until
// an answer reaches it.
func TestWaitForRevisionBeyondTheStore(t *testing.T) {
	h := newHarness(t)
	kv := h.server.KV()
	vh := openView(h, view.DecodeBytes)
	now := kv.Revision()
	done := callAsync(func() error { return vh.v.WaitForRevision(context.Background(), now+2) })
	require.NotNil(t, vh.srv.Recv(t).GetProgressRequest())
	vh.srv.Send(t, ws.Progress(-1, now)) // not there yet
	require.NotNil(t, vh.srv.Recv(t).GetProgressRequest(), "not asked again")
	vh.srv.Send(t, ws.Progress(-1, now+2))
	require.NoError(t, recv(t, done, "WaitForRevision"))
	require.Equal(t, now+2, vh.v.Revision())
}

// TestSyncMovesTheRevisionWithoutProgress: where progress is unsafe (etcd
// 3.4.23), Sync reads the range; once the view holds the state that read
// saw, it moves to the read's revision, so that Revision says how fresh it
// is, and WaitForRevision of a revision written elsewhere returns by the
// same read, asking again while the store has not reached it.
func TestSyncMovesTheRevisionWithoutProgress(t *testing.T) {
	h := harnessOn(t, ws.StartRelease(t, "3.4.23"))
	kv := h.server.KV()
	putKeys(kv, 2)
	vh := openView(h, view.DecodeBytes)
	rev := kv.Put("elsewhere", "x")
	require.NoError(t, vh.v.Sync(context.Background()))
	require.Equal(t, rev, vh.v.Revision(), "Sync returned with the view's revision below the read's")

	rev = kv.Put("elsewhere", "y")
	require.NoError(t, vh.v.WaitForRevision(context.Background(), rev))
	require.Equal(t, rev, vh.v.Revision())
	reads := func(reqs []*pb.RangeRequest) int {
		n := 0
		for _, r := range reqs {
			if r.SortTarget == pb.RangeRequest_MOD {
				n++
			}
		}
		return n
	}
	before := reads(kv.Requests())
	done := callAsync(func() error { return vh.v.WaitForRevision(context.Background(), rev+1) })
	// Asked twice, the second after a cadence, while the store is behind.
	kv.AwaitRequests(t, func(reqs []*pb.RangeRequest) bool { return reads(reqs) >= before+2 })
	select {
	case err := <-done:
		t.Fatalf("WaitForRevision of a revision the store has not reached returned %v", err)
	default:
	}
	kv.Put("elsewhere", "z")
	require.NoError(t, recv(t, done, "WaitForRevision"))
}

// TestSubscribeFromASavedRevision: a subscriber that saved the revision of
// the last batch it applied (here a batch without changes, the view moved
// by a Sync) subscribes again from it, as after a restart of its own, and
// gets exactly the changes after it; one that saved a revision the
// history no longer reaches gets a Resync.
func TestSubscribeFromASavedRevision(t *testing.T) {
	h := newHarness(t)
	kv := h.server.KV()
	vh := openView(h, view.DecodeBytes, view.WithHistoryBytes(1024))
	first := vh.v.Subscribe(t.Context(), vh.v.Revision())
	vh.send(kv.PutEvent("v/a", "1"))
	require.Equal(t, []string{"created v/a"}, summary(nextBatch(t, first)))
	rev := kv.Put("elsewhere", "x")
	done := callAsync(func() error { return vh.v.WaitForRevision(context.Background(), rev) })
	require.NotNil(t, vh.srv.Recv(t).GetProgressRequest())
	vh.srv.Send(t, ws.Progress(-1, rev))
	require.NoError(t, recv(t, done, "WaitForRevision"))
	saved := nextBatch(t, first).Revision
	require.Equal(t, rev, saved)
	first.Close() // the subscriber goes away, its revision saved

	vh.send(kv.PutEvent("v/b", "1"))
	vh.send(kv.PutEvent("v/a", "2"))
	again := vh.v.Subscribe(t.Context(), saved)
	var got []string
	for from := saved; from < kv.Revision(); {
		b := nextBatch(t, again)
		require.Equal(t, from, b.From, "batches follow each other from the saved revision")
		got, from = append(got, summary(b)...), b.Revision
	}
	require.Equal(t, []string{"created v/b", "updated v/a"}, got, "exactly the changes after the saved revision")

	for range 20 { // past the history's 1 KiB
		vh.send(kv.PutEvent("v/c", "x"))
	}
	late := vh.v.Subscribe(t.Context(), saved)
	require.Equal(t, view.Resync, nextBatch(t, late).Kind)
	require.EqualValues(t, 1, vh.v.Stats().Resyncs)
}

// TestSubscriptionEndsWithItsContext: the context a subscription is made
// with ends it: Next and Batches stop, and Err says why.
func TestSubscriptionEndsWithItsContext(t *testing.T) {
	h := newHarness(t)
	vh := openView(h, view.DecodeBytes)
	ctx, cancel := context.WithCancelCause(context.Background())
	sub := vh.v.Subscribe(ctx, vh.v.Revision())
	require.Equal(t, 1, vh.v.Stats().Subscribers)
	require.NoError(t, sub.Err())
	stop := errors.New("the subscriber is done")
	ended := callAsync(func() error {
		for range sub.Batches() {
		}
		return sub.Err()
	})
	cancel(stop)
	require.ErrorIs(t, recv(t, ended, "Batches"), stop)
	_, err := sub.Next(context.Background())
	require.ErrorIs(t, err, stop)
}

// TestStatsOfSharedViews: Views of one state share the state's counters,
// but each counts its own subscriptions and Resyncs.
func TestStatsOfSharedViews(t *testing.T) {
	h := newHarness(t)
	vh := openView(h, view.DecodeBytes)
	other := vh.v.Share()
	t.Cleanup(func() { other.Close() })
	vh.v.Subscribe(t.Context(), 0)
	vh.v.Subscribe(t.Context(), 0)
	other.Subscribe(t.Context(), 0)
	require.Equal(t, 2, vh.v.Stats().Subscribers)
	require.Equal(t, 1, other.Stats().Subscribers)
	require.Equal(t, vh.v.Stats().Revision, other.Stats().Revision)
}

// TestSyncDoesNotTakeALateAnswer: answers to progress requests cannot be
// matched to them, and a request asked before Sync was called may be
// answered after it, with a revision below a write made before the call.
// Sync reads the store's revision first, so such an answer does not end
// it: the view reaches the write.
func TestSyncDoesNotTakeALateAnswer(t *testing.T) {
	h := newHarness(t)
	kv := h.server.KV()
	vh := openView(h, view.DecodeBytes)
	early := kv.Revision()
	ev := kv.PutEvent("v/a", "1") // the write, made before Sync
	done := callAsync(func() error { return vh.v.Sync(context.Background()) })
	require.NotNil(t, vh.srv.Recv(t).GetProgressRequest(), "Sync did not ask")
	// An answer at the revision before the write: what a request asked
	// before the call, answered late, would carry.
	vh.srv.Send(t, ws.Progress(-1, early))
	vh.srv.Send(t, ws.Events(vh.id, kv.Revision(), ev))
	vh.srv.Send(t, ws.Progress(-1, kv.Revision()))
	require.NoError(t, recv(t, done, "Sync"))
	_, ok := vh.v.Get("v/a")
	require.True(t, ok, "Sync took the late answer and returned before the write")
}

// gatedSource is a Stream whose listings of a range (not its reads of one
// key, nor of the newest key) can be held once the server has answered,
// for a test to act while a relist is under way.
type gatedSource struct {
	*etcdwatch.Stream
	mu   sync.Mutex
	gate chan struct{} // set: the next listing waits until it is closed
	held chan struct{} // closed once that listing has its answer
}

// holdNext holds the next listing; it returns the channel that closes once
// the listing has its answer and the one that releases it.
func (g *gatedSource) holdNext() (held <-chan struct{}, release chan<- struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.gate, g.held = make(chan struct{}), make(chan struct{})
	return g.held, g.gate
}

func (g *gatedSource) Conn() grpc.ClientConnInterface { return gatedConn{g.Stream.Conn(), g} }

type gatedConn struct {
	grpc.ClientConnInterface
	g *gatedSource
}

func (c gatedConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	err := c.ClientConnInterface.Invoke(ctx, method, args, reply, opts...)
	if r, ok := args.(*pb.RangeRequest); ok && len(r.RangeEnd) > 0 && r.Limit != 1 && !r.CountOnly {
		c.g.mu.Lock()
		gate, held := c.g.gate, c.g.held
		c.g.gate = nil
		c.g.mu.Unlock()
		if gate != nil {
			close(held)
			<-gate
		}
	}
	return err
}

// TestSyncDuringARelist: a Sync made while the view lists again after a
// compaction asks progress on the lane, which another isolated watch keeps
// answering; the answer R, above the listing's revision (the store moved
// on outside the range), goes as a bookmark to the watches the lane has
// then, not to the view's next one. Sync asks again for the view's new
// watch and returns with the view at R. Catches: Sync taking the first
// answer as its own and waiting for a bookmark that never comes (the view
// stays at the listing's revision: nothing of its range changes).
func TestSyncDuringARelist(t *testing.T) {
	h := newHarness(t)
	kv := h.server.KV()
	putKeys(kv, 2)
	h.plainWatch("elsewhere")
	src := &gatedSource{Stream: h.s}
	res := make(chan viewResult[[]byte], 1)
	go func() {
		v, err := view.New(context.Background(), src, etcdwatch.Prefix("v/"), view.DecodeBytes, view.WithBookmarkInterval(0))
		res <- viewResult[[]byte]{v, err}
	}()
	c := h.srv.RecvCreate(t)
	h.srv.Send(t, ws.Created(c.WatchId, kv.Revision()))
	h.settle()
	v := started(t, res)

	held, release := src.holdNext()
	h.srv.Send(t, ws.Compacted(c.WatchId, kv.Revision()))
	require.Equal(t, c.WatchId, h.srv.RecvCancel(t), "etcd keeps a compacted watcher until told")
	<-held // the relist has read the range at L
	listed := kv.Revision()
	kv.Put("w/elsewhere", "x")
	synced := callAsync(func() error { return v.Sync(context.Background()) })
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest())
	h.srv.Send(t, ws.Progress(-1, kv.Revision())) // to the lane's watches now: the plain one
	close(release)
	c = h.srv.RecvCreate(t)
	require.Equal(t, listed, c.StartRevision)
	h.srv.Send(t, ws.Created(c.WatchId, kv.Revision()))
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest(), "Sync asks again for the view's new watch")
	h.srv.Send(t, ws.Progress(-1, kv.Revision()))
	require.NoError(t, recv(t, synced, "Sync"))
	require.Equal(t, kv.Revision(), v.Revision())
}

// TestRelistedStartsWhereTheSubscriberDoes: a Sync soon after a progress
// batch moves the view without a batch of its own (progressGap); a
// subscriber from the revision it moved to gets, at a relist, a Relisted
// batch from that revision, as Subscribe promises, not from the last
// batch's. (On a machine slow enough that the second Sync comes after
// progressGap, both moves have batches and the test shows nothing.)
func TestRelistedStartsWhereTheSubscriberDoes(t *testing.T) {
	vh, _ := movedWithoutABatch(t)
	rev := vh.v.Revision()
	sub := vh.v.Subscribe(context.Background(), rev)
	vh.compacted()
	vh.confirm()
	b := nextBatch(t, sub)
	require.Equal(t, view.Relisted, b.Kind)
	require.Equal(t, rev, b.From, "batches that start at the revision subscribed at")
	require.Empty(t, b.Changes)
}

// TestResyncThenTheNextBatchChains: a Resync given right after the view
// moved without a batch (a Sync within progressGap of the last progress
// batch) is at the view's revision, and the next batch starts there.
// Catches: the next batch starting where the last batch published ended,
// before the Resync's revision.
func TestResyncThenTheNextBatchChains(t *testing.T) {
	vh, kv := movedWithoutABatch(t)
	sub := vh.v.Subscribe(context.Background(), 0)
	r := nextBatch(t, sub)
	require.Equal(t, view.Resync, r.Kind)
	ev := kv.PutEvent("v/new", "1")
	vh.srv.Send(t, ws.Events(vh.id, kv.Revision(), ev))
	b := nextBatch(t, sub)
	require.Equal(t, r.Revision, b.From, "the batch after the Resync starts at its revision")
	require.Equal(t, []string{"created v/new"}, summary(b))
}

// TestNoEmptyStepAfterAResync: a Resync at the revision the view moved to
// without a batch is followed by no batch from that revision to itself
// when the delayed progress batch comes out (progressGap): the subscriber
// has that state already. It got an empty step from X to X. (On a machine
// slow enough that the second Sync comes after progressGap, the progress
// batch is out before the Resync and the test shows nothing.)
func TestNoEmptyStepAfterAResync(t *testing.T) {
	h := newHarness(t)
	kv := h.server.KV()
	putKeys(kv, 2)
	vh := openView(h, view.DecodeBytes)
	kv.Put("w/a", "1")
	syncAnswered(t, vh) // a progress batch
	early := vh.v.Subscribe(context.Background(), vh.v.Revision())
	kv.Put("w/b", "1")
	syncAnswered(t, vh) // within progressGap: no batch yet
	x := vh.v.Revision()
	sub := vh.v.Subscribe(context.Background(), 0)
	r := nextBatch(t, sub)
	require.Equal(t, view.Resync, r.Kind)
	require.Equal(t, x, r.Revision)
	p := nextBatch(t, early) // the progress batch to x, out now
	require.Equal(t, x, p.Revision)
	require.Empty(t, p.Changes)
	ev := kv.PutEvent("v/new", "1")
	vh.srv.Send(t, ws.Events(vh.id, kv.Revision(), ev))
	b := nextBatch(t, sub)
	require.Equal(t, x, b.From)
	require.Equal(t, []string{"created v/new"}, summary(b), "a step from %d to %d", b.From, b.Revision)
}

// TestSubscribeInsideARestoredRelist: a view restored from a state saved
// at S, whose history since is compacted, reports the difference from S
// in one Relisted batch. A subscriber from S gets it; one from a revision
// it saved past S (its own progress, saved more often than the view's
// file) gets a Resync: the view cannot know what changed between S and
// that revision. Catches: the Relisted batch given from the later
// revision, missing a key created after S and deleted after it.
func TestSubscribeInsideARestoredRelist(t *testing.T) {
	h := newHarness(t)
	kv := h.server.KV()
	putKeys(kv, 2)
	saved, at := savedState(t, h, etcdwatch.Prefix("v/"))
	past := kv.Put("v/k", "1") // the subscriber's saved progress
	kv.Delete("v/k")
	vh := restoreCompacted(t, h, saved, at)

	b := nextBatch(t, vh.v.Subscribe(context.Background(), at))
	require.Equal(t, view.Relisted, b.Kind)
	require.Equal(t, at, b.From)
	b = nextBatch(t, vh.v.Subscribe(context.Background(), past))
	require.Equal(t, view.Resync, b.Kind, "from %d, inside the step from %d", past, at)
	require.Zero(t, vh.v.Stats().Resyncs, "not a subscriber that fell behind")
}

// TestSubscribeAheadOfTheViewThenRelisted: a subscriber holds the
// range's state at a revision another View of it reached, and subscribes
// to a View behind it. When that View's next batch is Relisted, its
// changes are the difference from the View's older state, not the
// subscriber's: the subscriber gets a Resync, not counted. (One that ends
// before the subscriber's revision is skipped instead: see the next
// test.) Catches the
// Relisted batch given as if from the subscriber's revision ("created"
// for a key it holds).
func TestSubscribeAheadOfTheViewThenRelisted(t *testing.T) {
	h := newHarness(t)
	kv := h.server.KV()
	kv.Put("v/a", "1")
	ahead := openView(h, view.DecodeBytes)
	behind := openView(h, view.DecodeBytes)
	ahead.send(kv.PutEvent("v/b", "1")) // behind has not had it
	held := ahead.v.Snapshot()
	sub := behind.v.Subscribe(context.Background(), held.Revision())
	kv.Put("v/b", "2")
	behind.compacted()
	behind.confirm()
	b := nextBatch(t, sub)
	require.Equal(t, view.Resync, b.Kind, "%v %d->%d %v", b.Kind, b.From, b.Revision, summary(b))
	require.Equal(t, behind.v.Revision(), b.Revision)
	require.Zero(t, behind.v.Stats().Resyncs, "not a subscriber that fell behind")
}

// TestSubscribeAheadOfARelistThatEndsBeforeIt: a subscriber ahead of a
// View whose relist ends before the subscriber's revision has a later
// state: the Relisted batch is skipped, and the next batch starts at the
// subscriber's revision.
func TestSubscribeAheadOfARelistThatEndsBeforeIt(t *testing.T) {
	h := newHarness(t)
	kv := h.server.KV()
	kv.Put("v/a", "1")
	behind := openView(h, view.DecodeBytes)
	behind.compacted()
	c := behind.isolated().RecvCreate(t) // sent once the relist has listed the store
	rev := kv.Put("v/b", "1")
	sub := behind.v.Subscribe(context.Background(), rev) // the state at rev, held from elsewhere
	behind.id = c.WatchId
	behind.srv.Send(t, ws.Created(c.WatchId, c.StartRevision))
	ev := kv.PutEvent("v/c", "1")
	behind.send(ev)
	b := nextBatch(t, sub)
	require.Equal(t, view.Events, b.Kind, "%v %d->%d %v", b.Kind, b.From, b.Revision, summary(b))
	require.Equal(t, rev, b.From)
	require.Equal(t, []string{"created v/c"}, summary(b))
}

// TestSubscriptionsEndedByTheirContextAreForgotten: a subscription whose
// context ends leaves its View's count, as one closed does; and one whose
// view ended says so in Err once Next has returned the view's end.
func TestSubscriptionsEndedByTheirContextAreForgotten(t *testing.T) {
	h := newHarness(t)
	vh := openView(h, view.DecodeBytes)
	for range 10 {
		ctx, cancel := context.WithCancel(context.Background())
		sub := vh.v.Subscribe(ctx, 0)
		cancel()
		require.Eventually(t, func() bool { return sub.Err() != nil }, wait, time.Millisecond)
		require.ErrorIs(t, sub.Err(), context.Canceled)
	}
	require.Zero(t, vh.v.Stats().Subscribers, "once Err says so, the View counts them no more")
	ended := vh.v.Subscribe(context.Background(), 0)
	require.Equal(t, 1, vh.v.Stats().Subscribers)
	nextBatch(t, ended) // its Resync
	vh.srv.Send(t, &pb.WatchResponse{Header: ws.Header(vh.kv.Revision()), WatchId: vh.id, Canceled: true, CancelReason: "etcdserver: permission denied"})
	_, err := ended.Next(context.Background())
	require.ErrorIs(t, err, etcdwatch.ErrPermissionDenied)
	require.ErrorIs(t, ended.Err(), etcdwatch.ErrPermissionDenied, "Err says why, as Next did")
}

// TestSubscriptionsEndedWhileSubscribingAreForgotten: a subscription
// whose context has ended already may end (and tell its View) before
// Subscribe counts it; it must not stay counted then. It did, for as long
// as the View lived: under -race, as make test runs, a few times in these
// 20,000 calls (8 runs of 10); a plain run hardly ever meets that order.
func TestSubscriptionsEndedWhileSubscribingAreForgotten(t *testing.T) {
	h := newHarness(t)
	vh := openView(h, view.DecodeBytes)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for range 20000 {
		sub := vh.v.Subscribe(ctx, 0)
		for { // its Resync may come first: until it has ended
			if _, err := sub.Next(context.Background()); err != nil {
				require.ErrorIs(t, err, context.Canceled)
				break
			}
		}
	}
	require.Zero(t, vh.v.Stats().Subscribers, "ended subscriptions still counted")
}

// syncAnswered makes a Sync of vh's view and answers the progress request
// it makes at the KV's revision.
func syncAnswered(t *testing.T, vh *viewHarness[[]byte]) {
	t.Helper()
	done := callAsync(func() error { return vh.v.Sync(context.Background()) })
	require.NotNil(t, vh.srv.Recv(t).GetProgressRequest())
	vh.srv.Send(t, ws.Progress(-1, vh.kv.Revision()))
	require.NoError(t, recv(t, done, "Sync"))
}

// movedWithoutABatch opens a view of two keys and moves it twice by Syncs
// answered at writes outside its range, the second within progressGap of
// the first's progress batch: published without a batch of its own.
func movedWithoutABatch(t *testing.T) (*viewHarness[[]byte], *ws.KV) {
	t.Helper()
	h := newHarness(t)
	kv := h.server.KV()
	putKeys(kv, 2)
	vh := openView(h, view.DecodeBytes)
	kv.Put("w/a", "1")
	syncAnswered(t, vh) // a progress batch
	kv.Put("w/b", "1")
	syncAnswered(t, vh)
	return vh, kv
}

// TestSubscribeFromBeforeTheViewIsNotAFallBehind: Stats.Resyncs counts
// "whole states given to this View's subscribers that fell behind", and a
// Resync the subscriber did not cause by falling behind is not counted
// (rev 0; a start inside a restored relist). A subscriber that restarts
// with the revision it saved, against a view that has just listed (a
// fleet restart), gets a Resync because the view never had that history:
// nothing was dropped, yet it is counted as a fall-behind, and
// etcdwatch_view_resyncs_total rises on every restart.
func TestSubscribeFromBeforeTheViewIsNotAFallBehind(t *testing.T) {
	h := newHarness(t)
	kv := h.server.KV()
	putKeys(kv, 2)
	saved := kv.Revision() // the subscriber's, from its previous run
	kv.Put("v/x", "1")
	vh := openView(h, view.DecodeBytes)
	b := nextBatch(t, vh.v.Subscribe(t.Context(), saved))
	require.Equal(t, view.Resync, b.Kind, "the view never had the changes after %d", saved)
	require.Zero(t, vh.v.Stats().HistoryBytes, "no history was kept, so none was dropped")
	require.Zero(t, vh.v.Stats().Resyncs, "not a subscriber that fell behind")
}

// TestSubscribeRacingClose: subscriptions made while their View closes,
// and ones whose context ends at once, all end.
func TestSubscribeRacingClose(t *testing.T) {
	h := newHarness(t)
	kv := h.server.KV()
	putKeys(kv, 2)
	vh := openView(h, view.DecodeBytes)
	for range 50 {
		w := vh.v.Share()
		subs := make(chan *view.Subscription[[]byte], 40)
		done := make(chan struct{})
		go func() {
			defer close(done)
			for i := range 40 {
				ctx, cancel := context.WithCancel(context.Background())
				if i%2 == 0 {
					cancel()
				}
				subs <- w.Subscribe(ctx, 0)
				defer cancel()
			}
		}()
		w.Close()
		<-done
		close(subs)
		for s := range subs {
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			for {
				if _, err := s.Next(ctx); err != nil {
					require.NotErrorIs(t, err, context.DeadlineExceeded)
					break
				}
			}
			cancel()
		}
	}
}

// TestSubscribeEndedCtxNotCounted: on an open View, subscriptions whose
// context ended at once or soon after are no longer counted once Err says
// they ended.
func TestSubscribeEndedCtxNotCounted(t *testing.T) {
	h := newHarness(t)
	putKeys(h.server.KV(), 2)
	vh := openView(h, view.DecodeBytes)
	w := vh.v.Share()
	defer w.Close()
	for i := range 200 {
		ctx, cancel := context.WithCancel(context.Background())
		if i%2 == 0 {
			cancel()
		}
		s := w.Subscribe(ctx, 0)
		cancel()
		require.Error(t, s.Err())
	}
	require.Zero(t, w.Stats().Subscribers, "ended subscriptions still counted")
}

package etcdwatch_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/grpc"

	"github.com/etcdwatch/etcdwatch"
	"github.com/etcdwatch/etcdwatch/internal/clock"
	ws "github.com/etcdwatch/etcdwatch/internal/watchserver"
)

// TestCancelRacingEvents: the server keeps sending while the consumer
// cancels. After Cancel returns nothing more is delivered, the channel is
// closed, and the server is asked to cancel the watch.
func TestCancelRacingEvents(t *testing.T) {
	h := newHarness(t)
	w := h.watch(etcdwatch.Prefix("a/"), 1)
	stop := make(chan struct{})
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		for rev := int64(2); ; rev++ {
			select {
			case <-stop:
				return
			default:
				h.srv.Send(t, ws.Events(w.ID(), rev, ws.Put("a/x", "v", rev)))
			}
		}
	}()
	for range 20 {
		next(t, w)
	}
	w.Cancel()
	w.Cancel() // idempotent
	_, ok := <-w.Responses()
	require.False(t, ok, "delivered after Cancel returned")
	require.ErrorIs(t, w.Err(), etcdwatch.ErrCanceled)
	for {
		if req := h.srv.Recv(t); req.GetCancelRequest() != nil {
			require.Equal(t, w.ID(), req.GetCancelRequest().WatchId)
			break
		}
	}
	close(stop)
	<-sent
	h.srv.Send(t, ws.Canceled(w.ID()))
	h.handledAll()
	require.Zero(t, h.s.Stats().Watches)
	require.Equal(t, uint64(0), h.s.Stats().UnknownResponses, "late events of a canceled watch are expected, not unknown")
}

// TestCompactionEndsWatch: a compacted start revision ends the watch with a
// *CompactedError after delivering what came before it.
func TestCompactionEndsWatch(t *testing.T) {
	h := newHarness(t)
	w := h.watch(etcdwatch.Key("a").FromRevision(5), 20)
	h.srv.Send(t, ws.Events(w.ID(), 20, ws.Put("a", "v", 5)))
	h.srv.Send(t, ws.Compacted(w.ID(), 12))
	require.Equal(t, int64(5), next(t, w).Revision)
	err := ended(t, w)
	require.ErrorIs(t, err, etcdwatch.ErrCompacted)
	var ce *etcdwatch.CompactedError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, etcdwatch.CompactedError{CompactRevision: 12, Revision: 6}, *ce)
}

// TestServerCancelEndsOnlyThatWatch: a server cancel of a live watch with
// a reason ends that watch alone; its neighbour carries on. etcd 3.7 sends
// none (it checks permissions at create only, and cancels a live watch
// only when asked, or with a compaction), so this is defence against a
// server or proxy that would; the real path, a re-create refused after a
// cut, is TestPermissionDeniedEndsOnlyItsWatch in internal/e2e.
func TestServerCancelEndsOnlyThatWatch(t *testing.T) {
	h := newHarness(t)
	a := h.watch(etcdwatch.Key("a"), 1)
	b := h.watch(etcdwatch.Key("b"), 1)
	resp := ws.Canceled(a.ID())
	resp.CancelReason = "etcdserver: permission denied"
	h.srv.Send(t, resp)
	h.srv.Send(t, ws.Events(b.ID(), 2, ws.Put("b", "v", 2)))
	require.ErrorIs(t, ended(t, a), etcdwatch.ErrPermissionDenied)
	require.Equal(t, "b", string(next(t, b).Events[0].Key))
	require.Nil(t, b.Err())
}

// TestDuplicateEventsAreDropped: a server replaying history the watch has
// already delivered must not make it deliver twice.
func TestDuplicateEventsAreDropped(t *testing.T) {
	h := newHarness(t)
	w := h.watch(etcdwatch.Key("a"), 1)
	h.srv.Send(t, ws.Events(w.ID(), 3, ws.Put("a", "1", 2), ws.Put("a", "2", 3)))
	h.srv.Send(t, ws.Events(w.ID(), 4, ws.Put("a", "2", 3), ws.Put("a", "3", 4)))
	h.srv.Send(t, ws.Events(w.ID(), 4, ws.Put("a", "3", 4)))
	h.srv.Send(t, ws.Events(w.ID(), 5, ws.Del("a", 5)))
	var revs []int64
	for len(revs) < 4 {
		for _, e := range next(t, w).Events {
			revs = append(revs, e.ModRevision)
		}
	}
	require.Equal(t, []int64{2, 3, 4, 5}, revs)
	require.Equal(t, uint64(2), h.s.Stats().DuplicatesDropped)
}

// TestConsumerBehindTakesJoinedResponses: small responses queued for a
// consumer that is behind are joined, up to 64 events, into responses that
// still hold whole revisions in order, each with the header of the last
// message it carries; a bookmark is never joined with events, and large
// responses go as they came.
func TestConsumerBehindTakesJoinedResponses(t *testing.T) {
	h := newHarness(t)
	w := h.watch(etcdwatch.Key("a"), 1)
	const small = 200
	for rev := int64(2); rev < 2+small; rev++ {
		h.srv.Send(t, ws.Events(w.ID(), rev+1000, ws.Put("a", fmt.Sprint(rev), rev)))
	}
	h.srv.Send(t, ws.Progress(w.ID(), 2+small))
	large := ws.Events(w.ID(), 3+small+1000)
	for range 40 { // two revisions of 40 events each: too many to join
		large.Events = append(large.Events, ws.Put("a", "x", 3+small))
	}
	h.srv.Send(t, large)
	large.Events = append([]*mvccpb.Event(nil), large.Events...)
	for _, e := range large.Events {
		e.Kv = &mvccpb.KeyValue{Key: e.Kv.Key, Value: e.Kv.Value, ModRevision: 4 + small}
	}
	large.Header = ws.Header(4 + small + 1000)
	h.srv.Send(t, large)
	h.handledAll()
	require.Equal(t, uint64(small+80), h.s.Stats().Events)

	var revs []int64
	responses := 0
	for len(revs) < small {
		r := next(t, w)
		responses++
		require.NotEmpty(t, r.Events)
		require.LessOrEqual(t, len(r.Events), 64)
		last := r.Events[len(r.Events)-1].ModRevision
		require.Equal(t, last, r.Revision)
		require.Equal(t, last+1000, r.Header.Revision, "not the header of the last message joined")
		for _, e := range r.Events {
			require.Equal(t, fmt.Sprint(e.ModRevision), string(e.Value))
			revs = append(revs, e.ModRevision)
		}
	}
	require.Equal(t, revisions(2, 1+small), revs)
	require.Less(t, responses, small/10, "responses were not joined")
	require.True(t, next(t, w).IsProgress(), "a bookmark was joined")
	for rev := int64(3 + small); rev <= 4+small; rev++ {
		r := next(t, w)
		require.Len(t, r.Events, 40)
		require.Equal(t, rev, r.Revision)
	}
}

// TestSlowConsumerIsPausedAndResumed: without a stall budget, a consumer
// that stops reading gets its watch paused at the buffer limit, without
// holding up a busy neighbour, and after it catches up the watch resumes
// from the next revision: nothing is lost, nothing repeated.
func TestSlowConsumerIsPausedAndResumed(t *testing.T) {
	const limit = 8
	h := newHarness(t, etcdwatch.WithBufferLimit(limit), etcdwatch.WithStallBudget(0))
	slow := h.watch(etcdwatch.Key("slow"), 1)
	fast := h.watch(etcdwatch.Key("fast"), 1)
	oldID := slow.ID()
	for rev := int64(2); rev <= 41; rev++ {
		h.srv.Send(t, ws.Events(slow.ID(), rev, ws.Put("slow", fmt.Sprint(rev), rev)))
		h.srv.Send(t, ws.Events(fast.ID(), rev, ws.Put("fast", fmt.Sprint(rev), rev)))
		require.Equal(t, rev, next(t, fast).Revision, "the busy watch was held up")
	}
	require.Equal(t, oldID, h.srv.RecvCancel(t), "full watch not paused")
	h.srv.Send(t, ws.Canceled(oldID))
	require.Equal(t, uint64(1), h.s.Stats().Pauses)

	var got []int64
	read := func() {
		for _, e := range next(t, slow).Events {
			got = append(got, e.ModRevision)
		}
	}
	for len(got) < limit/2 {
		read()
	}
	c := h.srv.RecvCreate(t)
	require.Equal(t, int64(2+limit), c.StartRevision, "paused at the wrong revision: the limit counts every event not yet received")

	// From here the server replays history for every create, as etcd would,
	// while the consumer reads at its own pace; the watch may pause again.
	consumed := make(chan struct{})
	go func() {
		defer close(consumed)
		for len(got) < 40 {
			read()
		}
	}()
	serve := func(req *pb.WatchRequest) {
		if c := req.GetCreateRequest(); c != nil {
			h.srv.Send(t, ws.Created(c.WatchId, 41))
			for rev := c.StartRevision; rev <= 41; rev++ {
				h.srv.Send(t, ws.Events(c.WatchId, 41, ws.Put("slow", fmt.Sprint(rev), rev)))
			}
		} else if id := req.GetCancelRequest().GetWatchId(); id != 0 {
			h.srv.Send(t, ws.Canceled(id))
		}
	}
	serve(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: c}})
	for done := false; !done; {
		select {
		case req := <-h.srv.Requests():
			serve(req)
		case <-consumed:
			done = true
		}
	}
	for i, rev := range got {
		require.Equal(t, int64(i+2), rev)
	}
	// The consumer's last read may have made the pump ask for a resume the
	// dispatcher has not handled yet: once every pump has ended its run,
	// and the dispatcher has handled what they asked, every pause has its
	// resume.
	h.await(h.obs.PumpsIdle)
	etcdwatch.Settle(t, h.s, wait)
	require.Zero(t, h.s.Stats().Paused, "a watch stayed paused")
	st := h.s.Stats()
	require.Equal(t, st.Pauses, st.Resumes)
	require.Zero(t, st.Stalls)
	t.Logf("pauses: %d", st.Pauses)
}

// TestOneBookmarkBringsTwoWatchesToTheirLimit: a progress answer bookmarks
// every watch at once, so two whose consumers have stopped can reach their
// limits in one go. The stream waits for one of them (a stall) and pauses
// the other at once. Catches: the second stall replacing the first, whose
// watch, behind and neither waited for nor paused, would then take events
// without bound.
func TestOneBookmarkBringsTwoWatchesToTheirLimit(t *testing.T) {
	const limit = 2
	// A shared stall ends after sharedStall whatever the budget: on the
	// real clock, that could pause the stalled watch too before Stats.
	h := newHarness(t, etcdwatch.WithBufferLimit(limit), etcdwatch.WithStallBudget(time.Hour), etcdwatch.WithClock(clock.NewFake()))
	a := h.watch(etcdwatch.Key("a"), 1)
	b := h.watch(etcdwatch.Key("b"), 1)
	h.srv.Send(t, ws.Events(a.ID(), 2, ws.Put("a", "2", 2)))
	h.srv.Send(t, ws.Events(b.ID(), 3, ws.Put("b", "3", 3)))
	h.handledAll()
	require.Zero(t, h.s.Stats().Stalls, "one short of the limit each")

	got := h.progressAsync()
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest())
	h.srv.Send(t, ws.Progress(-1, 3)) // a bookmark each: both at their limit
	require.NoError(t, recvProgress(t, got).err)
	paused := h.srv.RecvCancel(t)
	require.Contains(t, []int64{a.ID(), b.ID()}, paused)
	st := h.s.Stats()
	require.Equal(t, uint64(1), st.Stalls, "one watch waited for")
	require.Equal(t, uint64(1), st.Pauses, "the other paused")
}

// TestPausedWatchResumesAtHalfItsLimit: a paused watch is re-created once
// its consumer has taken half the limit, not before. Responses of 40 events
// are too large to join, so the consumer takes them one by one.
func TestPausedWatchResumesAtHalfItsLimit(t *testing.T) {
	const limit, per = 200, 40
	h := newHarness(t, etcdwatch.WithBufferLimit(limit), etcdwatch.WithStallBudget(0))
	w := h.watch(etcdwatch.Key("a"), 1)
	pauseAtLimit(h, w, limit, per)
	for range 2 { // 120 events left: above half
		require.Len(t, next(t, w).Events, per)
	}
	// Once the pump has accounted for both, any resume it asked for has
	// reached the dispatcher, which has handled it after Settle.
	h.await(func() bool { return h.obs.Count(etcdwatch.HookTook) == 2 })
	etcdwatch.Settle(t, h.s, wait)
	require.Zero(t, h.s.Stats().Resumes, "resumed above half the limit")
	require.Len(t, next(t, w).Events, per) // 80 left
	c := h.srv.RecvCreate(t)
	// Its last revision queued is the highest the stream has seen: asked
	// again, not the next, which would be one the store has not reached.
	require.Equal(t, int64(1+limit/per), c.StartRevision)
	require.Equal(t, uint64(1), h.s.Stats().Resumes)
}

// pauseAtLimit sends w limit events from revision 2 on, per events a
// response, which its consumer does not read, and answers the cancel that
// pauses it (the harness's Stream waits no stall budget).
func pauseAtLimit(h *harness, w *etcdwatch.Watch, limit, per int) {
	h.t.Helper()
	for rev := int64(2); rev < int64(2+limit/per); rev++ {
		resp := ws.Events(w.ID(), rev)
		for range per {
			resp.Events = append(resp.Events, ws.Put("a", "v", rev))
		}
		h.srv.Send(h.t, resp)
	}
	h.srv.Send(h.t, ws.Canceled(h.srv.RecvCancel(h.t)))
}

// fillToLimit sends w limit events from revision 2 on and waits until the
// Stream stalls for w's consumer, which reads none of them.
func fillToLimit(h *harness, w *etcdwatch.Watch, limit int) {
	h.t.Helper()
	stalls := h.s.Stats().Stalls
	for rev := int64(2); rev < int64(2+limit); rev++ {
		h.srv.Send(h.t, ws.Events(w.ID(), rev, ws.Put("k", fmt.Sprint(rev), rev)))
	}
	h.handledAll() // the last of them began the stall
	require.Equal(h.t, stalls+1, h.s.Stats().Stalls)
}

// stalled opens a watch "lag", alone on a new harness, and fills it to its
// limit, so that the Stream stalls for lag's consumer.
func stalled(t *testing.T, limit int, budget time.Duration, opts ...etcdwatch.Option) (h *harness, lag *etcdwatch.Watch) {
	t.Helper()
	h = newHarness(t, append([]etcdwatch.Option{etcdwatch.WithBufferLimit(limit), etcdwatch.WithStallBudget(budget)}, opts...)...)
	lag = h.watch(etcdwatch.Key("lag"), 1)
	fillToLimit(h, lag, limit)
	return h, lag
}

// readEvents reads responses of w until at least n events have come and
// returns their revisions. Responses queued for a consumer that is behind
// are joined, so there may be more than n.
func readEvents(t *testing.T, w *etcdwatch.Watch, n int) []int64 {
	t.Helper()
	var revs []int64
	for len(revs) < n {
		for _, e := range next(t, w).Events {
			revs = append(revs, e.ModRevision)
		}
	}
	return revs
}

// revisions returns from, from+1, ... to.
func revisions(from, to int64) []int64 {
	var revs []int64
	for rev := from; rev <= to; rev++ {
		revs = append(revs, rev)
	}
	return revs
}

// TestLaggingConsumerIsWaitedFor: a consumer alone on its stream that
// reaches its buffer limit and then catches up is waited for. The stream
// reads nothing more until the consumer has taken half its backlog (gRPC
// flow control then slows the server), and the watch is never paused (no
// cancel, no replay).
func TestLaggingConsumerIsWaitedFor(t *testing.T) {
	const limit = 8
	h, lag := stalled(t, limit, time.Hour)
	id := lag.ID()
	read := h.s.Stats().Responses
	received := h.obs.Count(etcdwatch.HookReceived)
	h.srv.Send(t, ws.Events(lag.ID(), 10, ws.Put("k", "10", 10)))
	h.await(func() bool { return h.obs.Count(etcdwatch.HookReceived) == received+1 })
	// The response waits for the dispatcher, whose loop now runs with it
	// there at each command: a loop that read during a stall would pick
	// it rather than the command, at random, half of the time.
	for range 20 {
		etcdwatch.Settle(t, h.s, wait)
		require.Equal(t, read, h.s.Stats().Responses, "a response was read during the stall")
	}
	got := readEvents(t, lag, limit/2)
	require.Equal(t, revisions(2, int64(1+len(got))), got)
	require.Equal(t, revisions(int64(2+len(got)), 10), readEvents(t, lag, 9-len(got)))
	require.Empty(t, h.barrier(10), "a request (a pause's cancel?) was sent")
	st := h.s.Stats()
	require.Equal(t, uint64(1), st.Stalls)
	require.Zero(t, st.Pauses)
	require.Equal(t, id, lag.ID(), "the watch was re-created")
}

// TestStoppedConsumerDoesNotHoldUpItsNeighbour: a consumer that reads
// nothing costs the other watch on its stream nothing it can count: while
// the scripted server keeps sending to both, the neighbour receives every
// one of its events before the stopped consumer reads any. However large the
// stall budget, a stall that holds up other watches is cut short and the
// stopped watch paused; it then gets everything once it reads.
func TestStoppedConsumerDoesNotHoldUpItsNeighbour(t *testing.T) {
	const limit, n = 8, 500
	h := newHarness(t, etcdwatch.WithBufferLimit(limit), etcdwatch.WithStallBudget(time.Hour))
	stopped := h.watch(etcdwatch.Key("stopped"), 1)
	busy := h.watch(etcdwatch.Key("busy"), 1)
	oldID := stopped.ID()
	sent := make(chan struct{})
	go func() { // exits once it has sent every event; waited for below
		defer close(sent)
		for rev := int64(2); rev < 2+n; rev++ {
			h.srv.Send(t, ws.Events(stopped.ID(), rev, ws.Put("stopped", "v", rev)))
			h.srv.Send(t, ws.Events(busy.ID(), rev, ws.Put("busy", "v", rev)))
		}
	}()
	require.Equal(t, revisions(2, 1+n), readEvents(t, busy, n), "the neighbour was held up")
	<-sent
	require.Equal(t, oldID, h.srv.RecvCancel(t), "the stopped watch was not paused")
	h.srv.Send(t, ws.Canceled(oldID))
	st := h.s.Stats()
	require.Equal(t, uint64(1), st.Pauses)

	got := readEvents(t, stopped, limit/2)
	c := h.srv.RecvCreate(t)
	require.Equal(t, int64(2+limit), c.StartRevision, "resumed at the wrong revision")
	h.srv.Send(t, ws.Created(c.WatchId, 1+n))
	rest := ws.Events(c.WatchId, 1+n) // one catch-up response, as etcd sends
	for rev := c.StartRevision; rev < 2+n; rev++ {
		rest.Events = append(rest.Events, ws.Put("stopped", "v", rev))
	}
	h.srv.Send(t, rest)
	got = append(got, readEvents(t, stopped, n-len(got))...)
	require.Equal(t, revisions(2, 1+n), got, "the stopped consumer lost or repeated events")
}

// TestCreateCutsAStallShort: a stall for a watch alone on its stream holds
// up nobody, until another watch is created: its answer waits behind the
// stall, so the stall is cut short and the lagging watch paused.
func TestCreateCutsAStallShort(t *testing.T) {
	const limit = 4
	h, lag := stalled(t, limit, time.Hour)
	id := lag.ID()
	res := h.watchAsync(context.Background(), etcdwatch.Key("other"))
	c := h.srv.RecvCreate(t)
	h.srv.Send(t, ws.Created(c.WatchId, 5))
	require.NoError(t, recvResult(t, res).err, "a create waited behind the stall")
	require.Equal(t, id, h.srv.RecvCancel(t), "the lagging watch was not paused")
	require.Equal(t, uint64(1), h.s.Stats().Pauses)
	require.Equal(t, revisions(2, 1+limit), readEvents(t, lag, limit))
	require.Equal(t, int64(1+limit), h.srv.RecvCreate(t).StartRevision, "resumed from the revision it had reached, the highest seen")
}

// TestStuckConsumerIsPausedAfterItsStall: a consumer alone on its stream
// that does not catch up holds up the stream only until the stall budget is
// spent (plus the free first millisecond); its watch is then paused, and
// resumed when it has caught up.
func TestStuckConsumerIsPausedAfterItsStall(t *testing.T) {
	const limit, budget = 4, 20 * time.Millisecond
	clk := clock.NewFake()
	h, stuck := stalled(t, limit, budget, etcdwatch.WithClock(clk))
	id := stuck.ID()
	awaitArmed(t, clk, budget+time.Millisecond)
	clk.Advance(budget)
	etcdwatch.Settle(t, h.s, wait)
	require.Zero(t, h.s.Stats().Pauses, "paused before its stall was spent")
	clk.Advance(time.Millisecond)
	require.Equal(t, id, h.srv.RecvCancel(t), "the stuck watch was not paused")
	st := h.s.Stats()
	require.Equal(t, uint64(1), st.Stalls)
	require.Equal(t, uint64(1), st.Pauses)
	require.Equal(t, revisions(2, 1+limit), readEvents(t, stuck, limit))
	require.Equal(t, int64(1+limit), h.srv.RecvCreate(t).StartRevision, "resumed from the revision it had reached, the highest seen")
}

// TestCancelEndsAStall: a consumer that cancels its watch during a stall
// releases the stream at once: it reads on.
func TestCancelEndsAStall(t *testing.T) {
	const limit = 4
	h, lag := stalled(t, limit, time.Hour)
	id := lag.ID()
	h.srv.Send(t, ws.Events(12345, 10, ws.Put("x", "v", 10))) // read only once the stall is over
	lag.Cancel()
	require.Equal(t, id, h.srv.RecvCancel(t))
	h.await(func() bool { return h.s.Stats().UnknownResponses == 1 }, "the stream read nothing after the stall")
	require.Zero(t, h.s.Stats().Pauses)
}

// TestStreamEndDuringAStallPausesTheWatch: when the stream breaks during a
// stall, the watch waited for is paused, not re-created on the new stream,
// until its consumer has caught up.
func TestStreamEndDuringAStallPausesTheWatch(t *testing.T) {
	const limit = 4
	h, lag := stalled(t, limit, time.Hour)
	h.cut()
	h.await(func() bool { return h.s.Stats().Reconnects == 1 })
	st := h.s.Stats()
	require.Equal(t, uint64(1), st.Pauses)
	require.Equal(t, int64(1), st.Paused, "the stalled watch was re-created before its consumer caught up")
	probe := h.srv.RecvCreate(t) // the new stream has nothing else to ask (see TestIdleStreamConnectedAgainAfterReconnect)
	require.NotEqual(t, "lag", string(probe.Key))
	require.Equal(t, revisions(2, 1+limit), readEvents(t, lag, limit))
	c := h.srv.RecvCreate(t)
	require.Equal(t, "lag", string(c.Key))
	require.Equal(t, int64(1+limit), c.StartRevision, "re-created from the revision it had reached, the highest seen")
}

// TestPausedWatchCompactedWhileAway: if the history a paused watch needs is
// compacted before it resumes, it ends with *CompactedError, never a gap.
func TestPausedWatchCompactedWhileAway(t *testing.T) {
	h := newHarness(t, etcdwatch.WithBufferLimit(2), etcdwatch.WithStallBudget(0))
	w := h.watch(etcdwatch.Key("a"), 1)
	for rev := int64(2); rev <= 5; rev++ {
		h.srv.Send(t, ws.Events(w.ID(), rev, ws.Put("a", "v", rev)))
	}
	h.srv.Send(t, ws.Canceled(h.srv.RecvCancel(t)))
	next(t, w)
	c := h.srv.RecvCreate(t)
	h.srv.Send(t, ws.Created(c.WatchId, 30))
	h.srv.Send(t, ws.Compacted(c.WatchId, 25))
	var ce *etcdwatch.CompactedError
	require.ErrorAs(t, ended(t, w), &ce)
	// Paused with every event up to 3 queued (the limit), it needs 4 next.
	// Its create asked from 4, or from 3 itself when 3 was the highest
	// revision the stream had seen (4 and 5 not yet read): a watch
	// re-created at the store's head asks for its own revision, whose
	// events it then drops.
	require.Equal(t, int64(4), ce.Revision)
	require.Contains(t, []int64{3, 4}, c.StartRevision)
	require.Equal(t, int64(25), ce.CompactRevision)
}

// TestWatchEndsWithItsContext: the watch's context bounds its life, and its
// cause is the watch's error.
func TestWatchEndsWithItsContext(t *testing.T) {
	h := newHarness(t)
	ctx, cancel := context.WithCancelCause(context.Background())
	res := h.watchAsync(ctx, etcdwatch.Key("a"))
	c := h.srv.RecvCreate(t)
	h.srv.Send(t, ws.Created(c.WatchId, 1))
	w := recvResult(t, res).w
	cause := errors.New("shutting down")
	cancel(cause)
	require.ErrorIs(t, ended(t, w), cause)
	require.Equal(t, c.WatchId, h.srv.RecvCancel(t))
}

// TestWatchesSharingAContextEndTogether: watches under one context (or
// contexts that share its Done channel) all end with its cause when it
// ends, each released on the server; other watches, and watches that had
// already ended, are not touched.
func TestWatchesSharingAContextEndTogether(t *testing.T) {
	h := newHarness(t)
	type key struct{}
	ctx, cancel := context.WithCancelCause(context.Background())
	open := func(ctx context.Context, k string) *etcdwatch.Watch {
		res := h.watchAsync(ctx, etcdwatch.Key(k))
		c := h.srv.RecvCreate(t)
		h.srv.Send(t, ws.Created(c.WatchId, 1))
		got := recvResult(t, res)
		require.NoError(t, got.err)
		return got.w
	}
	shared := []*etcdwatch.Watch{open(ctx, "a"), open(context.WithValue(ctx, key{}, 1), "b"), open(ctx, "c")}
	canceled := open(ctx, "d")
	other := open(t.Context(), "e")
	canceled.Cancel()
	require.Equal(t, canceled.ID(), h.srv.RecvCancel(t))

	cause := errors.New("shutting down")
	cancel(cause)
	want := map[int64]bool{}
	for _, w := range shared {
		require.ErrorIs(t, ended(t, w), cause)
		want[w.ID()] = true
	}
	got := map[int64]bool{}
	for range shared {
		got[h.srv.RecvCancel(t)] = true
	}
	require.Equal(t, want, got)
	require.ErrorIs(t, canceled.Err(), etcdwatch.ErrCanceled, "an ended watch changed its error")
	h.srv.Send(t, ws.Events(other.ID(), 2, ws.Put("e", "v", 2)))
	require.Equal(t, int64(2), next(t, other).Revision)
	require.Nil(t, other.Err())

	// A watch opened under a fresh context after all this ends with it too.
	ctx2, cancel2 := context.WithCancel(context.Background())
	late := open(ctx2, "f")
	cancel2()
	require.ErrorIs(t, ended(t, late), context.Canceled)
	require.Equal(t, late.ID(), h.srv.RecvCancel(t))
}

// TestContextOutlivesManyOfItsWatches: a context's group lets go of the
// watches canceled before it ends (most of them, past the point where it
// compacts its list), and still ends every one left, each once. Catches: a
// compaction that drops a watch still bound, or keeps a canceled one to
// end again.
func TestContextOutlivesManyOfItsWatches(t *testing.T) {
	const n, kept = 200, 25
	h := newHarness(t)
	ctx, cancel := context.WithCancelCause(context.Background())
	ks := make([]string, n)
	for i := range ks {
		ks[i] = fmt.Sprint("k", i)
	}
	res := h.watchAllAsync(ctx, keys(ks...)...)
	for range n {
		c := h.srv.RecvCreate(t)
		h.srv.Send(t, ws.Created(c.WatchId, 1))
	}
	got := recvAll(t, res)
	require.NoError(t, got.err)
	for i, w := range got.ws {
		if i%7 != 0 || i/7 >= kept { // keep every seventh, kept of them
			w.Cancel()
			require.Equal(t, w.ID(), h.srv.RecvCancel(t))
		}
	}
	cause := errors.New("shutting down")
	cancel(cause)
	want := map[int64]bool{}
	for i, w := range got.ws {
		if i%7 == 0 && i/7 < kept {
			require.ErrorIs(t, ended(t, w), cause)
			want[w.ID()] = true
		} else {
			require.ErrorIs(t, w.Err(), etcdwatch.ErrCanceled)
		}
	}
	require.Len(t, want, kept)
	released := map[int64]bool{}
	for range kept {
		released[h.srv.RecvCancel(t)] = true
	}
	require.Equal(t, want, released)
	h.await(func() bool { return h.s.Stats().Watches == 0 })
}

// TestContextEndsBeforeCreated: a watch given up while its create is in
// flight is canceled on the server as soon as the server confirms it.
func TestContextEndsBeforeCreated(t *testing.T) {
	h := newHarness(t)
	ctx, cancel := context.WithCancel(context.Background())
	res := h.watchAsync(ctx, etcdwatch.Key("a"))
	c := h.srv.RecvCreate(t)
	cancel()
	require.ErrorIs(t, recvResult(t, res).err, context.Canceled)
	h.srv.Send(t, ws.Created(c.WatchId, 1))
	require.Equal(t, c.WatchId, h.srv.RecvCancel(t))
	h.srv.Send(t, ws.Canceled(c.WatchId))
	h.await(func() bool { return h.s.Stats().Watches == 0 })
}

// TestCreateRequestCarriesTheRequest checks the wire form of every field.
func TestCreateRequestCarriesTheRequest(t *testing.T) {
	h := newHarness(t)
	r := etcdwatch.Prefix("p/").FromRevision(7).WithPrevKV().WithoutDeletes().WithProgressNotify().WithFragment()
	res := h.watchAsync(context.Background(), r)
	c := h.srv.RecvCreate(t)
	require.Equal(t, "p/", string(c.Key))
	require.Equal(t, "p0", string(c.RangeEnd))
	require.Equal(t, int64(7), c.StartRevision)
	require.True(t, c.PrevKv && c.ProgressNotify && c.Fragment)
	require.Equal(t, []pb.WatchCreateRequest_FilterType{pb.WatchCreateRequest_NODELETE}, c.Filters)
	require.Positive(t, c.WatchId)
	h.srv.Send(t, ws.Created(c.WatchId, 3))
	w := recvResult(t, res).w
	require.Equal(t, r, w.Request())
	require.Equal(t, int64(6), w.Revision(), "a watch from revision 7 has delivered everything before it")
}

func TestRequestValidation(t *testing.T) {
	for _, tc := range []struct {
		name  string
		r     etcdwatch.Request
		field string // named in the error; "" for a valid request
	}{
		{"key", etcdwatch.Key("a"), ""},
		{"prefix", etcdwatch.Prefix("a"), ""},
		{"every key", etcdwatch.Prefix(""), ""},
		{"from key", etcdwatch.FromKey("a"), ""},
		{"range", etcdwatch.Range("a", "b"), ""},
		{"zero", etcdwatch.Request{}, "Key"},
		{"empty key", etcdwatch.Key(""), "Key"},
		{"end before key", etcdwatch.Range("b", "a"), "End"},
		{"end equals key", etcdwatch.Range("a", "a"), "End"},
		{"negative revision", etcdwatch.Key("a").FromRevision(-1), "Revision"},
		{"bookmarks alone", etcdwatch.Key("a").WithoutPuts().WithoutDeletes(), ""},
		{"bookmarks alone, the server's too", etcdwatch.Key("a").WithoutPuts().WithoutDeletes().WithProgressNotify(), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.r.Validate()
			if tc.field == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, etcdwatch.ErrInvalidRequest)
			require.Contains(t, err.Error(), tc.field)
		})
	}
}

func TestPrefixEnd(t *testing.T) {
	for prefix, end := range map[string]string{
		"a": "b", "a/": "a0", "a\xff": "b", "\xff\xff": "\x00", "": "\x00",
	} {
		require.Equal(t, end, string(etcdwatch.Prefix(prefix).End), "prefix %q", prefix)
	}
}

// TestWatchWithANilContextPanicsUncounted: a nil ctx is a programmer's
// error and panics, as in the standard library, but before the watch is
// counted: it stayed in Stats.Watches for good when the panic was
// recovered.
func TestWatchWithANilContextPanicsUncounted(t *testing.T) {
	h := newHarness(t)
	require.PanicsWithValue(t, "etcdwatch: invalid argument: a watch with a nil Context", func() {
		var nilCtx context.Context // the nil is the test
		h.s.Watch(nilCtx, etcdwatch.Key("a"))
	})
	require.Zero(t, h.s.Stats().Watches)
}

func TestWatchRefusesInvalidRequest(t *testing.T) {
	h := newHarness(t)
	_, err := h.s.Watch(context.Background(), etcdwatch.Range("b", "a"))
	require.ErrorIs(t, err, etcdwatch.ErrInvalidRequest)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = h.s.Watch(ctx, etcdwatch.Key("a"))
	require.ErrorIs(t, err, context.Canceled)
}

func TestOpenValidation(t *testing.T) {
	conn := ws.Start(t).Dial(t)
	var typedNil *grpc.ClientConn // what a failed grpc.NewClient returns
	for _, tc := range []struct {
		name  string
		conn  grpc.ClientConnInterface
		opt   etcdwatch.Option
		field string
	}{
		{"nil conn", nil, nil, "conn"},
		{"nil *grpc.ClientConn", typedNil, nil, "conn"},
		{"buffer limit", conn, etcdwatch.WithBufferLimit(0), "WithBufferLimit"},
		{"buffer bytes", conn, etcdwatch.WithBufferBytes(0), "WithBufferBytes"},
		{"connect retry", conn, etcdwatch.WithConnectRetry(-time.Millisecond), "WithConnectRetry"},
		{"create timeout", conn, etcdwatch.WithCreateTimeout(-time.Millisecond), "WithCreateTimeout"},
		{"progress retry", conn, etcdwatch.WithProgressRetry(0, time.Second), "WithProgressRetry"},
		{"progress retry max below min", conn, etcdwatch.WithProgressRetry(time.Second, time.Millisecond), "WithProgressRetry"},
		{"stall budget", conn, etcdwatch.WithStallBudget(-time.Millisecond), "WithStallBudget"},
		{"codec", conn, etcdwatch.WithCallOptions(grpc.CallContentSubtype("json")), "WithCallOptions"},
		{"custom codec", conn, etcdwatch.WithCallOptions(grpc.CallCustomCodec(nil)), "WithCallOptions"}, //lint:ignore SA1019 deprecated, still in gRPC: it won over the Stream's codec
		{"nil logger", conn, etcdwatch.WithLogger(nil), "WithLogger"},
		{"nil call option", conn, etcdwatch.WithCallOptions(grpc.WaitForReady(true), nil), "WithCallOptions"}, // a nil one panicked in gRPC on the Stream's goroutine
	} {
		t.Run(tc.name, func(t *testing.T) {
			var opts []etcdwatch.Option
			if tc.opt != nil {
				opts = append(opts, tc.opt)
			}
			s, err := etcdwatch.Open(tc.conn, opts...)
			require.Nil(t, s)
			require.ErrorIs(t, err, etcdwatch.ErrInvalidArgument)
			require.True(t, strings.Contains(err.Error(), tc.field), err.Error())
		})
	}
}

// TestPausedWatchResumesAtExactlyHalfItsLimit: a paused watch is resumed
// once what it holds for its consumer has fallen to half its limit, not
// below it. Catches: a consumer left one more response behind before the
// watch goes on.
func TestPausedWatchResumesAtExactlyHalfItsLimit(t *testing.T) {
	const limit, per = 200, 50
	h := newHarness(t, etcdwatch.WithBufferLimit(limit), etcdwatch.WithStallBudget(0))
	w := h.watch(etcdwatch.Key("a"), 1)
	pauseAtLimit(h, w, limit, per)
	require.Len(t, next(t, w).Events, per)
	require.Len(t, next(t, w).Events, per) // 100 left: half
	h.await(func() bool { return h.obs.Count(etcdwatch.HookTook) == 2 })
	etcdwatch.Settle(t, h.s, wait)
	require.Equal(t, uint64(1), h.s.Stats().Resumes, "not resumed at half its limit")
	c := h.srv.RecvCreate(t)
	require.Equal(t, int64(1+limit/per), c.StartRevision)
}

// eventOverhead is what an event costs beyond its keys and values against
// WithBufferBytes (backpressure.go's eventOverhead).
const eventOverhead = 96

// wideEvents returns a response for watch id at revision rev carrying n
// events of key "a", value "v": too many, at n > 32, to be joined with
// another such response in a backlog (JoinLimit is 64).
func wideEvents(id, rev int64, n int) *pb.WatchResponse {
	resp := ws.Events(id, rev)
	for range n {
		resp.Events = append(resp.Events, ws.Put("a", "v", rev))
	}
	return resp
}

// TestByteLimitCountsPreviousValuesAndIsReachedAtItsSize: a watch whose
// consumer stops reading is paused once what it holds reaches
// WithBufferBytes exactly, previous keys and values counted. Catches: the
// previous key and value left out of the weight (a WithPrevKV watch then
// holds far more than its limit), and a byte limit reached only once
// exceeded.
func TestByteLimitCountsPreviousValuesAndIsReachedAtItsSize(t *testing.T) {
	prev := strings.Repeat("p", 100)
	weight := eventOverhead + len("a") + len("v") + len("a") + len(prev) // one event, its previous one included
	h := newHarness(t, etcdwatch.WithBufferBytes(2*weight), etcdwatch.WithStallBudget(0))
	w := h.watch(etcdwatch.Key("a").WithPrevKV(), 1)
	id := w.ID()
	event := func(rev int64) *pb.WatchResponse {
		e := ws.Put("a", "v", rev)
		e.PrevKv = &mvccpb.KeyValue{Key: []byte("a"), Value: []byte(prev), ModRevision: rev - 1}
		return ws.Events(id, rev, e)
	}
	h.srv.Send(t, event(2))
	h.handledAll()
	require.Zero(t, h.s.Stats().Pauses, "paused one event short of the byte limit")
	h.srv.Send(t, event(3)) // exactly at the limit
	h.handledAll()
	require.Equal(t, uint64(1), h.s.Stats().Pauses, "not paused with the byte limit reached, previous values counted")
	require.Equal(t, id, h.srv.RecvCancel(t))
	h.srv.Send(t, ws.Canceled(id))

	var revs []int64
	for len(revs) < 2 {
		for _, e := range next(t, w).Events {
			require.NotNil(t, e.PrevKV)
			require.Equal(t, prev, string(e.PrevKV.Value))
			revs = append(revs, e.ModRevision)
		}
	}
	require.Equal(t, []int64{2, 3}, revs)
	require.Equal(t, "a", string(h.srv.RecvCreate(t).Key), "not resumed once caught up")
}

// TestPausedWatchResumesAtHalfItsByteLimit: a watch paused at its byte
// limit, far below its event limit, resumes only once its consumer has
// taken half the bytes. Catches: a resume decided on the event count
// alone, which re-creates the watch at once, to be paused again at the
// next response.
func TestPausedWatchResumesAtHalfItsByteLimit(t *testing.T) {
	const per = 40 // events a response: responses are not joined
	size := per * (eventOverhead + len("a") + len("v"))
	h := newHarness(t, etcdwatch.WithBufferBytes(3*size), etcdwatch.WithStallBudget(0))
	w := h.watch(etcdwatch.Key("a"), 1)
	for rev := int64(2); rev <= 4; rev++ { // 3 responses: at the byte limit; 120 events, far below 1024
		h.srv.Send(t, wideEvents(w.ID(), rev, per))
	}
	h.srv.Send(t, ws.Canceled(h.srv.RecvCancel(t)))
	require.Equal(t, uint64(1), h.s.Stats().Pauses)

	require.Len(t, next(t, w).Events, per) // 2 responses' bytes left: above half
	// Once the pump has accounted for it, any resume it asked for has
	// reached the dispatcher, which has handled it after Settle.
	h.await(func() bool { return h.obs.Count(etcdwatch.HookTook) == 1 })
	etcdwatch.Settle(t, h.s, wait)
	require.Zero(t, h.s.Stats().Resumes, "resumed above half the byte limit")

	require.Len(t, next(t, w).Events, per) // 1 response's bytes left: below half
	c := h.srv.RecvCreate(t)
	require.Equal(t, "a", string(c.Key))
	require.Equal(t, uint64(1), h.s.Stats().Resumes)
}

// TestStallWithAProgressRequestWaitingIsShared: a watch that reaches its
// limit while a RequestProgress waits for its answer holds that answer
// up, so its stall is a shared one, cut short whatever the budget: the
// watch is paused and the answer read. Catches: the waiting request not
// counted, the stall taken for one that holds up nobody, and
// RequestProgress held for as long as the budget (an hour here).
func TestStallWithAProgressRequestWaitingIsShared(t *testing.T) {
	const limit = 4
	h := newHarness(t, etcdwatch.WithBufferLimit(limit), etcdwatch.WithStallBudget(time.Hour))
	w := h.watch(etcdwatch.Key("k"), 1)
	got := h.progressAsync()
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest())
	for rev := int64(2); rev < 2+limit; rev++ {
		h.srv.Send(t, ws.Events(w.ID(), rev, ws.Put("k", fmt.Sprint(rev), rev)))
	}
	h.srv.Send(t, ws.Progress(-1, 1+limit))
	pausedAfterItsStall(t, h, w, limit)
	require.NoError(t, recvProgress(t, got).err)
}

// TestStallWithACreateInFlightIsShared: a watch that reaches its limit
// while another watch's create awaits its answer holds that answer up, so
// its stall is a shared one, cut short whatever the budget: the watch is
// paused and the create's answer read. Catches: the create in flight not
// counted, the stall taken for one that holds up nobody, and the Watch
// call held for as long as the budget (an hour here). (A create sent
// during the stall cuts it short too: TestCreateCutsAStallShort.)
func TestStallWithACreateInFlightIsShared(t *testing.T) {
	const limit = 4
	h := newHarness(t, etcdwatch.WithBufferLimit(limit), etcdwatch.WithStallBudget(time.Hour))
	lag := h.watch(etcdwatch.Key("lag"), 1)
	res := h.watchAsync(context.Background(), etcdwatch.Key("other"))
	c := h.srv.RecvCreate(t)
	require.Equal(t, "other", string(c.Key))
	for rev := int64(2); rev < 2+limit; rev++ {
		h.srv.Send(t, ws.Events(lag.ID(), rev, ws.Put("lag", fmt.Sprint(rev), rev)))
	}
	h.srv.Send(t, ws.Created(c.WatchId, 1+limit))
	pausedAfterItsStall(t, h, lag, limit)
	require.NoError(t, recvResult(t, res).err, "a create in flight waited behind the stall")
}

// pausedAfterItsStall checks that w, at its limit of limit events from
// revision 2, was waited for once (a stall) and then paused: its cancel
// sent, and every event it held delivered.
func pausedAfterItsStall(t *testing.T, h *harness, w *etcdwatch.Watch, limit int) {
	t.Helper()
	require.Equal(t, w.ID(), h.srv.RecvCancel(t), "the lagging watch was not paused")
	st := h.s.Stats()
	require.Equal(t, uint64(1), st.Stalls)
	require.Equal(t, uint64(1), st.Pauses)
	require.Equal(t, revisions(2, int64(1+limit)), readEvents(t, w, limit))
}

// TestStallOutlastsThePauseOfAnotherWatch: one bookmark brings two watches
// to their limits: the stream waits for one (a stall) and pauses the
// other. Pausing the other must leave the stall be: the watch waited for
// is still waited for, and paused once its stall is spent. Catches: a
// pause ending whatever stall was under way, which left the watch waited
// for behind its limit, neither waited for nor paused, to take events
// without bound.
func TestStallOutlastsThePauseOfAnotherWatch(t *testing.T) {
	const limit = 2
	clk := clock.NewFake()
	h := newHarness(t, etcdwatch.WithBufferLimit(limit), etcdwatch.WithStallBudget(time.Hour), etcdwatch.WithClock(clk))
	a := h.watch(etcdwatch.Key("a"), 1)
	b := h.watch(etcdwatch.Key("b"), 1)
	h.srv.Send(t, ws.Events(a.ID(), 2, ws.Put("a", "2", 2)))
	h.srv.Send(t, ws.Events(b.ID(), 3, ws.Put("b", "3", 3)))
	h.handledAll()
	got := h.progressAsync()
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest())
	h.srv.Send(t, ws.Progress(-1, 3)) // a bookmark each: both at their limit
	require.NoError(t, recvProgress(t, got).err)
	paused := h.srv.RecvCancel(t)
	waited := a.ID()
	if paused == a.ID() {
		waited = b.ID()
	}
	require.Contains(t, []int64{a.ID(), b.ID()}, paused)
	require.Equal(t, uint64(1), h.s.Stats().Stalls)
	// The stall holds up a neighbour: it lasts sharedStall (2ms), and its
	// watch is paused then.
	awaitArmed(t, clk, 2*time.Millisecond)
	clk.Advance(2 * time.Millisecond)
	require.Equal(t, waited, h.srv.RecvCancel(t), "the watch waited for was not paused once its stall was spent")
	require.Equal(t, uint64(2), h.s.Stats().Pauses)
}

// TestWatchPausedAgainAfterAResume: a watch paused at its limit and
// resumed once its consumer caught up is held to its limit again: a
// consumer that stops again gets it paused again. Catches: the resume
// leaving the backlog counted as behind, so that it never reports
// reaching the limit again, and grows without bound.
func TestWatchPausedAgainAfterAResume(t *testing.T) {
	const limit = 4
	h := newHarness(t, etcdwatch.WithBufferLimit(limit), etcdwatch.WithStallBudget(0))
	w := h.watch(etcdwatch.Key("a"), 1)
	for rev := int64(2); rev < 2+limit; rev++ {
		h.srv.Send(t, ws.Events(w.ID(), rev, ws.Put("a", "v", rev)))
	}
	h.srv.Send(t, ws.Canceled(h.srv.RecvCancel(t)))
	require.Equal(t, revisions(2, 1+limit), readEvents(t, w, limit))
	c := h.srv.RecvCreate(t)
	require.Equal(t, int64(1+limit), c.StartRevision)
	h.srv.Send(t, ws.Created(c.WatchId, 1+limit))
	for rev := int64(2 + limit); rev < 2+2*limit; rev++ { // the consumer stops again
		h.srv.Send(t, ws.Events(c.WatchId, rev, ws.Put("a", "v", rev)))
	}
	require.Equal(t, c.WatchId, h.srv.RecvCancel(t), "not paused again at its limit")
	h.srv.Send(t, ws.Canceled(c.WatchId))
	st := h.s.Stats()
	require.Equal(t, uint64(2), st.Pauses)
	require.Equal(t, uint64(1), st.Resumes)
	require.Equal(t, revisions(2+limit, 1+2*limit), readEvents(t, w, limit))
}

package etcdwatch_test

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/etcdwatch/etcdwatch"
	ws "github.com/etcdwatch/etcdwatch/internal/watchserver"
)

// recorder is a Handler's function and WithEnded for tests: it records
// every call, and what no Handler may do (two calls for one watch at once,
// a call after Ended).
type recorder struct {
	gate chan struct{} // when not nil, each call waits for it to close

	mu       sync.Mutex
	revs     map[*etcdwatch.Watch][]int64 // each watch's events (ModRevision) in the order handed over; a bookmark's revision
	calls    map[*etcdwatch.Watch]int     // each watch's calls (responses waiting together are joined into one)
	index    map[*etcdwatch.Watch]int     // the index each watch was called with
	calling  map[*etcdwatch.Watch]bool
	ends     map[*etcdwatch.Watch]error
	broken   []string      // what a Handler did that it must not
	running  int           // calls in progress
	changed  chan struct{} // closed and replaced at each call's start and end
	doneSeen map[*etcdwatch.Watch]bool
}

func newRecorder() *recorder {
	return &recorder{
		revs: map[*etcdwatch.Watch][]int64{}, calls: map[*etcdwatch.Watch]int{}, index: map[*etcdwatch.Watch]int{}, calling: map[*etcdwatch.Watch]bool{},
		ends: map[*etcdwatch.Watch]error{}, changed: make(chan struct{}), doneSeen: map[*etcdwatch.Watch]bool{},
	}
}

// handler returns a Handler of rec with opts.
func (rec *recorder) handler(opts ...etcdwatch.HandlerOption) *etcdwatch.Handler {
	return etcdwatch.NewHandler(rec.handle, append([]etcdwatch.HandlerOption{etcdwatch.WithEnded(rec.ended)}, opts...)...)
}

func (rec *recorder) handle(w *etcdwatch.Watch, i int, r etcdwatch.Response) {
	rec.update(func() {
		if j, ok := rec.index[w]; ok && j != i {
			rec.broken = append(rec.broken, fmt.Sprintf("watch %d called with index %d, then %d", w.ID(), j, i))
		}
		rec.index[w] = i
		if rec.calling[w] {
			rec.broken = append(rec.broken, fmt.Sprintf("two calls at once for watch %d", w.ID()))
		}
		if _, ok := rec.ends[w]; ok {
			rec.broken = append(rec.broken, fmt.Sprintf("a call for watch %d after Ended", w.ID()))
		}
		rec.calling[w] = true
		rec.running++
		rec.calls[w]++
		for _, e := range r.Events {
			rec.revs[w] = append(rec.revs[w], e.ModRevision)
		}
		if len(r.Events) == 0 {
			rec.revs[w] = append(rec.revs[w], r.Revision)
		}
	})
	if rec.gate != nil {
		<-rec.gate
	}
	runtime.Gosched() // give a second goroutine for the same watch its chance to be caught
	rec.update(func() {
		rec.calling[w] = false
		rec.running--
	})
}

func (rec *recorder) ended(w *etcdwatch.Watch, err error) {
	select {
	case <-w.Done():
	default:
		err = fmt.Errorf("Done not closed at Ended: %w", err)
	}
	rec.update(func() {
		if rec.calling[w] {
			rec.broken = append(rec.broken, fmt.Sprintf("Ended during a call for watch %d", w.ID()))
		}
		if _, ok := rec.ends[w]; ok {
			rec.broken = append(rec.broken, fmt.Sprintf("Ended twice for watch %d", w.ID()))
		}
		rec.ends[w] = err
	})
}

func (rec *recorder) update(f func()) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	f()
	close(rec.changed)
	rec.changed = make(chan struct{})
}

// await waits until cond holds, checked under rec's lock.
func (rec *recorder) await(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.After(wait)
	for {
		rec.mu.Lock()
		ok, changed := cond(), rec.changed
		rec.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("not in time: %s", what)
		}
	}
}

// check fails t if the Handler broke its contract.
func (rec *recorder) check(t *testing.T) {
	t.Helper()
	rec.mu.Lock()
	defer rec.mu.Unlock()
	require.Empty(t, rec.broken)
}

// handleAsync calls Handle in a goroutine; the result arrives on the channel.
func (h *harness) handleAsync(ctx context.Context, hd *etcdwatch.Handler, rs ...etcdwatch.Request) <-chan watchAllResult {
	ch := make(chan watchAllResult, 1)
	go func() {
		ws, err := h.s.Handle(ctx, hd, rs...)
		ch <- watchAllResult{ws, err}
	}()
	return ch
}

// handled opens watches of n keys with hd, each confirmed at revision 1.
// When the test ends, the Stream closes and hd's goroutines are waited for.
func (h *harness) handled(hd *etcdwatch.Handler, n int) []*etcdwatch.Watch {
	h.t.Helper()
	h.t.Cleanup(func() {
		_ = h.s.Close()
		hd.Wait()
	})
	ks := make([]string, n)
	for i := range ks {
		ks[i] = fmt.Sprint("k", i)
	}
	res := h.handleAsync(context.Background(), hd, keys(ks...)...)
	for range n {
		c := h.srv.RecvCreate(h.t)
		h.srv.Send(h.t, ws.Created(c.WatchId, 1))
	}
	got := recvAll(h.t, res)
	require.NoError(h.t, got.err)
	for _, w := range got.ws {
		require.Nil(h.t, w.Responses(), "a Handler's watch has no channel")
	}
	return got.ws
}

// TestHandlerCallsEachWatchInOrder: responses of many watches, interleaved
// on the stream, reach the Handler's function in each watch's revision
// order, one call at a time per watch, though three goroutines share the
// work. Catches: a watch served by two goroutines at once, responses
// reordered or lost across the queue, a watch left unserved.
func TestHandlerCallsEachWatchInOrder(t *testing.T) {
	const watches, responses = 20, 10
	h := newHarness(t)
	rec := newRecorder()
	hd := rec.handler(etcdwatch.WithGoroutines(3))
	wts := h.handled(hd, watches)
	for rev := int64(2); rev < 2+responses; rev++ {
		for i, w := range wts {
			h.srv.Send(t, ws.Events(w.ID(), rev, ws.Put(fmt.Sprint("k", i), "v", rev)))
		}
	}
	want := make([]int64, responses)
	for i := range want {
		want[i] = int64(2 + i)
	}
	rec.await(t, func() bool {
		for _, w := range wts {
			if len(rec.revs[w]) < responses {
				return false
			}
		}
		return true
	}, "every response handled")
	for i, w := range wts {
		require.Equal(t, i, rec.index[w], "the index of its request")
		require.Equal(t, want, rec.revs[w], "watch %d", w.ID())
		require.Equal(t, int64(1+responses), w.Revision())
	}
	rec.check(t)
	require.NoError(t, h.s.Close())
	hd.Wait()
	require.Len(t, rec.ends, watches)
	for _, err := range rec.ends {
		require.ErrorIs(t, err, etcdwatch.ErrClosed)
	}
	rec.check(t)
	queued, running := hd.Load()
	require.Zero(t, queued+running, "Wait returned with work left")
}

// TestHandlerGoroutineLimit: a Handler makes at most WithGoroutines calls
// at once; the other watches wait their turn in its queue, and are served
// once a call returns. With no limit, every watch with something to
// deliver gets a goroutine. Catches: a limit not kept, a queue not served.
func TestHandlerGoroutineLimit(t *testing.T) {
	for _, c := range []struct {
		limit, running int
	}{{2, 2}, {0, 5}} {
		t.Run(fmt.Sprint("limit ", c.limit), func(t *testing.T) {
			h := newHarness(t)
			rec := newRecorder()
			rec.gate = make(chan struct{})
			hd := rec.handler(etcdwatch.WithGoroutines(c.limit))
			wts := h.handled(hd, 5)
			for i, w := range wts {
				h.srv.Send(t, ws.Events(w.ID(), 2, ws.Put(fmt.Sprint("k", i), "v", 2)))
			}
			rec.await(t, func() bool { return rec.running == c.running }, fmt.Sprint(c.running, " calls at once"))
			h.await(func() bool { q, r := hd.Load(); return q == 5-c.running && r == c.running }, "the rest queued")
			close(rec.gate)
			rec.await(t, func() bool { return len(rec.revs) == 5 && rec.running == 0 }, "every watch served")
			rec.check(t)
		})
	}
}

// TestHandlerEndsAfterTheLastCall: a watch the server ends still hands its
// buffered responses to the Handler, then Ended is called once, after the
// last call, with the watch's error, Done closed. Catches: Ended racing a
// call in progress, buffered responses dropped at the end, Ended missing.
func TestHandlerEndsAfterTheLastCall(t *testing.T) {
	h := newHarness(t)
	rec := newRecorder()
	rec.gate = make(chan struct{})
	hd := rec.handler()
	w := h.handled(hd, 1)[0]
	for rev := int64(2); rev <= 4; rev++ {
		h.srv.Send(t, ws.Events(w.ID(), rev, ws.Put("k0", "v", rev)))
	}
	h.srv.Send(t, ws.Compacted(w.ID(), 3))
	rec.await(t, func() bool { return rec.running == 1 }, "the first call")
	h.handledAll()
	close(rec.gate)
	rec.await(t, func() bool { _, ok := rec.ends[w]; return ok }, "Ended")
	require.Equal(t, []int64{2, 3, 4}, rec.revs[w])
	var compacted *etcdwatch.CompactedError
	require.ErrorAs(t, rec.ends[w], &compacted)
	require.Equal(t, w.Err(), rec.ends[w])
	rec.check(t)
}

// TestHandlerCancelFromACall: a call may cancel its own watch: Cancel
// returns (it does not wait for the call it is made from), nothing more is
// handed over, and Ended follows with ErrCanceled. Catches: Cancel waiting
// for the call it is made in (a deadlock), a buffered response handed over
// after Cancel.
func TestHandlerCancelFromACall(t *testing.T) {
	h := newHarness(t)
	rec := newRecorder()
	block := make(chan struct{})
	hd := etcdwatch.NewHandler(func(w *etcdwatch.Watch, i int, r etcdwatch.Response) {
		<-block
		rec.handle(w, i, r)
		w.Cancel()
	}, etcdwatch.WithEnded(rec.ended))
	w := h.handled(hd, 1)[0]
	h.srv.Send(t, ws.Events(w.ID(), 2, ws.Put("k0", "v", 2)))
	h.srv.Send(t, ws.Events(w.ID(), 3, ws.Put("k0", "v", 3)))
	h.handledAll()
	close(block)
	rec.await(t, func() bool { _, ok := rec.ends[w]; return ok }, "Ended")
	require.Equal(t, 1, rec.calls[w], "nothing after Cancel")
	require.ErrorIs(t, rec.ends[w], etcdwatch.ErrCanceled)
	require.Equal(t, w.ID(), h.srv.RecvCancel(t))
	rec.check(t)
}

// TestHandlerSlowCallPausesOnlyItsWatch: while a call for one watch blocks,
// the Handler's other goroutine serves the others; the blocked watch holds
// its buffer limit, is paused on the server, and once its call returns it
// resumes from its next revision and loses nothing. Catches: a slow call
// holding up other watches, a backlog without bound, events lost or
// repeated across the pause.
func TestHandlerSlowCallPausesOnlyItsWatch(t *testing.T) {
	h := newHarness(t, etcdwatch.WithBufferLimit(2))
	gate := make(chan struct{})
	rec := newRecorder()
	hd := etcdwatch.NewHandler(func(w *etcdwatch.Watch, i int, r etcdwatch.Response) {
		if i == 0 && r.Events[0].ModRevision == 2 { // the first watch is slow
			<-gate
		}
		rec.handle(w, i, r)
	}, etcdwatch.WithGoroutines(2))
	wts := h.handled(hd, 2)
	slow, fast := wts[0], wts[1]
	for rev := int64(2); rev <= 6; rev++ {
		h.srv.Send(t, ws.Events(slow.ID(), rev, ws.Put("k0", "v", rev)))
	}
	require.Equal(t, slow.ID(), h.srv.RecvCancel(t), "paused at its limit")
	// One response at a time, each handed over before the next is sent:
	// two queued would reach the buffer limit, and a busy machine that
	// runs the Handler's goroutine late would then have the stream pause
	// that watch too (a stall lasts 2ms with a neighbour).
	for rev := int64(7); rev <= 9; rev++ {
		h.srv.Send(t, ws.Events(fast.ID(), rev, ws.Put("k1", "v", rev)))
		rec.await(t, func() bool { return len(rec.revs[fast]) == int(rev-6) }, "the other watch served meanwhile")
	}
	close(gate)
	c := h.srv.RecvCreate(t)
	require.Equal(t, "k0", string(c.Key))
	require.Greater(t, c.StartRevision, int64(2), "resumed after what it had")
	h.srv.Send(t, ws.Created(c.WatchId, 9))
	rec.await(t, func() bool { return len(rec.revs[slow]) == int(c.StartRevision-2) }, "the slow watch took what it had kept")
	for rev := c.StartRevision; rev <= 6; rev++ {
		h.srv.Send(t, ws.Events(c.WatchId, rev, ws.Put("k0", "v", rev)))
		rec.await(t, func() bool { return len(rec.revs[slow]) == int(rev-1) }, "the slow watch caught up")
	}
	require.Equal(t, []int64{2, 3, 4, 5, 6}, rec.revs[slow], "in order, nothing lost or repeated")
	require.EqualValues(t, 1, h.s.Stats().Pauses)
	rec.check(t)
}

// TestHandleIsAllOrNothing: a refused create fails Handle, and every watch
// it opened ends, Ended telling the Handler of each: the refused one with
// the refusal, the others with ErrCanceled (not another request's
// refusal).
func TestHandleIsAllOrNothing(t *testing.T) {
	h := newHarness(t)
	h.watch(etcdwatch.Key("first"), 1) // an echoed id: the stream is trusted to pipeline
	rec := newRecorder()
	hd := rec.handler()
	t.Cleanup(hd.Wait)
	res := h.handleAsync(context.Background(), hd, keys("a", "deny", "b")...)
	for range 3 {
		c := h.srv.RecvCreate(t)
		if string(c.Key) == "deny" {
			h.srv.Send(t, ws.CreateFailed("rpc error: code = PermissionDenied desc = etcdserver: permission denied"))
			continue
		}
		h.srv.Send(t, ws.Created(c.WatchId, 1))
	}
	got := recvAll(t, res)
	require.ErrorIs(t, got.err, etcdwatch.ErrPermissionDenied)
	require.Nil(t, got.ws)
	rec.await(t, func() bool { return len(rec.ends) == 3 }, "every watch of the call ended")
	rec.mu.Lock()
	for w, err := range rec.ends {
		if string(w.Request().Key) == "deny" {
			require.ErrorIs(t, err, etcdwatch.ErrPermissionDenied)
		} else {
			require.ErrorIs(t, err, etcdwatch.ErrCanceled, "%s", w.Request().Key)
		}
	}
	rec.mu.Unlock()
	rec.check(t)
}

// TestNewHandlerRefusesNil: a nil function, or a nil Handler, is a
// programming error.
func TestNewHandlerRefusesNil(t *testing.T) {
	require.Panics(t, func() { etcdwatch.NewHandler(nil) })
	h := newHarness(t)
	// A literal: built from the sentinel, the expected value would follow
	// any change to it.
	require.PanicsWithValue(t, "etcdwatch: invalid argument: Handle with a nil Handler", func() {
		_, _ = h.s.Handle(context.Background(), nil, etcdwatch.Key("a"))
	})
}

// TestHandlerWaitWhileResponsesCome: Wait may be called while responses
// keep coming. It returns only once the call in progress has returned,
// and a response after that starts the Handler again. Catches: a Wait
// that returns with a call running, and (under -race) a count that rises
// from zero while a Wait is waiting on it, as a sync.WaitGroup's may not.
func TestHandlerWaitWhileResponsesCome(t *testing.T) {
	h := newHarness(t)
	entered, release := make(chan int64), make(chan struct{})
	hd := etcdwatch.NewHandler(func(_ *etcdwatch.Watch, _ int, r etcdwatch.Response) {
		entered <- r.Revision
		<-release
	})
	w := h.handled(hd, 1)[0]
	wait := func() <-chan struct{} {
		waited := make(chan struct{})
		go func() {
			hd.Wait()
			close(waited)
		}()
		return waited
	}
	for rev := int64(2); rev < 50; rev++ {
		early := wait() // racing the response: it may return before the call, or after
		h.srv.Send(t, ws.Events(w.ID(), rev, ws.Put("k0", "v", rev)))
		require.Equal(t, rev, recv(t, entered, "the call"))
		during := wait()
		select {
		case <-during:
			t.Fatalf("Wait returned while the call for revision %d was running", rev)
		default:
		}
		release <- struct{}{}
		recv(t, during, "Wait")
		recv(t, early, "the Wait begun before the response")
		queued, running := hd.Load()
		require.Zero(t, queued+running, "Wait returned with work left")
	}
}

// TestHandlerCancelOfAnIdleWatchEndsItAtOnce: a Handler's watch with no
// call running, nor due, has had its last call: once Cancel returns, Err is
// set and Done closed, as for a channel's watch, even while every goroutine
// of the Handler is busy with another watch's call. Ended follows.
func TestHandlerCancelOfAnIdleWatchEndsItAtOnce(t *testing.T) {
	h := newHarness(t)
	rec := newRecorder()
	rec.gate = make(chan struct{})
	release := sync.OnceFunc(func() { close(rec.gate) })
	hd := rec.handler(etcdwatch.WithGoroutines(1))
	wts := h.handled(hd, 12)
	t.Cleanup(release) // before handled's Wait, should the test fail
	busy, idle := wts[0], wts[1:]
	h.srv.Send(t, ws.Events(busy.ID(), 2, ws.Put("k0", "v", 2)))
	rec.await(t, func() bool { return rec.running == 1 }, "the busy watch's call")
	for _, w := range idle {
		w.Cancel()
		require.ErrorIs(t, w.Err(), etcdwatch.ErrCanceled, "Err once Cancel returned")
		select {
		case <-w.Done():
		default:
			t.Fatal("Done not closed once Cancel returned")
		}
	}
	release()
	rec.await(t, func() bool { return len(rec.ends) == len(idle) }, "Ended for each canceled watch")
	for _, w := range idle {
		require.ErrorIs(t, rec.ends[w], etcdwatch.ErrCanceled)
	}
	require.Empty(t, rec.broken)
}

// TestHandlerCancelOfAQueuedWatchEndsItAtOnce: a watch with a response
// due, queued while the Handler's one goroutine is held in another
// watch's call, is canceled: the response is dropped, no call runs for it
// nor can follow, so Err and Done say it ended once Cancel returns, as
// for an idle watch. They waited for a goroutine to get to it, for good
// if the call in progress never returned.
func TestHandlerCancelOfAQueuedWatchEndsItAtOnce(t *testing.T) {
	h := newHarness(t)
	rec := newRecorder()
	rec.gate = make(chan struct{})
	release := sync.OnceFunc(func() { close(rec.gate) })
	hd := rec.handler(etcdwatch.WithGoroutines(1))
	wts := h.handled(hd, 2)
	t.Cleanup(release) // before handled's Wait, should the test fail
	busy, queued := wts[0], wts[1]
	h.srv.Send(t, ws.Events(busy.ID(), 2, ws.Put("k0", "v", 2)))
	rec.await(t, func() bool { return rec.running == 1 }, "the busy watch's call")
	h.srv.Send(t, ws.Events(queued.ID(), 3, ws.Put("k1", "v", 3)))
	h.await(func() bool { q, _ := hd.Load(); return q == 1 }, "the other watch queued")
	queued.Cancel()
	require.ErrorIs(t, queued.Err(), etcdwatch.ErrCanceled, "Err once Cancel returned")
	select {
	case <-queued.Done():
	default:
		t.Fatal("Done not closed once Cancel returned")
	}
	release()
	rec.await(t, func() bool { _, ok := rec.ends[queued]; return ok }, "Ended")
	require.ErrorIs(t, rec.ends[queued], etcdwatch.ErrCanceled)
	require.Zero(t, rec.calls[queued], "a call after Cancel")
	require.Empty(t, rec.broken)
}

// TestHandlerWaitAfterAnEndWaitsForEnded: once Err says a watch ended,
// its Ended call is due, so a Handler.Wait then returns only after it.
// Wait could return first: Err was set before the call was scheduled.
// The window is narrow: a spinning reader met it in 2,638 of 3,000 rounds
// under -race, as make test runs.
func TestHandlerWaitAfterAnEndWaitsForEnded(t *testing.T) {
	h := newHarness(t)
	rec := newRecorder()
	hd := rec.handler(etcdwatch.WithGoroutines(0))
	wts := h.handled(hd, 3000)
	missed := 0
	for _, w := range wts {
		go w.Cancel()
		for w.Err() == nil { // spins: parked on Done, this goroutine would wake too late to meet the window
		}
		hd.Wait()
		rec.mu.Lock()
		_, told := rec.ends[w]
		rec.mu.Unlock()
		if !told {
			missed++
		}
	}
	require.Zero(t, missed, "Wait returned before Ended, of %d watches", len(wts))
}

// TestHandlerHandsNothingOverAfterClose: once Close begins, a Handler
// hands over no more responses, as a channel's pump gives no more: here
// those of a watch the server ended with responses still waiting for the
// call in progress. That call returns, and Ended follows, with the
// server's error.
func TestHandlerHandsNothingOverAfterClose(t *testing.T) {
	h := newHarness(t)
	rec := newRecorder()
	rec.gate = make(chan struct{})
	release := sync.OnceFunc(func() { close(rec.gate) })
	hd := rec.handler()
	w := h.handled(hd, 1)[0]
	t.Cleanup(release) // before handled's Wait, should the test fail
	for rev := int64(2); rev <= 4; rev++ {
		h.srv.Send(t, ws.Events(w.ID(), rev, ws.Put("k0", "v", rev)))
		if rev == 2 {
			rec.await(t, func() bool { return rec.running == 1 }, "the first call")
		}
	}
	h.srv.Send(t, ws.Canceled(w.ID())) // the server ends the watch; two responses wait
	h.await(func() bool { return h.s.Stats().Watches == 0 }, "the server's end taken")
	require.NoError(t, h.s.Close())
	release()
	hd.Wait()
	rec.mu.Lock()
	defer rec.mu.Unlock()
	require.Equal(t, 1, rec.calls[w], "a call after Close began")
	var se *etcdwatch.ServerError
	require.ErrorAs(t, rec.ends[w], &se, "Ended with the server's end")
	require.Empty(t, rec.broken)
}

// TestHandlerBeginsNoCallAfterClose: a goroutine that found Close not begun
// and then weighed a long response (O(events)) before its call began that
// call after Close had returned; it now weighs first, so that nothing but
// a Store lies between its look at Close and the call. Not deterministic
// (no hook can stop a goroutine between the two): before the fix it failed
// about 6 runs in 10.
func TestHandlerBeginsNoCallAfterClose(t *testing.T) {
	server := ws.Start(t)
	obs := etcdwatch.NewObserver()
	s, err := etcdwatch.Open(server.Dial(t), etcdwatch.WithObserver(obs), etcdwatch.WithProgressRetry(time.Hour, time.Hour),
		etcdwatch.WithBufferLimit(1<<30), etcdwatch.WithBufferBytes(math.MaxInt))
	require.NoError(t, err)
	srv := server.Accept(t)
	var closed, late atomic.Bool
	hd := etcdwatch.NewHandler(func(*etcdwatch.Watch, int, etcdwatch.Response) {
		if closed.Load() {
			late.Store(true)
		}
	})
	res := make(chan []*etcdwatch.Watch, 1)
	go func() {
		got, _ := s.Handle(context.Background(), hd, etcdwatch.Key("k"))
		res <- got
	}()
	c := srv.RecvCreate(t)
	srv.Send(t, ws.Created(c.WatchId, 1))
	w := (<-res)[0]
	require.NotNil(t, w)
	evs := make([]*mvccpb.Event, 300_000)
	for i := range evs {
		evs[i] = ws.Put("k", "", 2)
	}
	before := obs.Count(etcdwatch.HookResponse)
	srv.Send(t, ws.Events(w.ID(), 2, evs...))
	obs.Await(t, wait, func() bool { return obs.Count(etcdwatch.HookResponse) > before })
	require.NoError(t, s.Close())
	closed.Store(true)
	hd.Wait()
	require.False(t, late.Load(), "the Handler's function was called for a response after Close had returned")
}

// TestHandlerWithNegativeGoroutinesHasNoLimit: WithGoroutines(n) with
// n < 0, as with 0, sets no limit. Catches: a negative limit kept as it
// is, which no count of goroutines is below: no call is ever made.
func TestHandlerWithNegativeGoroutinesHasNoLimit(t *testing.T) {
	h := newHarness(t)
	rec := newRecorder()
	rec.gate = make(chan struct{})
	hd := rec.handler(etcdwatch.WithGoroutines(-1))
	wts := h.handled(hd, 3)
	for i, w := range wts {
		h.srv.Send(t, ws.Events(w.ID(), 2, ws.Put(fmt.Sprint("k", i), "v", 2)))
	}
	rec.await(t, func() bool { return rec.running == len(wts) }, "a call for each watch at once")
	close(rec.gate)
	rec.await(t, func() bool { return len(rec.revs) == len(wts) && rec.running == 0 }, "every watch served")
	for _, w := range wts {
		require.Equal(t, []int64{2}, rec.revs[w])
	}
	rec.check(t)
}

// TestHandlerResumesAPausedWatchWhereverItCatchesUp: a Handler's
// goroutine hands a watch 16 responses (a turn), accounting for each as
// it takes the next, and for the turn's last as it lets the watch go for
// the others' turn. A paused watch whose backlog falls to half its limit
// is resumed, whichever account takes it there. Catches: an account that
// finds the watch caught up not asking for the resume: the watch, no
// longer behind, was never resumed, and received nothing more.
func TestHandlerResumesAPausedWatchWhereverItCatchesUp(t *testing.T) {
	const (
		turn = 16 // handlerTurn
		per  = 40 // events a response: responses are not joined
	)
	for _, c := range []struct {
		name      string
		responses int // at the limit: half of them taken is half the limit
	}{
		{"within a turn", turn / 2},
		{"at the end of a turn", 2 * turn},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, etcdwatch.WithBufferLimit(c.responses*per), etcdwatch.WithStallBudget(0))
			rec := newRecorder()
			rec.gate = make(chan struct{})
			release := sync.OnceFunc(func() { close(rec.gate) })
			hd := rec.handler(etcdwatch.WithGoroutines(1))
			w := h.handled(hd, 1)[0]
			t.Cleanup(release) // before handled's Wait, should the test fail
			id := w.ID()
			last := int64(1 + c.responses)
			for rev := int64(2); rev <= last; rev++ {
				h.srv.Send(t, wideEvents(id, rev, per))
			}
			require.Equal(t, id, h.srv.RecvCancel(t), "not paused at its limit")
			h.srv.Send(t, ws.Canceled(id))
			h.handledAll()
			require.Zero(t, h.s.Stats().Resumes)
			release() // the first call, held until now, returns; the rest follow

			cr := h.srv.RecvCreate(t)
			require.Equal(t, "k0", string(cr.Key))
			require.Equal(t, last, cr.StartRevision, "resumed from the revision it had reached")
			h.srv.Send(t, ws.Created(cr.WatchId, last))
			h.srv.Send(t, ws.Events(cr.WatchId, last+1, ws.Put("k0", "v", last+1)))
			rec.await(t, func() bool { return len(rec.revs[w]) == c.responses*per+1 }, "everything handed over after the resume")
			want := []int64{}
			for rev := int64(2); rev <= last; rev++ {
				for range per {
					want = append(want, rev)
				}
			}
			require.Equal(t, append(want, last+1), rec.revs[w])
			require.Equal(t, uint64(1), h.s.Stats().Resumes)
			rec.check(t)
		})
	}
}

// TestHandlerGoroutineTakesTurns: a Handler goroutine serving a watch with
// a long backlog lets a watch queued behind it have a turn before the
// backlog is through. Catches: one watch's backlog holding the Handler's
// only goroutine, and every other watch of the Handler, until it is
// through.
func TestHandlerGoroutineTakesTurns(t *testing.T) {
	const responses, per = 64, 40 // more than a turn (16); not joined
	h := newHarness(t, etcdwatch.WithBufferLimit(2*responses*per))
	rec := newRecorder()
	gate := make(chan struct{})
	firstCalls := make(chan int, 1) // the long watch's calls when the other watch's first call came
	longCalled := make(chan struct{})
	var long *etcdwatch.Watch
	hd := etcdwatch.NewHandler(func(w *etcdwatch.Watch, i int, r etcdwatch.Response) {
		if i == 0 && r.Revision == 2 {
			close(longCalled)
			<-gate
		}
		if i == 1 {
			rec.mu.Lock()
			n := rec.calls[long]
			rec.mu.Unlock()
			select {
			case firstCalls <- n:
			default:
			}
		}
		rec.handle(w, i, r)
	}, etcdwatch.WithGoroutines(1), etcdwatch.WithEnded(rec.ended))
	wts := h.handled(hd, 2)
	long = wts[0]
	for rev := int64(2); rev < 2+responses; rev++ {
		h.srv.Send(t, wideEvents(long.ID(), rev, per))
	}
	recv(t, longCalled, "the long watch's first call")
	h.srv.Send(t, ws.Events(wts[1].ID(), 2, ws.Put("k1", "v", 2)))
	h.handledAll()
	q, r := hd.Load()
	require.Equal(t, [2]int{1, 1}, [2]int{q, r}, "the other watch queued behind the long one")
	close(gate)
	n := recv(t, firstCalls, "the other watch's call")
	require.Less(t, n, responses, "the other watch waited for the whole backlog")
	rec.await(t, func() bool { return rec.calls[long] == responses && rec.calls[wts[1]] == 1 }, "every response handled")
	require.Zero(t, h.s.Stats().Pauses)
	rec.check(t)
}

// TestHandlerCancelDuringACallEndsItAfterTheCall: a Handler's watch
// canceled (from another goroutine) while a call for it runs, nothing
// else due, has its last call still running: Done closes and Err is set
// once that call returns, not before, and Ended follows. Catches: the
// running call not counted, Done closed and Err set while the call
// still runs (an application freeing, at Done, what the call uses).
func TestHandlerCancelDuringACallEndsItAfterTheCall(t *testing.T) {
	h := newHarness(t)
	rec := newRecorder()
	rec.gate = make(chan struct{})
	release := sync.OnceFunc(func() { close(rec.gate) })
	hd := rec.handler()
	w := h.handled(hd, 1)[0]
	t.Cleanup(release) // before handled's Wait, should the test fail
	h.srv.Send(t, ws.Events(w.ID(), 2, ws.Put("k0", "v", 2)))
	rec.await(t, func() bool { return rec.running == 1 }, "the call")
	w.Cancel()
	select {
	case <-w.Done():
		t.Fatal("Done closed while the watch's call still runs")
	default:
	}
	require.NoError(t, w.Err(), "Err set while the watch's call still runs")
	release()
	rec.await(t, func() bool { _, ok := rec.ends[w]; return ok }, "Ended")
	require.ErrorIs(t, rec.ends[w], etcdwatch.ErrCanceled)
	require.ErrorIs(t, w.Err(), etcdwatch.ErrCanceled)
	require.Equal(t, 1, rec.calls[w])
	rec.check(t)
}

// TestHandlerWatchEndedByTheServerIsDoneAfterItsBacklog: a Handler's watch
// the server ends (here with a compaction) while responses wait for it,
// queued behind another watch's call, is done only once they are handed
// over: no call finds Done closed or Err set. Catches: the waiting
// responses not counted, Done closed and Err set at once, calls made
// after.
func TestHandlerWatchEndedByTheServerIsDoneAfterItsBacklog(t *testing.T) {
	h := newHarness(t)
	rec := newRecorder()
	gate := make(chan struct{})
	release := sync.OnceFunc(func() { close(gate) })
	var lateCalls atomic.Int64 // calls that found their watch Done
	busyCalled := make(chan struct{})
	hd := etcdwatch.NewHandler(func(w *etcdwatch.Watch, i int, r etcdwatch.Response) {
		if i == 0 { // once: the busy watch has one response
			close(busyCalled)
			<-gate
		}
		select {
		case <-w.Done():
			lateCalls.Add(1)
		default:
		}
		rec.handle(w, i, r)
	}, etcdwatch.WithGoroutines(1), etcdwatch.WithEnded(rec.ended))
	wts := h.handled(hd, 2)
	t.Cleanup(release) // before handled's Wait, should the test fail
	busy, ending := wts[0], wts[1]
	h.srv.Send(t, ws.Events(busy.ID(), 2, ws.Put("k0", "v", 2)))
	recv(t, busyCalled, "the busy watch's call")
	h.srv.Send(t, ws.Events(ending.ID(), 3, ws.Put("k1", "v", 3)))
	h.srv.Send(t, ws.Events(ending.ID(), 4, ws.Put("k1", "v", 4)))
	h.srv.Send(t, ws.Compacted(ending.ID(), 4))
	h.handledAll()
	q, _ := hd.Load()
	require.Equal(t, 1, q, "the ending watch queued")
	select {
	case <-ending.Done():
		t.Fatal("Done closed with responses still to hand over")
	default:
	}
	require.NoError(t, ending.Err(), "Err set with responses still to hand over")
	release()
	rec.await(t, func() bool { _, ok := rec.ends[ending]; return ok }, "Ended")
	require.Equal(t, []int64{3, 4}, rec.revs[ending])
	require.Zero(t, lateCalls.Load(), "a call found its watch Done")
	var compacted *etcdwatch.CompactedError
	require.ErrorAs(t, rec.ends[ending], &compacted)
	rec.check(t)
}

// TestHandlerCancelOfAWatchQueuedAfterItsTurnEndsItAtOnce: a watch that
// had its turn (16 responses) and was queued again behind another watch,
// whose call now holds the Handler's only goroutine, has no call running:
// once Cancel returns, Done is closed and Err set, as for any queued watch
// (TestHandlerCancelOfAQueuedWatchEndsItAtOnce); the goroutine that
// comes back to it then only tells Ended. Catches: the end of a turn
// leaving the watch counted as in a call, Done then waiting for the
// goroutine to come back to it (for good if the other call never
// returns); and that goroutine closing Done a second time (a panic).
func TestHandlerCancelOfAWatchQueuedAfterItsTurnEndsItAtOnce(t *testing.T) {
	const turn = 16 // handlerTurn
	h := newHarness(t)
	rec := newRecorder()
	longGate, otherGate := make(chan struct{}), make(chan struct{})
	releaseLong, releaseOther := sync.OnceFunc(func() { close(longGate) }), sync.OnceFunc(func() { close(otherGate) })
	longCalled, otherCalled := make(chan struct{}), make(chan struct{})
	hd := etcdwatch.NewHandler(func(w *etcdwatch.Watch, i int, r etcdwatch.Response) {
		switch {
		case i == 0 && r.Revision == 2:
			close(longCalled)
			<-longGate
		case i == 1:
			close(otherCalled) // once: the other watch has one response
			<-otherGate
		}
		rec.handle(w, i, r)
	}, etcdwatch.WithGoroutines(1), etcdwatch.WithEnded(rec.ended))
	wts := h.handled(hd, 2)
	t.Cleanup(func() { releaseLong(); releaseOther() }) // before handled's Wait, should the test fail
	long, other := wts[0], wts[1]
	for rev := int64(2); rev < 2+turn+2; rev++ { // more than a turn
		h.srv.Send(t, wideEvents(long.ID(), rev, 40))
	}
	recv(t, longCalled, "the long watch's first call")
	h.srv.Send(t, ws.Events(other.ID(), 2, ws.Put("k1", "v", 2)))
	h.handledAll()
	q, r := hd.Load()
	require.Equal(t, [2]int{1, 1}, [2]int{q, r}, "the other watch queued behind the long one")
	releaseLong()
	// The goroutine calls for the other watch once the long one has had
	// its turn and is queued again.
	recv(t, otherCalled, "the other watch's call")
	rec.await(t, func() bool { return rec.calls[long] == turn && rec.running == 0 }, "the long watch's turn")
	q, _ = hd.Load()
	require.Equal(t, 1, q, "the long watch queued again, behind the other's call")
	done := long.Done() // taken before the end, as a waiter would
	long.Cancel()
	require.ErrorIs(t, long.Err(), etcdwatch.ErrCanceled, "Err once Cancel returned")
	select {
	case <-done:
	default:
		t.Fatal("Done not closed once Cancel returned")
	}
	releaseOther()
	rec.await(t, func() bool { _, ok := rec.ends[long]; return ok }, "Ended")
	require.Equal(t, turn, rec.calls[long], "a call after Cancel")
	rec.check(t)
}

// TestHandlerWaitCoversAWatchQueuedAgainAfterItsTurn: a watch with more
// than a turn (16 responses) to hand over is queued again at the end of
// its turn, without the Handler ever having nothing to do: a Wait under
// way returns only once its whole backlog is handed over. Catches: the
// watch queued again by another goroutine, after the one that served it
// found the queue empty and told Wait the Handler was idle.
func TestHandlerWaitCoversAWatchQueuedAgainAfterItsTurn(t *testing.T) {
	const responses = 40 // more than two turns; not joined
	h := newHarness(t, etcdwatch.WithBufferLimit(2*responses*40))
	rec := newRecorder()
	rec.gate = make(chan struct{})
	release := sync.OnceFunc(func() { close(rec.gate) })
	hd := rec.handler(etcdwatch.WithGoroutines(1))
	w := h.handled(hd, 1)[0]
	t.Cleanup(release) // before handled's Wait, should the test fail
	for rev := int64(2); rev < 2+responses; rev++ {
		h.srv.Send(t, wideEvents(w.ID(), rev, 40))
	}
	h.handledAll()
	waited := make(chan struct{})
	go func() { // returns once the Handler is idle
		hd.Wait()
		close(waited)
	}()
	release()
	recv(t, waited, "Wait")
	rec.mu.Lock()
	calls := rec.calls[w]
	rec.mu.Unlock()
	require.Equal(t, responses, calls, "Wait returned with responses still to hand over")
	queued, running := hd.Load()
	require.Zero(t, queued+running, "Wait returned with work left")
	rec.check(t)
}

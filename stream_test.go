package etcdwatch_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/etcdwatch/etcdwatch"
	"github.com/etcdwatch/etcdwatch/internal/clock"
	ws "github.com/etcdwatch/etcdwatch/internal/watchserver"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// wait bounds every wait of these tests; nothing is timed.
const wait = ws.Timeout

// harness is a Stream on a scripted server, and the server's side of the
// Stream's current Watch stream.
type harness struct {
	t      *testing.T
	s      *etcdwatch.Stream
	obs    *etcdwatch.Observer
	server *ws.Server
	srv    *ws.Stream
}

func newHarness(t *testing.T, opts ...etcdwatch.Option) *harness {
	t.Helper()
	server := ws.Start(t)
	obs := etcdwatch.NewObserver()
	// A progress request is asked again only where a test says so: the
	// scripted server answers when the test does, and a request asked
	// again meanwhile (after 10ms) would stand among the ones it expects.
	defaults := []etcdwatch.Option{etcdwatch.WithObserver(obs), etcdwatch.WithProgressRetry(time.Hour, time.Hour)}
	s, err := etcdwatch.Open(server.Dial(t), append(defaults, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, s.Close()) })
	return &harness{t: t, s: s, obs: obs, server: server, srv: server.Accept(t)}
}

// await waits until cond holds, checking it after each thing the Stream's
// goroutines do (a response or command handled, a response taken); it
// fails the test if cond does not hold within wait.
func (h *harness) await(cond func() bool, msgAndArgs ...any) {
	h.t.Helper()
	h.obs.Await(h.t, wait, cond, msgAndArgs...)
}

// handledAll waits until the dispatcher has handled every response the
// server sent on the current stream, which was the first.
func (h *harness) handledAll() {
	h.t.Helper()
	h.await(func() bool { return int64(h.obs.Count(etcdwatch.HookResponse)) == h.srv.Sent() })
}

// cut ends the current stream with a retryable error and takes the one the
// Stream opens to replace it.
func (h *harness) cut() {
	h.srv.Close(status.Error(codes.Unavailable, "member going away"))
	h.srv = h.server.Accept(h.t)
}

type watchResult struct {
	w   *etcdwatch.Watch
	err error
}

// watchAsync calls Watch in a goroutine; the result arrives on the channel.
func (h *harness) watchAsync(ctx context.Context, r etcdwatch.Request) <-chan watchResult {
	return watchAsync(ctx, h.s, r)
}

// watchAsync calls s.Watch in a goroutine, which ends when the call
// returns; the result arrives on the channel.
func watchAsync(ctx context.Context, s *etcdwatch.Stream, r etcdwatch.Request) <-chan watchResult {
	ch := make(chan watchResult, 1)
	go func() {
		w, err := s.Watch(ctx, r)
		ch <- watchResult{w, err}
	}()
	return ch
}

// watch opens a watch, confirming its create at header revision rev.
func (h *harness) watch(r etcdwatch.Request, rev int64) *etcdwatch.Watch {
	h.t.Helper()
	res := h.watchAsync(context.Background(), r)
	c := h.srv.RecvCreate(h.t)
	h.srv.Send(h.t, ws.Created(c.WatchId, rev))
	got := recvResult(h.t, res)
	require.NoError(h.t, got.err)
	require.Equal(h.t, c.WatchId, got.w.ID())
	return got.w
}

// progressResult is what a RequestProgress call returned.
type progressResult struct {
	rev int64
	err error
}

// progressAsync calls RequestProgress in a goroutine; the result arrives on
// the channel.
func (h *harness) progressAsync() <-chan progressResult {
	ch := make(chan progressResult, 1)
	go func() {
		rev, err := h.s.RequestProgress(context.Background())
		ch <- progressResult{rev, err}
	}()
	return ch
}

// recvProgress waits for the result of a progressAsync call.
func recvProgress(t *testing.T, ch <-chan progressResult) progressResult {
	t.Helper()
	return recv(t, ch, "RequestProgress")
}

// awaitArmed waits until the Stream has armed a timer on clk to fire d from
// now, so that a test steps past a deadline only once it is set.
func awaitArmed(t *testing.T, clk *clock.Fake, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	require.True(t, clk.AwaitArmed(ctx, d), "no timer armed for %v; armed: %v", d, clk.Armed())
}

// recv waits for the result of a call made in the background; call names
// the call in the failure.
func recv[T any](t *testing.T, ch <-chan T, call string) T {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(wait):
		t.Fatalf("%s did not return", call)
		var zero T
		return zero
	}
}

// barrier returns every request the client sent before a RequestProgress
// issued now, answering it: the dispatcher handles commands in order, so the
// requests it wrote before the progress request are all it had to write.
func (h *harness) barrier(rev int64) []*pb.WatchRequest {
	h.t.Helper()
	ctx, cancel := context.WithCancel(h.t.Context())
	got := make(chan error, 1)
	go func() { // returns once canceled below, if not answered before
		_, err := h.s.RequestProgress(ctx)
		got <- err
	}()
	var before []*pb.WatchRequest
	for {
		req := h.srv.Recv(h.t)
		if req.GetProgressRequest() != nil {
			break
		}
		before = append(before, req)
	}
	// The call's request marks the place; the call itself may wait for
	// creates the test has not answered yet, so it is let go before the
	// answer, which then bookmarks the watches and asks nothing again.
	cancel()
	<-got
	h.srv.Send(h.t, ws.Progress(-1, rev))
	return before
}

func recvResult(t *testing.T, ch <-chan watchResult) watchResult {
	t.Helper()
	return recv(t, ch, "Watch")
}

// next returns the watch's next response.
func next(t *testing.T, w *etcdwatch.Watch) etcdwatch.Response {
	t.Helper()
	select {
	case r, ok := <-w.Responses():
		require.True(t, ok, "watch ended: %v", w.Err())
		return r
	case <-time.After(wait):
		t.Fatalf("no response for watch %d", w.ID())
		return etcdwatch.Response{}
	}
}

// ended waits for the watch to end and returns its error.
func ended(t *testing.T, w *etcdwatch.Watch) error {
	t.Helper()
	for {
		select {
		case _, ok := <-w.Responses():
			if !ok {
				return w.Err()
			}
		case <-time.After(wait):
			t.Fatalf("watch %d did not end", w.ID())
			return nil
		}
	}
}

// TestEventsOfBusyWatchInterleaveWithCreates is the reported bug: events of a
// busy watch arrive between creates and their created responses. Every one
// of 300 new watches must get its own created response and its own events.
func TestEventsOfBusyWatchInterleaveWithCreates(t *testing.T) {
	h := newHarness(t)
	busy := h.watch(etcdwatch.Prefix("busy/"), 1)
	const n = 300
	results := make([]<-chan watchResult, n)
	for i := range results {
		results[i] = h.watchAsync(context.Background(), etcdwatch.Key(fmt.Sprintf("k%03d", i)))
	}
	rev := int64(1)
	busyEvent := func() {
		rev++
		h.srv.Send(t, ws.Events(busy.ID(), rev, ws.Put("busy/x", fmt.Sprint(rev), rev)))
	}
	keyOf := map[int64]string{}
	var creates []*pb.WatchCreateRequest
	for range n {
		c := h.srv.RecvCreate(t)
		creates = append(creates, c)
		keyOf[c.WatchId] = string(c.Key)
		busyEvent() // an event of another watch before this create is answered
	}
	for _, c := range creates {
		busyEvent()
		h.srv.Send(t, ws.Created(c.WatchId, rev))
		busyEvent()
		rev++
		h.srv.Send(t, ws.Events(c.WatchId, rev, ws.Put(string(c.Key), "own", rev)))
	}
	for want := int64(2); want <= rev; {
		r := next(t, busy)
		for _, e := range r.Events {
			require.Equal(t, "busy/x", string(e.Key))
			require.Equal(t, fmt.Sprint(e.ModRevision), string(e.Value))
			require.GreaterOrEqual(t, e.ModRevision, want, "busy watch got revision twice or out of order")
			want = e.ModRevision + 1
		}
		if len(creates) > 0 && r.Revision >= rev-2 {
			break // the last busy event precedes the last watch's own event
		}
	}
	for i, res := range results {
		got := recvResult(t, res)
		require.NoError(t, got.err)
		require.Equal(t, fmt.Sprintf("k%03d", i), keyOf[got.w.ID()], "watch got another watch's id")
		r := next(t, got.w)
		require.Len(t, r.Events, 1)
		require.Equal(t, keyOf[got.w.ID()], string(r.Events[0].Key))
		require.Equal(t, "own", string(r.Events[0].Value))
	}
	require.Equal(t, int64(n+1), h.s.Stats().Watches)
}

// TestFailedCreatesAreMatchedByOrder: refused creates carry id -1 and are
// told apart only by their place among the answers.
func TestFailedCreatesAreMatchedByOrder(t *testing.T) {
	h := newHarness(t)
	h.watch(etcdwatch.Key("first"), 1) // from here on the stream is trusted to pipeline
	keys := []string{"ok1", "deny", "ok2", "dup", "ok3", "empty"}
	results := map[string]<-chan watchResult{}
	for _, k := range keys {
		results[k] = h.watchAsync(context.Background(), etcdwatch.Key(k))
	}
	reasons := map[string]string{
		"deny":  "rpc error: code = PermissionDenied desc = etcdserver: permission denied",
		"dup":   "mvcc: duplicate watch ID provided on the WatchStream",
		"empty": "mvcc: watcher range is empty",
	}
	var creates []*pb.WatchCreateRequest
	for range keys {
		creates = append(creates, h.srv.RecvCreate(t))
	}
	for i, c := range creates {
		if reason, fail := reasons[string(c.Key)]; fail {
			h.srv.Send(t, ws.CreateFailed(reason))
			continue
		}
		h.srv.Send(t, ws.Created(c.WatchId, 10))
		h.srv.Send(t, ws.Events(c.WatchId, 11+int64(i), ws.Put(string(c.Key), "v", 11+int64(i))))
	}
	wantKind := map[string]error{
		"deny": etcdwatch.ErrPermissionDenied, "dup": etcdwatch.ErrInvalidRequest, "empty": etcdwatch.ErrInvalidRequest,
	}
	for _, k := range keys {
		got := recvResult(t, results[k])
		if kind, fail := wantKind[k]; fail {
			require.ErrorIs(t, got.err, kind, k)
			var se *etcdwatch.ServerError
			require.ErrorAs(t, got.err, &se)
			require.Equal(t, reasons[k], se.Reason)
			continue
		}
		require.NoError(t, got.err, k)
		require.Equal(t, k, string(next(t, got.w).Events[0].Key))
	}
	require.Equal(t, int64(4), h.s.Stats().Watches)
}

// TestCreatesArePipelinedFromTheStart: a new stream gets its creates at once,
// without waiting for the first answer.
func TestCreatesArePipelinedFromTheStart(t *testing.T) {
	h := newHarness(t)
	results := []<-chan watchResult{h.watchAsync(context.Background(), etcdwatch.Key("a")), h.watchAsync(context.Background(), etcdwatch.Key("b"))}
	first, second := h.srv.RecvCreate(t), h.srv.RecvCreate(t) // both before any answer
	h.srv.Send(t, ws.Created(first.WatchId, 1))
	h.srv.Send(t, ws.Created(second.WatchId, 1))
	for _, res := range results {
		require.NoError(t, recvResult(t, res).err)
	}
	require.Zero(t, h.s.Stats().Reconnects)
}

// TestPipelinedCreatesMeetAProxy: etcd's gRPC proxy picks its own ids and may
// answer pipelined creates out of order. An answer that does not echo the
// oldest create's id, before any echo, makes the client give the stream up
// without matching anything; the next stream gets one create at a time, and
// each watch ends up with its own answer.
func TestPipelinedCreatesMeetAProxy(t *testing.T) {
	h := newHarness(t)
	a := h.watchAsync(context.Background(), etcdwatch.Key("a"))
	b := h.watchAsync(context.Background(), etcdwatch.Key("b"))
	h.srv.RecvCreate(t)
	h.srv.RecvCreate(t)
	h.srv.Send(t, ws.Created(0, 1)) // the proxy's own id, for either create
	require.True(t, h.srv.Ended(t), "the stream was kept")
	h.srv = h.server.Accept(t)
	h.progressAsync() // answered below, to end it
	first := h.srv.RecvCreate(t)
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest(), "a second create went out before the first was answered")
	h.srv.Send(t, ws.Created(0, 1))
	second := h.srv.RecvCreate(t)
	h.srv.Send(t, ws.Created(1, 1))
	keyOf := map[int64]string{0: string(first.Key), 1: string(second.Key)}
	for key, res := range map[string]<-chan watchResult{"a": a, "b": b} {
		got := recvResult(t, res)
		require.NoError(t, got.err)
		require.Equal(t, key, keyOf[got.w.ID()])
	}
	h.srv.Send(t, ws.Progress(-1, 1))
	require.True(t, h.s.Stats().IDsRewritten)
}

// TestEarlyRefusalOfPipelinedCreates: a refusal carries no id, so one that
// comes before the stream has echoed an id, with other creates in flight,
// cannot be matched: the stream is given up, and the next one gets one
// create at a time until it echoes an id, then pipelines again.
func TestEarlyRefusalOfPipelinedCreates(t *testing.T) {
	h := newHarness(t, etcdwatch.WithClock(clock.NewFake())) // the progress request below is not asked again
	denied := h.watchAsync(context.Background(), etcdwatch.Key("deny"))
	c := h.srv.RecvCreate(t)
	require.Equal(t, "deny", string(c.Key))
	ok := h.watchAsync(context.Background(), etcdwatch.Key("ok"))
	require.Equal(t, "ok", string(h.srv.RecvCreate(t).Key))
	const reason = "rpc error: code = PermissionDenied desc = etcdserver: permission denied"
	h.srv.Send(t, ws.CreateFailed(reason))
	require.True(t, h.srv.Ended(t), "the stream was kept")

	h.srv = h.server.Accept(t)
	h.progressAsync() // answered below, to end it
	first := h.srv.RecvCreate(t)
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest(), "a second create went out before the first was answered")
	if string(first.Key) == "deny" {
		h.srv.Send(t, ws.CreateFailed(reason))
		c = h.srv.RecvCreate(t)
		h.srv.Send(t, ws.Created(c.WatchId, 1))
	} else {
		h.srv.Send(t, ws.Created(first.WatchId, 1))
		h.srv.Send(t, ws.CreateFailed(reason)) // answering the next create, now pipelined
		h.srv.RecvCreate(t)
	}
	require.ErrorIs(t, recvResult(t, denied).err, etcdwatch.ErrPermissionDenied)
	require.NoError(t, recvResult(t, ok).err)
	h.srv.Send(t, ws.Progress(-1, 1)) // ends the call, even where ok's create went out after the request: ok is from now

	// Trusted again: creates are pipelined.
	x := h.watchAsync(context.Background(), etcdwatch.Key("x"))
	y := h.watchAsync(context.Background(), etcdwatch.Key("y"))
	cx, cy := h.srv.RecvCreate(t), h.srv.RecvCreate(t)
	h.srv.Send(t, ws.Created(cx.WatchId, 1))
	h.srv.Send(t, ws.Created(cy.WatchId, 1))
	require.NoError(t, recvResult(t, x).err)
	require.NoError(t, recvResult(t, y).err)
	require.Equal(t, uint64(1), h.s.Stats().Reconnects)
}

// TestRequestProgressIgnoresOldAnswers: an answer below what the stream had
// already seen when the call began is an answer to an older request, or
// from a member behind the others: the call waits on, and the request is
// asked again after the retry delay, not at once, which a lagging member
// would answer at round-trip speed for as long as it lags.
func TestRequestProgressIgnoresOldAnswers(t *testing.T) {
	clk := clock.NewFake()
	h := newHarness(t, etcdwatch.WithClock(clk), etcdwatch.WithProgressRetry(10*time.Millisecond, 250*time.Millisecond))
	w := h.watch(etcdwatch.Key("a"), 1)
	h.srv.Send(t, ws.Events(w.ID(), 50, ws.Put("a", "v", 50)))
	next(t, w)
	got := h.progressAsync()
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest())
	h.srv.Send(t, ws.Progress(-1, 40)) // too old for the call
	h.handledAll()
	// The next request is a create made now, not the progress request
	// asked again.
	x := h.watchAsync(context.Background(), etcdwatch.Key("x"))
	c := h.srv.RecvCreate(t)
	h.srv.Send(t, ws.Created(c.WatchId, 50))
	require.NoError(t, recvResult(t, x).err)
	awaitArmed(t, clk, 20*time.Millisecond) // the series goes on: 10ms, then 20
	clk.Advance(20 * time.Millisecond)
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest(), "not asked again after a stale answer")
	h.srv.Send(t, ws.Progress(-1, 60))
	r := recvProgress(t, got)
	require.NoError(t, r.err)
	require.Equal(t, int64(60), r.rev)
}

// TestRequestProgressWhenLastWatchGoes: etcd never answers a stream without
// watches, so a waiting call must not wait for ever.
func TestRequestProgressWhenLastWatchGoes(t *testing.T) {
	clk := clock.NewFake()
	h := newHarness(t, etcdwatch.WithClock(clk), etcdwatch.WithProgressRetry(5*time.Millisecond, 5*time.Millisecond))
	w := h.watch(etcdwatch.Key("a"), 1)
	got := h.progressAsync()
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest())
	w.Cancel()
	// The dispatcher has the cancel before the tick: Cancel returns once the
	// watch's channel is closed, which may be before.
	h.await(func() bool { return h.s.Stats().Watches == 0 })
	awaitArmed(t, clk, 5*time.Millisecond)
	clk.Advance(5 * time.Millisecond) // when it would ask again
	require.ErrorIs(t, recvProgress(t, got).err, etcdwatch.ErrNoWatches)
}

// TestServerChosenIDsAreAdopted: a gRPC proxy ignores the client's ids. The
// client adopts the server's ids and then keeps one create in flight.
func TestServerChosenIDsAreAdopted(t *testing.T) {
	h := newHarness(t)
	first := h.watchAsync(context.Background(), etcdwatch.Key("a"))
	c := h.srv.RecvCreate(t)
	h.srv.Send(t, ws.Created(c.WatchId+1000, 5))
	a := recvResult(t, first)
	require.NoError(t, a.err)
	require.Equal(t, c.WatchId+1000, a.w.ID())
	require.True(t, h.s.Stats().IDsRewritten)

	const n = 5
	var results []<-chan watchResult
	for i := range n {
		results = append(results, h.watchAsync(context.Background(), etcdwatch.Key(fmt.Sprint("k", i))))
	}
	h.await(func() bool { return h.s.Stats().Watches == n+1 })
	before := h.barrier(5)
	require.Len(t, before, 1, "creates must not be pipelined once the server picks ids")
	keyOf := map[int64]string{}
	c = before[0].GetCreateRequest()
	for i := range n {
		id := int64(2000 + i)
		keyOf[id] = string(c.Key)
		h.srv.Send(t, ws.Created(id, 5))
		if i < n-1 {
			c = h.srv.RecvCreate(t)
		}
	}
	for _, res := range results {
		got := recvResult(t, res)
		require.NoError(t, got.err)
		h.srv.Send(t, ws.Events(got.w.ID(), 6, ws.Put(keyOf[got.w.ID()], "v", 6)))
		require.Equal(t, keyOf[got.w.ID()], string(next(t, got.w).Events[0].Key))
	}
	h.srv.Send(t, ws.Events(a.w.ID(), 7, ws.Put("a", "v", 7)))
	require.True(t, next(t, a.w).IsProgress(), "the barrier's bookmark")
	require.Equal(t, "a", string(next(t, a.w).Events[0].Key))
}

// TestUnknownIDIsCanceledOnce: events for an id the client never created are
// dropped, and the server is asked once to cancel that id.
func TestUnknownIDIsCanceledOnce(t *testing.T) {
	h := newHarness(t)
	w := h.watch(etcdwatch.Key("a"), 1)
	for rev := int64(2); rev < 5; rev++ {
		h.srv.Send(t, ws.Events(77, rev, ws.Put("stray", "v", rev)))
	}
	h.srv.Send(t, ws.Events(w.ID(), 5, ws.Put("a", "v", 5)))
	require.Equal(t, int64(5), next(t, w).Revision)
	before := h.barrier(5)
	require.Len(t, before, 1)
	require.Equal(t, int64(77), before[0].GetCancelRequest().GetWatchId())
	require.Equal(t, uint64(1), h.s.Stats().UnknownResponses)
}

// TestFragmentsAreJoined: a revision split over fragments arrives whole.
func TestFragmentsAreJoined(t *testing.T) {
	h := newHarness(t)
	w := h.watch(etcdwatch.Prefix("big/").WithFragment(), 1)
	frag := func(last bool, keys ...string) *pb.WatchResponse {
		r := ws.Events(w.ID(), 2)
		for _, k := range keys {
			r.Events = append(r.Events, ws.Put(k, "v", 2))
		}
		r.Fragment = !last
		return r
	}
	h.srv.Send(t, frag(false, "big/1", "big/2"))
	h.srv.Send(t, frag(false, "big/3"))
	h.srv.Send(t, frag(true, "big/4", "big/5"))
	h.srv.Send(t, ws.Events(w.ID(), 3, ws.Put("big/6", "v", 3)))
	r := next(t, w)
	require.Len(t, r.Events, 5)
	for i, e := range r.Events {
		require.Equal(t, fmt.Sprint("big/", i+1), string(e.Key))
	}
	require.Equal(t, int64(2), r.Revision)
	require.Equal(t, int64(3), next(t, w).Revision)
}

// TestStreamProgressReachesEveryWatch: a progress response with id -1 is a
// bookmark for every watch; one with a watch's id is for that watch alone.
func TestStreamProgressReachesEveryWatch(t *testing.T) {
	h := newHarness(t)
	var watches []*etcdwatch.Watch
	for i := range 3 {
		watches = append(watches, h.watch(etcdwatch.Key(fmt.Sprint("k", i)), 10))
	}
	got := h.progressAsync() // etcd sends a stream-wide progress only as an answer
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest())
	h.srv.Send(t, ws.Progress(watches[1].ID(), 40))
	h.srv.Send(t, ws.Progress(-1, 50))
	require.Equal(t, int64(50), recvProgress(t, got).rev)
	for i, w := range watches {
		r := next(t, w)
		require.True(t, r.IsProgress())
		if i == 1 && r.Revision == 40 { // else the newer bookmark replaced it in the queue
			r = next(t, w)
		}
		require.Equal(t, int64(50), r.Revision)
		require.Equal(t, int64(50), r.Header.Revision)
		h.await(func() bool { return w.Revision() == 50 })
	}
}

// TestRequestProgressAsksAgain: etcd 3.6+ ignores a progress request while a
// watch catches up; the client must ask again until answered.
func TestRequestProgressAsksAgain(t *testing.T) {
	clk := clock.NewFake()
	h := newHarness(t, etcdwatch.WithClock(clk), etcdwatch.WithProgressRetry(10*time.Millisecond, 10*time.Millisecond))
	h.watch(etcdwatch.Key("a"), 1)
	got := h.progressAsync()
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest())
	awaitArmed(t, clk, 10*time.Millisecond)
	clk.Advance(10 * time.Millisecond)
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest(), "unanswered progress request not repeated")
	h.srv.Send(t, ws.Progress(-1, 99))
	r := recvProgress(t, got)
	require.NoError(t, r.err)
	require.Equal(t, int64(99), r.rev)
}

func TestRequestProgressEndsWithContext(t *testing.T) {
	h := newHarness(t)
	h.watch(etcdwatch.Key("a"), 1)
	ctx, cancel := context.WithCancelCause(context.Background())
	cause := errors.New("caller gave up")
	go func() {
		_, err := h.srv.Next() // the progress request is out
		assert.NoError(t, err)
		cancel(cause)
	}()
	_, err := h.s.RequestProgress(ctx)
	require.ErrorIs(t, err, cause)
}

func TestRequestProgressWithoutWatches(t *testing.T) {
	h := newHarness(t)
	_, err := h.s.RequestProgress(context.Background())
	require.ErrorIs(t, err, etcdwatch.ErrNoWatches)
}

// TestFatalStreamErrorEndsWatches: a stream refused for a reason a new
// stream cannot fix ends every watch with an error that keeps the status.
func TestFatalStreamErrorEndsWatches(t *testing.T) {
	h := newHarness(t)
	w := h.watch(etcdwatch.Key("a"), 1)
	h.srv.Send(t, ws.Events(w.ID(), 2, ws.Put("a", "v", 2)))
	h.srv.Close(status.Error(codes.PermissionDenied, "no"))
	require.Equal(t, int64(2), next(t, w).Revision, "buffered events are still delivered")
	err := ended(t, w)
	require.ErrorIs(t, err, etcdwatch.ErrStreamFailed)
	require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
	_, err = h.s.Watch(context.Background(), etcdwatch.Key("b"))
	require.ErrorIs(t, err, etcdwatch.ErrStreamFailed)
	_, err = h.s.RequestProgress(context.Background())
	require.ErrorIs(t, err, etcdwatch.ErrStreamFailed)
	require.Equal(t, uint64(0), h.s.Stats().Reconnects)
}

// TestCloseEndsEverything: Close ends watches, pending creates and the RPC.
func TestCloseEndsEverything(t *testing.T) {
	h := newHarness(t)
	w := h.watch(etcdwatch.Key("a"), 1)
	h.srv.Send(t, ws.Events(w.ID(), 2, ws.Put("a", "v", 2))) // left unread
	h.srv.Send(t, ws.Events(w.ID(), 3, ws.Put("a", "v", 3)))
	h.handledAll()
	require.Equal(t, uint64(2), h.s.Stats().Events)
	pending := h.watchAsync(context.Background(), etcdwatch.Key("b"))
	h.srv.RecvCreate(t) // never answered
	require.NoError(t, h.s.Close())
	require.NoError(t, h.s.Close(), "Close is idempotent")
	require.ErrorIs(t, recvResult(t, pending).err, etcdwatch.ErrClosed)
	_, ok := <-w.Responses()
	require.False(t, ok, "a closed stream delivers nothing more")
	require.ErrorIs(t, w.Err(), etcdwatch.ErrClosed)
	require.True(t, h.srv.Ended(t), "gRPC stream not ended")
	_, err := h.s.Watch(context.Background(), etcdwatch.Key("c"))
	require.ErrorIs(t, err, etcdwatch.ErrClosed)
	_, err = h.s.RequestProgress(context.Background())
	require.ErrorIs(t, err, etcdwatch.ErrClosed)
}

// TestConcurrentWatchersAndCancels runs creates and cancels from many
// goroutines against an auto-answering server, for the race detector.
func TestConcurrentWatchersAndCancels(t *testing.T) {
	h := newHarness(t)
	const goroutines, each = 20, 25
	serverDone := make(chan struct{})
	go func() {
		defer close(serverDone)
		creates, cancels := 0, 0
		for creates < goroutines*each || cancels < goroutines*each {
			req, err := h.srv.Next()
			if !assert.NoError(t, err) {
				return
			}
			switch {
			case req.GetCreateRequest() != nil:
				creates++
				id := req.GetCreateRequest().WatchId
				h.srv.Send(t, ws.Created(id, 1))
				h.srv.Send(t, ws.Events(id, 2, ws.Put(string(req.GetCreateRequest().Key), "v", 2)))
			case req.GetCancelRequest() != nil:
				cancels++
				h.srv.Send(t, ws.Canceled(req.GetCancelRequest().WatchId))
			}
		}
	}()
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				key := fmt.Sprintf("g%d/%d", g, i)
				w, err := h.s.Watch(context.Background(), etcdwatch.Key(key))
				if !assert.NoError(t, err) {
					return
				}
				r, ok := <-w.Responses()
				if !assert.True(t, ok, "watch ended: %v", w.Err()) || !assert.Len(t, r.Events, 1) {
					return
				}
				assert.Equal(t, key, string(r.Events[0].Key))
				w.Cancel()
			}
		})
	}
	wg.Wait()
	select {
	case <-serverDone:
	case <-time.After(wait):
		t.Fatal("server did not see every create and cancel")
	}
	require.Equal(t, int64(0), h.s.Stats().Watches)
}

// watchAllAsync calls WatchAll in a goroutine; the result arrives on the channel.
func (h *harness) watchAllAsync(ctx context.Context, rs ...etcdwatch.Request) <-chan watchAllResult {
	ch := make(chan watchAllResult, 1)
	go func() {
		ws, err := h.s.WatchAll(ctx, rs...)
		ch <- watchAllResult{ws, err}
	}()
	return ch
}

type watchAllResult struct {
	ws  []*etcdwatch.Watch
	err error
}

func recvAll(t *testing.T, ch <-chan watchAllResult) watchAllResult {
	t.Helper()
	return recv(t, ch, "WatchAll")
}

// keys returns a Key request for each key.
func keys(ks ...string) []etcdwatch.Request {
	rs := make([]etcdwatch.Request, len(ks))
	for i, k := range ks {
		rs[i] = etcdwatch.Key(k)
	}
	return rs
}

// TestWatchAllSendsEveryCreateAtOnce: all the creates reach the server before
// it answers any, and the watches come back in the order asked, each with
// its own id and events, though events of confirmed watches arrive among
// the answers.
func TestWatchAllSendsEveryCreateAtOnce(t *testing.T) {
	h := newHarness(t)
	const n = 100
	var ks []string
	for i := range n {
		ks = append(ks, fmt.Sprint("k", i))
	}
	res := h.watchAllAsync(context.Background(), keys(ks...)...)
	var creates []*pb.WatchCreateRequest
	for range n {
		creates = append(creates, h.srv.RecvCreate(t))
	}
	for i, c := range creates {
		require.Equal(t, ks[i], string(c.Key), "creates go out in the order asked")
		h.srv.Send(t, ws.Created(c.WatchId, 1))
		h.srv.Send(t, ws.Events(c.WatchId, int64(2+i), ws.Put(ks[i], "v", int64(2+i))))
	}
	got := recvAll(t, res)
	require.NoError(t, got.err)
	require.Len(t, got.ws, n)
	for i, w := range got.ws {
		require.Equal(t, creates[i].WatchId, w.ID())
		require.Equal(t, ks[i], string(next(t, w).Events[0].Key))
	}
	require.Equal(t, int64(n), h.s.Stats().Watches)
}

// TestWatchAllIsAllOrNothing: one refused create fails the call, naming the
// request, and every watch it opened is canceled on the server.
func TestWatchAllIsAllOrNothing(t *testing.T) {
	h := newHarness(t)
	h.watch(etcdwatch.Key("first"), 1) // an echoed id: the stream is trusted to pipeline
	res := h.watchAllAsync(context.Background(), keys("a", "b", "deny", "c", "d")...)
	const reason = "rpc error: code = PermissionDenied desc = etcdserver: permission denied"
	confirmed := map[int64]bool{}
	for range 5 {
		c := h.srv.RecvCreate(t)
		if string(c.Key) == "deny" {
			h.srv.Send(t, ws.CreateFailed(reason))
			continue
		}
		h.srv.Send(t, ws.Created(c.WatchId, 1))
		confirmed[c.WatchId] = true
	}
	got := recvAll(t, res)
	require.ErrorIs(t, got.err, etcdwatch.ErrPermissionDenied)
	var se *etcdwatch.ServerError
	require.ErrorAs(t, got.err, &se)
	require.Equal(t, reason, se.Reason)
	require.Contains(t, got.err.Error(), `request 2 of 5 (key "deny")`)
	var re *etcdwatch.RequestError
	require.ErrorAs(t, got.err, &re)
	require.Equal(t, 2, re.Index)
	require.Equal(t, 5, re.Of)
	require.Equal(t, "deny", string(re.Request.Key))
	require.Nil(t, got.ws)
	for range confirmed {
		id := h.srv.RecvCancel(t)
		require.True(t, confirmed[id], "cancel of %d, which was not opened by the call", id)
		delete(confirmed, id)
		h.srv.Send(t, ws.Canceled(id))
	}
	h.await(func() bool { return h.s.Stats().Watches == 1 })
}

// TestWatchAllValidatesEveryRequestFirst: one invalid request and nothing is
// sent.
func TestWatchAllValidatesEveryRequestFirst(t *testing.T) {
	h := newHarness(t)
	h.watch(etcdwatch.Key("first"), 1)
	_, err := h.s.WatchAll(context.Background(), etcdwatch.Key("a"), etcdwatch.Range("b", "a"), etcdwatch.Key("c"))
	require.ErrorIs(t, err, etcdwatch.ErrInvalidRequest)
	require.Contains(t, err.Error(), "request 1 of 3")
	var re *etcdwatch.RequestError
	require.ErrorAs(t, err, &re)
	require.Equal(t, 1, re.Index)
	require.Empty(t, h.barrier(1), "requests were sent")
	ws, err := h.s.WatchAll(context.Background())
	require.NoError(t, err)
	require.Nil(t, ws)
}

// TestWatchAllEndsWithItsContext: a context that ends before every watch is
// confirmed fails the call with its cause, and the watches confirmed after
// that are canceled on the server.
func TestWatchAllEndsWithItsContext(t *testing.T) {
	h := newHarness(t)
	ctx, cancel := context.WithCancelCause(context.Background())
	res := h.watchAllAsync(ctx, keys("a", "b")...)
	a, b := h.srv.RecvCreate(t), h.srv.RecvCreate(t)
	h.srv.Send(t, ws.Created(a.WatchId, 1))
	gone := errors.New("caller gone")
	cancel(gone)
	got := recvAll(t, res)
	require.ErrorIs(t, got.err, gone)
	require.NotContains(t, got.err.Error(), "request", "no request failed")
	h.srv.Send(t, ws.Created(b.WatchId, 1))
	cancels := map[int64]bool{h.srv.RecvCancel(t): true, h.srv.RecvCancel(t): true}
	require.Equal(t, map[int64]bool{a.WatchId: true, b.WatchId: true}, cancels)
}

// TestStatsLastMessage: zero until a response arrives, then when the
// latest did. Catches a time kept from the first response, or read at
// Stats.
func TestStatsLastMessage(t *testing.T) {
	clk := clock.NewFake()
	h := newHarness(t, etcdwatch.WithClock(clk))
	require.True(t, h.s.Stats().LastMessage.IsZero())
	w := h.watch(etcdwatch.Key("a"), 1)
	first := clk.Now()
	require.Truef(t, h.s.Stats().LastMessage.Equal(first), "LastMessage %v, the created answer came at %v", h.s.Stats().LastMessage, first)
	clk.Advance(time.Millisecond)
	h.srv.Send(t, ws.Events(w.ID(), 2, ws.Put("a", "2", 2)))
	h.handledAll()
	clk.Advance(time.Millisecond) // after the event: not its time
	require.Truef(t, h.s.Stats().LastMessage.Equal(first.Add(time.Millisecond)), "LastMessage %v, the event came at %v", h.s.Stats().LastMessage, first.Add(time.Millisecond))
}

// TestWatchAllEndedForTheWholeStream: a Stream closed, or failed for good,
// while WatchAll waits fails the call with that error, naming no request.
func TestWatchAllEndedForTheWholeStream(t *testing.T) {
	for name, tc := range map[string]struct {
		end  func(h *harness)
		want error
	}{
		"Close":  {func(h *harness) { h.s.Close() }, etcdwatch.ErrClosed},
		"failed": {func(h *harness) { h.srv.Close(status.Error(codes.PermissionDenied, "no")) }, etcdwatch.ErrStreamFailed},
	} {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t)
			res := h.watchAllAsync(context.Background(), keys("a", "b", "c")...)
			a := h.srv.RecvCreate(t)
			h.srv.RecvCreate(t)
			h.srv.RecvCreate(t)
			h.srv.Send(t, ws.Created(a.WatchId, 1))
			tc.end(h)
			got := recvAll(t, res)
			require.ErrorIs(t, got.err, tc.want)
			require.NotContains(t, got.err.Error(), "request", "a request was blamed")
			require.Nil(t, got.ws)
		})
	}
}

// TestCreateTimeoutBoundsOnlyTheWait: WithCreateTimeout fails a call the
// server does not answer in time, with ErrCreateTimeout, and cancels its
// watch once the server does answer; a watch confirmed in time outlives it.
func TestCreateTimeoutBoundsOnlyTheWait(t *testing.T) {
	clk := clock.NewFake()
	h := newHarness(t, etcdwatch.WithClock(clk), etcdwatch.WithCreateTimeout(50*time.Millisecond))
	kept := h.watch(etcdwatch.Key("kept"), 1)
	late := h.watchAsync(context.Background(), etcdwatch.Key("late"))
	c := h.srv.RecvCreate(t)
	awaitArmed(t, clk, 50*time.Millisecond)
	clk.Advance(50 * time.Millisecond)
	err := recvResult(t, late).err // the timeout has passed: kept has outlived it
	require.ErrorIs(t, err, etcdwatch.ErrCreateTimeout)
	h.srv.Send(t, ws.Created(c.WatchId, 1))
	require.Equal(t, c.WatchId, h.srv.RecvCancel(t), "the late watch was not released")
	h.srv.Send(t, ws.Events(kept.ID(), 2, ws.Put("kept", "v", 2)))
	require.Equal(t, int64(2), next(t, kept).Revision)
	require.Nil(t, kept.Err())
	require.Equal(t, int64(1), h.s.Stats().Watches)
}

// TestWatchAllWithACompactedRequest: a compacted start revision is not a
// refusal: etcd confirms the create, then cancels it. WatchAll returns
// every watch, and the compacted one ends at once with *CompactedError.
func TestWatchAllWithACompactedRequest(t *testing.T) {
	h := newHarness(t)
	res := h.watchAllAsync(context.Background(), etcdwatch.Key("a"), etcdwatch.Key("old").FromRevision(2))
	a, old := h.srv.RecvCreate(t), h.srv.RecvCreate(t)
	h.srv.Send(t, ws.Created(a.WatchId, 10))
	h.srv.Send(t, ws.Created(old.WatchId, 10))
	h.srv.Send(t, ws.Compacted(old.WatchId, 5))
	got := recv(t, res, "WatchAll")
	require.NoError(t, got.err)
	require.Len(t, got.ws, 2)
	var ce *etcdwatch.CompactedError
	require.ErrorAs(t, ended(t, got.ws[1]), &ce)
	require.Equal(t, int64(5), ce.CompactRevision)
	require.Nil(t, got.ws[0].Err(), "the other watch ended too")
}

// TestWatchFromNowTakesEventsBelowItsCreatedHeader: etcd reads a created
// response's header after registering the watch, so writes in between put
// the header ahead of the watch's start, and their events come after the
// created response. Every event before the first is new; after it,
// duplicates are dropped as ever. Catches a watch from now that took its
// header for its start and dropped those events as duplicates (on one
// etcd 3.7 member under 64 writers: 4 watches in 10,150 lost up to 66).
func TestWatchFromNowTakesEventsBelowItsCreatedHeader(t *testing.T) {
	h := newHarness(t)
	w := h.watch(etcdwatch.Prefix("k"), 10)
	h.srv.Send(t, ws.Events(w.ID(), 10, ws.Put("k1", "a", 8)))
	h.srv.Send(t, ws.Events(w.ID(), 10, ws.Put("k2", "b", 9)))
	h.srv.Send(t, ws.Events(w.ID(), 11, ws.Put("k1", "c", 11)))
	var revs []int64
	for len(revs) < 3 {
		for _, e := range next(t, w).Events {
			revs = append(revs, e.ModRevision)
		}
	}
	require.Equal(t, []int64{8, 9, 11}, revs)
	require.Zero(t, h.s.Stats().DuplicatesDropped)
	h.srv.Send(t, ws.Events(w.ID(), 11, ws.Put("k2", "b", 9))) // sent twice: now a duplicate
	h.srv.Send(t, ws.Events(w.ID(), 12, ws.Put("k2", "d", 12)))
	require.Equal(t, int64(12), next(t, w).Events[0].ModRevision)
	require.Equal(t, uint64(1), h.s.Stats().DuplicatesDropped)
}

// TestCreatedRevision: CreatedRevision is the header revision of the
// server's first created response, whatever revision the watch starts
// from, and a re-create after a pause does not change it.
func TestCreatedRevision(t *testing.T) {
	h := newHarness(t)
	now := h.watch(etcdwatch.Key("now"), 4)
	require.Equal(t, int64(4), now.CreatedRevision())
	require.Zero(t, now.Revision(), "a watch from now has delivered nothing, and its start is not known")
	past := h.watch(etcdwatch.Key("past").FromRevision(2), 9)
	require.Equal(t, int64(9), past.CreatedRevision())
	require.Equal(t, int64(1), past.Revision())
	h.cut()
	for range 2 {
		c := h.srv.RecvCreate(t)
		h.srv.Send(t, ws.Created(c.WatchId, 12))
	}
	h.barrier(12)
	require.Equal(t, int64(9), past.CreatedRevision(), "moved by a re-create")
}

// TestStreamProgressDoesNotCoverALaterCreate: etcd answers a progress
// request for the watches it has when it takes it, but the answer can
// reach the client after the created response of a watch whose create
// went out after the request. That watch, from an old revision, is still
// catching up below the answer: it gets no bookmark from it, and its
// events come. Catches a bookmark at the answer that made the watch drop
// its catch-up events as duplicates. The call, which began before the
// watch was created, has its answer: it waits for the watches it began
// with, not for those created since.
func TestStreamProgressDoesNotCoverALaterCreate(t *testing.T) {
	h := newHarness(t)
	a := h.watch(etcdwatch.Key("a"), 10)
	got := h.progressAsync()
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest())
	res := h.watchAsync(context.Background(), etcdwatch.Key("b").FromRevision(5))
	c := h.srv.RecvCreate(t)
	h.srv.Send(t, ws.Created(c.WatchId, 11))
	b := recvResult(t, res).w
	h.srv.Send(t, ws.Progress(-1, 11)) // taken before b existed
	require.Equal(t, int64(11), next(t, a).Revision, "a is covered")
	require.Equal(t, int64(11), recvProgress(t, got).rev)
	h.srv.Send(t, ws.Events(c.WatchId, 11, ws.Put("b", "x", 7)))
	r := next(t, b)
	require.False(t, r.IsProgress(), "b was bookmarked at an answer that did not cover it")
	require.Equal(t, int64(7), r.Events[0].ModRevision)
	got = h.progressAsync() // a call made now waits for b too
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest())
	h.srv.Send(t, ws.Progress(-1, 11))
	require.Equal(t, int64(11), recvProgress(t, got).rev)
	require.Equal(t, int64(11), next(t, b).Revision)
	require.Zero(t, h.s.Stats().DuplicatesDropped)
}

// TestProgressWaitsForAWatchCreatedAgain: RequestProgress is waiting when
// the stream ends; on the next one the watch is created again and the
// request asked again, and the answer comes before the created response
// (etcd's sender picks either first). The watch is not bookmarked by that
// answer, so the call asks again once the create is answered, and returns
// once an answer reaches the watch too. Catches a call answered while a watch it began with had no
// bookmark.
func TestProgressWaitsForAWatchCreatedAgain(t *testing.T) {
	clk := clock.NewFake()
	h := newHarness(t, etcdwatch.WithClock(clk)) // a clock that does not move: no request is asked again by the timer
	a := h.watch(etcdwatch.Key("a"), 10)
	got := h.progressAsync()
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest())
	h.srv.Close(status.Error(codes.Unavailable, "member going away")) // it worked: the next at once
	h.srv = h.server.Accept(t)
	c := h.srv.RecvCreate(t)
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest(), "asked again on the new stream")
	h.srv.Send(t, ws.Progress(-1, 10))
	h.srv.Send(t, ws.Created(c.WatchId, 10))
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest(), "asked again once a's create was answered: a was not bookmarked")
	h.await(func() bool { return h.s.Stats().Moved == 1 })
	select {
	case r := <-got:
		t.Fatalf("the call returned %v before a had a bookmark", r)
	default:
	}
	h.srv.Send(t, ws.Progress(-1, 10))
	require.Equal(t, int64(10), recvProgress(t, got).rev)
	r := next(t, a)
	require.True(t, r.IsProgress())
	require.Equal(t, int64(10), r.Revision)
}

// TestProgressWaitsForAFirstCreateSentBeforeIt: a watch's first create
// is out, unanswered, when RequestProgress begins, and the answer comes
// before the created response (etcd's sender picks either first, and holds
// the watch's events until its created response is out). The call asks
// again once the create is answered, and returns once an answer comes
// after the watch's event.
// Catches a call that returns a revision while a watch it began with has
// events at or below it still to come.
func TestProgressWaitsForAFirstCreateSentBeforeIt(t *testing.T) {
	clk := clock.NewFake()
	h := newHarness(t, etcdwatch.WithClock(clk)) // a clock that does not move: no request is asked again by the timer
	h.watch(etcdwatch.Key("a"), 5)
	res := h.watchAsync(t.Context(), etcdwatch.Key("b"))
	c := h.srv.RecvCreate(t) // sent, not answered yet
	got := h.progressAsync()
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest())
	h.srv.Send(t, ws.Progress(-1, 9)) // before b's created response
	h.srv.Send(t, ws.Created(c.WatchId, 5))
	h.srv.Send(t, ws.Events(c.WatchId, 9, ws.Put("b", "v", 7)))
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest(), "asked again once b's create was answered: b was not bookmarked")
	b := recvResult(t, res).w
	require.Equal(t, int64(7), next(t, b).Events[0].ModRevision)
	select {
	case r := <-got:
		t.Fatalf("the call returned %v before b's event", r)
	default:
	}
	h.srv.Send(t, ws.Progress(-1, 9))
	require.Equal(t, int64(9), recvProgress(t, got).rev)
	require.Equal(t, int64(9), next(t, b).Revision)
}

// TestProgressWaitsForAResumeSentBeforeIt: a paused watch whose consumer
// has caught up is created again from its next revision. A call that
// began with that create in flight waits for it as for a first create
// (etcd may answer before its created response, and holds the watch's
// events until after it), and the watch gets the call's bookmark after
// its events. Catches a call that returns R while a watch it began with,
// resumed, has events <= R still to come, and never bookmarks it at R.
func TestProgressWaitsForAResumeSentBeforeIt(t *testing.T) {
	h := newHarness(t, etcdwatch.WithClock(clock.NewFake()), etcdwatch.WithBufferLimit(2), etcdwatch.WithStallBudget(0))
	w := h.watch(etcdwatch.Key("a"), 1)
	for rev := int64(2); rev <= 4; rev++ { // unread: paused at the limit
		h.srv.Send(t, ws.Events(w.ID(), rev, ws.Put("a", "v", rev)))
	}
	paused := w.ID()
	require.Equal(t, paused, h.srv.RecvCancel(t), "paused")
	h.srv.Send(t, ws.Canceled(paused))
	// The stream has seen 4 before the consumer catches up: else the watch
	// resumes at the head, from 3 itself.
	h.await(func() bool { return h.s.Stats().Revision >= 4 })
	for read := int64(0); read < 3; { // 2 and 3, perhaps joined: it resumes
		read = next(t, w).Revision
	}
	resume := h.srv.RecvCreate(t) // sent, not answered yet
	require.Equal(t, int64(4), resume.StartRevision)
	got := h.progressAsync()
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest())
	h.srv.Send(t, ws.Progress(-1, 5)) // before the resume's created response
	h.srv.Send(t, ws.Created(resume.WatchId, 5))
	h.srv.Send(t, ws.Events(resume.WatchId, 5, ws.Put("a", "v", 5))) // one event: two would reach the limit, and pause it again
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest(), "asked again once the resume was answered")
	select {
	case r := <-got:
		t.Fatalf("the call returned %v before the resumed watch was answered again", r)
	default:
	}
	// Its event is read, and its pump done, first: a bookmark counts as an
	// event, and queued behind it would reach the limit of 2, and pause the
	// watch again.
	require.Equal(t, int64(5), next(t, w).Events[0].ModRevision)
	h.await(h.obs.PumpsIdle)
	h.srv.Send(t, ws.Progress(-1, 5))
	require.Equal(t, int64(5), recvProgress(t, got).rev)
	b := next(t, w)
	require.True(t, b.IsProgress(), "the watch's bookmark, after its event")
	require.Equal(t, int64(5), b.Revision)
}

// TestProgressAsksAgainOnceTheCreateIsAnswered: an answer that leaves a
// call waiting only for a create not confirmed yet is not followed by
// another request at once, which would get an answer that cannot cover
// that create either (a request per round trip for as long as the create
// takes): the next request goes once the create is answered. The cancel of
// another watch marks the place: it is the next request after the answer.
func TestProgressAsksAgainOnceTheCreateIsAnswered(t *testing.T) {
	clk := clock.NewFake()
	h := newHarness(t, etcdwatch.WithClock(clk)) // a clock that does not move: no request is asked again by the timer
	h.watch(etcdwatch.Key("a"), 5)
	marker := h.watch(etcdwatch.Key("c"), 5)
	res := h.watchAsync(t.Context(), etcdwatch.Key("b"))
	c := h.srv.RecvCreate(t) // sent, not answered
	got := h.progressAsync()
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest())
	h.srv.Send(t, ws.Progress(-1, 9))
	h.handledAll()
	marker.Cancel()
	require.NotNil(t, h.srv.Recv(t).GetCancelRequest(), "nothing asked again while b's create is unanswered")
	h.srv.Send(t, ws.Created(c.WatchId, 5))
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest(), "asked again once b's create was answered")
	require.NoError(t, recvResult(t, res).err)
	h.srv.Send(t, ws.Progress(-1, 9))
	require.Equal(t, int64(9), recvProgress(t, got).rev)
}

// TestProgressNotHeldByCreatesQueuedDuringItOneAtATime: on a stream that
// takes one create at a time, a call that began with a create in flight
// and one queued waits for those two, and not for the watches opened
// during it, queued behind them. Catches a call waiting for every create
// until the queue is empty, which watches opened during it can keep from
// ever happening.
func TestProgressNotHeldByCreatesQueuedDuringItOneAtATime(t *testing.T) {
	h := newHarness(t)
	res := h.watchAsync(t.Context(), etcdwatch.Key("z"))
	h.srv.RecvCreate(t)
	h.srv.Send(t, ws.Created(100, 10)) // its own id: one create at a time from now on
	require.NoError(t, recvResult(t, res).err)
	h.watchAsync(t.Context(), etcdwatch.Key("a"))
	h.srv.RecvCreate(t)                           // a in flight
	h.watchAsync(t.Context(), etcdwatch.Key("b")) // queued behind a
	h.await(func() bool { return h.s.Stats().Watches == 3 })
	got := h.progressAsync() // began with z, a (sent) and b (queued)
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest())

	h.watchAsync(t.Context(), etcdwatch.Key("k0")) // opened during the call
	h.await(func() bool { return h.s.Stats().Watches == 4 })
	h.srv.Send(t, ws.Created(101, 10)) // a
	require.Equal(t, "b", string(h.srv.RecvCreate(t).Key))
	h.srv.Send(t, ws.Progress(-1, 10)) // b not confirmed: the call waits

	h.watchAsync(t.Context(), etcdwatch.Key("k1")) // opened during the call
	h.await(func() bool { return h.s.Stats().Watches == 5 })
	h.srv.Send(t, ws.Created(102, 10)) // b
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest(), "asked again once b's create was answered")
	require.Equal(t, "k0", string(h.srv.RecvCreate(t).Key))
	h.srv.Send(t, ws.Progress(-1, 10)) // covers z, a and b; k0 and k1 came after the call
	require.Equal(t, int64(10), recvProgress(t, got).rev)
}

// sentAgainBehindAnAbandoned plays what follows once a call waits for
// watch w's first create, to be sent again on the current stream behind a
// create in flight whose caller has given up: an answer comes first, which
// must not return the call; then the abandoned create's answer (id
// abandoned), w's create and its answer (id), and an event of w at 7. The
// call returns at the answer that comes after w's create.
func (h *harness) sentAgainBehindAnAbandoned(resW <-chan watchResult, got <-chan progressResult, abandoned, id int64) {
	t := h.t
	t.Helper()
	h.srv.Send(t, ws.Progress(-1, 20))       // w not sent again yet: the call waits
	h.srv.Send(t, ws.Created(abandoned, 20)) // canceled
	var cw *pb.WatchCreateRequest
	for cw == nil { // past the abandoned one's cancel and the request asked again
		cw = h.srv.Recv(t).GetCreateRequest()
	}
	require.Equal(t, "w", string(cw.Key))
	h.srv.Send(t, ws.Created(id, 20))
	h.srv.Send(t, ws.Events(id, 20, ws.Put("w", "v", 7)))
	w := recvResult(t, resW).w
	require.Equal(t, int64(7), next(t, w).Events[0].ModRevision)
	select {
	case r := <-got:
		t.Fatalf("the call returned %+v before w's create was sent again", r)
	default:
	}
	h.srv.Send(t, ws.Progress(-1, 20)) // to the request asked again before w's create
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest(), "asked again: w was created after it")
	h.srv.Send(t, ws.Progress(-1, 20))
	require.Equal(t, int64(20), recvProgress(t, got).rev)
}

// TestProgressWaitsForAFirstCreateSentAgain: a watch's first create is
// out when RequestProgress begins; the stream is given up (a proxy's own
// id), and on the next one, taking one create at a time, it waits in line
// behind another, whose caller then gives up. An answer then must not
// return the call: the watch's create, sent before the call, is not even
// sent again, and its events at or below the answer come later. Catches a
// first create counted only while in flight on the stream it was sent on.
func TestProgressWaitsForAFirstCreateSentAgain(t *testing.T) {
	h := newHarness(t, etcdwatch.WithClock(clock.NewFake()))
	ctxX, cancelX := context.WithCancel(t.Context())
	defer cancelX()
	resX := h.watchAsync(ctxX, etcdwatch.Key("x"))
	require.Equal(t, "x", string(h.srv.RecvCreate(t).Key))
	resW := h.watchAsync(t.Context(), etcdwatch.Key("w").FromRevision(5))
	require.Equal(t, "w", string(h.srv.RecvCreate(t).Key))
	got := h.progressAsync() // began with w's create sent
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest())
	h.srv.Send(t, ws.Created(0, 10)) // a proxy's own id: unmatched, the stream is given up
	require.True(t, h.srv.Ended(t))
	h.srv = h.server.Accept(t)
	require.Equal(t, "x", string(h.srv.RecvCreate(t).Key)) // one at a time: w waits
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest())
	cancelX()
	require.Error(t, recvResult(t, resX).err)
	h.await(func() bool { return h.s.Stats().Watches == 1 })
	h.sentAgainBehindAnAbandoned(resW, got, 0, 1)
}

// TestProgressWaitsForAFirstCreateRefusedForAStaleToken: a watch's first
// create is out when RequestProgress begins, and is refused for a stale
// token: it goes again on a new stream, one create at a time, in line
// behind another whose caller then gives up. An answer then must not
// return the call: the refused create, sent before the call, is not even
// sent again. Catches the refused create forgotten by the calls.
func TestProgressWaitsForAFirstCreateRefusedForAStaleToken(t *testing.T) {
	h := newHarness(t, etcdwatch.WithClock(clock.NewFake()))
	res := h.watchAsync(t.Context(), etcdwatch.Key("z"))
	h.srv.RecvCreate(t)
	h.srv.Send(t, ws.Created(100, 10)) // its own id: one create at a time from now on
	z := recvResult(t, res).w
	z.Cancel()
	require.Equal(t, int64(100), h.srv.RecvCancel(t))
	h.srv.Send(t, ws.Canceled(100))
	resW := h.watchAsync(t.Context(), etcdwatch.Key("w").FromRevision(5))
	require.Equal(t, "w", string(h.srv.RecvCreate(t).Key))
	ctxV, cancelV := context.WithCancel(t.Context())
	defer cancelV()
	resV := h.watchAsync(ctxV, etcdwatch.Key("v")) // queued behind w
	h.await(func() bool { return h.s.Stats().Watches == 2 })
	got := h.progressAsync() // began with w's create sent
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest())
	h.srv.Send(t, ws.CreateFailed(staleToken))
	require.True(t, h.srv.Ended(t), "a new stream for new credentials")
	h.srv = h.server.Accept(t)
	require.Equal(t, "v", string(h.srv.RecvCreate(t).Key)) // one at a time: w waits behind it
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest())
	cancelV()
	require.Error(t, recvResult(t, resV).err)
	h.await(func() bool { return h.s.Stats().Watches == 1 })
	h.sentAgainBehindAnAbandoned(resW, got, 200, 201)
}

// TestProgressNotHeldByAWatchCanceledWhileCreatedAgain: a watch canceled
// while it is created again on a new stream, its create unanswered, holds
// no RequestProgress made after: it is no longer active. Catches a call
// waiting for the answer to a create its consumer gave up.
func TestProgressNotHeldByAWatchCanceledWhileCreatedAgain(t *testing.T) {
	h := newHarness(t, etcdwatch.WithClock(clock.NewFake())) // a clock that does not move: no request is asked again by the timer
	z := h.watch(etcdwatch.Key("z"), 10)
	resA := h.watchAsync(t.Context(), etcdwatch.Key("a"))
	h.srv.RecvCreate(t) // a in flight at the stream's end: created again first, then z
	h.cut()
	ca, cz := h.srv.RecvCreate(t), h.srv.RecvCreate(t)
	require.Equal(t, "a", string(ca.Key))
	require.Equal(t, "z", string(cz.Key))
	h.srv.Send(t, ws.Created(ca.WatchId, 10))
	require.NoError(t, recvResult(t, resA).err)
	z.Cancel() // its create again in flight
	h.await(func() bool { return h.s.Stats().Watches == 1 })
	got := h.progressAsync()
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest())
	h.srv.Send(t, ws.Progress(-1, 10))
	require.Equal(t, int64(10), recvProgress(t, got).rev)
}

// TestProgressNotHeldByCreatesQueuedDuringItAfterAStreamEnd: as
// TestProgressNotHeldByCreatesQueuedDuringItOneAtATime, across a stream's
// end: the call waits for the watches created again, and not for those
// opened during it, one at a time behind them. Catches a call waiting for
// every create until the queue is empty once a stream ended.
func TestProgressNotHeldByCreatesQueuedDuringItAfterAStreamEnd(t *testing.T) {
	h := newHarness(t)
	for i, k := range []string{"z", "y"} {
		res := h.watchAsync(t.Context(), etcdwatch.Key(k))
		h.srv.RecvCreate(t)
		h.srv.Send(t, ws.Created(int64(100+i), 10)) // its own id: one create at a time from now on
		require.NoError(t, recvResult(t, res).err)
	}
	got := h.progressAsync() // began with z and y, confirmed
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest())
	h.cut()
	nextCreate := func() string { // past the requests asked again
		for {
			if c := h.srv.Recv(t).GetCreateRequest(); c != nil {
				return string(c.Key)
			}
		}
	}
	first := nextCreate()                          // z or y, created again; the other waits
	h.watchAsync(t.Context(), etcdwatch.Key("k0")) // opened during the call
	h.await(func() bool { return h.s.Stats().Watches == 3 })
	h.srv.Send(t, ws.Created(200, 10))
	second := nextCreate()
	require.ElementsMatch(t, []string{"z", "y"}, []string{first, second})
	h.srv.Send(t, ws.Progress(-1, 10))             // the second not confirmed: the call waits
	h.watchAsync(t.Context(), etcdwatch.Key("k1")) // opened during the call
	h.await(func() bool { return h.s.Stats().Watches == 4 })
	h.srv.Send(t, ws.Created(201, 10)) // the second
	require.Equal(t, "k0", nextCreate())
	h.srv.Send(t, ws.Progress(-1, 10)) // covers z and y; k0 and k1 came during the call
	require.Equal(t, int64(10), recvProgress(t, got).rev)
}

// TestProgressAnswerStartsANewSeriesAfterACreate: the request sent once a
// create is answered, for a call the last answer left waiting only for
// that create, starts a new retry series (an answer came), rather than
// taking the series' next step: after a few creates every such request,
// which etcd 3.5.13+ ignores while the new watch catches up, would be
// asked again only after the maximum.
func TestProgressAnswerStartsANewSeriesAfterACreate(t *testing.T) {
	const first, max = 10 * time.Millisecond, 250 * time.Millisecond
	clk := clock.NewFake()
	h := newHarness(t, etcdwatch.WithClock(clk), etcdwatch.WithProgressRetry(first, max))
	h.watch(etcdwatch.Key("a"), 5)
	res := h.watchAsync(t.Context(), etcdwatch.Key("b"))
	c := h.srv.RecvCreate(t) // sent, not answered
	got := h.progressAsync()
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest())
	awaitArmed(t, clk, first)
	h.srv.Send(t, ws.Progress(-1, 9)) // before b's created response
	h.srv.Send(t, ws.Created(c.WatchId, 5))
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest(), "asked again once b's create was answered")
	require.NoError(t, recvResult(t, res).err)
	awaitArmed(t, clk, first) // a new series
	h.srv.Send(t, ws.Progress(-1, 9))
	require.Equal(t, int64(9), recvProgress(t, got).rev)
}

// TestProgressAfterCreateNotLeftSet: an answer that serves every call
// clears what an earlier one set for calls waiting on a create: a create
// answered later does not ask again for a call whose request is in flight
// and which waits for no create. The cancel of another watch marks the
// place: it is the next request.
func TestProgressAfterCreateNotLeftSet(t *testing.T) {
	clk := clock.NewFake()
	h := newHarness(t, etcdwatch.WithClock(clk))
	h.watch(etcdwatch.Key("a"), 5)
	marker := h.watch(etcdwatch.Key("m"), 5)
	ctxB, cancelB := context.WithCancel(t.Context())
	resB := h.watchAsync(ctxB, etcdwatch.Key("b"))
	cb := h.srv.RecvCreate(t) // sent, not answered
	got1 := h.progressAsync()
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest())
	h.srv.Send(t, ws.Progress(-1, 9)) // b unconfirmed: the call waits for its create
	h.handledAll()
	cancelB() // b abandoned: waited for no longer
	require.Error(t, recvResult(t, resB).err)
	got2 := h.progressAsync()
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest())
	h.srv.Send(t, ws.Progress(-1, 9)) // serves both calls
	require.Equal(t, int64(9), recvProgress(t, got1).rev)
	require.Equal(t, int64(9), recvProgress(t, got2).rev)
	got3 := h.progressAsync()
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest()) // in flight
	h.srv.Send(t, ws.Created(cb.WatchId, 9))              // b's create answered: canceled
	require.NotNil(t, h.srv.Recv(t).GetCancelRequest())
	marker.Cancel()
	req := h.srv.Recv(t)
	require.NotNil(t, req.GetCancelRequest(), "asked again for a call whose request is in flight: %v", req)
	h.srv.Send(t, ws.Progress(-1, 9))
	require.Equal(t, int64(9), recvProgress(t, got3).rev)
}

// TestProgressNotHeldByLaterCreates: a watch is opened between each
// progress request and its answer, so that no answer covers every watch.
// Each answer covers the one the call began with, so the first returns it.
// Catches a call held for as long as watches are being created.
func TestProgressNotHeldByLaterCreates(t *testing.T) {
	h := newHarness(t)
	h.watch(etcdwatch.Key("a"), 10)
	got := h.progressAsync()
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest())
	h.watch(etcdwatch.Key("b"), 10)
	h.srv.Send(t, ws.Progress(-1, 10))
	require.Equal(t, int64(10), recvProgress(t, got).rev)
}

// TestProgressAfterAStreamEndNotHeldByLaterCreates: a call that waited
// across a stream's end waits, on the next stream, for the watches created
// again there, and not for one created after them. Catches a call held
// for as long as watches are being created, once its stream was replaced.
func TestProgressAfterAStreamEndNotHeldByLaterCreates(t *testing.T) {
	clk := clock.NewFake()
	h := newHarness(t, etcdwatch.WithClock(clk)) // a clock that does not move: no request is asked again by the timer
	h.watch(etcdwatch.Key("a"), 10)
	got := h.progressAsync()
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest())
	h.srv.Close(status.Error(codes.Unavailable, "member going away")) // it worked: the next at once
	h.srv = h.server.Accept(t)
	c := h.srv.RecvCreate(t)
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest())
	h.srv.Send(t, ws.Created(c.WatchId, 10))
	h.watch(etcdwatch.Key("b"), 10) // after the request
	h.srv.Send(t, ws.Progress(-1, 10))
	require.Equal(t, int64(10), recvProgress(t, got).rev)
}

// TestProgressRequestsPastTheRecordedLimit: more requests go out
// unanswered than the Stream records apart (8: the retry timer asks again,
// a watch created before each), a watch from an old revision is created
// after them all, and the server answers them in order. No answer to a
// request sent before that create may bookmark the watch. Catches the
// answers to requests past the limit, unrecorded, taken for later ones':
// the watch was bookmarked at 11 and its catch-up event at 7 dropped as a
// duplicate.
func TestProgressRequestsPastTheRecordedLimit(t *testing.T) {
	clk := clock.NewFake()
	h := newHarness(t, etcdwatch.WithClock(clk), etcdwatch.WithProgressRetry(5*time.Millisecond, 5*time.Millisecond))
	h.watch(etcdwatch.Key("a"), 10)
	first := h.progressAsync()
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest())
	const unanswered = 10
	for i := range unanswered - 1 { // each after a create of its own, asked again by the timer
		h.watch(etcdwatch.Key(fmt.Sprint("k", i)), 10)
		awaitArmed(t, clk, 5*time.Millisecond)
		clk.Advance(5 * time.Millisecond)
		require.NotNil(t, h.srv.Recv(t).GetProgressRequest())
	}
	res := h.watchAsync(context.Background(), etcdwatch.Key("b").FromRevision(5))
	c := h.srv.RecvCreate(t)
	h.srv.Send(t, ws.Created(c.WatchId, 11))
	b := recvResult(t, res).w
	got := h.progressAsync() // waits for b: every answer below asks again
	h.handledAll()
	for i := range unanswered {
		h.srv.Send(t, ws.Progress(-1, 11))
		h.handledAll()
		select {
		case r := <-got:
			t.Fatalf("the answer to request %d, sent before b's create, was taken to cover b (returned %v)", i+1, r)
		default:
		}
		require.NotNil(t, h.srv.Recv(t).GetProgressRequest())
	}
	require.Equal(t, int64(11), recvProgress(t, first).rev, "the first call began before the watches after a")
	h.srv.Send(t, ws.Events(c.WatchId, 11, ws.Put("b", "x", 7)))
	h.srv.Send(t, ws.Events(c.WatchId, 12, ws.Put("b", "y", 12)))
	var revs []int64
	for len(revs) == 0 || revs[len(revs)-1] < 12 {
		r := next(t, b)
		require.False(t, r.IsProgress(), "b bookmarked at %d, before its catch-up", r.Revision)
		for _, e := range r.Events {
			revs = append(revs, e.ModRevision)
		}
	}
	require.Equal(t, []int64{7, 12}, revs)
	h.srv.Send(t, ws.Progress(-1, 12)) // the answer to the request sent after b's create
	require.Equal(t, int64(12), recvProgress(t, got).rev)
	require.Zero(t, h.s.Stats().DuplicatesDropped)
}

// TestProgressWaitsForAWatchQueuedToBeCreatedAgain: on a stream that takes
// one create at a time (the server picks its own ids), a call waits across
// the stream's end while a watch it began with waits in line to be created
// again; an answer then must not return it. Catches a call returned with
// that watch neither created again nor bookmarked.
func TestProgressWaitsForAWatchQueuedToBeCreatedAgain(t *testing.T) {
	h := newHarness(t)
	res := h.watchAsync(context.Background(), etcdwatch.Key("z"))
	h.srv.RecvCreate(t)
	h.srv.Send(t, ws.Created(100, 1)) // its own id: one create at a time from now on
	z := recvResult(t, res).w
	h.watchAsync(context.Background(), etcdwatch.Key("a")) // in flight at the stream's end: not moved, created
	h.srv.RecvCreate(t)
	got := h.progressAsync()
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest())

	h.cut()
	ca := h.srv.RecvCreate(t)
	require.Equal(t, "a", string(ca.Key), "a first, then z, one at a time")
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest())
	h.srv.Send(t, ws.Progress(-1, 1)) // before a's created response
	h.srv.Send(t, ws.Created(101, 1))
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest(), "asked again once a's create was answered: z is not created again yet")
	cz := h.srv.RecvCreate(t)
	require.Equal(t, "z", string(cz.Key))
	h.srv.Send(t, ws.Created(102, 1))
	h.await(func() bool { return h.s.Stats().Moved == 1 })
	h.srv.Send(t, ws.Progress(-1, 1)) // the request asked again went out before z's create
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest(), "asked again: z was created after it")
	h.srv.Send(t, ws.Progress(-1, 1))
	require.Equal(t, int64(1), recvProgress(t, got).rev)
	r := next(t, z)
	require.True(t, r.IsProgress(), "z gets the bookmark")
}

// TestProgressNotHeldByLaterCreatesOneAtATime: on a stream that takes one
// create at a time, a call made while a create waits its turn waits for
// the watches whose creates had been queued when it began, and not for
// those created after: a watch opened within each round trip does not
// hold it. Catches the call held for as long as watches are opened there.
func TestProgressNotHeldByLaterCreatesOneAtATime(t *testing.T) {
	h := newHarness(t)
	id := int64(100)
	create := func(key string) {
		res := h.watchAsync(context.Background(), etcdwatch.Key(key))
		h.srv.RecvCreate(t)
		h.srv.Send(t, ws.Created(id, 10))
		id++
		require.NoError(t, recvResult(t, res).err)
	}
	create("z") // its own id: one create at a time from now on
	resA := h.watchAsync(context.Background(), etcdwatch.Key("a"))
	h.srv.RecvCreate(t)
	resB := h.watchAsync(context.Background(), etcdwatch.Key("b").FromRevision(5)) // queued behind a; from an old revision, so that only an answer to a request after its create covers it
	h.await(func() bool { return h.s.Stats().Watches == 3 })
	got := h.progressAsync() // began with z, a and b
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest())
	h.srv.Send(t, ws.Created(id, 10)) // a
	id++
	require.NoError(t, recvResult(t, resA).err)
	h.srv.RecvCreate(t) // b
	h.srv.Send(t, ws.Created(id, 10))
	id++
	require.NoError(t, recvResult(t, resB).err)
	h.srv.Send(t, ws.Progress(-1, 10)) // answers the request sent before b's create: asked again
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest())
	create("c")                        // a watch opened within the round trip
	h.srv.Send(t, ws.Progress(-1, 10)) // covers z, a and b
	require.Equal(t, int64(10), recvProgress(t, got).rev)
}

// TestProgressAfterAHoldNotHeldByAWatchFromNow: requests go out
// unanswered (etcd 3.5.13+ stays silent while a watch catches up), then a
// watch from now is created and a call waits for it. The first answer
// after it returns the call, whichever request it answers: etcd answers
// only when every watch it has on the stream is synced, and a watch from
// now it registered after that moment starts past the answer's revision.
// Catches the call asking again once for each request the server ignored,
// back to back (the answers are counted off oldest first).
func TestProgressAfterAHoldNotHeldByAWatchFromNow(t *testing.T) {
	clk := clock.NewFake()
	h := newHarness(t, etcdwatch.WithClock(clk), etcdwatch.WithProgressRetry(5*time.Millisecond, 5*time.Millisecond))
	h.watch(etcdwatch.Key("a").FromRevision(2), 10) // catching up: the server answers nothing
	first := h.progressAsync()
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest())
	const unanswered = 5
	for range unanswered - 1 { // asked again by the timer
		awaitArmed(t, clk, 5*time.Millisecond)
		clk.Advance(5 * time.Millisecond)
		require.NotNil(t, h.srv.Recv(t).GetProgressRequest())
	}
	b := h.watch(etcdwatch.Key("b"), 11) // from now, after every request
	cmds := h.obs.Count(etcdwatch.HookCommand)
	got := h.progressAsync() // joins the request in flight
	h.await(func() bool { return h.obs.Count(etcdwatch.HookCommand) > cmds })
	h.srv.Send(t, ws.Progress(-1, 11)) // a caught up: the answer to some request before b's create
	require.Equal(t, int64(11), recvProgress(t, first).rev)
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest(), "asked for the call that joined")
	h.srv.Send(t, ws.Progress(-1, 12)) // counted off as the second request's answer
	require.Equal(t, int64(12), recvProgress(t, got).rev, "answered: b is from now")
	res := h.watchAsync(context.Background(), etcdwatch.Key("marker"))
	require.NotNil(t, h.srv.Recv(t).GetCreateRequest(), "asked again after the call was answered")
	h.srv.Send(t, ws.Created(200, 12))
	require.NoError(t, recvResult(t, res).err)
	h.srv.Send(t, ws.Events(b.ID(), 13, ws.Put("b", "v", 13)))
	var bookmarked int64 // the last bookmark before b's next event
	r := next(t, b)
	for ; r.IsProgress(); r = next(t, b) {
		bookmarked = r.Revision
	}
	require.Equal(t, int64(12), bookmarked, "b bookmarked at the revision the call returned, as RequestProgress promises")
	require.Equal(t, int64(13), r.Revision, "b delivers on")
}

// TestProgressWaitsForAWatchCompactedJustPastItsRevision: a call waits
// across a stream's end; on the new stream, the watch it waits for asks
// for its own revision again and is compacted just past it, so it is
// created once more, from the next revision. The answer to the request
// sent before that create must not return the call: the watch's events
// at the compaction revision come after it. Catches the compaction's
// create, made on a stream the call already waits on, left out of what
// the call waits for.
func TestProgressWaitsForAWatchCompactedJustPastItsRevision(t *testing.T) {
	h := newHarness(t, etcdwatch.WithClock(clock.NewFake())) // no request asked again by the timer
	a := h.watch(etcdwatch.Key("a"), 10)
	h.srv.Send(t, ws.Events(a.ID(), 11, ws.Put("a", "v", 11)))
	require.EqualValues(t, 11, next(t, a).Revision)
	got := h.progressAsync()
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest())
	handled := h.obs.Count(etcdwatch.HookResponse) // the first stream's, all handled
	h.cut()
	c := h.srv.RecvCreate(t)
	require.EqualValues(t, 11, c.StartRevision, "at the head: asks for its own revision again")
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest(), "asked again on the new stream")
	h.srv.Send(t, ws.Created(c.WatchId, 12))
	h.srv.Send(t, ws.Compacted(c.WatchId, 12)) // just past its revision: created again from 12
	require.Equal(t, c.WatchId, h.srv.RecvCancel(t))
	again := h.srv.RecvCreate(t)
	require.EqualValues(t, 12, again.StartRevision)
	h.srv.Send(t, ws.Progress(-1, 12)) // to the request sent before that create
	h.await(func() bool { return h.obs.Count(etcdwatch.HookResponse) == handled+int(h.srv.Sent()) })
	select {
	case r := <-got:
		t.Fatalf("returned %v before the watch created again was confirmed", r)
	default:
	}
	h.srv.Send(t, ws.Created(again.WatchId, 12))
	h.srv.Send(t, ws.Events(again.WatchId, 12, ws.Put("a", "w", 12)))
	r := next(t, a)
	require.EqualValues(t, 12, r.Revision, "its event at the compaction revision")
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest(), "asked again once the create was answered")
	h.srv.Send(t, ws.Progress(-1, 12))
	require.EqualValues(t, 12, recvProgress(t, got).rev)
}

// TestLateEventsOfAnAnsweredCancelAreDropped: etcd may send a watch's last
// events after its answer to the watch's cancel (its send loop takes them
// from another queue). They are dropped: neither canceled again, as an id
// the server made up is, nor counted as unknown.
func TestLateEventsOfAnAnsweredCancelAreDropped(t *testing.T) {
	h := newHarness(t)
	a := h.watch(etcdwatch.Key("a"), 1)
	b := h.watch(etcdwatch.Key("b"), 1)
	id := a.ID()
	a.Cancel()
	require.Equal(t, id, h.srv.RecvCancel(t))
	h.srv.Send(t, ws.Canceled(id))
	h.srv.Send(t, ws.Events(id, 2, ws.Put("a", "v", 2)))
	h.srv.Send(t, ws.Events(b.ID(), 3, ws.Put("b", "v", 3)))
	require.Equal(t, int64(3), next(t, b).Revision) // a's late event handled before
	require.Empty(t, h.barrier(3), "the late event's id canceled again")
	require.Zero(t, h.s.Stats().UnknownResponses)
}

// TestProgressNotHeldByAWatchCanceledWhileQueuedToBeCreatedAgain:
// as TestProgressNotHeldByAWatchCanceledWhileCreatedAgain, for a watch
// canceled while it waits in line (one create at a time) to be created
// again, behind a create that is not answered.
func TestProgressNotHeldByAWatchCanceledWhileQueuedToBeCreatedAgain(t *testing.T) {
	h := newHarness(t, etcdwatch.WithClock(clock.NewFake()))
	res := h.watchAsync(t.Context(), etcdwatch.Key("b"))
	h.srv.RecvCreate(t)
	h.srv.Send(t, ws.Created(100, 10)) // its own id: one create at a time from now on
	b := recvResult(t, res).w
	ctxA, cancelA := context.WithCancel(t.Context())
	defer cancelA()
	resA := h.watchAsync(ctxA, etcdwatch.Key("a"))
	h.srv.RecvCreate(t) // in flight at the stream's end: created again first
	h.cut()
	require.Equal(t, "a", string(h.srv.RecvCreate(t).Key)) // b waits behind it
	b.Cancel()
	cancelA()
	require.Error(t, recvResult(t, resA).err)
	h.await(func() bool { return h.s.Stats().Watches == 0 })
	got := h.progressAsync()
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest())
	h.srv.Send(t, ws.Progress(-1, 10))
	require.Equal(t, int64(10), recvProgress(t, got).rev)
}

// TestEventsAfterFragmentsStandAlone: once a fragmented revision has
// arrived whole, the watch's next response carries its own events only,
// and a progress notification after it is delivered. Catches: the joined
// fragments kept after the last one, so that the next response repeats
// them and every later bookmark is taken for one inside a fragmented
// revision and dropped.
func TestEventsAfterFragmentsStandAlone(t *testing.T) {
	h := newHarness(t)
	w := h.watch(etcdwatch.Prefix("big/").WithFragment(), 1)
	first := ws.Events(w.ID(), 2, ws.Put("big/1", "v", 2), ws.Put("big/2", "v", 2))
	first.Fragment = true
	h.srv.Send(t, first)
	h.srv.Send(t, ws.Events(w.ID(), 2, ws.Put("big/3", "v", 2))) // the last piece
	r := next(t, w)
	require.Len(t, r.Events, 3)
	require.Equal(t, int64(2), r.Revision)

	h.srv.Send(t, ws.Events(w.ID(), 3, ws.Put("big/4", "v", 3)))
	r = next(t, w)
	require.Len(t, r.Events, 1, "the fragments' events delivered again")
	require.Equal(t, "big/4", string(r.Events[0].Key))
	require.Equal(t, int64(3), r.Revision)

	h.srv.Send(t, ws.Progress(w.ID(), 4))
	r = next(t, w)
	require.True(t, r.IsProgress(), "a bookmark after the fragments")
	require.Equal(t, int64(4), r.Revision)
	require.Zero(t, h.s.Stats().DuplicatesDropped)
}

// TestBookmarkInsideAFragmentedRevisionWaits: a progress notification that
// comes between the fragments of a revision is not delivered before the
// revision is whole, and does not make the rest of it count as
// duplicates. Catches: the bookmark delivered at the fragments' revision,
// after which their last piece is dropped, its events lost.
func TestBookmarkInsideAFragmentedRevisionWaits(t *testing.T) {
	h := newHarness(t)
	w := h.watch(etcdwatch.Prefix("big/").WithFragment(), 1)
	first := ws.Events(w.ID(), 2, ws.Put("big/1", "v", 2), ws.Put("big/2", "v", 2))
	first.Fragment = true
	h.srv.Send(t, first)
	h.srv.Send(t, ws.Progress(w.ID(), 2))
	h.srv.Send(t, ws.Events(w.ID(), 2, ws.Put("big/3", "v", 2))) // the last piece
	r := next(t, w)
	require.False(t, r.IsProgress(), "a bookmark inside a fragmented revision")
	require.Len(t, r.Events, 3)
	require.Equal(t, int64(2), r.Revision)
	require.Zero(t, h.s.Stats().DuplicatesDropped)
}

// TestLateEventsOfTheNewestWatchAfterItsCancelAreDropped: as
// TestLateEventsOfAnAnsweredCancelAreDropped, for the watch whose id is the
// last the client chose. Catches: that id taken for one the client never
// chose, canceled again and counted as unknown.
func TestLateEventsOfTheNewestWatchAfterItsCancelAreDropped(t *testing.T) {
	h := newHarness(t)
	a := h.watch(etcdwatch.Key("a"), 1)
	b := h.watch(etcdwatch.Key("b"), 1) // the last id chosen
	id := b.ID()
	b.Cancel()
	require.Equal(t, id, h.srv.RecvCancel(t))
	h.srv.Send(t, ws.Canceled(id))
	h.srv.Send(t, ws.Events(id, 2, ws.Put("b", "v", 2)))
	h.srv.Send(t, ws.Events(a.ID(), 3, ws.Put("a", "v", 3)))
	require.Equal(t, int64(3), next(t, a).Revision) // b's late event handled before
	require.Empty(t, h.barrier(3), "the late event's id canceled again")
	require.Zero(t, h.s.Stats().UnknownResponses)
}

// TestUnknownIDZeroIsCanceled: events for id 0, the first id a server that
// picks its own ids gives, when the client knows no watch by it, are
// dropped and the id is canceled, as any other unknown id is. Catches: id
// 0 left live on the server, sending events nobody reads.
func TestUnknownIDZeroIsCanceled(t *testing.T) {
	h := newHarness(t)
	w := h.watch(etcdwatch.Key("a"), 1)
	h.srv.Send(t, ws.Events(0, 2, ws.Put("stray", "v", 2)))
	h.srv.Send(t, ws.Events(w.ID(), 3, ws.Put("a", "v", 3)))
	require.Equal(t, int64(3), next(t, w).Revision)
	before := h.barrier(3)
	require.Len(t, before, 1)
	require.NotNil(t, before[0].GetCancelRequest(), "got %v", before[0])
	require.Equal(t, int64(0), before[0].GetCancelRequest().GetWatchId())
	require.Equal(t, uint64(1), h.s.Stats().UnknownResponses)
}

// watchWithID opens a watch of r that the server confirms with an id of
// its own choosing, as a gRPC proxy does, and checks the watch took it.
func (h *harness) watchWithID(r etcdwatch.Request, id int64) *etcdwatch.Watch {
	h.t.Helper()
	res := h.watchAsync(context.Background(), r)
	h.srv.RecvCreate(h.t)
	h.srv.Send(h.t, ws.Created(id, 1))
	w := recvResult(h.t, res).w
	require.Equal(h.t, id, w.ID())
	return w
}

// TestLateEventsOfAServerChosenIDAreCanceledAgain: after the server
// answered the cancel of a watch whose id it chose itself, a late event for
// that id cannot be told from one for an id the server made up: it is
// counted as unknown and the id canceled again (see
// TestLateEventsOfAnAnsweredCancelAreDropped for ids the client chose).
// Catches: a cancel's id kept after its answer, so that what comes for it
// is dropped unseen for the life of the stream, and every id canceled on
// it stays held.
func TestLateEventsOfAServerChosenIDAreCanceledAgain(t *testing.T) {
	h := newHarness(t)
	a := h.watchWithID(etcdwatch.Key("a"), 100)
	b := h.watchWithID(etcdwatch.Key("b"), 101)

	a.Cancel()
	require.Equal(t, int64(100), h.srv.RecvCancel(t))
	h.srv.Send(t, ws.Canceled(100))
	h.srv.Send(t, ws.Events(100, 2, ws.Put("a", "v", 2)))
	h.srv.Send(t, ws.Events(b.ID(), 3, ws.Put("b", "v", 3)))
	require.Equal(t, int64(3), next(t, b).Revision) // a's late event handled before
	before := h.barrier(3)
	require.Len(t, before, 1)
	require.Equal(t, int64(100), before[0].GetCancelRequest().GetWatchId())
	require.Equal(t, uint64(1), h.s.Stats().UnknownResponses)
}

// TestServerConfirmingAnIDInUseEndsTheNewWatch: a server that picks its
// own ids and confirms a create with the id of a watch that is active
// refuses the new watch with a *ServerError; the active one keeps its id
// and its events. Catches: the new watch taking the id over, the first
// one left without events and never ended.
func TestServerConfirmingAnIDInUseEndsTheNewWatch(t *testing.T) {
	h := newHarness(t)
	a := h.watchWithID(etcdwatch.Key("a"), 100)
	res := h.watchAsync(context.Background(), etcdwatch.Key("b"))
	h.srv.RecvCreate(t)
	h.srv.Send(t, ws.Created(100, 1)) // in use
	got := recvResult(t, res)
	var se *etcdwatch.ServerError
	require.ErrorAs(t, got.err, &se)
	h.srv.Send(t, ws.Events(100, 2, ws.Put("a", "v", 2)))
	r := next(t, a)
	require.Equal(t, "a", string(r.Events[0].Key))
	require.Equal(t, int64(2), r.Revision)
	require.Nil(t, a.Err())
}

// TestEndedWatchesDoNotCount: a watch counts in Stats.Watches no more
// once its end can be seen: a Watch call the server refused, or made on a
// Stream that failed for good, has returned its error; a watch the server
// ended has its Err set. Each is tried many times over. Catches: the count
// taken off after the caller or the consumer was told, so that Stats read
// at once still counted the watch (1 run in 100 to 200, each trying once).
func TestEndedWatchesDoNotCount(t *testing.T) {
	h := newHarness(t)
	for range 50 {
		res := h.watchAsync(context.Background(), etcdwatch.Key("a"))
		c := h.srv.RecvCreate(t)
		h.srv.Send(t, &pb.WatchResponse{Header: ws.Header(1), WatchId: c.WatchId, Created: true, Canceled: true, CancelReason: "etcdserver: permission denied"})
		require.ErrorIs(t, recvResult(t, res).err, etcdwatch.ErrPermissionDenied)
		require.Zero(t, h.s.Stats().Watches, "a watch the server refused still counted")
	}
	for range 50 {
		w := h.watch(etcdwatch.Key("a"), 1)
		h.srv.Send(t, &pb.WatchResponse{Header: ws.Header(1), WatchId: w.ID(), Canceled: true, CancelReason: "etcdserver: permission denied"})
		require.ErrorIs(t, ended(t, w), etcdwatch.ErrPermissionDenied)
		require.Zero(t, h.s.Stats().Watches, "a watch the server ended still counted")
	}
	w := h.watch(etcdwatch.Key("a"), 1)
	h.srv.Close(status.Error(codes.PermissionDenied, "etcdserver: permission denied"))
	require.ErrorIs(t, ended(t, w), etcdwatch.ErrStreamFailed)
	require.Zero(t, h.s.Stats().Watches, "a watch of a failed Stream still counted")
	for range 50 {
		_, err := h.s.Watch(context.Background(), etcdwatch.Key("b"))
		require.ErrorIs(t, err, etcdwatch.ErrStreamFailed)
		require.Zero(t, h.s.Stats().Watches, "a watch refused by a failed Stream still counted")
	}
}

// TestStatsRevisionFollowsEveryHeader: Stats.Revision is the highest
// header revision so far, one revision after another.
func TestStatsRevisionFollowsEveryHeader(t *testing.T) {
	h := newHarness(t)
	w := h.watch(etcdwatch.Key("a"), 5)
	require.Equal(t, int64(5), h.s.Stats().Revision)
	for rev := int64(6); rev <= 8; rev++ {
		h.srv.Send(t, ws.Events(w.ID(), rev, ws.Put("a", "v", rev)))
		require.Equal(t, rev, next(t, w).Revision)
		require.Equal(t, rev, h.s.Stats().Revision)
	}
}

// afterFuncCounter is a context that counts the AfterFunc registrations
// made on it and not yet stopped: context.AfterFunc uses its method, once
// Value hides the cancelCtx it wraps.
type afterFuncCounter struct {
	context.Context
	mu   sync.Mutex
	live int
}

func (c *afterFuncCounter) Value(any) any { return nil }

func (c *afterFuncCounter) AfterFunc(f func()) func() bool {
	stop := context.AfterFunc(c.Context, f)
	c.mu.Lock()
	c.live++
	c.mu.Unlock()
	var once sync.Once
	return func() bool {
		stopped := stop()
		once.Do(func() {
			c.mu.Lock()
			c.live--
			c.mu.Unlock()
		})
		return stopped
	}
}

func (c *afterFuncCounter) registered() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.live
}

// TestCanceledWatchReleasesItsContext: a watch whose context outlives it
// lets go of its registration with the context once it ends, so that a
// long-lived context does not collect one for every watch opened under it.
// Catches: the AfterFunc of a group left registered after its last watch
// was canceled.
func TestCanceledWatchReleasesItsContext(t *testing.T) {
	h := newHarness(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	c := &afterFuncCounter{Context: ctx}
	res := h.watchAsync(c, etcdwatch.Key("a"))
	create := h.srv.RecvCreate(t)
	h.srv.Send(t, ws.Created(create.WatchId, 1))
	w := recvResult(t, res).w
	require.Equal(t, 1, c.registered())
	w.Cancel()
	require.Equal(t, w.ID(), h.srv.RecvCancel(t))
	h.await(func() bool { return h.s.Stats().Watches == 0 })
	require.Zero(t, c.registered(), "the context still holds the watch's AfterFunc")
}

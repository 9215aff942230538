package etcdwatch_test

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/etcdwatch/etcdwatch"
	ws "github.com/etcdwatch/etcdwatch/internal/watchserver"
)

// isolated opens an isolated watch on h's Stream, which goes on a second
// gRPC stream: the first isolated watch opens it, and the server side of
// that stream is returned with the watch.
func (h *harness) isolated(r etcdwatch.Request, rev int64, iso *ws.Stream) (*etcdwatch.Watch, *ws.Stream) {
	h.t.Helper()
	r.Isolated = true
	res := h.watchAsync(context.Background(), r)
	if iso == nil {
		iso = h.server.Accept(h.t)
	}
	c := iso.RecvCreate(h.t)
	iso.Send(h.t, ws.Created(c.WatchId, rev))
	got := recvResult(h.t, res)
	require.NoError(h.t, got.err)
	return got.w, iso
}

// TestIsolatedWatchProgressIsNotHeldUp: isolated watches share a gRPC
// stream of their own. A progress request for one of them goes on that
// stream only, and is answered while the main stream's server stays
// silent (as etcd does while a watch there catches up); the Stream-wide
// RequestProgress asks both, and waits for the slower.
func TestIsolatedWatchProgressIsNotHeldUp(t *testing.T) {
	h := newHarness(t)
	neighbour := h.watch(etcdwatch.Key("n").FromRevision(1), 3) // catching up: the main stream answers no progress
	v, iso := h.isolated(etcdwatch.Prefix("v/"), 5, nil)
	w, _ := h.isolated(etcdwatch.Prefix("w/"), 5, iso)
	require.Equal(t, int64(3), h.s.Stats().Watches, "the Stream counts the watches of both its gRPC streams")

	got := make(chan progressResult, 1)
	go func() {
		rev, err := v.RequestProgress(context.Background())
		got <- progressResult{rev, err}
	}()
	require.NotNil(t, iso.Recv(t).GetProgressRequest(), "asked on the isolated stream")
	iso.Send(t, ws.Progress(-1, 9))
	r := recvProgress(t, got)
	require.NoError(t, r.err)
	require.Equal(t, int64(9), r.rev)
	for _, x := range []*etcdwatch.Watch{v, w} {
		b := next(t, x)
		require.True(t, b.IsProgress())
		require.Equal(t, int64(9), b.Revision, "every watch of the isolated stream gets the bookmark")
	}
	h.watch(etcdwatch.Key("x"), 9) // its create is the next request on the main stream: no progress request came before it

	all := h.progressAsync()
	require.NotNil(t, iso.Recv(t).GetProgressRequest())
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest())
	iso.Send(t, ws.Progress(-1, 12))
	select {
	case r := <-all:
		t.Fatalf("Stream.RequestProgress returned %v before the main stream answered", r)
	default:
	}
	h.srv.Send(t, ws.Progress(-1, 11))
	r = recvProgress(t, all)
	require.NoError(t, r.err)
	require.Equal(t, int64(11), r.rev, "every watch has queued its events up to the lower answer")
	require.Equal(t, int64(11), next(t, neighbour).Revision)
}

// TestWatchAllOverBothLanes: one WatchAll of watches on both lanes sends
// each lane's creates on its own gRPC stream, in the order of the call,
// and returns the watches in that order, each with the id its own stream
// confirmed.
func TestWatchAllOverBothLanes(t *testing.T) {
	h := newHarness(t)
	keys := []string{"a", "b", "c", "d", "e"}
	isolated := []bool{false, true, false, true, true}
	rs := make([]etcdwatch.Request, len(keys))
	for i, k := range keys {
		rs[i] = etcdwatch.Key(k)
		rs[i].Isolated = isolated[i]
	}
	type result struct {
		ws  []*etcdwatch.Watch
		err error
	}
	done := make(chan result, 1)
	go func() {
		ws, err := h.s.WatchAll(context.Background(), rs...)
		done <- result{ws, err}
	}()
	iso := h.server.Accept(t)
	ids := make(map[string]int64)
	for _, lane := range []struct {
		srv  *ws.Stream
		keys []string
	}{{h.srv, []string{"a", "c"}}, {iso, []string{"b", "d", "e"}}} {
		for _, k := range lane.keys {
			c := lane.srv.RecvCreate(t)
			require.Equal(t, k, string(c.Key), "creates in the call's order on each stream")
			ids[k] = c.WatchId
			lane.srv.Send(t, ws.Created(c.WatchId, 5))
		}
	}
	r := recv(t, done, "WatchAll")
	require.NoError(t, r.err)
	require.Len(t, r.ws, len(keys))
	for i, w := range r.ws {
		require.Equal(t, keys[i], string(w.Request().Key), "watches in the order of the requests")
		require.Equal(t, ids[keys[i]], w.ID())
	}
}

// TestOpeningIsolatedLaneKeepsTheStreamConnected: while the isolated lane
// opens for the first isolated watch, its server not answering yet, the
// Stream's State stays as the main lane's; once that server has answered
// the lane counts, and its stream failing reads as a disconnection.
func TestOpeningIsolatedLaneKeepsTheStreamConnected(t *testing.T) {
	h := newHarness(t)
	h.watch(etcdwatch.Key("a"), 3)
	require.True(t, h.s.State().Connected)
	r := etcdwatch.Prefix("v/")
	r.Isolated = true
	res := h.watchAsync(context.Background(), r)
	iso := h.server.Accept(t)
	c := iso.RecvCreate(t)
	require.True(t, h.s.State().Connected, "an isolated lane not answered yet")
	iso.Send(t, ws.Created(c.WatchId, 3))
	got := recvResult(t, res)
	require.NoError(t, got.err)
	require.True(t, h.s.State().Connected)
	iso.Close(status.Error(codes.Unavailable, "member going away"))
	h.await(func() bool { return !h.s.State().Connected })
}

// TestStreamOfIsolatedWatchesAloneIsConnected: a Stream whose only
// watches are isolated (views) asks nothing of its main stream, whose
// server so never answers; the Stream reads connected once the isolated
// stream's server has, and disconnected when that stream ends. It read
// disconnected until the main stream's first liveness probe, 30 s by
// default, so README's alert on etcdwatch_connected fired for every
// program of views alone.
func TestStreamOfIsolatedWatchesAloneIsConnected(t *testing.T) {
	h := newHarness(t)
	require.False(t, h.s.State().Connected, "nothing answered yet")
	_, iso := h.isolated(etcdwatch.Prefix("v/"), 5, nil)
	require.True(t, h.s.State().Connected)
	ctx, cancel := context.WithCancel(context.Background())
	res := h.watchAsync(ctx, etcdwatch.Key("a"))
	h.srv.RecvCreate(t) // asked of the main stream now, not answered
	require.False(t, h.s.State().Connected, "a watch waits on a main stream whose server has never answered")
	cancel()
	require.ErrorIs(t, recvResult(t, res).err, context.Canceled)
	iso.Close(status.Error(codes.Unavailable, "member going away"))
	h.await(func() bool { return !h.s.State().Connected }, "the isolated stream's end noticed")
}

// TestStreamOfViewsOpenedDuringAnOutageIsConnectedOnceBack: the same
// Stream of isolated watches alone, opened while its member was down.
// Once the member is back its main stream opens, and the isolated stream's
// server answers: the Stream reads connected. Catches the connection
// failure met by the main stream as it first opened counting for ever:
// the Stream read disconnected until the main stream's first liveness
// probe (30 s by default), or for ever without the checks. Found by a
// review.
func TestStreamOfViewsOpenedDuringAnOutageIsConnectedOnceBack(t *testing.T) {
	server := ws.Start(t)
	f, s := openWhileDown(t, server)
	f.up()
	main := server.Accept(t) // the main stream is open, and probed (TestIdleFirstStreamOpenedAfterAnOutageIsProbed)
	probe := main.RecvCreate(t)
	main.Send(t, ws.Created(probe.WatchId, 5))
	require.Equal(t, probe.WatchId, main.RecvCancel(t))
	r := etcdwatch.Prefix("v/")
	r.Isolated = true
	res := watchAsync(context.Background(), s, r)
	iso := server.Accept(t)
	c := iso.RecvCreate(t)
	iso.Send(t, ws.Created(c.WatchId, 5))
	require.NoError(t, recvResult(t, res).err)
	st := s.State()
	require.True(t, st.Connected, "both streams open, the isolated one answering: %+v", st)
	require.ErrorContains(t, st.LastError, "scripted", "the outage's error is kept")
}

// TestLastErrorKeptOnceTheIsolatedLaneIsReplaced: the isolated stream's
// failure for good is the Stream's LastError, and stays it once the next
// isolated watch has opened a new isolated stream, as a LastError is kept
// after any stream is back. Catches the retired lane's error dropped with
// it. Found by a review.
func TestLastErrorKeptOnceTheIsolatedLaneIsReplaced(t *testing.T) {
	h := newHarness(t, etcdwatch.WithCallOptions(grpc.MaxCallRecvMsgSize(1<<10)))
	h.watch(etcdwatch.Key("m"), 5)
	v, iso := h.isolated(etcdwatch.Prefix("v/"), 5, nil)
	iso.Send(t, ws.Events(v.ID(), 6, ws.Put("v/x", strings.Repeat("x", 2<<10), 6))) // past the limit: fails for good
	require.ErrorIs(t, ended(t, v), etcdwatch.ErrStreamFailed)
	require.Equal(t, codes.ResourceExhausted, status.Code(h.s.State().LastError))
	h.isolated(etcdwatch.Prefix("w/"), 7, nil) // a new isolated stream, answered
	st := h.s.State()
	require.True(t, st.Connected)
	require.Equal(t, codes.ResourceExhausted, status.Code(st.LastError), "the last error is gone: %+v", st)
}

// TestStateSinceStaysWhenTheIsolatedLaneJoins: State.Since is when
// Connected last changed, so the isolated lane's stream answering later
// than the main one (a Stream's first view) does not move it. Catches the
// later of the two Sinces taken at each read:
// etcdwatch_state_since_timestamp_seconds jumping at a Stream's first view
// though it never disconnected.
func TestStateSinceStaysWhenTheIsolatedLaneJoins(t *testing.T) {
	h := newHarness(t)
	h.watch(etcdwatch.Key("m"), 5)
	mainUp := time.Now()
	h.isolated(etcdwatch.Prefix("v/"), 5, nil)
	st := h.s.State() // the first read, after the join
	require.True(t, st.Connected)
	require.True(t, st.Since.Before(mainUp), "Since %v is the isolated lane's answer, not the main one's", st.Since)
	require.Equal(t, st.Since, h.s.State().Since)
}

// TestStateSinceMovesAtABlipOfTheOnlyLane: a Stream of views alone is
// connected by its isolated lane; that lane going down and up again, even
// between two reads of State, moves Since. Catches the joining rule (see
// TestStateSinceStaysWhenTheIsolatedLaneJoins) applied to a lane that is
// the whole Stream.
func TestStateSinceMovesAtABlipOfTheOnlyLane(t *testing.T) {
	h := newHarness(t)
	w, iso := h.isolated(etcdwatch.Prefix("v/"), 5, nil)
	before := h.s.State()
	require.True(t, before.Connected)
	iso.Close(status.Error(codes.Unavailable, "member going away"))
	again := h.server.Accept(t)
	c := again.RecvCreate(t)
	again.Send(t, ws.Created(c.WatchId, 5))
	again.Send(t, ws.Events(c.WatchId, 6, ws.Put("v/a", "1", 6)))
	next(t, w)
	after := h.s.State()
	require.True(t, after.Connected)
	require.True(t, after.Since.After(before.Since), "down and up again, Since stayed at %v", after.Since)
}

// TestProgressLeavesOutALaneThatFailed: the main gRPC stream fails for good
// (a response above the receive limit), ending its watches; the isolated
// one goes on. Stream.RequestProgress answers for the isolated watches, as
// it would for a lane without watches. Catches the Stream's progress
// failing for ever with the main lane's error.
func TestProgressLeavesOutALaneThatFailed(t *testing.T) {
	h := newHarness(t, etcdwatch.WithCallOptions(grpc.MaxCallRecvMsgSize(1<<10)))
	main := h.watch(etcdwatch.Key("m"), 5)
	v, iso := h.isolated(etcdwatch.Prefix("v/"), 5, nil)
	h.srv.Send(t, ws.Events(main.ID(), 6, ws.Put("m", strings.Repeat("x", 2<<10), 6)))
	require.ErrorIs(t, ended(t, main), etcdwatch.ErrStreamFailed)

	got := h.progressAsync()
	require.NotNil(t, iso.Recv(t).GetProgressRequest())
	iso.Send(t, ws.Progress(-1, 9))
	r := recvProgress(t, got)
	require.NoError(t, r.err)
	require.Equal(t, int64(9), r.rev)
	require.True(t, next(t, v).IsProgress())
}

// TestHandleFailingForGoodEndsEveryWatchWithIt: a call whose watches are on
// both lanes, the main one failing for good while the isolated create is
// unanswered, fails with ErrStreamFailed, and each of its watches ends
// with that error, not ErrCanceled. Catches: the failure taken for the
// refusal of the one watch it reached first, the others told they were
// canceled.
func TestHandleFailingForGoodEndsEveryWatchWithIt(t *testing.T) {
	h := newHarness(t)
	rec := newRecorder()
	iso := etcdwatch.Key("iso")
	iso.Isolated = true
	res := h.handleAsync(context.Background(), rec.handler(), etcdwatch.Key("main"), iso)
	isoSrv := h.server.Accept(t)
	h.srv.RecvCreate(t)
	isoSrv.RecvCreate(t) // never answered
	h.srv.Close(status.Error(codes.PermissionDenied, "etcdserver: permission denied"))
	r := recv(t, res, "Handle")
	require.ErrorIs(t, r.err, etcdwatch.ErrStreamFailed)
	rec.await(t, func() bool { return len(rec.ends) == 2 }, "both watches ended")
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for w, err := range rec.ends {
		require.ErrorIs(t, err, etcdwatch.ErrStreamFailed, "watch %q ends with the call's error", w.Request().Key)
	}
}

// TestIsolatedLaneFailedForGoodIsReplaced: when the isolated watches'
// stream fails for good (a response above the receive limit), its watches
// end; the Stream's State says what happened without reading as a
// disconnection of the Stream, whose main stream works on; and the next
// isolated watch gets a new stream. Catches: isolated watches (so every
// view) refused for good, with a State that looks like a passing outage.
func TestIsolatedLaneFailedForGoodIsReplaced(t *testing.T) {
	h := newHarness(t, etcdwatch.WithCallOptions(grpc.MaxCallRecvMsgSize(1<<10)))
	main := h.watch(etcdwatch.Key("m"), 5)
	v, iso := h.isolated(etcdwatch.Prefix("v/"), 5, nil)
	iso.Send(t, ws.Events(v.ID(), 6, ws.Put("v/x", strings.Repeat("x", 2<<10), 6)))
	require.ErrorIs(t, ended(t, v), etcdwatch.ErrStreamFailed)

	st := h.s.State()
	require.True(t, st.Connected, "the main stream is connected: %+v", st)
	require.NoError(t, st.Failed, "the Stream can watch")
	require.Equal(t, codes.ResourceExhausted, status.Code(st.LastError), "the isolated stream's failure is the last error")

	w, iso2 := h.isolated(etcdwatch.Prefix("w/"), 7, nil) // on a new gRPC stream: nil makes isolated accept one
	iso2.Send(t, ws.Events(w.ID(), 8, ws.Put("w/a", "1", 8)))
	require.Equal(t, int64(8), next(t, w).Revision, "the new isolated stream delivers")
	h.srv.Send(t, ws.Events(main.ID(), 8, ws.Put("m", "1", 8)))
	require.Equal(t, int64(8), next(t, main).Revision, "the main stream works on")
}

// TestRetiredLanesExit: each isolated lane replaced after failing for good
// exits; a Stream whose isolated watches fail for good again and again
// keeps no goroutine for each. Catches: every replaced lane's dispatcher
// left running, refusing, until Close.
func TestRetiredLanesExit(t *testing.T) {
	h := newHarness(t, etcdwatch.WithCallOptions(grpc.MaxCallRecvMsgSize(1<<10)))
	h.watch(etcdwatch.Key("m"), 5)
	fail := func() { // an isolated watch on a new lane, which a response above the limit fails for good
		v, iso := h.isolated(etcdwatch.Prefix("v/"), 5, nil)
		iso.Send(t, ws.Events(v.ID(), 6, ws.Put("v/x", strings.Repeat("x", 2<<10), 6)))
		require.ErrorIs(t, ended(t, v), etcdwatch.ErrStreamFailed)
	}
	fail()
	fail() // the first lane retired
	before := runtime.NumGoroutine()
	const n = 30
	for range n {
		fail()
	}
	require.Eventually(t, func() bool { return runtime.NumGoroutine() < before+n/3 }, wait, time.Millisecond,
		"goroutines: %d before %d lanes failed for good and were replaced, %d after", before, n, runtime.NumGoroutine())
}

// TestWaitExplainedByItsOwnLane: a Watch on the main stream that gives up
// is explained by the main stream's state, not by the isolated stream's
// failure (nor the other way round): here the main stream answers, and the
// isolated one has lost its server.
func TestWaitExplainedByItsOwnLane(t *testing.T) {
	h := newHarness(t)
	h.watch(etcdwatch.Key("a"), 3)
	_, iso := h.isolated(etcdwatch.Prefix("v/"), 3, nil)
	iso.Close(status.Error(codes.Unavailable, "isolated member going away"))
	h.await(func() bool { return !h.s.State().Connected }, "the isolated stream's end noticed")

	ctx, cancel := context.WithCancel(context.Background())
	res := h.watchAsync(ctx, etcdwatch.Key("b"))
	h.srv.RecvCreate(t) // never answered
	cancel()
	got := recvResult(t, res)
	require.ErrorIs(t, got.err, context.Canceled)
	require.NotContains(t, got.err.Error(), "isolated member going away", "explained by the other stream's failure")
}

// TestProgressOverARetiredLaneIsNotClosed: a RequestProgress of the
// Stream, asked while its isolated stream had failed for good, is not
// failed with ErrClosed when the next isolated watch replaces that stream:
// the Stream is open, and the main stream answers. The call waited on the
// answer and on the retired lane's end together, and took either, so
// each round below failed it with even odds.
func TestProgressOverARetiredLaneIsNotClosed(t *testing.T) {
	h := newHarness(t, etcdwatch.WithCallOptions(grpc.MaxCallRecvMsgSize(1<<10)))
	main := h.watch(etcdwatch.Key("m"), 5)
	v, iso := h.isolated(etcdwatch.Prefix("v/"), 5, nil)
	for round := range 20 {
		iso.Send(t, ws.Events(v.ID(), 6, ws.Put("v/x", strings.Repeat("x", 2<<10), 6))) // above the limit: failed for good
		require.ErrorIs(t, ended(t, v), etcdwatch.ErrStreamFailed)
		got := h.progressAsync()
		require.NotNil(t, h.srv.Recv(t).GetProgressRequest())
		v, iso = h.isolated(etcdwatch.Prefix("v/"), 7, nil) // replaces the failed stream
		rev := 9 + int64(round)
		h.srv.Send(t, ws.Progress(-1, rev))
		r := recvProgress(t, got)
		require.NoError(t, r.err, "round %d", round)
		require.Equal(t, rev, r.rev)
		require.True(t, next(t, main).IsProgress())
	}
}

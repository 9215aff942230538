package etcdwatch_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/etcdwatch/etcdwatch"
	"github.com/etcdwatch/etcdwatch/internal/clock"
	ws "github.com/etcdwatch/etcdwatch/internal/watchserver"
)

// confirmCreates reads n creates, confirms them in order at revision rev and
// indexes them by key.
func confirmCreates(t *testing.T, st *ws.Stream, n int, rev int64) map[string]*pb.WatchCreateRequest {
	t.Helper()
	m := map[string]*pb.WatchCreateRequest{}
	for range n {
		c := st.RecvCreate(t)
		m[string(c.Key)] = c
		st.Send(t, ws.Created(c.WatchId, rev))
	}
	return m
}

// TestResumeFromNextRevision: after the stream breaks, every watch is
// re-created on a new stream from the revision after what it delivered
// (its last event, its last bookmark, or its creation), keeps its channel,
// and drops what the new stream sends again.
func TestResumeFromNextRevision(t *testing.T) {
	h := newHarness(t)
	events := h.watch(etcdwatch.Key("events"), 10)
	marked := h.watch(etcdwatch.Key("marked").FromRevision(5), 10)
	quiet := h.watch(etcdwatch.Key("quiet"), 30)
	h.srv.Send(t, ws.Events(events.ID(), 11, ws.Put("events", "v", 11)))
	h.srv.Send(t, ws.Events(marked.ID(), 11, ws.Put("marked", "v", 5), ws.Put("marked", "v", 6)))
	h.srv.Send(t, ws.Progress(marked.ID(), 20))
	require.Equal(t, int64(11), next(t, events).Revision)
	require.Equal(t, int64(6), next(t, marked).Revision)
	require.Equal(t, int64(20), next(t, marked).Revision)

	h.cut()
	c := confirmCreates(t, h.srv, 3, 40)
	require.Equal(t, int64(12), c["events"].StartRevision, "after events: last event + 1")
	require.Equal(t, int64(21), c["marked"].StartRevision, "after a bookmark: bookmark + 1")
	// A watch from now that saw nothing resumes at its created header: etcd
	// reads it after registering the watch, so writes racing the create
	// sit at or below it.
	require.Equal(t, int64(30), c["quiet"].StartRevision)
	h.srv.Send(t, ws.Events(c["events"].WatchId, 40, ws.Put("events", "old", 11), ws.Put("events", "v", 12)))
	h.srv.Send(t, ws.Events(c["marked"].WatchId, 40, ws.Put("marked", "v", 21)))
	r := next(t, events)
	require.Len(t, r.Events, 1, "the replayed revision 11 must be dropped")
	require.Equal(t, int64(12), r.Events[0].ModRevision)
	require.Equal(t, int64(21), next(t, marked).Revision)
	require.Equal(t, c["quiet"].WatchId, quiet.ID())
	st := h.s.Stats()
	require.Equal(t, uint64(1), st.Reconnects)
	require.Equal(t, uint64(3), st.Moved)
	require.Equal(t, uint64(1), st.DuplicatesDropped)
	require.Nil(t, events.Err())
}

// TestPendingCreateSurvivesReconnect: a Watch call whose create was in
// flight when the stream broke is answered on the next stream.
func TestPendingCreateSurvivesReconnect(t *testing.T) {
	h := newHarness(t)
	res := h.watchAsync(context.Background(), etcdwatch.Key("a"))
	first := h.srv.RecvCreate(t)
	require.Equal(t, int64(0), first.StartRevision)
	h.cut()
	again := h.srv.RecvCreate(t)
	require.Equal(t, int64(0), again.StartRevision, "never confirmed, so still from now")
	h.srv.Send(t, ws.Created(again.WatchId, 3))
	got := recvResult(t, res)
	require.NoError(t, got.err)
	require.Equal(t, again.WatchId, got.w.ID())
}

// TestRequestProgressSurvivesReconnect: a waiting RequestProgress call asks
// the new stream.
func TestRequestProgressSurvivesReconnect(t *testing.T) {
	h := newHarness(t)
	w := h.watch(etcdwatch.Key("a"), 3)
	got := h.progressAsync()
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest())
	h.cut()
	var sawCreate, sawProgress bool
	for !sawCreate || !sawProgress {
		req := h.srv.Recv(t)
		if c := req.GetCreateRequest(); c != nil {
			sawCreate = true
			h.srv.Send(t, ws.Created(c.WatchId, 7))
		}
		sawProgress = sawProgress || req.GetProgressRequest() != nil
	}
	h.srv.Send(t, ws.Progress(-1, 7))
	r := recvProgress(t, got)
	require.NoError(t, r.err)
	require.Equal(t, int64(7), r.rev)
	require.Equal(t, int64(7), next(t, w).Revision)
}

// TestSilentStreamIsReplaced: a stream that stops answering is probed, then
// replaced; its watches carry on over the new one.
func TestSilentStreamIsReplaced(t *testing.T) {
	const idle, timeout = 20 * time.Millisecond, 50 * time.Millisecond
	clk := clock.NewFake()
	var logs logRecorder
	h := newHarness(t, etcdwatch.WithClock(clk), etcdwatch.WithLiveness(idle, timeout), etcdwatch.WithLogger(slog.New(&logs)))
	w := h.watch(etcdwatch.Key("a"), 3) // heard now; the clock stands still: no probe yet
	require.True(t, h.s.State().Connected, "the server answered on the stream")
	awaitArmed(t, clk, idle)
	clk.Advance(idle) // quiet for idle since the last message: a probe
	// The probe is answered, as etcd would; the stream stays, and the
	// probe watch is released.
	probe := h.srv.RecvCreate(t)
	require.NotEqual(t, "a", string(probe.Key))
	require.Zero(t, probe.StartRevision, "a probe watches from now, with no history for etcd to replay")
	h.srv.Send(t, ws.Created(probe.WatchId, 3))
	require.Equal(t, probe.WatchId, h.srv.RecvCancel(t))
	require.Equal(t, uint64(1), h.s.Stats().Created, "the watch's create; a probe's answer counts as none")
	awaitArmed(t, clk, idle) // idle from the answer
	clk.Advance(idle)
	// The next probe is not answered: once its timeout has passed, the
	// stream must be given up.
	silent := h.srv
	require.NotEqual(t, "a", string(silent.RecvCreate(t).Key))
	awaitArmed(t, clk, timeout)
	clk.Advance(timeout - time.Millisecond)
	etcdwatch.Settle(t, h.s, wait)
	require.Zero(t, h.s.Stats().Reconnects, "replaced before its timeout")
	require.True(t, h.s.State().Connected, "unanswered for less than idle plus timeout")
	clk.Advance(time.Millisecond)
	require.True(t, silent.Ended(t), "silent stream not ended")
	h.await(func() bool { return h.s.Stats().Reconnects == 1 })
	require.False(t, h.s.State().Connected, "a replaced stream's server has not answered yet")
	h.srv = h.server.Accept(t)
	c := h.srv.RecvCreate(t)
	require.Equal(t, "a", string(c.Key))
	require.Equal(t, int64(3), c.StartRevision)
	h.srv.Send(t, ws.Created(c.WatchId, 9))
	h.srv.Send(t, ws.Events(c.WatchId, 9, ws.Put("a", "v", 9)))
	require.Equal(t, int64(9), next(t, w).Revision)
	require.True(t, h.s.State().Connected)
	// Down from the probe's answer, the last message, to the new stream's
	// first: the silence counts, not only the time after it was noticed.
	require.Equal(t, 1, logs.count("INFO etcdwatch: watch stream back down="+(idle+timeout).String()), "%q", logs.all())
	require.Equal(t, uint64(1), h.s.Stats().Reconnects)
	require.Equal(t, int64(1), h.s.Stats().Watches, "probes are not watches")
}

// TestRequireLeaderMetadata: WithRequireLeader marks the stream so that etcd
// refuses it on a member without a leader.
func TestRequireLeaderMetadata(t *testing.T) {
	h := newHarness(t, etcdwatch.WithRequireLeader())
	require.Equal(t, []string{"true"}, h.srv.Metadata().Get("hasleader"))
	plain := newHarness(t)
	require.Empty(t, plain.srv.Metadata().Get("hasleader"))
}

// TestCloseWhileReconnecting: Close during the backoff wait ends cleanly.
func TestCloseWhileReconnecting(t *testing.T) {
	h := newHarness(t, etcdwatch.WithReconnectBackoff(time.Hour, time.Hour))
	w := h.watch(etcdwatch.Key("a"), 3)
	h.cut() // first retry is immediate
	h.srv.RecvCreate(t)
	h.srv.Close(status.Error(codes.Unavailable, "again")) // the second waits an hour
	h.await(func() bool { return h.s.Stats().Reconnects == 2 })
	require.NoError(t, h.s.Close())
	require.ErrorIs(t, ended(t, w), etcdwatch.ErrClosed)
}

// TestStaleTokenGetsOneNewStream: a re-create refused for an invalid auth
// token is tried once more on a new stream, which carries the connection's
// current credentials; refused again, the watch ends.
func TestStaleTokenGetsOneNewStream(t *testing.T) {
	var logs logRecorder
	h := newHarness(t, etcdwatch.WithLogger(slog.New(&logs)))
	w := h.watch(etcdwatch.Key("a"), 3)
	other := h.watch(etcdwatch.Key("b"), 3)
	// Every stream from here on answers creates in order, refusing "a" for
	// its token. A refusal that comes while another create is in flight on a
	// stream that has echoed no id cannot be matched and costs a stream of
	// its own, so how many streams it takes depends on the creates' order;
	// what must hold is one retry for the token, then the end.
	serve := func(st *ws.Stream) {
		for req := range st.Requests() {
			switch c := req.GetCreateRequest(); {
			case string(c.GetKey()) == "a":
				st.Send(t, ws.CreateFailed(staleToken))
			case c != nil:
				st.Send(t, ws.Created(c.WatchId, 5))
			}
		}
	}
	var serving sync.WaitGroup // one per stream; each ends with its stream
	done := make(chan struct{})
	serving.Go(func() { // hands each new stream to serve until the test is over
		for {
			select {
			case st := <-h.server.Streams():
				serving.Go(func() { serve(st) })
			case <-done:
				return
			}
		}
	})
	defer func() {
		close(done)
		require.NoError(t, h.s.Close()) // ends the last stream, and its serve
		serving.Wait()
	}()
	h.srv.Close(status.Error(codes.Unavailable, "member going away"))
	require.ErrorIs(t, ended(t, w), etcdwatch.ErrUnauthenticated)
	require.Nil(t, other.Err(), "the other watch carries on")
	require.Equal(t, 1, logs.count("create refused for its credentials; trying a new stream"), "one retry for a stale token")
}

// staleToken is etcd's refusal of a create for an expired or invalid token.
const staleToken = "rpc error: code = Unauthenticated desc = etcdserver: invalid auth token"

// requireEndsUnauthenticated fails t unless w, refused twice in a row for
// a stale token, ends with ErrUnauthenticated rather than being tried on
// another stream.
func requireEndsUnauthenticated(t *testing.T, h *harness, w *etcdwatch.Watch) {
	t.Helper()
	select {
	case <-w.Done():
		require.ErrorIs(t, w.Err(), etcdwatch.ErrUnauthenticated)
	case next := <-h.server.Streams():
		t.Fatalf("refused twice in a row for its token, the watch was tried on another stream (create %d)", next.RecvCreate(t).WatchId)
	case <-time.After(wait):
		t.Fatal("neither the watch's end nor a new stream")
	}
}

// TestStaleTokenRetryCutBeforeItsAnswerStillCounts: a create refused for
// a stale token is tried once more on a new stream; that stream is cut
// before it answers, and the stream after refuses it again. Two refusals
// in a row end the watch, whatever came between them (README, Known
// limits): a retry counts from when it is due, so that no sequence of
// refusals and cuts can keep a watch going from stream to stream.
func TestStaleTokenRetryCutBeforeItsAnswerStillCounts(t *testing.T) {
	h := newHarness(t)
	w := h.watch(etcdwatch.Key("a"), 3)
	h.cut()
	h.srv.RecvCreate(t)
	h.srv.Send(t, ws.CreateFailed(staleToken)) // the first refusal: a new stream
	h.srv = h.server.Accept(t)
	h.srv.RecvCreate(t) // the retry, on the new stream...
	h.cut()             // ...which is cut before it answers
	h.srv.RecvCreate(t)
	h.srv.Send(t, ws.CreateFailed(staleToken)) // the second refusal in a row
	requireEndsUnauthenticated(t, h, w)
}

// TestStaleTokenRefusedAsItsStreamEnds: the first refusal for a stale
// token arrives as its stream ends for another reason (a cut), so that the
// dispatcher takes it from the ended stream, after the cut's error has
// ended the session. The refusal counts: the retry goes on the next
// stream, and a second refusal in a row ends the watch, rather than the
// watch getting a third stream (or, against a server that always refuses
// and cuts, new streams for ever).
func TestStaleTokenRefusedAsItsStreamEnds(t *testing.T) {
	obs := etcdwatch.NewObserver()
	var armed atomic.Bool
	held, release := make(chan struct{}), make(chan struct{})
	gate := func(p etcdwatch.Hook) { // holds the dispatcher after the response handled once armed
		if p == etcdwatch.HookResponse && armed.CompareAndSwap(true, false) {
			close(held)
			<-release
		}
	}
	server := ws.Start(t)
	s, err := etcdwatch.Open(server.Dial(t), etcdwatch.WithGate(obs, gate), etcdwatch.WithProgressRetry(time.Hour, time.Hour))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	letGo := sync.OnceFunc(func() { close(release) })
	t.Cleanup(letGo) // first: a test that failed while holding the dispatcher lets Close end
	h := &harness{t: t, s: s, obs: obs, server: server, srv: server.Accept(t)}

	w := h.watch(etcdwatch.Key("a"), 3)
	h.cut()
	h.srv.RecvCreate(t) // a created again on the new stream
	armed.Store(true)
	h.srv.Send(t, ws.Progress(-1, 3)) // handled, then the dispatcher is held
	<-held
	received, exited := h.obs.Count(etcdwatch.HookReceived), h.obs.Count(etcdwatch.HookExited)
	h.srv.Send(t, ws.CreateFailed(staleToken)) // the first refusal...
	h.await(func() bool { return h.obs.Count(etcdwatch.HookReceived) == received+1 })
	h.srv.Close(status.Error(codes.Unavailable, "member going away")) // ...and the stream's end, before the dispatcher sees either
	h.await(func() bool { return h.obs.Count(etcdwatch.HookExited) == exited+1 })
	letGo()
	h.srv = h.server.Accept(t)
	h.srv.RecvCreate(t)                        // the retry
	h.srv.Send(t, ws.CreateFailed(staleToken)) // refused again: the second in a row
	requireEndsUnauthenticated(t, h, w)
}

// TestStaleTokenRefusedWithACutEveryTimeEnds: a server that refuses every
// create for a stale token and cuts the stream as it does, with two
// watches created one at a time. Each must end with ErrUnauthenticated
// after one retry: a cut must not give back the spent retry of the watch
// that waits in toCreate while the other is refused.
func TestStaleTokenRefusedWithACutEveryTimeEnds(t *testing.T) {
	obs := etcdwatch.NewObserver()
	var mu sync.Mutex
	var held, release chan struct{}
	gate := func(p etcdwatch.Hook) { // holds the dispatcher after the response handled once armed
		if p != etcdwatch.HookResponse {
			return
		}
		mu.Lock()
		h, r := held, release
		held, release = nil, nil
		mu.Unlock()
		if h != nil {
			close(h)
			<-r
		}
	}
	server := ws.Start(t)
	s, err := etcdwatch.Open(server.Dial(t), etcdwatch.WithGate(obs, gate),
		etcdwatch.WithProgressRetry(time.Hour, time.Hour), etcdwatch.WithReconnectBackoff(time.Millisecond, time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	letGo := func() {}            // lets the dispatcher go on, if the test holds it
	t.Cleanup(func() { letGo() }) // first: a test that failed while holding the dispatcher lets Close end
	h := &harness{t: t, s: s, obs: obs, server: server, srv: server.Accept(t)}

	ctx := context.Background()
	resA := h.watchAsync(ctx, etcdwatch.Key("a"))
	h.srv.RecvCreate(t)
	resB := h.watchAsync(ctx, etcdwatch.Key("b"))
	h.srv.RecvCreate(t)
	h.srv.Send(t, ws.CreateFailed(staleToken)) // two in flight, unproven: unmatched; the next streams create one at a time

	ended := 0
	for streams := 1; ended < 2; {
		select {
		case r := <-resA:
			require.ErrorIs(t, r.err, etcdwatch.ErrUnauthenticated)
			ended++
			resA = nil
			continue
		case r := <-resB:
			require.ErrorIs(t, r.err, etcdwatch.ErrUnauthenticated)
			ended++
			resB = nil
			continue
		case h.srv = <-server.Streams():
		case <-time.After(wait):
			t.Fatal("neither a watch's end nor a new stream")
		}
		streams++
		if streams > 12 {
			t.Fatalf("after %d streams, each refusing for a stale token and cut, %d of 2 watches ended", streams-1, ended)
		}
		h.srv.RecvCreate(t)
		mu.Lock()
		held, release = make(chan struct{}), make(chan struct{})
		hd, rl := held, release
		mu.Unlock()
		letGo = sync.OnceFunc(func() { close(rl) })
		h.srv.Send(t, ws.Progress(-1, 3)) // handled, then the dispatcher is held
		<-hd
		received, exited := obs.Count(etcdwatch.HookReceived), obs.Count(etcdwatch.HookExited)
		h.srv.Send(t, ws.CreateFailed(staleToken)) // a refusal...
		h.await(func() bool { return obs.Count(etcdwatch.HookReceived) == received+1 })
		h.srv.Close(status.Error(codes.Unavailable, "member going away")) // ...and a cut, together
		h.await(func() bool { return obs.Count(etcdwatch.HookExited) == exited+1 })
		letGo()
	}
}

// TestStaleTokenRetryRefusedBehindAStallEnds: a watch's retry for a stale
// token is refused again while the stream stalls for a slow consumer, and
// the stream is cut before that refusal is read, so the client never sees
// it. The retry goes again on the next stream, still spent: a refusal
// there ends the watch with ErrUnauthenticated rather than earning it yet
// another stream.
func TestStaleTokenRetryRefusedBehindAStallEnds(t *testing.T) {
	clk := clock.NewFake()
	h := newHarness(t, etcdwatch.WithClock(clk), etcdwatch.WithBufferLimit(1),
		etcdwatch.WithReconnectBackoff(time.Millisecond, time.Millisecond))
	ctx := context.Background()

	h.watch(etcdwatch.Key("x"), 3) // an echoed id: the stream is trusted
	resW := h.watchAsync(ctx, etcdwatch.Key("a"))
	h.srv.RecvCreate(t)
	resV := h.watchAsync(ctx, etcdwatch.Key("v"))
	h.srv.RecvCreate(t)                        // v in flight behind a
	h.srv.Send(t, ws.CreateFailed(staleToken)) // a's first refusal: a new stream, v first on it

	h.srv = h.server.Accept(t)
	cV := h.srv.RecvCreate(t)
	require.Equal(t, "v", string(cV.Key))
	cA := h.srv.RecvCreate(t) // a's retry
	require.Equal(t, "a", string(cA.Key))
	h.srv.RecvCreate(t) // x
	h.srv.Send(t, ws.Created(cV.WatchId, 3))
	v := recvResult(t, resV).w                                   // its consumer never reads
	h.srv.Send(t, ws.Events(cV.WatchId, 4, ws.Put("v", "1", 4))) // v at its limit: the stream stalls for it
	h.await(func() bool { return h.s.Stats().Stalls == 1 })
	received, exited, ends := h.obs.Count(etcdwatch.HookReceived), h.obs.Count(etcdwatch.HookExited), h.obs.Count(etcdwatch.HookStreamEnd)
	h.srv.Send(t, ws.CreateFailed(staleToken)) // a's retry refused: its second refusal...
	h.await(func() bool { return h.obs.Count(etcdwatch.HookReceived) == received+1 })
	h.srv.Close(status.Error(codes.Unavailable, "member going away")) // ...then a cut, while the stall holds it unread
	h.await(func() bool { return h.obs.Count(etcdwatch.HookExited) == exited+1 })
	h.await(func() bool { return h.obs.Count(etcdwatch.HookStreamEnd) == ends+1 })
	_ = v

	awaitArmed(t, clk, time.Millisecond) // the next stream's backoff
	clk.Advance(time.Millisecond)
	h.srv = h.server.Accept(t)
	// a and x are created again (v is paused), a first: refused with x in
	// flight on a stream that has echoed no id, the refusal cannot be
	// matched, and the stream after takes one create at a time.
	require.Equal(t, "a", string(h.srv.RecvCreate(t).Key))
	require.Equal(t, "x", string(h.srv.RecvCreate(t).Key))
	h.srv.Send(t, ws.CreateFailed(staleToken))
	require.True(t, h.srv.Ended(t), "an unmatched refusal ends the stream")
	awaitArmed(t, clk, time.Millisecond)
	clk.Advance(time.Millisecond)
	h.srv = h.server.Accept(t)
	require.Equal(t, "a", string(h.srv.RecvCreate(t).Key))
	h.srv.Send(t, ws.CreateFailed(staleToken)) // matched: its retry was spent long ago
	select {
	case r := <-resW:
		require.ErrorIs(t, r.err, etcdwatch.ErrUnauthenticated)
	case <-h.server.Streams():
		t.Fatal("refused again on the stream after, its retry spent, the watch was tried on yet another stream")
	case <-time.After(wait):
		t.Fatal("neither the watch's end nor a new stream")
	}
}

// logRecorder is a slog.Handler that keeps the messages it is given, each
// after its level and followed by its attributes ("WARN etcdwatch: ...
// err=...").
type logRecorder struct {
	mu   sync.Mutex
	msgs []string
}

func (l *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logRecorder) WithGroup(string) slog.Handler            { return l }
func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := r.Level.String() + " " + r.Message
	r.Attrs(func(a slog.Attr) bool {
		m += " " + a.String()
		return true
	})
	l.msgs = append(l.msgs, m)
	return nil
}

// all returns a copy of the messages, for a failure's text.
func (l *logRecorder) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.msgs...)
}

// count returns how many messages contained s.
func (l *logRecorder) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, m := range l.msgs {
		if strings.Contains(m, s) {
			n++
		}
	}
	return n
}

// TestSeriesOfCutsReconnectsAtOnce: a stream that worked is replaced at
// once, however many were cut before it: with a backoff that would wait
// 100ms doubling up to an hour for streams that fail, ten cuts in a row of
// working streams each get a new stream within the wait.
func TestSeriesOfCutsReconnectsAtOnce(t *testing.T) {
	const spacing = 100 * time.Millisecond
	clk := clock.NewFake()
	h := newHarness(t, etcdwatch.WithClock(clk), etcdwatch.WithReconnectBackoff(spacing, time.Hour))
	w := h.watch(etcdwatch.Key("a"), 1)
	h.srv.Send(t, ws.Events(w.ID(), 2, ws.Put("a", "v", 2)))
	require.Equal(t, int64(2), next(t, w).Revision)
	for rev := int64(3); rev < 13; rev++ {
		h.srv.Close(status.Error(codes.Unavailable, "member going away"))
		if rev > 3 { // the clock stands still: an immediate retry waits out min since the last
			awaitArmed(t, clk, spacing)
			clk.Advance(spacing)
		}
		h.srv = h.server.Accept(t)
		c := h.srv.RecvCreate(t)
		// At the store's head: the revision it has, asked again, whose
		// event the server sends again and the watch drops.
		require.Equal(t, rev-1, c.StartRevision)
		h.srv.Send(t, ws.Created(c.WatchId, rev-1))
		h.srv.Send(t, ws.Events(c.WatchId, rev-1, ws.Put("a", "v", rev-1)))
		h.srv.Send(t, ws.Events(c.WatchId, rev, ws.Put("a", "v", rev)))
		require.Equal(t, rev, next(t, w).Revision)
	}
	require.Equal(t, uint64(10), h.s.Stats().Reconnects)
	require.Zero(t, h.s.Stats().DuplicatesDropped, "the events asked for again are expected, not duplicates")
}

// TestNoLeaderRefusalsArePolled: a member without a leader refuses every
// stream that requires one, before anything is said on it. Such refusals
// are retried every few tens of milliseconds rather than backed off, so
// the watch is back as soon as a leader is.
func TestNoLeaderRefusalsArePolled(t *testing.T) {
	noLeader := status.Error(codes.Unavailable, "etcdserver: no leader")
	clk := clock.NewFake()
	h := newHarness(t, etcdwatch.WithClock(clk), etcdwatch.WithRequireLeader(), etcdwatch.WithReconnectBackoff(time.Hour, time.Hour))
	w := h.watch(etcdwatch.Key("a"), 1)
	h.srv.Close(noLeader) // the stream worked: replaced at once
	for range 5 {
		h.srv = h.server.Accept(t)
		h.srv.Close(noLeader) // refused before anything: polled, not backed off for an hour
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		d, ok := clk.AwaitArmedIn(ctx, 25*time.Millisecond, 50*time.Millisecond)
		cancel()
		require.True(t, ok, "no retry within 25-50ms armed; armed: %v", clk.Armed())
		clk.Advance(d)
	}
	h.srv = h.server.Accept(t)
	c := h.srv.RecvCreate(t)
	require.Equal(t, int64(1), c.StartRevision, "from its created header: it saw nothing")
	h.srv.Send(t, ws.Created(c.WatchId, 2))
	h.srv.Send(t, ws.Events(c.WatchId, 2, ws.Put("a", "v", 2)))
	require.Equal(t, int64(2), next(t, w).Revision)
	require.Equal(t, uint64(6), h.s.Stats().Reconnects)
}

// TestConnectionBackoffIsCutShort: a stream waiting for a connection in
// TRANSIENT_FAILURE resets the connection's backoff, so that gRPC's own
// (1s, then 1.6 times longer each time) does not keep the watches away
// from a member that is back: five refused connection attempts take gRPC
// over 10s alone, and well within the wait with the Stream hurrying them.
func TestConnectionBackoffIsCutShort(t *testing.T) {
	server := ws.Start(t)
	var attempts atomic.Int64
	conn, err := grpc.NewClient("passthrough:///flaky",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			if attempts.Add(1) <= 5 {
				return nil, errors.New("connection refused (scripted)")
			}
			return server.Connect(ctx)
		}),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	s, err := etcdwatch.Open(conn, etcdwatch.WithConnectRetry(10*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	res := watchAsync(context.Background(), s, etcdwatch.Key("a"))
	srv := server.Accept(t)
	c := srv.RecvCreate(t)
	srv.Send(t, ws.Created(c.WatchId, 1))
	require.NoError(t, recvResult(t, res).err)
	require.Greater(t, attempts.Load(), int64(5))
}

// TestAbandonedCreatesAreNotSent: Watch calls that give up while the
// stream waits for its connection stop counting at once, and their creates
// never reach the server once the connection is back.
func TestAbandonedCreatesAreNotSent(t *testing.T) {
	const n = 20
	server := ws.Start(t)
	var up atomic.Bool
	conn, err := grpc.NewClient("passthrough:///down",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			if !up.Load() {
				return nil, errors.New("connection refused (scripted)")
			}
			return server.Connect(ctx)
		}),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	obs := etcdwatch.NewObserver()
	s, err := etcdwatch.Open(conn, etcdwatch.WithConnectRetry(5*time.Millisecond), etcdwatch.WithObserver(obs))
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })

	ctx, cancel := context.WithCancel(context.Background())
	var calls sync.WaitGroup
	for i := range n {
		calls.Go(func() {
			_, err := s.Watch(ctx, etcdwatch.Key(fmt.Sprint("gone/", i)))
			assert.ErrorIs(t, err, context.Canceled)
		})
	}
	obs.Await(t, wait, func() bool { return s.Stats().Watches == n })
	cancel()
	calls.Wait()
	obs.Await(t, wait, func() bool { return s.Stats().Watches == 0 }, "abandoned watches still counted")

	res := watchAsync(context.Background(), s, etcdwatch.Key("kept"))
	obs.Await(t, wait, func() bool { return s.Stats().Watches == 1 })
	etcdwatch.Settle(t, s, wait) // its create is queued: the stream has a create to send as it opens, and is not probed
	up.Store(true)
	srv := server.Accept(t)
	c := srv.RecvCreate(t)
	require.Equal(t, "kept", string(c.Key), "an abandoned watch's create was sent")
	srv.Send(t, ws.Created(c.WatchId, 1))
	require.NoError(t, recvResult(t, res).err)
	require.Equal(t, int64(1), s.Stats().Watches)
}

// TestMovedCountsConfirmedWatches: Stats.Moved counts a watch re-created
// after a reconnect once the new stream confirms it, not when it is queued.
func TestMovedCountsConfirmedWatches(t *testing.T) {
	h := newHarness(t)
	w := h.watch(etcdwatch.Key("a"), 1)
	h.cut()
	c := h.srv.RecvCreate(t)
	require.Zero(t, h.s.Stats().Moved, "counted before the server confirmed it")
	h.srv.Send(t, ws.Created(c.WatchId, 2))
	h.srv.Send(t, ws.Events(c.WatchId, 2, ws.Put("a", "v", 2)))
	require.Equal(t, int64(2), next(t, w).Revision)
	require.Equal(t, uint64(1), h.s.Stats().Moved)
}

// TestProgressOffWhereItRunsAhead: on an etcd whose progress answers can
// run ahead of its events (#15220), learned from the Status RPC at Open,
// RequestProgress fails with ErrProgressUnsupported and sends nothing, and
// a stream-wide answer to a request sent before the release was known
// gives no bookmark: an event at or below its revision is still delivered.
func TestProgressOffWhereItRunsAhead(t *testing.T) {
	server := ws.StartRelease(t, "3.4.23")
	s, err := etcdwatch.Open(server.Dial(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	h := &harness{t: t, s: s, server: server, srv: server.Accept(t)}
	w := h.watch(etcdwatch.Key("a"), 1)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	_, err = s.RequestProgress(ctx) // held until the Stream knows the release
	require.ErrorIs(t, err, etcdwatch.ErrProgressUnsupported, "RequestProgress on etcd 3.4.23")
	h.srv.Send(t, ws.Progress(-1, 20)) // late, or unasked: ahead of revision 5 below
	h.srv.Send(t, ws.Events(w.ID(), 20, ws.Put("a", "v", 5)))
	r := next(t, w)
	require.False(t, r.IsProgress(), "a stream-wide bookmark was delivered")
	require.Equal(t, int64(5), r.Revision)
	require.Zero(t, s.Stats().DuplicatesDropped)
}

// TestProgressOnWhereItIsSafe: on a fixed release, RequestProgress works.
func TestProgressOnWhereItIsSafe(t *testing.T) {
	for _, version := range []string{"3.4.25", "3.5.8", "3.5.35", "3.6.16", "3.7.3"} {
		server := ws.StartRelease(t, version)
		s, err := etcdwatch.Open(server.Dial(t))
		require.NoError(t, err)
		h := &harness{t: t, s: s, server: server, srv: server.Accept(t)}
		w := h.watch(etcdwatch.Key("a"), 1)
		got := h.progressAsync()
		require.NotNil(t, h.srv.Recv(t).GetProgressRequest(), version)
		h.srv.Send(t, ws.Progress(-1, 7))
		require.NoError(t, recvProgress(t, got).err, version)
		require.True(t, next(t, w).IsProgress(), version)
		require.NoError(t, s.Close())
	}
}

// wrappedConn hides every method of its connection but those of
// grpc.ClientConnInterface, as a wrapper adding metadata to RPCs does.
type wrappedConn struct{ grpc.ClientConnInterface }

// TestConnectivityOfAWrappedConnection: a Stream on a wrapper that hides
// the connection's state learns it from WithConnectivity: when the
// connection's owner closes it, the watches end at once with an error
// wrapping ErrStreamFailed, rather than waiting on a connection that will
// never come back.
func TestConnectivityOfAWrappedConnection(t *testing.T) {
	server := ws.Start(t)
	conn := server.Dial(t)
	s, err := etcdwatch.Open(wrappedConn{conn}, etcdwatch.WithConnectivity(conn))
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	h := &harness{t: t, s: s, server: server, srv: server.Accept(t)}
	w := h.watch(etcdwatch.Key("a"), 1)
	require.NoError(t, conn.Close())
	require.ErrorIs(t, ended(t, w), etcdwatch.ErrStreamFailed)
	require.Zero(t, s.Stats().Reconnects, "a closed connection was retried")
}

// TestReceiveLimitIsKept: a grpc.MaxCallRecvMsgSize given with
// WithCallOptions bounds the responses the Stream takes. A revision above
// it ends the watches with ResourceExhausted, as clientv3's do, rather
// than being fetched again on a new stream, and again, for ever; State's
// Failed says so.
func TestReceiveLimitIsKept(t *testing.T) {
	h := newHarness(t, etcdwatch.WithCallOptions(grpc.MaxCallRecvMsgSize(1<<10)))
	w := h.watch(etcdwatch.Key("a"), 1)
	require.NoError(t, h.s.State().Failed)
	h.srv.Send(t, ws.Events(w.ID(), 2, ws.Put("a", strings.Repeat("v", 2<<10), 2)))
	err := ended(t, w)
	require.ErrorIs(t, err, etcdwatch.ErrStreamFailed)
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	require.Zero(t, h.s.Stats().Reconnects, "the same revision was asked for again")
	require.Equal(t, err, h.s.State().Failed, "State says the Stream failed for good, and why")
}

// TestCreatesQueuedBetweenStreamsAfterAProxy: after a stream given up as
// unmatched (a proxy picking its own ids), the next stream takes one create
// at a time, those queued while waiting to reconnect included: the proxy
// answers a create whose range it already watches first, so only one in
// flight can be matched. Catches: creates queued between streams sent back
// to back under the last stream's policy, and the events of "b" reaching
// watch "z" matched by order.
func TestCreatesQueuedBetweenStreamsAfterAProxy(t *testing.T) {
	clk := clock.NewFake()
	h := newHarness(t, etcdwatch.WithClock(clk), etcdwatch.WithReconnectBackoff(time.Hour, time.Hour))
	z := h.watch(etcdwatch.Key("z"), 1)
	h.srv.Close(status.Error(codes.Unavailable, "member going away"))
	h.srv = h.server.Accept(t)
	h.srv.RecvCreate(t)
	h.watchAsync(context.Background(), etcdwatch.Key("a"))
	h.srv.RecvCreate(t)
	h.srv.Send(t, ws.Created(0, 1))
	require.True(t, h.srv.Ended(t))
	awaitArmed(t, clk, time.Hour)
	h.watchAsync(context.Background(), etcdwatch.Key("b"))
	h.await(func() bool { return h.s.Stats().Watches == 3 }) // b's create handled
	clk.Advance(time.Hour)
	h.srv = h.server.Accept(t)
	// One create in flight: its answer, under the proxy's own id, is the
	// next create's cue.
	ids := map[string]int64{}
	for id := int64(100); id < 103; id++ {
		c := h.srv.RecvCreate(t)
		require.Empty(t, h.barrier(5), "a second create went out before %q was answered", c.Key)
		ids[string(c.Key)] = id
		h.srv.Send(t, ws.Created(id, 5))
	}
	require.Len(t, ids, 3)
	h.srv.Send(t, ws.Events(ids["b"], 6, ws.Put("b", "v", 6)))
	h.srv.Send(t, ws.Events(ids["z"], 7, ws.Put("z", "v", 7)))
	r := next(t, z)
	for r.IsProgress() { // the markers' bookmarks
		r = next(t, z)
	}
	require.Equal(t, "z", string(r.Events[0].Key), "watch on z got an event for another key")
}

// TestSilentStreamThatNeverAnsweredDidNotWork: a stream whose server never
// answered, given up as silent after the liveness idle and timeout (longer
// than the healthy period), did not work: the next one waits its backoff,
// and the outage counts from when the watches last heard. Catches: such a
// stream counted as one that worked, resetting the backoff and the
// outage's start (the "back" log then said down=0s).
func TestSilentStreamThatNeverAnsweredDidNotWork(t *testing.T) {
	var logs logRecorder
	clk := clock.NewFake()
	h := newHarness(t, etcdwatch.WithClock(clk), etcdwatch.WithLogger(slog.New(&logs)),
		etcdwatch.WithLiveness(30*time.Second, 10*time.Second), etcdwatch.WithReconnectBackoff(time.Second, time.Second))
	h.watch(etcdwatch.Key("a"), 3)
	h.srv.Close(status.Error(codes.Unavailable, "member going away")) // it worked: the next at once
	h.srv = h.server.Accept(t)
	h.srv.RecvCreate(t) // never answered: a hung member
	awaitArmed(t, clk, 30*time.Second)
	clk.Advance(30 * time.Second)
	h.srv.RecvCreate(t) // the probe, never answered
	awaitArmed(t, clk, 10*time.Second)
	clk.Advance(10 * time.Second) // given up as silent
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	d, ok := clk.AwaitArmedIn(ctx, 500*time.Millisecond, time.Second)
	require.True(t, ok, "the next stream waits its backoff; armed: %v", clk.Armed())
	clk.Advance(d)
	h.srv = h.server.Accept(t)
	c := h.srv.RecvCreate(t)
	h.srv.Send(t, ws.Created(c.WatchId, 3))
	h.await(func() bool {
		return logs.count("INFO etcdwatch: watch stream back down="+(40*time.Second+d).String()) == 1
	}, "down from the cut")
}

// movedAtItsHead opens watch a at revision 1, delivers its event at 2,
// cuts the stream, and confirms, at revision 3, the create that moves the
// watch to the new stream: from its own revision 2, at the head (see
// entry.start). It returns the watch and that create.
func movedAtItsHead(t *testing.T, h *harness) (*etcdwatch.Watch, *pb.WatchCreateRequest) {
	t.Helper()
	w := h.watch(etcdwatch.Key("a"), 1)
	h.srv.Send(t, ws.Events(w.ID(), 2, ws.Put("a", "v", 2)))
	require.Equal(t, int64(2), next(t, w).Revision)
	h.cut()
	c := h.srv.RecvCreate(t)
	require.Equal(t, int64(2), c.StartRevision, "at the head: from its own revision")
	h.srv.Send(t, ws.Created(c.WatchId, 3))
	return w, c
}

// TestTrapCompactedJustPastItsRevision: a watch at the store's head is
// re-created from its own revision r (see entry.start). If the store was
// written and compacted at r+1 meanwhile, etcd cancels that create as
// compacted, though everything the watch needs, r+1 on, is there: it is
// created again from r+1 and goes on. Catches a watch ended with "needs
// revision r+1; history starts at r+1".
func TestTrapCompactedJustPastItsRevision(t *testing.T) {
	h := newHarness(t)
	w, c := movedAtItsHead(t, h)
	h.srv.Send(t, ws.Compacted(c.WatchId, 3))
	require.Equal(t, c.WatchId, h.srv.RecvCancel(t), "the compacted watcher is canceled on the server")
	again := h.srv.RecvCreate(t)
	require.Equal(t, int64(3), again.StartRevision)
	h.srv.Send(t, ws.Created(again.WatchId, 4))
	h.srv.Send(t, ws.Events(again.WatchId, 4, ws.Put("a", "w", 4)))
	require.Equal(t, int64(4), next(t, w).Revision)
	require.Nil(t, w.Err())
}

// TestTrapRecreateIsBookmarked: a RequestProgress call made while a watch
// was active waits for that watch even when the compaction trap creates it
// again under the call: the answer to the request sent before the new
// create cannot cover it, so the call asks again, and the watch gets its
// bookmark. etcd answers that request before it confirms the new create
// (the order it takes them in); the other order is checked too. Catches:
// the call returning the first answer's revision while the watch got no
// bookmark, as RequestProgress promises each watch.
func TestTrapRecreateIsBookmarked(t *testing.T) {
	for _, answerFirst := range []bool{true, false} {
		t.Run(fmt.Sprintf("answer first %v", answerFirst), func(t *testing.T) {
			h := newHarness(t)
			w, c := movedAtItsHead(t, h)
			h.await(func() bool { return h.s.Stats().Moved == 1 }, "moved")
			got := h.progressAsync()
			require.NotNil(t, h.srv.Recv(t).GetProgressRequest())
			h.srv.Send(t, ws.Compacted(c.WatchId, 3)) // the trap: created again from 3
			require.Equal(t, c.WatchId, h.srv.RecvCancel(t))
			again := h.srv.RecvCreate(t)
			require.Equal(t, int64(3), again.StartRevision)
			h.srv.Send(t, ws.Canceled(c.WatchId))
			if answerFirst {
				h.srv.Send(t, ws.Progress(-1, 4)) // the request sent before the new create
				h.srv.Send(t, ws.Created(again.WatchId, 4))
			} else {
				h.srv.Send(t, ws.Created(again.WatchId, 4))
				h.srv.Send(t, ws.Progress(-1, 4))
			}
			require.NotNil(t, h.srv.Recv(t).GetProgressRequest(), "asked again, for the watch created since")
			h.srv.Send(t, ws.Progress(-1, 5))
			r := recvProgress(t, got)
			require.NoError(t, r.err)
			require.Equal(t, int64(5), r.rev)
			b := next(t, w)
			require.True(t, b.IsProgress(), "the watch's bookmark")
			require.Equal(t, int64(5), b.Revision)
		})
	}
}

// TestTrapRecreateConfirmedIsAWatchLikeAnyOther: once the compaction
// trap's re-create is confirmed, the watch is waited for by RequestProgress
// as any watch is: paused later for its consumer and resumed before the
// call, its resume is waited for as any create in flight is (see
// TestProgressWaitsForAResumeSentBeforeIt), and it gets the bookmark.
func TestTrapRecreateConfirmedIsAWatchLikeAnyOther(t *testing.T) {
	h := newHarness(t, etcdwatch.WithBufferLimit(2), etcdwatch.WithStallBudget(0))
	w, c := movedAtItsHead(t, h)
	h.srv.Send(t, ws.Compacted(c.WatchId, 3)) // the trap: created again from 3
	require.Equal(t, c.WatchId, h.srv.RecvCancel(t))
	again := h.srv.RecvCreate(t)
	h.srv.Send(t, ws.Canceled(c.WatchId))
	h.srv.Send(t, ws.Created(again.WatchId, 3))
	for rev := int64(3); rev <= 5; rev++ { // unread: paused at the limit
		h.srv.Send(t, ws.Events(again.WatchId, rev, ws.Put("a", "v", rev)))
	}
	require.Equal(t, again.WatchId, h.srv.RecvCancel(t), "paused")
	h.srv.Send(t, ws.Canceled(again.WatchId))
	// The stream has seen 5 before the consumer catches up: else the watch
	// resumes from 4 itself, the highest revision seen (see
	// TestPausedWatchCompactedWhileAway), whose event the server then sends
	// again, a duplicate the watch drops.
	h.await(func() bool { return h.s.Stats().Revision >= 5 })
	for read := int64(0); read < 4; { // 3 and 4, perhaps joined in one response
		read = next(t, w).Revision
	}
	resume := h.srv.RecvCreate(t) // not confirmed yet
	require.Equal(t, int64(5), resume.StartRevision)
	got := h.progressAsync()
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest())
	h.srv.Send(t, ws.Progress(-1, 5)) // before the resume's created response
	h.srv.Send(t, ws.Created(resume.WatchId, 5))
	h.srv.Send(t, ws.Events(resume.WatchId, 5, ws.Put("a", "v", 5)))
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest(), "asked again once the resume was answered")
	// Its event is read, and its pump done, first: a bookmark counts as an
	// event, and queued behind it would reach the limit of 2, and pause the
	// watch again.
	require.Equal(t, int64(5), next(t, w).Events[0].ModRevision)
	h.await(h.obs.PumpsIdle)
	h.srv.Send(t, ws.Progress(-1, 5))
	r := recvProgress(t, got)
	require.NoError(t, r.err)
	require.Equal(t, int64(5), r.rev)
	b := next(t, w)
	require.True(t, b.IsProgress(), "the watch's bookmark, after its event")
	require.Equal(t, int64(5), b.Revision)
}

// TestCompactedWatchIsCanceledOnTheServer: etcd keeps a watcher it
// canceled for a compaction on its stream until the client cancels it,
// and answers no stream-wide progress request while it is there. Catches
// a client that never canceled it: RequestProgress then waited for ever.
func TestCompactedWatchIsCanceledOnTheServer(t *testing.T) {
	h := newHarness(t)
	w := h.watch(etcdwatch.Key("a").FromRevision(2), 10)
	h.srv.Send(t, ws.Compacted(w.ID(), 5))
	var ce *etcdwatch.CompactedError
	require.ErrorAs(t, ended(t, w), &ce)
	require.Equal(t, w.ID(), h.srv.RecvCancel(t))
}

// TestProgressRequestsDoNotPileUpWhileDown: a RequestProgress call that
// waits through an outage asks again at every retry, but a request that
// has not gone out yet (the stream waits for its connection) is not joined
// by more: once the connection is back, one goes out, not one for each
// retry of the outage. Catches: a request queued at every retry, all sent
// at once on the new stream (an hour's outage at the default 250 ms: 14,400).
func TestProgressRequestsDoNotPileUpWhileDown(t *testing.T) {
	server := ws.Start(t)
	f := newFlaky(t, server)
	conn := f.conn
	clk := clock.NewFake()
	const retry = 10 * time.Millisecond
	s, err := etcdwatch.Open(conn, etcdwatch.WithClock(clk), etcdwatch.WithProgressRetry(retry, retry))
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	res := watchAsync(context.Background(), s, etcdwatch.Key("a"))
	srv := server.Accept(t)
	c := srv.RecvCreate(t)
	srv.Send(t, ws.Created(c.WatchId, 1))
	require.NoError(t, recvResult(t, res).err)
	got := make(chan progressResult, 1)
	go func() { // once the Stream knows the server's release, which holds calls until then
		rev, err := s.RequestProgress(context.Background())
		got <- progressResult{rev, err}
	}()
	require.NotNil(t, srv.Recv(t).GetProgressRequest())
	srv.Send(t, ws.Progress(-1, 1))
	require.NoError(t, recvProgress(t, got).err)

	f.down() // the member goes away: the stream ends, and the next waits for a connection
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	backoff, ok := clk.AwaitArmedIn(ctx, 0, time.Second) // the new stream's backoff
	require.True(t, ok, "no backoff armed; armed: %v", clk.Armed())
	clk.Advance(backoff)
	awaitWaitingForConnection(t, s)
	go func() { // ends when answered, or at ctx's end
		rev, err := s.RequestProgress(ctx)
		got <- progressResult{rev, err}
	}()
	for range 20 { // the call asks again 20 times while the connection is down
		awaitArmed(t, clk, retry)
		clk.Advance(retry)
	}

	f.up()
	srv = server.Accept(t)
	c = srv.RecvCreate(t)
	require.Equal(t, "a", string(c.Key))
	srv.Send(t, ws.Created(c.WatchId, 1))
	require.NotNil(t, srv.Recv(t).GetProgressRequest())
	srv.Send(t, ws.Progress(-1, 1))
	require.NoError(t, recvProgress(t, got).err)
	res = watchAsync(context.Background(), s, etcdwatch.Key("b")) // a marker: its create goes out after every request queued before
	progress := 1
	for {
		r := srv.Recv(t)
		if cr := r.GetCreateRequest(); cr != nil {
			require.Equal(t, "b", string(cr.Key))
			srv.Send(t, ws.Created(cr.WatchId, 1))
			break
		}
		require.NotNil(t, r.GetProgressRequest(), "%v", r)
		progress++
	}
	require.NoError(t, recvResult(t, res).err)
	require.Equal(t, 1, progress, "progress requests sent on the new stream")
}

// flaky is a connection to a scripted server whose member the test takes
// down (its connections cut, new ones refused) and brings back.
type flaky struct {
	conn     *grpc.ClientConn
	refusing atomic.Bool
	mu       sync.Mutex
	conns    []net.Conn
}

func newFlaky(t *testing.T, server *ws.Server) *flaky {
	f := &flaky{}
	conn, err := grpc.NewClient("passthrough:///flaky",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			if f.refusing.Load() {
				return nil, errors.New("connection refused (scripted)")
			}
			c, err := server.Connect(ctx)
			f.mu.Lock()
			f.conns = append(f.conns, c)
			f.mu.Unlock()
			return c, err
		}),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	f.conn = conn
	return f
}

// down cuts every connection to the member and refuses new ones.
func (f *flaky) down() {
	f.refusing.Store(true)
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.conns {
		_ = c.Close()
	}
	f.conns = nil
}

// up lets connections through again, at once.
func (f *flaky) up() {
	f.refusing.Store(false)
	f.conn.ResetConnectBackoff()
}

// TestLivenessWaitsForTheStreamToOpen: while the stream waits for a
// connection, the liveness checks neither probe it nor give it up as
// silent: they look again every idle, State keeps the connection's error,
// and no stream is counted as replaced. Once the member is back, the
// stream opens and the watch is created. Catches: a Warn "silent" every
// idle plus timeout of an outage, the session torn down and LastError
// replaced by errSilent.
func TestLivenessWaitsForTheStreamToOpen(t *testing.T) {
	server := ws.Start(t)
	f := newFlaky(t, server)
	f.refusing.Store(true) // down from the start
	clk := clock.NewFake()
	const idle, timeout = 3 * time.Second, 5 * time.Second
	s, err := etcdwatch.Open(f.conn, etcdwatch.WithClock(clk), etcdwatch.WithLiveness(idle, timeout))
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	res := watchAsync(context.Background(), s, etcdwatch.Key("a"))
	awaitWaitingForConnection(t, s)
	for range 5 { // the checks look again every idle; had they probed, the next would be due at timeout
		awaitArmed(t, clk, idle)
		clk.Advance(idle)
	}
	require.Zero(t, s.Stats().Reconnects, "a stream waiting for its connection was given up as silent")
	require.Contains(t, fmt.Sprint(s.State().LastError), "scripted", "State keeps why the stream cannot open")

	f.up()
	srv := server.Accept(t)
	c := srv.RecvCreate(t)
	require.Equal(t, "a", string(c.Key))
	srv.Send(t, ws.Created(c.WatchId, 1))
	require.NoError(t, recvResult(t, res).err)
}

// TestIdleStreamConnectedAgainAfterReconnect: a Stream without watches
// whose stream ended probes the new one at once, so that State reads
// Connected again within a round trip of the server's return, rather than
// a liveness idle later (never, with the checks off). A group leaves a
// Stream that does not read so out of its placement.
func TestIdleStreamConnectedAgainAfterReconnect(t *testing.T) {
	h := newHarness(t, etcdwatch.WithLiveness(0, 0), etcdwatch.WithReconnectBackoff(time.Millisecond, time.Millisecond))
	w := h.watch(etcdwatch.Key("a"), 3)
	id := w.ID()
	w.Cancel()
	require.Equal(t, id, h.srv.RecvCancel(t))
	require.True(t, h.s.State().Connected)
	h.cut()
	h.await(func() bool { return h.s.Stats().Reconnects == 1 })
	require.False(t, h.s.State().Connected, "the new stream's server has not answered yet")
	probe := h.srv.RecvCreate(t)
	require.NotEqual(t, "a", string(probe.Key))
	require.Zero(t, probe.StartRevision, "a probe watches from now")
	h.srv.Send(t, ws.Created(probe.WatchId, 3))
	h.await(func() bool { return h.s.State().Connected }, "an idle Stream whose server answers again reads connected")
	require.Equal(t, probe.WatchId, h.srv.RecvCancel(t))
	require.Zero(t, h.s.Stats().Watches, "probes are not watches")
}

// TestOutageCountsFromTheLastMessageHeard: the "watch stream back" log
// says how long the watches were down, from the last message heard. A
// stream in the middle of the outage that never answered, though open for
// longer than a stream needs to count as having worked, does not restart
// that count. Found by a review.
func TestOutageCountsFromTheLastMessageHeard(t *testing.T) {
	var logs logRecorder
	clk := clock.NewFake()
	h := newHarness(t, etcdwatch.WithClock(clk), etcdwatch.WithLogger(slog.New(&logs)),
		etcdwatch.WithReconnectBackoff(time.Second, time.Second))
	h.watch(etcdwatch.Key("a"), 3) // the last message heard: now
	h.cut()                        // the stream that worked ends; the next goes at once
	h.srv.RecvCreate(t)            // never answered: a hung member
	clk.Advance(15 * time.Second)  // open past 10 s, short of the liveness idle
	h.srv.Close(status.Error(codes.Unavailable, "member going away"))
	h.srv = h.server.Accept(t)
	c := h.srv.RecvCreate(t)
	h.srv.Send(t, ws.Created(c.WatchId, 3))
	h.await(func() bool { return logs.count("INFO etcdwatch: watch stream back") == 1 })
	require.Equal(t, 1, logs.count("INFO etcdwatch: watch stream back down=15s"), "%q", logs.all())
}

// TestStreamOpenedAfterAWaitForItsConnectionDidNotWork: a stream worked if
// the server answered on it, or it stayed open 10 s. One that waited 15 s
// for its connection, opened, and was ended at once before it answered was
// open for no time: the next stream waits its backoff. Catches the 10 s
// counted from when the stream began to wait: the next went at once, its
// backoff reset. Found by a review.
func TestStreamOpenedAfterAWaitForItsConnectionDidNotWork(t *testing.T) {
	server := ws.Start(t)
	f := newFlaky(t, server)
	clk := clock.NewFake()
	s, err := etcdwatch.Open(f.conn, etcdwatch.WithClock(clk), etcdwatch.WithReconnectBackoff(time.Second, time.Second))
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	res := watchAsync(context.Background(), s, etcdwatch.Key("a"))
	srv := server.Accept(t)
	c := srv.RecvCreate(t)
	srv.Send(t, ws.Created(c.WatchId, 1))
	require.NoError(t, recvResult(t, res).err)
	f.down() // the stream that worked ends; the next waits for a connection
	awaitWaitingForConnection(t, s)
	clk.Advance(15 * time.Second) // waiting, not open
	f.up()
	srv = server.Accept(t)
	srv.RecvCreate(t)
	srv.Close(status.Error(codes.Unavailable, "member going away")) // before answering anything
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	_, ok := clk.AwaitArmedIn(ctx, 500*time.Millisecond, time.Second)
	require.True(t, ok, "the stream after one that never answered went without its backoff; armed %v, reconnects %d",
		clk.Armed(), s.Stats().Reconnects)
}

// TestHurryStopsOnceTheStreamIsOpen: the connection hurry (every 100 ms,
// WithConnectRetry) is for a stream waiting for its connection. A stream
// that is open but has nothing to say (no watches, or the main stream of
// views alone), with the liveness checks off, does not keep it ticking.
// Catches a dispatcher woken ten times a second for ever. Found by a
// review.
func TestHurryStopsOnceTheStreamIsOpen(t *testing.T) {
	server := ws.Start(t)
	clk := clock.NewFake()
	s, err := etcdwatch.Open(server.Dial(t), etcdwatch.WithClock(clk), etcdwatch.WithLiveness(0, 0))
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	server.Accept(t) // the stream is open: the connection is up
	for range 50 {
		if len(clk.Armed()) == 0 {
			return
		}
		clk.Advance(100 * time.Millisecond)
		// The tick waits in the timer's channel: each Settle is one more
		// turn of the dispatcher's select, which takes it with odds 1/2.
		for range 30 {
			etcdwatch.Settle(t, s, wait)
		}
	}
	t.Fatalf("the hurry still ticks every 100 ms after 50 ticks: armed %v", clk.Armed())
}

// TestIdleFirstStreamOpenedAfterAnOutageIsProbed: a Stream without watches
// opened while its member was down probes its first stream once the
// member is back and the stream opens, as it probes a stream that replaces
// one that ended, and reads connected once the probe is answered. Catches
// the first stream left unasked: the Stream read disconnected until the
// liveness idle (30 s by default), or for ever without the checks, and a
// group read disconnected and left the Stream out of its placement
// meanwhile. Found by a review of group.
func TestIdleFirstStreamOpenedAfterAnOutageIsProbed(t *testing.T) {
	server := ws.Start(t)
	f, s := openWhileDown(t, server)
	f.up()
	srv := server.Accept(t)
	probe := srv.RecvCreate(t)
	require.Zero(t, probe.StartRevision, "a probe watches from now")
	srv.Send(t, ws.Created(probe.WatchId, 3))
	require.Eventually(t, func() bool { return s.State().Connected }, wait, time.Millisecond, "an idle Stream whose server answered reads connected")
	require.Equal(t, probe.WatchId, srv.RecvCancel(t))
	require.Zero(t, s.Stats().Watches, "probes are not watches")
}

// openWhileDown opens a Stream on a connection to server refused from the
// start, with a clock that does not move (no liveness idle passes), once
// its first stream waits for the connection.
func openWhileDown(t *testing.T, server *ws.Server) (*flaky, *etcdwatch.Stream) {
	t.Helper()
	f := newFlaky(t, server)
	f.refusing.Store(true)
	s, err := etcdwatch.Open(f.conn, etcdwatch.WithClock(clock.NewFake()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	awaitWaitingForConnection(t, s)
	return f, s
}

// awaitWaitingForConnection waits until s's stream waits for a connection
// the flaky dialer refuses.
func awaitWaitingForConnection(t *testing.T, s *etcdwatch.Stream) {
	t.Helper()
	require.Eventually(t, func() bool { return strings.Contains(fmt.Sprint(s.State().LastError), "scripted") },
		wait, time.Millisecond, "the stream never waited for a connection")
}

// shutConn is a *grpc.ClientConn whose state reads Shutdown once shut.
type shutConn struct {
	*grpc.ClientConn
	shut *atomic.Bool
}

func (c shutConn) GetState() connectivity.State {
	if c.shut.Load() {
		return connectivity.Shutdown
	}
	return c.ClientConn.GetState()
}

// TestEOFOnAClosedConnectionIsNotRetried: a stream the server ends cleanly
// (io.EOF) once the connection reads Shutdown is not replaced, and the
// watches end with gRPC's Canceled. An EOF was retried before the
// connection's state was looked at: a new stream, a reconnect counted.
func TestEOFOnAClosedConnectionIsNotRetried(t *testing.T) {
	server := ws.Start(t)
	var shut atomic.Bool
	s, err := etcdwatch.Open(shutConn{server.Dial(t), &shut})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	h := &harness{t: t, s: s, server: server, srv: server.Accept(t)}
	w := h.watch(etcdwatch.Key("a"), 1)
	shut.Store(true)
	h.srv.Close(nil) // a clean end: io.EOF
	err = ended(t, w)
	require.ErrorIs(t, err, etcdwatch.ErrStreamFailed)
	require.Equal(t, codes.Canceled, status.Code(err), "%v", err)
	require.Zero(t, s.Stats().Reconnects, "a closed connection was retried")
}

// TestWatchFromNowMovesFromItsCreatedHeader: a watch from now that has had
// nothing since its creation is created again, on the next stream, from
// its created response's header revision (see activate), though the
// Stream has seen later revisions since (b, at that head, asks for its own
// revision again). Catches: it asked from the revision after, losing the
// events of writes that raced its create.
func TestWatchFromNowMovesFromItsCreatedHeader(t *testing.T) {
	h := newHarness(t)
	a := h.watch(etcdwatch.Key("a"), 10)
	b := h.watch(etcdwatch.Key("b"), 10)
	h.srv.Send(t, ws.Events(b.ID(), 12, ws.Put("b", "v", 12))) // the Stream's head is 12
	require.Equal(t, int64(12), next(t, b).Revision)
	h.cut()
	starts := map[string]int64{}
	for range 2 { // active watches are created again in no set order
		c := h.srv.RecvCreate(t)
		starts[string(c.Key)] = c.StartRevision
	}
	require.Equal(t, map[string]int64{"a": 10, "b": 12}, starts)
	require.Nil(t, a.Err())
}

// revisionsOf lists the ModRevision of every event of r.
func revisionsOf(r etcdwatch.Response) []int64 {
	var revs []int64
	for _, e := range r.Events {
		revs = append(revs, e.ModRevision)
	}
	return revs
}

// movedBeforeItsFirstEvent opens a watch of "a" from now, confirmed at
// header 10, cuts its stream before any event, and returns the create
// sent for it on the next stream, checked to ask from that header.
func movedBeforeItsFirstEvent(t *testing.T) (*harness, *etcdwatch.Watch, *pb.WatchCreateRequest) {
	t.Helper()
	h := newHarness(t)
	w := h.watch(etcdwatch.Key("a"), 10)
	require.Equal(t, int64(10), w.CreatedRevision())
	h.cut()
	c := h.srv.RecvCreate(t)
	require.Equal(t, int64(10), c.StartRevision, "from its created header")
	return h, w, c
}

// TestWatchFromNowRecreatedDropsReplayBelowItsStart: a watch from now,
// confirmed at header 10 and re-created on a new stream before its first
// event, asks from 10. On that stream its start is known: a member that
// replays history below 10 (etcd #15271, #20221) sends events the watch
// never asked for, which predate its CreatedRevision and must be dropped
// as the events of any other re-created watch are. Only 10 and later are
// delivered.
func TestWatchFromNowRecreatedDropsReplayBelowItsStart(t *testing.T) {
	h, w, c := movedBeforeItsFirstEvent(t)
	h.srv.Send(t, ws.Created(c.WatchId, 12))
	h.srv.Send(t, ws.Events(c.WatchId, 12, ws.Put("a", "old", 5), ws.Put("a", "old", 9), ws.Put("a", "v", 10)))
	r := next(t, w)
	require.Equal(t, []int64{10}, revisionsOf(r), "events below the start asked for (10) were delivered")
	require.Equal(t, uint64(2), h.s.Stats().DuplicatesDropped)
}

// TestWatchFromNowRecreatedOnALaggingMember: as above, where the member
// answering the re-create is behind the first (its created header, 8, is
// below the first stream's, 10) and sends an event at 9, below the start
// asked for.
func TestWatchFromNowRecreatedOnALaggingMember(t *testing.T) {
	h, w, c := movedBeforeItsFirstEvent(t)
	h.srv.Send(t, ws.Created(c.WatchId, 8))
	h.srv.Send(t, ws.Events(c.WatchId, 9, ws.Put("a", "old", 9)))
	h.srv.Send(t, ws.Events(c.WatchId, 11, ws.Put("a", "v", 11)))
	r := next(t, w)
	require.Equal(t, []int64{11}, revisionsOf(r), "an event below the start asked for (10) was delivered")
}

// TestWatchFromNowRecreatedTwiceKeepsItsStart: cut twice before its
// first event, the watch asks from its first created header both times, and
// the second re-create drops a replay below it too.
func TestWatchFromNowRecreatedTwiceKeepsItsStart(t *testing.T) {
	h, w, c := movedBeforeItsFirstEvent(t)
	h.srv.Send(t, ws.Created(c.WatchId, 12))
	h.await(func() bool { return w.ID() == c.WatchId })
	h.cut()
	c = h.srv.RecvCreate(t)
	require.Equal(t, int64(10), c.StartRevision, "still from its first created header")
	h.srv.Send(t, ws.Created(c.WatchId, 12))
	h.srv.Send(t, ws.Events(c.WatchId, 12, ws.Put("a", "old", 7), ws.Put("a", "v", 12)))
	require.Equal(t, []int64{12}, revisionsOf(next(t, w)))
	require.Equal(t, int64(10), w.CreatedRevision(), "the first confirmation's header")
}

// TestWatchFromNowFirstEventFragmentedThenCut: a watch from now whose
// first event came fragmented is anchored at that revision once the last
// piece came: re-created after a cut, it asks from the next revision, and
// the revision sent again is dropped, not delivered twice.
func TestWatchFromNowFirstEventFragmentedThenCut(t *testing.T) {
	h := newHarness(t)
	w := h.watch(etcdwatch.Prefix("big/").WithFragment(), 10)
	frag := func(id int64, rev int64, more bool, keys ...string) *pb.WatchResponse {
		r := ws.Events(id, 15)
		for _, k := range keys {
			r.Events = append(r.Events, ws.Put(k, "v", rev))
		}
		r.Fragment = more
		return r
	}
	h.srv.Send(t, frag(w.ID(), 11, true, "big/1", "big/2"))
	h.srv.Send(t, frag(w.ID(), 11, false, "big/3"))
	r := next(t, w)
	require.Len(t, r.Events, 3)
	require.Equal(t, int64(11), r.Revision)
	h.cut()
	c := h.srv.RecvCreate(t)
	require.Equal(t, int64(12), c.StartRevision, "after its first event: that revision + 1")
	h.srv.Send(t, ws.Created(c.WatchId, 15))
	h.srv.Send(t, frag(c.WatchId, 11, true, "big/1", "big/2")) // a member that replays
	h.srv.Send(t, frag(c.WatchId, 11, false, "big/3"))
	h.srv.Send(t, ws.Events(c.WatchId, 15, ws.Put("big/4", "v", 12)))
	r = next(t, w)
	require.Equal(t, []int64{12}, revisionsOf(r), "revision 11 was delivered twice")
	require.Equal(t, uint64(3), h.s.Stats().DuplicatesDropped)
}

// TestWatchFromNowCutInsideItsFirstFragmentedEvent: cut after the first
// piece of its first event, the watch from now is still unanchored and asks
// from its created header; the revision comes whole on the new stream,
// once, with none of the old stream's pieces.
func TestWatchFromNowCutInsideItsFirstFragmentedEvent(t *testing.T) {
	h := newHarness(t)
	w := h.watch(etcdwatch.Prefix("big/").WithFragment(), 10)
	first := ws.Events(w.ID(), 11, ws.Put("big/1", "v", 11), ws.Put("big/2", "v", 11))
	first.Fragment = true
	h.srv.Send(t, first)
	h.handledAll()
	h.cut()
	c := h.srv.RecvCreate(t)
	require.Equal(t, int64(10), c.StartRevision, "nothing delivered: from its created header")
	h.srv.Send(t, ws.Created(c.WatchId, 11))
	h.srv.Send(t, ws.Events(c.WatchId, 11, ws.Put("big/1", "v", 11), ws.Put("big/2", "v", 11), ws.Put("big/3", "v", 11)))
	r := next(t, w)
	require.Equal(t, []int64{11, 11, 11}, revisionsOf(r))
	require.Equal(t, int64(11), r.Revision)
}

// TestWatchFromNowBookmarkOnlyThenCut: a watch from now whose only
// response so far was a progress notification is anchored at it: it asks
// from the bookmark again (the Stream's head), drops that revision's events
// sent again, and delivers the next.
func TestWatchFromNowBookmarkOnlyThenCut(t *testing.T) {
	h := newHarness(t)
	w := h.watch(etcdwatch.Key("a"), 10)
	h.srv.Send(t, ws.Progress(w.ID(), 14))
	require.Equal(t, int64(14), next(t, w).Revision)
	h.cut()
	c := h.srv.RecvCreate(t)
	require.Equal(t, int64(14), c.StartRevision, "at the Stream's head: its own revision again")
	h.srv.Send(t, ws.Created(c.WatchId, 16))
	h.srv.Send(t, ws.Events(c.WatchId, 16, ws.Put("a", "old", 9), ws.Put("a", "old", 14), ws.Put("a", "v", 15)))
	require.Equal(t, []int64{15}, revisionsOf(next(t, w)))
	require.Equal(t, uint64(1), h.s.Stats().DuplicatesDropped, "9 a duplicate; 14 asked for again")
}

// TestWatchFromNowStreamProgressOnlyThenCut: as above, with a
// stream-wide progress answer (a bookmark to the watch, whose create asked
// from now on that stream) as its only response, below the Stream's head:
// it asks from the bookmark + 1.
func TestWatchFromNowStreamProgressOnlyThenCut(t *testing.T) {
	h := newHarness(t)
	w := h.watch(etcdwatch.Key("a"), 10)
	other := h.watch(etcdwatch.Key("b"), 10)
	got := h.progressAsync()
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest())
	h.srv.Send(t, ws.Progress(-1, 13))
	require.Equal(t, int64(13), recvProgress(t, got).rev)
	require.Equal(t, int64(13), next(t, w).Revision)
	require.Equal(t, int64(13), next(t, other).Revision)
	h.srv.Send(t, ws.Events(other.ID(), 20, ws.Put("b", "v", 20))) // head 20
	require.Equal(t, int64(20), next(t, other).Revision)
	h.cut()
	c := confirmCreates(t, h.srv, 2, 20)
	require.Equal(t, int64(14), c["a"].StartRevision)
	h.srv.Send(t, ws.Events(c["a"].WatchId, 20, ws.Put("a", "old", 13), ws.Put("a", "v", 14)))
	require.Equal(t, []int64{14}, revisionsOf(next(t, w)))
}

// TestTrapCompactedJustPastWithAnOlderHeader: as
// TestTrapCompactedJustPastItsRevision, where the created response's
// header is the watch's own revision (the store was written and compacted
// after the create, while etcd had the watch unsynced) and the
// compaction's cancel carries no header revision, as etcd's does: the
// compaction tells the store has reached r+1, and the watch is created
// again from there. Catches: it asked from r again, to be compacted again,
// and again.
func TestTrapCompactedJustPastWithAnOlderHeader(t *testing.T) {
	h := newHarness(t)
	w := h.watch(etcdwatch.Key("a"), 1)
	h.srv.Send(t, ws.Events(w.ID(), 2, ws.Put("a", "v", 2)))
	require.Equal(t, int64(2), next(t, w).Revision)
	h.cut()
	c := h.srv.RecvCreate(t)
	require.Equal(t, int64(2), c.StartRevision, "at the head: from its own revision")
	h.srv.Send(t, ws.Created(c.WatchId, 2))
	h.srv.Send(t, ws.Compacted(c.WatchId, 3))
	require.Equal(t, c.WatchId, h.srv.RecvCancel(t))
	again := h.srv.RecvCreate(t)
	require.Equal(t, int64(3), again.StartRevision)
	h.srv.Send(t, ws.Created(again.WatchId, 4))
	h.srv.Send(t, ws.Events(again.WatchId, 4, ws.Put("a", "w", 4)))
	require.Equal(t, int64(4), next(t, w).Revision)
	require.Nil(t, w.Err())
}

// TestCancelLeftByAnEndedStreamIsForgotten: a cancel sent on a stream that
// ended before the server answered it is forgotten with that stream. A
// server that picks its own ids counts them from 0 again on each stream:
// when it later ends the watch that now has that id, the watch ends.
// Catches: the old stream's cancel still awaited, so that the server's
// end of the new watch is taken for its answer and swallowed, leaving the
// watch open on a server that dropped it.
func TestCancelLeftByAnEndedStreamIsForgotten(t *testing.T) {
	h := newHarness(t)
	a := h.watchWithID(etcdwatch.Key("a"), 0) // its own ids, from 0
	b := h.watchWithID(etcdwatch.Key("b"), 1)
	a.Cancel()
	require.Equal(t, int64(0), h.srv.RecvCancel(t)) // not answered: the stream ends
	h.cut()
	c := h.srv.RecvCreate(t)
	require.Equal(t, "b", string(c.Key))
	h.srv.Send(t, ws.Created(0, 2)) // the new stream's first id
	h.await(func() bool { return b.ID() == 0 })
	h.srv.Send(t, &pb.WatchResponse{Header: ws.Header(2), WatchId: 0, Canceled: true, CancelReason: "etcdserver: permission denied"})
	require.Error(t, ended(t, b), "the server ended the watch")
}

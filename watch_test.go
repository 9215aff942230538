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

	"github.com/etcdwatch/etcdwatch"
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
	require.Eventually(t, func() bool { return h.s.Stats().Watches == 0 }, wait, time.Millisecond)
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

// TestServerCancelEndsOnlyThatWatch: a permission revoked mid-watch (or any
// other server cancel) ends one watch; its neighbour carries on.
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

// TestSlowConsumerIsPausedAndResumed: a consumer that stops reading gets its
// watch paused at the buffer limit, without holding up a busy neighbour, and
// after it catches up the watch resumes from the next revision: nothing is
// lost, nothing repeated.
func TestSlowConsumerIsPausedAndResumed(t *testing.T) {
	const limit = 8
	h := newHarness(t, etcdwatch.WithBufferLimit(limit))
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
	for range limit / 2 {
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
	st := h.s.Stats()
	require.Equal(t, st.Pauses, st.Resumes)
	require.Equal(t, int64(0), st.Paused)
	t.Logf("pauses: %d", st.Pauses)
}

// TestPausedWatchCompactedWhileAway: if the history a paused watch needs is
// compacted before it resumes, it ends with *CompactedError, never a gap.
func TestPausedWatchCompactedWhileAway(t *testing.T) {
	h := newHarness(t, etcdwatch.WithBufferLimit(2))
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
	require.Equal(t, c.StartRevision, ce.Revision)
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
	require.Eventually(t, func() bool { return h.s.Stats().Watches == 0 }, wait, time.Millisecond)
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
		{"no events at all", etcdwatch.Key("a").WithoutPuts().WithoutDeletes(), "NoPut"},
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
	for _, tc := range []struct {
		name  string
		conn  bool
		opt   etcdwatch.Option
		field string
	}{
		{"nil conn", false, nil, "conn"},
		{"buffer limit", true, etcdwatch.WithBufferLimit(0), "WithBufferLimit"},
		{"progress retry", true, etcdwatch.WithProgressRetry(0), "WithProgressRetry"},
		{"nil logger", true, etcdwatch.WithLogger(nil), "WithLogger"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var opts []etcdwatch.Option
			if tc.opt != nil {
				opts = append(opts, tc.opt)
			}
			var s *etcdwatch.Stream
			var err error
			if tc.conn {
				s, err = etcdwatch.Open(conn, opts...)
			} else {
				s, err = etcdwatch.Open(nil, opts...)
			}
			require.Nil(t, s)
			require.ErrorIs(t, err, etcdwatch.ErrInvalidArgument)
			require.True(t, strings.Contains(err.Error(), tc.field), err.Error())
		})
	}
}

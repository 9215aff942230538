package group_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/etcdwatch/etcdwatch"
	"github.com/etcdwatch/etcdwatch/dial"
	"github.com/etcdwatch/etcdwatch/group"
	ws "github.com/etcdwatch/etcdwatch/internal/watchserver"
	"github.com/etcdwatch/etcdwatch/view"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func timeout() <-chan time.Time { return time.After(ws.Timeout) }

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), ws.Timeout)
	t.Cleanup(cancel)
	return c
}

// newGroup opens a group of n Streams on the fake's connection, closed when
// the test ends, and waits until each has opened its Watch stream. They
// open at once, so the fake's numbers are not the group's: see mapping.
func newGroup(t *testing.T, f *fake, n int, opts ...group.Option) *group.Group {
	t.Helper()
	opts = append([]group.Option{group.WithStreams(n)}, opts...)
	g, err := group.New(f.server.Dial(t), opts...)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, g.Close()) })
	f.stream(n - 1)
	return g
}

// requests returns Key requests for prefix+"0" to prefix+"n-1".
func requests(prefix string, n int) []etcdwatch.Request {
	rs := make([]etcdwatch.Request, n)
	for i := range rs {
		rs[i] = etcdwatch.Key(fmt.Sprintf("%s%d", prefix, i))
	}
	return rs
}

// mapping opens a watch on each of the group's n fresh Streams, keys
// prefix0 to prefix(n-1) (placement takes fresh Streams in order), and
// returns the fake's number of each of the group's Streams.
func (f *fake) mapping(t *testing.T, g *group.Group, prefix string, n int) ([]*etcdwatch.Watch, []int) {
	t.Helper()
	watches, err := g.WatchAll(ctx(t), requests(prefix, n)...)
	require.NoError(t, err)
	m := make([]int, n)
	for i := range m {
		m[i] = f.streamOf(fmt.Sprintf("%s%d", prefix, i))
	}
	sorted := slices.Sorted(slices.Values(m))
	require.Equal(t, len(m), len(slices.Compact(sorted)), "one watch on each Stream: %v", m)
	return watches, m
}

// streamOf returns the fake stream whose watches include key.
func (f *fake) streamOf(key string) int {
	f.t.Helper()
	at := -1
	f.await(func() bool {
		for i, fs := range f.streams {
			if slices.Contains(fs.keys, key) {
				at = i
			}
		}
		return at >= 0
	}, "no stream has "+key)
	return at
}

// TestWatchesSpreadOverStreams: one WatchAll spreads its requests evenly,
// in turn, each Stream's share in one WatchAll of its own; watches opened
// one Watch at a time afterwards keep the balance; each Stream's Stats
// count its own, and the group's their sum.
func TestWatchesSpreadOverStreams(t *testing.T) {
	f := serve(t)
	g := newGroup(t, f, 3)
	_, m := f.mapping(t, g, "first", 3)
	watches, err := g.WatchAll(ctx(t), requests("a", 9)...)
	require.NoError(t, err)
	require.Len(t, watches, 9)
	for i, w := range watches {
		require.Equal(t, fmt.Sprintf("a%d", i), string(w.Request().Key), "watches in the order of the requests")
	}
	for i := range 3 {
		want := []string{fmt.Sprintf("first%d", i), fmt.Sprintf("a%d", i), fmt.Sprintf("a%d", i+3), fmt.Sprintf("a%d", i+6)}
		require.Equal(t, want, f.keysOf(m[i]))
	}
	for i := range 3 {
		_, err := g.Watch(ctx(t), etcdwatch.Key(fmt.Sprintf("b%d", i)))
		require.NoError(t, err)
		require.Equal(t, m[i], f.streamOf(fmt.Sprintf("b%d", i)))
	}
	streams := g.Streams()
	require.Len(t, streams, 4)
	for i, s := range streams[:3] {
		require.Equal(t, fmt.Sprint(i), s.Name)
		require.EqualValues(t, 5, s.Stats.Watches, "stream %d", i)
		require.EqualValues(t, 5, s.Stats.Created, "stream %d", i)
		require.Equal(t, "bufconn", s.Member, "the peer the stream answered from")
		require.True(t, s.State.Connected)
	}
	require.Equal(t, "pinned", streams[3].Name)
	require.Zero(t, streams[3].Stats.Created)
	st := g.Stats()
	require.EqualValues(t, 15, st.Watches)
	require.EqualValues(t, 15, st.Created)
	require.EqualValues(t, created, st.Revision)
	require.True(t, g.State().Connected)

	// A canceled watch frees its place: the next one goes there.
	watches[4].Cancel() // a4, on stream 1
	f.await(func() bool { return f.streams[m[1]].cancels == 1 }, "cancel")
	_, err = g.Watch(ctx(t), etcdwatch.Key("c"))
	require.NoError(t, err)
	require.Equal(t, m[1], f.streamOf("c"))
}

// TestWatchAllIsAllOrNothing: one refused request fails the call, naming
// its Stream and wrapping the refusal, and every watch the other Streams
// opened is canceled; an invalid one opens nothing and is named by its
// index in the call.
func TestWatchAllIsAllOrNothing(t *testing.T) {
	f := serve(t)
	g := newGroup(t, f, 3)
	first, m := f.mapping(t, g, "first", 3)
	for _, w := range first {
		w.Cancel()
	}
	// Placement counts a Stream's watches as its Stats do: a canceled
	// watch once its dispatcher has the cancel.
	require.Eventually(t, func() bool { return g.Stats().Watches == 0 }, ws.Timeout, time.Millisecond)
	rs := requests("a", 6)
	rs[4] = etcdwatch.Key("refused/x") // on stream 1
	_, err := g.WatchAll(ctx(t), rs...)
	require.ErrorIs(t, err, etcdwatch.ErrPermissionDenied)
	var se *etcdwatch.ServerError
	require.ErrorAs(t, err, &se)
	require.Contains(t, err.Error(), "stream 1: ")
	var re *etcdwatch.RequestError
	require.ErrorAs(t, err, &re)
	require.Equal(t, 4, re.Index, "the index in the call, not in stream 1's share")
	require.Equal(t, 6, re.Of)
	require.Equal(t, "refused/x", string(re.Request.Key))
	f.await(func() bool {
		live := 0
		for _, fs := range f.streams {
			live += len(fs.live)
		}
		return live == 0
	}, "every confirmed watch canceled")
	require.Eventually(t, func() bool { return g.Stats().Watches == 0 }, ws.Timeout, time.Millisecond)
	// A watch canceled while its create was in flight is canceled on the
	// server once its answer comes, after Stats stopped counting it.
	f.await(func() bool {
		return f.streams[m[0]].cancels == 1+2 && // first0, a0, a3
			f.streams[m[1]].cancels == 1+1 && // first1, a1; refused/x was never confirmed
			f.streams[m[2]].cancels == 1+2
	}, "each confirmed watch canceled once")

	// A Stream's share answered after another's refusal: the call has
	// returned already, and the late watch is canceled once confirmed.
	_, err = g.WatchAll(ctx(t), etcdwatch.Key("slow/0"), etcdwatch.Key("refused/y"), etcdwatch.Key("c"))
	require.ErrorIs(t, err, etcdwatch.ErrPermissionDenied)
	require.ErrorAs(t, err, &re, "a share of one request")
	require.Equal(t, 1, re.Index)
	require.Equal(t, 3, re.Of)
	close(f.slow) // only now: the call did not wait for it
	slow := f.streamOf("slow/0")
	f.await(func() bool { return len(f.streams[slow].live) == 0 && slices.Contains(f.streams[slow].keys, "slow/0") }, "slow/0 confirmed, then canceled")
	require.Eventually(t, func() bool { return g.Stats().Watches == 0 }, ws.Timeout, time.Millisecond)

	bad := requests("b", 3)
	bad[2] = etcdwatch.Request{}
	_, err = g.WatchAll(ctx(t), bad...)
	require.ErrorIs(t, err, etcdwatch.ErrInvalidRequest)
	require.ErrorContains(t, err, "request 2 of 3")
	require.ErrorAs(t, err, &re)
	require.Equal(t, 2, re.Index)
	_, err = g.Watch(ctx(t), etcdwatch.Request{})
	require.ErrorIs(t, err, etcdwatch.ErrInvalidRequest)
	require.NotContains(t, err.Error(), "request 0")
	var keys []string // copied: a failed require must not leave the fake locked
	f.mu.Lock()
	for _, fs := range f.streams {
		keys = append(keys, fs.keys...)
	}
	f.mu.Unlock()
	require.NotContains(t, keys, "b0", "an invalid request opens nothing")

	none, err := g.WatchAll(ctx(t))
	require.NoError(t, err)
	require.Nil(t, none)
}

// TestWatchAllOfOneRequest: WatchAll names a failed request by its index
// however many it is given, one included, with the Stream it failed on;
// Watch gives the Stream's error as it is. Catches: a call of one request
// taken for Watch.
func TestWatchAllOfOneRequest(t *testing.T) {
	f := serve(t)
	g := newGroup(t, f, 2)
	iso := etcdwatch.Key("refused/y")
	iso.Isolated = true
	for _, tc := range []struct {
		r      etcdwatch.Request
		is     error
		stream string
	}{
		{etcdwatch.Request{}, etcdwatch.ErrInvalidRequest, ""},
		{etcdwatch.Key("refused/x"), etcdwatch.ErrPermissionDenied, "stream "},
		{iso, etcdwatch.ErrPermissionDenied, "pinned stream: "},
	} {
		_, err := g.WatchAll(ctx(t), tc.r)
		require.ErrorIs(t, err, tc.is)
		var re *etcdwatch.RequestError
		require.ErrorAs(t, err, &re, "%v", err)
		require.Equal(t, 0, re.Index)
		require.Equal(t, 1, re.Of)
		require.Contains(t, err.Error(), tc.stream)

		_, err = g.Watch(ctx(t), tc.r)
		require.ErrorIs(t, err, tc.is)
		require.False(t, errors.As(err, &re), "Watch: the Stream's own error, %v", err)
	}
}

// TestCanceledWithARequestError: a WatchAll whose ctx ends with a cause
// that holds a *etcdwatch.RequestError (errgroup's, a sibling call's
// error) returns that cause; it is none of this call's requests. Catches:
// the cause taken for a Stream's answer, renumbered (or out of range: a
// panic, in a part's goroutine when the call spans Streams).
func TestCanceledWithARequestError(t *testing.T) {
	for _, streams := range []int{1, 2} {
		t.Run(fmt.Sprint(streams, " streams"), func(t *testing.T) {
			f := serve(t)
			g := newGroup(t, f, streams)
			c, cancel := context.WithCancelCause(ctx(t))
			done := make(chan error, 1)
			go func() {
				_, err := g.WatchAll(c, requests("slow/", 2*streams)...)
				done <- err
			}()
			f.holding(streams) // each Stream's first create is held: the call waits
			sibling := &etcdwatch.RequestError{Index: 7, Of: 10, Request: etcdwatch.Key("other"), Err: errors.New("a sibling failed")}
			cancel(sibling)
			var err error
			select {
			case err = <-done:
			case <-timeout():
				t.Fatal("WatchAll did not return")
			}
			var re *etcdwatch.RequestError
			require.ErrorAs(t, err, &re)
			require.Same(t, sibling, re, "the cause, not one of this call's requests: %v", err)
		})
	}
}

// TestRetiringPinnedStreamKeepsTheGroupConnected: a pinned watch that ends
// closes its Stream, which is no failure of the group: State stays
// connected throughout, as it does while one opens. Catches: the closing
// Stream's ErrClosed read as the group's state.
func TestRetiringPinnedStreamKeepsTheGroupConnected(t *testing.T) {
	f := serve(t)
	g := newGroup(t, f, 1)
	f.mapping(t, g, "a", 1)
	require.True(t, g.State().Connected)
	stop := make(chan struct{})
	seen := make(chan etcdwatch.State, 1) // the first disconnected State seen
	polled := make(chan struct{})
	go func() { // returns when stop closes
		defer close(polled)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if st := g.State(); !st.Connected {
				seen <- st
				return
			}
		}
	}()
	for range 50 {
		p, err := g.WatchPinned(ctx(t), etcdwatch.Key("p"))
		require.NoError(t, err)
		p.Cancel()
		<-p.Done()
	}
	close(stop)
	<-polled
	select {
	case st := <-seen:
		t.Fatalf("the group read disconnected while a pinned watch ended: %+v", st)
	default:
	}
}

// TestPinned: WatchPinned, an isolated request and a view's watch each
// get a Stream of their own, which the others' placement leaves alone; it
// closes when its watch ends, and its counters stay in the group's.
func TestPinned(t *testing.T) {
	f := serve(t)
	g := newGroup(t, f, 2)
	big, err := g.WatchPinned(ctx(t), etcdwatch.Prefix("big/"))
	require.NoError(t, err)
	require.Equal(t, 3, f.opened(), "a Stream of its own")
	require.Equal(t, []string{"big/"}, f.keysOf(2))
	require.False(t, big.Request().Isolated, "alone on its Stream, it needs no isolated lane")

	iso := etcdwatch.Key("iso")
	iso.Isolated = true
	watches, err := g.WatchAll(ctx(t), etcdwatch.Key("a"), iso, etcdwatch.Key("b"))
	require.NoError(t, err)
	require.Equal(t, 4, f.opened())
	require.Equal(t, []string{"iso"}, f.keysOf(3))
	// big, then iso, opened on Stream 0's connection (members unknown here)
	// and weigh there: a goes to Stream 1, iso then to 0 (its Stream has
	// fewer watches of its own), and b to 1.
	// (The fake numbers gRPC streams as they come: the group's two in
	// either order.)
	require.Contains(t, []int{0, 1}, f.streamOf("a"))
	require.Equal(t, f.streamOf("a"), f.streamOf("b"), "the pinned Streams weigh on the connection they opened on")
	require.Equal(t, "iso", string(watches[1].Request().Key))

	pinned := g.Streams()[2]
	require.Equal(t, "pinned", pinned.Name)
	require.EqualValues(t, 2, pinned.Stats.Watches)
	require.EqualValues(t, 4, g.Stats().Watches)

	// A view's watch is isolated: it gets a Stream of its own too.
	v, err := view.New(ctx(t), g, etcdwatch.Prefix("v/"), view.DecodeBytes)
	require.NoError(t, err)
	require.Equal(t, 5, f.opened())
	require.Equal(t, []string{"v/"}, f.keysOf(4))
	require.NoError(t, v.Close())

	// Ended watches close their Streams; the counts stay.
	big.Cancel()
	watches[1].Cancel()
	for _, i := range []int{2, 3, 4} {
		f.await(func() bool { return f.streams[i].ended }, fmt.Sprintf("pinned stream %d closed", i))
	}
	require.Eventually(t, func() bool { return g.Streams()[2].Stats.Watches == 0 }, ws.Timeout, time.Millisecond)
	pinned = g.Streams()[2]
	require.EqualValues(t, 3, pinned.Stats.Created, "closed pinned Streams keep their counts")
	require.True(t, pinned.State.Connected, "none open: nothing down")
	require.EqualValues(t, 2, g.Stats().Watches)
	require.EqualValues(t, 5, g.Stats().Created)
}

// TestRequestProgress: every Stream with watches is asked, pinned ones
// too, and the lowest answer is the group's; a Stream that answers below
// the highest revision the group has seen is asked again; Streams without
// watches are not waited for.
func TestRequestProgress(t *testing.T) {
	f := serve(t)
	g := newGroup(t, f, 3)
	_, err := g.RequestProgress(ctx(t))
	require.ErrorIs(t, err, etcdwatch.ErrNoWatches)

	_, m := f.mapping(t, g, "a", 2) // streams 0 and 1; 2 has none
	f.answer(m[0], 30)
	f.answer(m[1], 20)
	rev, err := g.RequestProgress(ctx(t))
	require.NoError(t, err)
	require.EqualValues(t, 20, rev)

	_, err = g.WatchPinned(ctx(t), etcdwatch.Key("p")) // stream 3
	require.NoError(t, err)
	f.answer(m[0], 50)
	f.answer(m[1], 45)
	f.answer(3, 40)
	rev, err = g.RequestProgress(ctx(t))
	require.NoError(t, err)
	require.EqualValues(t, 40, rev, "the pinned Stream is asked too")

	// The group has now seen 50: a Stream answering below it is behind,
	// and is asked again until it answers at least 50.
	require.EqualValues(t, 50, g.Stats().Revision)
	f.answer(m[0], 70)
	f.answer(m[1], 65)
	f.answer(3, 45, 45, 60)
	rev, err = g.RequestProgress(ctx(t))
	require.NoError(t, err)
	require.EqualValues(t, 60, rev)
	f.mu.Lock()
	left := slices.Clone(f.streams[3].progress)
	f.mu.Unlock()
	require.Equal(t, []int64{60}, left, "asked until it answered 60")

	ended, cancel := context.WithCancelCause(context.Background())
	cancel(errors.New("gone"))
	_, err = g.RequestProgress(ended)
	require.EqualError(t, err, "gone")
}

// TestRequestProgressWhilePinnedWatchEnds: a pinned watch that ends while
// RequestProgress asks its Stream again (its member answered below the
// group's revision) closes that Stream; the call leaves it out, as a
// Stream with no watch, rather than failing with the Stream's ErrClosed
// while the group is open.
func TestRequestProgressWhilePinnedWatchEnds(t *testing.T) {
	f := serve(t)
	g := newGroup(t, f, 1)
	_, err := g.Watch(ctx(t), etcdwatch.Key("a"))
	require.NoError(t, err)
	f.answer(0, 100)
	_, err = g.RequestProgress(ctx(t)) // the group has now seen 100
	require.NoError(t, err)
	p, err := g.WatchPinned(ctx(t), etcdwatch.Key("p")) // stream 1
	require.NoError(t, err)
	f.answer(1, 1) // below 100, every time: asked again and again
	type result struct {
		rev int64
		err error
	}
	done := make(chan result, 1)
	go func() {
		rev, err := g.RequestProgress(ctx(t))
		done <- result{rev, err}
	}()
	f.await(func() bool { return f.streams[1].asked >= 2 }, "the pinned Stream asked again")
	p.Cancel()
	select {
	case r := <-done:
		require.NoError(t, r.err)
		require.EqualValues(t, 100, r.rev)
	case <-timeout():
		t.Fatal("RequestProgress did not return")
	}
}

// TestOpeningPinnedStreamKeepsTheGroupConnected: a Stream opened for a
// pinned watch, its server not answering yet, leaves the group's State
// (and the pinned entry of Streams) as it was; once it has answered it
// counts like the others.
func TestOpeningPinnedStreamKeepsTheGroupConnected(t *testing.T) {
	f := serve(t)
	g := newGroup(t, f, 2)
	f.mapping(t, g, "a", 2) // both answered
	require.True(t, g.State().Connected)
	f.mu.Lock()
	f.holdNext = true
	f.mu.Unlock()
	type result struct {
		w   *etcdwatch.Watch
		err error
	}
	done := make(chan result, 1)
	go func() {
		w, err := g.WatchPinned(ctx(t), etcdwatch.Key("p"))
		done <- result{w, err}
	}()
	f.stream(2) // the pinned Stream's, held
	require.True(t, g.State().Connected, "a pinned Stream not answered yet")
	require.True(t, g.Streams()[2].State.Connected)
	f.release(2)
	var r result
	select {
	case r = <-done:
	case <-timeout():
		t.Fatal("WatchPinned did not return")
	}
	require.NoError(t, r.err)
	require.True(t, g.State().Connected)
	require.Equal(t, "p", string(r.w.Request().Key))
}

// TestOnlyTheFailedStreamMoves: when one Stream's gRPC stream fails, its
// watches, and only its, are re-created on its next one; while it is not
// answered again, new watches avoid it; Stats say which Stream moved.
func TestOnlyTheFailedStreamMoves(t *testing.T) {
	f := serve(t)
	g := newGroup(t, f, 3, group.WithStreamOptions(etcdwatch.WithReconnectBackoff(time.Millisecond, 10*time.Millisecond)))
	watches, m := f.mapping(t, g, "a", 3)

	f.mu.Lock()
	f.holdNext = true
	f.mu.Unlock()
	f.stream(m[0]).st.Close(status.Error(codes.Unavailable, "member going away"))
	replacement := f.stream(3) // stream 0's next, held
	require.Eventually(t, func() bool { return !g.Streams()[0].State.Connected }, ws.Timeout, time.Millisecond)
	require.Eventually(t, func() bool { return g.Streams()[0].Member == "" }, ws.Timeout, time.Millisecond,
		"the member is forgotten with its RPC")
	require.False(t, g.State().Connected)

	// Stream 0 has the fewest watches, but failed: a new watch goes to 1.
	_, err := g.Watch(ctx(t), etcdwatch.Key("new"))
	require.NoError(t, err)
	require.Equal(t, m[1], f.streamOf("new"))

	f.release(3)
	f.await(func() bool { return len(replacement.keys) == 1 }, "a0 re-created")
	require.Equal(t, []string{"a0"}, f.keysOf(3))
	require.Eventually(t, func() bool { return g.Streams()[0].Stats.Moved == 1 }, ws.Timeout, time.Millisecond)
	streams := g.Streams()
	require.EqualValues(t, 1, streams[0].Stats.Reconnects)
	require.Equal(t, "bufconn", streams[0].Member)
	for _, s := range streams[1:3] {
		require.Zero(t, s.Stats.Reconnects, "stream %s", s.Name)
		require.Zero(t, s.Stats.Moved, "stream %s", s.Name)
	}
	require.EqualValues(t, 1, g.Stats().Moved)
	require.True(t, g.State().Connected)
	for _, w := range watches {
		require.NoError(t, w.Err())
	}
}

// TestClose: Close ends every watch, pinned ones too, with ErrClosed, and
// Context with it as cause; later calls are refused with it.
func TestClose(t *testing.T) {
	f := serve(t)
	g := newGroup(t, f, 2)
	w, err := g.Watch(ctx(t), etcdwatch.Key("a"))
	require.NoError(t, err)
	p, err := g.WatchPinned(ctx(t), etcdwatch.Key("p"))
	require.NoError(t, err)
	require.NoError(t, g.Close())
	for _, w := range []*etcdwatch.Watch{w, p} {
		<-w.Done()
		require.ErrorIs(t, w.Err(), etcdwatch.ErrClosed)
	}
	<-g.Context().Done()
	require.ErrorIs(t, context.Cause(g.Context()), etcdwatch.ErrClosed)
	_, err = g.Watch(ctx(t), etcdwatch.Key("b"))
	require.ErrorIs(t, err, etcdwatch.ErrClosed)
	_, err = g.WatchPinned(ctx(t), etcdwatch.Key("b"))
	require.ErrorIs(t, err, etcdwatch.ErrClosed)
	_, err = g.WatchAll(ctx(t), requests("b", 3)...)
	require.ErrorIs(t, err, etcdwatch.ErrClosed)
	_, err = g.RequestProgress(ctx(t))
	require.ErrorIs(t, err, etcdwatch.ErrClosed)
	require.NoError(t, g.Close())
}

// TestOptions: what New and Dial refuse, each with ErrInvalidArgument.
func TestOptions(t *testing.T) {
	f := serve(t)
	conn := f.server.Dial(t)
	for _, tc := range []struct {
		name string
		open func() (*group.Group, error)
		want string
	}{
		{"nil conn", func() (*group.Group, error) { return group.New(nil) }, "conn is nil"},
		{"no streams", func() (*group.Group, error) { return group.New(conn, group.WithStreams(0)) }, "WithStreams(0)"},
		{"dial options on New", func() (*group.Group, error) {
			return group.New(conn, group.WithDialOptions(dial.WithInsecure()))
		}, "WithDialOptions is for Dial"},
		{"a bad stream option", func() (*group.Group, error) {
			return group.New(conn, group.WithStreamOptions(etcdwatch.WithBufferLimit(0)))
		}, "WithBufferLimit(0)"},
		{"no endpoints", func() (*group.Group, error) { return group.Dial(nil) }, "at least one endpoint"},
		{"no transport security", func() (*group.Group, error) { return group.Dial([]string{"127.0.0.1:1"}) }, "WithInsecure"},
		{"homing on New", func() (*group.Group, error) { return group.New(conn, group.WithHoming(0)) }, "WithHoming is for Dial"},
		{"negative homing", func() (*group.Group, error) {
			return group.Dial([]string{"127.0.0.1:1"}, group.WithHoming(-time.Second), group.WithDialOptions(dial.WithInsecure()))
		}, "WithHoming(-1s)"},
		{"negative streams", func() (*group.Group, error) {
			return group.Dial([]string{"127.0.0.1:1"}, group.WithStreams(-1), group.WithDialOptions(dial.WithInsecure()))
		}, "WithStreams(-1)"},
	} {
		g, err := tc.open()
		require.ErrorIs(t, err, etcdwatch.ErrInvalidArgument, tc.name)
		require.ErrorContains(t, err, tc.want, tc.name)
		require.Nil(t, g, tc.name)
	}
}

// TestPinnedStateOutlivesItsStreams: the pinned Streams' State reads
// connected since the group began, while none is open, while one is, and
// once it has closed: Connected never changed. Catches a Since that went
// back as pinned Streams closed (etcdwatch_state_since_timestamp_seconds
// running backwards), or moved to each pinned Stream's first answer.
func TestPinnedStateOutlivesItsStreams(t *testing.T) {
	f := serve(t)
	g := newGroup(t, f, 1)
	pinned := func() etcdwatch.State {
		infos := g.Streams()
		return infos[len(infos)-1].State
	}
	began := pinned()
	p, err := g.WatchPinned(ctx(t), etcdwatch.Key("p"))
	require.NoError(t, err)
	up := pinned()
	require.True(t, up.Connected)
	require.Equal(t, began.Since, up.Since, "a pinned Stream that joins changes no Connected")
	q, err := g.WatchPinned(ctx(t), etcdwatch.Key("q")) // came up after p
	require.NoError(t, err)
	require.Equal(t, began.Since, pinned().Since)
	q.Cancel()
	<-q.Done()
	p.Cancel()
	<-p.Done()
	require.NoError(t, g.Close()) // waits for the pinned Streams to close
	after := pinned()
	require.True(t, after.Connected, "none is down")
	require.Equal(t, began.Since, after.Since, "connected since the group began")
}

// TestGroupSinceStaysWhenAnIdleStreamJoins: an own Stream asked nothing
// yet counts by its errors only; its first answer, when a watch is placed
// on it, is no change of the group's Connected, nor of Since. Catches that
// answer taken for a blip.
func TestGroupSinceStaysWhenAnIdleStreamJoins(t *testing.T) {
	f := serve(t)
	g := newGroup(t, f, 2)
	_, err := g.Watch(ctx(t), etcdwatch.Key("a"))
	require.NoError(t, err)
	before := g.State()
	require.True(t, before.Connected)
	_, err = g.Watch(ctx(t), etcdwatch.Key("b")) // on the other Stream
	require.NoError(t, err)
	require.Equal(t, 1, int(g.Streams()[1].Stats.Watches), "placed on the idle Stream")
	after := g.State()
	require.True(t, after.Connected)
	require.Equal(t, before.Since, after.Since)
}

// TestGroupSinceStaysWhileConnected: the group's State.Since is when
// Connected last changed, so a pinned Stream that joins (answered later
// than the group's own) or leaves does not move it. Catches the later
// Since of combine taken at each read: etcdwatch_state_since_timestamp_seconds
// jumping forward at each WatchPinned (each relist of a view on the
// group) and back as it closed.
func TestGroupSinceStaysWhileConnected(t *testing.T) {
	f := serve(t)
	g := newGroup(t, f, 1)
	_, err := g.Watch(ctx(t), etcdwatch.Key("a"))
	require.NoError(t, err)
	before := g.State()
	require.True(t, before.Connected)
	p, err := g.WatchPinned(ctx(t), etcdwatch.Key("p"))
	require.NoError(t, err)
	during := g.State()
	require.True(t, during.Connected)
	require.Equal(t, before.Since, during.Since, "a pinned Stream joined")
	p.Cancel()
	<-p.Done()
	require.Eventually(t, func() bool { return g.Stats().Watches == 1 }, ws.Timeout, time.Millisecond)
	require.Equal(t, before.Since, g.State().Since, "a pinned Stream left")
}

// TestRequestProgressLeavesOutAFailedStream: a Stream of the group that
// failed for good (a response above its receive limit) has no watch left,
// and the group's RequestProgress answers for the watches on the others,
// as it does for a Stream without watches. Catches every later call
// failing with the dead Stream's error.
func TestRequestProgressLeavesOutAFailedStream(t *testing.T) {
	f := serve(t)
	g := newGroup(t, f, 2, group.WithStreamOptions(etcdwatch.WithCallOptions(grpc.MaxCallRecvMsgSize(32<<10))))
	watches, m := f.mapping(t, g, "a", 2)
	f.failForGood(t, m[0], watches[0])
	// The failed watch's Done closes before its Stream stops counting it.
	require.Eventually(t, func() bool { return g.Stats().Watches == 1 }, ws.Timeout, time.Millisecond)
	f.answer(m[1], 100)
	for range 2 {
		rev, err := g.RequestProgress(ctx(t))
		require.NoError(t, err)
		require.EqualValues(t, 100, rev)
	}
}

// failForGood makes the fake's stream i send w a response above a 32 KiB
// receive limit, which fails w's Stream for good, and waits for w's end.
func (f *fake) failForGood(t *testing.T, i int, w *etcdwatch.Watch) {
	t.Helper()
	f.stream(i).st.Send(t, ws.Events(w.ID(), 6, ws.Put(string(w.Request().Key), strings.Repeat("x", 64<<10), 6)))
	select {
	case <-w.Done():
	case <-timeout():
		t.Fatal("the watch did not end")
	}
	require.ErrorIs(t, w.Err(), etcdwatch.ErrStreamFailed)
	require.Equal(t, codes.ResourceExhausted, status.Code(w.Err()))
}

// TestWatchIsNotPlacedOnAFailedStream: one Stream of two failed for good,
// and the other is reconnecting (its member restarting). A Watch made then
// goes to the one reconnecting, and is confirmed once it is back; the
// failed Stream, though it has the fewest watches, would refuse it at once.
// The failed one says so in its State; the group's State does not, since
// the group can still watch.
func TestWatchIsNotPlacedOnAFailedStream(t *testing.T) {
	f := serve(t)
	g := newGroup(t, f, 2, group.WithStreamOptions(etcdwatch.WithCallOptions(grpc.MaxCallRecvMsgSize(32<<10))))
	watches, m := f.mapping(t, g, "a", 2)
	f.failForGood(t, m[0], watches[0])
	require.ErrorIs(t, g.Streams()[0].State.Failed, etcdwatch.ErrStreamFailed)
	require.NoError(t, g.Streams()[1].State.Failed)
	require.NoError(t, g.State().Failed, "the group can still watch")

	f.mu.Lock()
	f.holdNext = true
	f.mu.Unlock()
	f.stream(m[1]).st.Close(status.Error(codes.Unavailable, "member restarting"))
	require.Eventually(t, func() bool { return !g.Streams()[1].State.Connected }, ws.Timeout, time.Millisecond)
	res := make(chan error, 1)
	go func() {
		_, err := g.Watch(ctx(t), etcdwatch.Key("new"))
		res <- err
	}()
	require.Eventually(t, func() bool { return len(res) > 0 || g.Streams()[1].Stats.Watches == 2 }, ws.Timeout, time.Millisecond,
		"the Watch neither failed nor reached a Stream")
	select {
	case err := <-res:
		t.Fatalf("the Watch went to the Stream that failed for good: %v", err)
	default:
	}
	f.release(2) // the reconnecting Stream's new gRPC stream
	require.NoError(t, <-res)
	require.Equal(t, 2, f.streamOf("new"))
}

// TestCreateInFlightCountsOnce: a watch whose create is in flight counts
// once in placement, in its Stream's Stats (which count it from when the
// dispatcher has its create), not a second time as being placed. Two
// Streams with a watch each; slow/0 goes to Stream 0 and its create is
// held at the server. Then x goes to Stream 1 (2 against 1), and y finds
// 2 against 2: the tie goes to Stream 0, where its create waits behind
// slow/0's. Counted twice, Stream 0 would read 3 and y would go to Stream
// 1 too.
func TestCreateInFlightCountsOnce(t *testing.T) {
	f := serve(t)
	g := newGroup(t, f, 2)
	_, m := f.mapping(t, g, "first", 2)
	slow := watchAsync(g, etcdwatch.Key("slow/0"))
	f.holding(1)
	require.EqualValues(t, 3, g.Stats().Watches, "slow/0 counted in its Stream's Stats")
	_, err := g.Watch(ctx(t), etcdwatch.Key("x"))
	require.NoError(t, err)
	require.Equal(t, m[1], f.streamOf("x"))
	y := watchAsync(g, etcdwatch.Key("y"))
	// Placed while slow/0 is held: its Stream has counted it (the group has
	// no hook to wait on).
	require.Eventually(t, func() bool { return g.Stats().Watches == 5 }, ws.Timeout, time.Millisecond)
	close(f.slow)
	require.NoError(t, <-slow)
	require.NoError(t, <-y)
	require.Equal(t, m[0], f.streamOf("slow/0"))
	require.Equal(t, m[0], f.streamOf("y"), "y: 2 watches against 2, the tie to Stream 0")
}

// watchAsync calls g.Watch in a goroutine, which returns with the call;
// its error arrives on the channel.
func watchAsync(g *group.Group, r etcdwatch.Request) <-chan error {
	done := make(chan error, 1)
	go func() {
		c, cancel := context.WithTimeout(context.Background(), ws.Timeout)
		defer cancel()
		_, err := g.Watch(c, r)
		done <- err
	}()
	return done
}

// TestPinnedCreateInFlightCountsOnce: the same for a pinned watch, which
// its pinned Stream stands for in placement from before its create is
// answered. slow/p goes on Stream 0's connection, its create held; then a
// goes to Stream 1 (1 against 0) and b, at 1 against 1, to Stream 0.
// Counted twice, the pinned watch would weigh 2 and b go to Stream 1 too.
func TestPinnedCreateInFlightCountsOnce(t *testing.T) {
	f := serve(t)
	g := newGroup(t, f, 2)
	done := make(chan error, 1)
	go func() {
		_, err := g.WatchPinned(ctx(t), etcdwatch.Key("slow/p"))
		done <- err
	}()
	f.holding(1)
	_, err := g.Watch(ctx(t), etcdwatch.Key("a"))
	require.NoError(t, err)
	_, err = g.Watch(ctx(t), etcdwatch.Key("b"))
	require.NoError(t, err)
	a, b := f.streamOf("a"), f.streamOf("b")
	close(f.slow)
	require.NoError(t, <-done)
	require.NotEqual(t, a, b, "the pinned watch weighs 1 on Stream 0's connection")
}

// TestIdleStreamBackAfterAFailureTakesWatches: a Stream without watches
// whose gRPC stream failed (its member restarted, say) is healthy again as
// soon as the new stream's server answers: placement gives it the next
// watch, rather than piling watches, for life, on the others.
func TestIdleStreamBackAfterAFailureTakesWatches(t *testing.T) {
	f := serve(t)
	g := newGroup(t, f, 2, group.WithStreamOptions(etcdwatch.WithReconnectBackoff(time.Millisecond, 10*time.Millisecond)))
	watches, m := f.mapping(t, g, "a", 2)
	watches[1].Cancel() // Stream 1 has none
	f.await(func() bool { return f.streams[m[1]].cancels == 1 }, "a1 canceled")
	f.stream(m[1]).st.Close(status.Error(codes.Unavailable, "member restarting"))
	f.await(func() bool { return len(f.streams) == 3 && f.streams[2].cancels == 1 },
		"Stream 1's next gRPC stream probed, the probe answered and released")
	_, err := g.Watch(ctx(t), etcdwatch.Key("x"))
	require.NoError(t, err)
	require.Equal(t, 2, f.streamOf("x"), "x to Stream 1: 0 watches against 1, its server answering")
}

// gateCtx is a context whose nth Err call (context.Cause makes one) waits
// until released is closed: it holds a call at that point.
type gateCtx struct {
	context.Context
	n        int32
	calls    atomic.Int32
	entered  chan struct{}
	released chan struct{}
}

func (c *gateCtx) Err() error {
	if c.calls.Add(1) == c.n {
		close(c.entered)
		<-c.released
	}
	return c.Context.Err()
}

// TestPlacedWatchCountsUntilItsStreamHasIt: a watch placed on a Stream
// counts there from its placement on, with no moment in between where it
// counts nowhere. Watch a is placed on one of two empty Streams and held
// inside its Stream's Watch call (at that call's look at ctx, its second:
// the group's is first); Watch b, placed meanwhile, goes to the other.
func TestPlacedWatchCountsUntilItsStreamHasIt(t *testing.T) {
	f := serve(t)
	g := newGroup(t, f, 2)
	gc := &gateCtx{Context: ctx(t), n: 2, entered: make(chan struct{}), released: make(chan struct{})}
	res := make(chan error, 1)
	go func() {
		_, err := g.Watch(gc, etcdwatch.Key("a"))
		res <- err
	}()
	select {
	case <-gc.entered:
	case <-timeout():
		t.Fatal("a's Watch call not held")
	}
	_, err := g.Watch(ctx(t), etcdwatch.Key("b"))
	require.NoError(t, err)
	close(gc.released)
	require.NoError(t, <-res)
	require.NotEqual(t, f.streamOf("a"), f.streamOf("b"), "a and b on one Stream, the other empty")
}

// TestGroupStateLeavesOutIdleAndFailedStreams: the group's State counts a
// Stream of its own by its errors only while nothing has been asked of it
// (fewer watches than Streams, or views alone, whose watches are pinned),
// and once it failed for good (placement leaves it out, and the group can
// still watch). The group read disconnected then for as long as it lasted:
// with liveness probes off, for ever.
func TestGroupStateLeavesOutIdleAndFailedStreams(t *testing.T) {
	t.Run("idle", func(t *testing.T) {
		f := serve(t)
		g := newGroup(t, f, 2, group.WithStreamOptions(etcdwatch.WithLiveness(0, 0)))
		require.False(t, g.State().Connected, "nothing answered yet")
		_, err := g.WatchPinned(ctx(t), etcdwatch.Key("p"))
		require.NoError(t, err)
		require.True(t, g.State().Connected, "a pinned watch answered; the group's own Streams asked nothing")
		_, err = g.Watch(ctx(t), etcdwatch.Key("a"))
		require.NoError(t, err)
		require.True(t, g.State().Connected, "one Stream answered, the other asked nothing")
	})
	t.Run("failed", func(t *testing.T) {
		f := serve(t)
		g := newGroup(t, f, 2, group.WithStreamOptions(etcdwatch.WithCallOptions(grpc.MaxCallRecvMsgSize(32<<10))))
		watches, m := f.mapping(t, g, "a", 2)
		f.failForGood(t, m[0], watches[0])
		_, err := g.Watch(ctx(t), etcdwatch.Key("b"))
		require.NoError(t, err)
		st := g.State()
		require.NoError(t, st.Failed, "the group can still watch")
		require.True(t, st.Connected, "the Stream that failed for good counts by its error only")
		require.Equal(t, codes.ResourceExhausted, status.Code(st.LastError), "its error still shows")
	})
}

// TestGroupFailedOnceEveryOwnStreamFailed: State.Failed is set once every
// Stream of the group's own has failed for good, however many there are,
// one included, and not while one has not. Catches the failure taken from
// another Stream than the first (a group of one never reading failed).
func TestGroupFailedOnceEveryOwnStreamFailed(t *testing.T) {
	for _, n := range []int{1, 2} {
		f := serve(t)
		g := newGroup(t, f, n, group.WithStreamOptions(etcdwatch.WithCallOptions(grpc.MaxCallRecvMsgSize(32<<10))))
		watches, m := f.mapping(t, g, "a", n)
		for i := range n {
			require.NoError(t, g.State().Failed, "%d of %d Streams failed for good: the group can still watch", i, n)
			f.failForGood(t, m[i], watches[i])
		}
		require.ErrorIs(t, g.State().Failed, etcdwatch.ErrStreamFailed, "every one of %d Streams failed for good", n)
	}
}

// TestGroupStateCountsAStreamAskedAndNotAnswered: an own Stream that has
// a watch whose create its server has not answered counts in the group's
// State in full: the group reads disconnected until it answers, though the
// other Stream is connected. Only one asked nothing counts by its errors.
func TestGroupStateCountsAStreamAskedAndNotAnswered(t *testing.T) {
	f := serve(t)
	g := newGroup(t, f, 2, group.WithStreamOptions(etcdwatch.WithLiveness(0, 0)))
	_, err := g.Watch(ctx(t), etcdwatch.Key("a")) // Stream 0, answered
	require.NoError(t, err)
	require.True(t, g.State().Connected, "one Stream answered, the other asked nothing")
	slow := watchAsync(g, etcdwatch.Key("slow/1")) // Stream 1: 0 watches against 1
	f.holding(1)
	require.EqualValues(t, 1, g.Streams()[1].Stats.Watches, "slow/1 on Stream 1, counted by its call")
	require.False(t, g.State().Connected, "Stream 1 was asked, and its server has not answered")
	close(f.slow)
	require.NoError(t, <-slow)
	require.True(t, g.State().Connected, "Stream 1 answered")
}

// TestRequestProgressOfFailedStreamsIsTheirFailure: RequestProgress on a
// group whose every Stream with watches failed for good returns that
// failure, not ErrNoWatches, as its doc says. Catches the failure dropped
// as the Streams are left out.
func TestRequestProgressOfFailedStreamsIsTheirFailure(t *testing.T) {
	f := serve(t)
	g := newGroup(t, f, 1, group.WithStreamOptions(etcdwatch.WithCallOptions(grpc.MaxCallRecvMsgSize(32<<10))))
	watches, m := f.mapping(t, g, "a", 1)
	f.failForGood(t, m[0], watches[0])
	_, err := g.RequestProgress(ctx(t))
	require.ErrorIs(t, err, etcdwatch.ErrStreamFailed)
	require.NotErrorIs(t, err, etcdwatch.ErrNoWatches)
}

package group_test

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/etcdwatch/etcdwatch"
	"github.com/etcdwatch/etcdwatch/dial"
	"github.com/etcdwatch/etcdwatch/group"
	ws "github.com/etcdwatch/etcdwatch/internal/watchserver"
)

// dialScripted opens group.Dial over the scripted servers, server i at
// endpoint i.
func dialScripted(t *testing.T, servers []*ws.Server, opts ...group.Option) *group.Group {
	t.Helper()
	at := map[string]*ws.Server{}
	var endpoints []string
	for i, s := range servers {
		ep := fmt.Sprintf("127.0.0.1:%d", i+1)
		at[ep] = s
		endpoints = append(endpoints, ep)
	}
	dialer := func(ctx context.Context, addr string) (net.Conn, error) { return at[addr].Connect(ctx) }
	opts = append([]group.Option{group.WithDialOptions(dial.WithInsecure(), dial.WithGRPCOptions(grpc.WithContextDialer(dialer)))}, opts...)
	g, err := group.Dial(endpoints, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, g.Close()) })
	return g
}

var noLeader = status.Error(codes.Unavailable, "etcdserver: no leader")

// TestDialLeavesALeaderlessMemberAndGoesHome: a Stream whose member
// refuses it for want of a leader goes to the next member, not back to the
// same one; once its member says it has a leader again (Status), the
// Stream goes home after the settle time, and its watch resumes there
// from the revision after the last it delivered, with nothing repeated.
func TestDialLeavesALeaderlessMemberAndGoesHome(t *testing.T) {
	home, other := ws.StartRelease(t, "3.6.0"), ws.StartRelease(t, "3.6.0")
	other.SetLeader(1)
	g := dialScripted(t, []*ws.Server{home, other}, group.WithStreams(1), group.WithHoming(100*time.Millisecond),
		group.WithStreamOptions(etcdwatch.WithRequireLeader()))

	type opened struct {
		w   *etcdwatch.Watch
		err error
	}
	done := make(chan opened, 1)
	go func() { // returns once the watch is confirmed or refused, within the test's context
		w, err := g.Watch(t.Context(), etcdwatch.Key("k"))
		done <- opened{w, err}
	}()
	refused := home.Accept(t)
	require.Equal(t, []string{"true"}, refused.Metadata().Get("hasleader"))
	refused.Close(noLeader)

	away := other.Accept(t)
	c := away.RecvCreate(t)
	away.Send(t, ws.Created(c.WatchId, 5))
	o := <-done
	require.NoError(t, o.err)
	away.Send(t, ws.Events(c.WatchId, 6, ws.Put("k", "away", 6)))
	requireEvent(t, o.w, "away", 6)
	select {
	case st := <-home.Streams():
		t.Fatalf("a stream went back to the leaderless member: %v", st.Metadata())
	default:
	}

	home.SetLeader(1)
	back := home.Accept(t)
	c2 := back.RecvCreate(t)
	// At the head, the Stream asks for the revision it delivered again
	// (see entry.start), and drops it as it comes.
	require.EqualValues(t, 6, c2.StartRevision, "the watch resumes from its own revision")
	require.True(t, away.Ended(t), "the stream away from home ended")
	back.Send(t, ws.Created(c2.WatchId, 6))
	back.Send(t, ws.Events(c2.WatchId, 7, ws.Put("k", "away", 6), ws.Put("k", "home", 7)))
	requireEvent(t, o.w, "home", 7)
	require.EqualValues(t, 1, g.Stats().Moved)
}

// requireEvent reads the watch's next response and checks it is the put
// of value at rev.
func requireEvent(t *testing.T, w *etcdwatch.Watch, value string, rev int64) {
	t.Helper()
	select {
	case resp, ok := <-w.Responses():
		require.True(t, ok, "the watch ended: %v", w.Err())
		require.Len(t, resp.Events, 1, "%v", resp.Events)
		require.Equal(t, value, string(resp.Events[0].Value))
		require.Equal(t, rev, resp.Events[0].ModRevision)
	case <-timeout():
		t.Fatal("no event")
	}
}

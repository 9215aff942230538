package group_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/etcdwatch/etcdwatch"
	"github.com/etcdwatch/etcdwatch/dial"
	"github.com/etcdwatch/etcdwatch/group"
	ws "github.com/etcdwatch/etcdwatch/internal/watchserver"
)

// The route's wait for a ready connection (route.call), which stands in
// for gRPC's own across members: for a Stream's Watch RPCs and for calls
// through the group's Conn.

// TestWaitForReadyCallOptionDoesNotTieTheStreamToItsHome: a Stream whose
// call options make its RPCs wait for a ready connection
// (WithCallOptions(grpc.WaitForReady(true))) waits for its route's, as
// route.call does for other RPCs, not for one member's: once its home's
// first attempt to connect fails (a member that drops packets: dial's
// 5s connect timeout), its Watch RPC opens on the next member, which is
// up.
func TestWaitForReadyCallOptionDoesNotTieTheStreamToItsHome(t *testing.T) {
	other := ws.StartRelease(t, "3.6.0")
	other.SetLeader(1)
	dialer := func(ctx context.Context, addr string) (net.Conn, error) {
		if addr == "127.0.0.1:1" { // home: its connection attempts hang until they time out
			<-ctx.Done()
			return nil, ctx.Err()
		}
		return other.Connect(ctx)
	}
	g, err := group.Dial([]string{"127.0.0.1:1", "127.0.0.1:2"},
		group.WithDialOptions(dial.WithInsecure(), dial.WithGRPCOptions(grpc.WithContextDialer(dialer))),
		group.WithStreams(1),
		group.WithStreamOptions(etcdwatch.WithCallOptions(grpc.WaitForReady(true))))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, g.Close()) })

	done := openAsync(t, g, etcdwatch.Key("k"))
	confirmNext(t, other, "k", 5) // within ws.Timeout (10s): the home's attempt fails after 5s
	require.NoError(t, done.wait(t).err)
}

// TestWaitForReadyCallEndsWithItsContextsCode: a call through the group's
// Conn that waits for a ready connection, while every member is down,
// ends with the code of its context's end, as a call on a
// *grpc.ClientConn does (DeadlineExceeded, Canceled), also when the
// context has a cause, as etcdwatch's and views' contexts do: not with
// Unknown.
func TestWaitForReadyCallEndsWithItsContextsCode(t *testing.T) {
	servers := []*ws.Server{ws.StartRelease(t, "3.6.0"), ws.StartRelease(t, "3.6.0")}
	// Members refused stay refused (no reconnect within the test), so
	// that the call is waiting for a change, not in an attempt, when its
	// deadline comes: each attempt fails at once.
	g := dialScriptedDown(t, servers, func(int) bool { return true }, group.WithStreams(1),
		group.WithDialOptions(dial.WithGRPCOptions(grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: backoff.Config{BaseDelay: time.Minute, Multiplier: 1, MaxDelay: time.Minute}}))))

	cause := errors.New("the caller gave up")
	c, cancel := context.WithTimeoutCause(context.Background(), 500*time.Millisecond, cause)
	defer cancel()
	_, err := pb.NewKVClient(g.Conn()).Range(c, &pb.RangeRequest{Key: []byte("k")}, grpc.WaitForReady(true))
	require.ErrorIs(t, c.Err(), context.DeadlineExceeded, "the call ended before its deadline: %v", err)
	require.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v", err)
}

// TestWaitForReadyCallEndsAtClose: a call through the group's Conn that
// waits for a ready connection ends when Close closes the connections, as
// one on a *grpc.ClientConn does, rather than waiting for a member that
// no longer can come up.
func TestWaitForReadyCallEndsAtClose(t *testing.T) {
	servers := []*ws.Server{ws.StartRelease(t, "3.6.0"), ws.StartRelease(t, "3.6.0")}
	g := dialScriptedDown(t, servers, func(int) bool { return true }, group.WithStreams(1))

	c, cancel := context.WithCancel(context.Background())
	defer cancel()
	ended := make(chan error, 1)
	go func() { // returns once the call ends; the deferred cancel ends it at the latest
		_, err := pb.NewKVClient(g.Conn()).Range(c, &pb.RangeRequest{Key: []byte("k")}, grpc.WaitForReady(true))
		ended <- err
	}()
	require.Eventually(t, func() bool { return g.Streams()[0].State.LastError != nil }, ws.Timeout, time.Millisecond,
		"the Stream reported no failure") // both members refused: the call waits
	select {
	case err := <-ended:
		t.Fatalf("the call ended before Close: %v", err)
	default:
	}
	require.NoError(t, g.Close())
	select {
	case err := <-ended:
		require.Equal(t, codes.Canceled, status.Code(err), "as on a closed *grpc.ClientConn: %v", err)
	case <-time.After(ws.Timeout):
		t.Fatal("the call still waits after Close")
	}
}

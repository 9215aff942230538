package view_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/etcdwatch/etcdwatch"
	ws "github.com/etcdwatch/etcdwatch/internal/watchserver"
	"github.com/etcdwatch/etcdwatch/view"
)

// TestSyncAfterCloseSaysClosed: Sync and WaitForRevision on a closed View
// return view.ErrClosed, never the error of an RPC the close cut short,
// whether Sync asks for progress or, where progress is unsafe (3.4.23),
// reads the range.
func TestSyncAfterCloseSaysClosed(t *testing.T) {
	for _, release := range []string{"", "3.4.23"} {
		t.Run("release "+release, func(t *testing.T) {
			h := harnessOn(t, ws.StartRelease(t, release))
			vh := openView(h, view.DecodeBytes)
			vh.v.Close()
			for range 20 { // a race lost half of the time would show
				require.ErrorIs(t, vh.v.Sync(context.Background()), view.ErrClosed)
				require.ErrorIs(t, vh.v.WaitForRevision(context.Background(), vh.v.Revision()+1), view.ErrClosed)
			}
		})
	}
}

// TestSyncRefusedMatchesTheWatchSentinel: a Sync whose read the server
// refuses (on 3.4.23, where Sync reads) says why as a Watch would.
func TestSyncRefusedMatchesTheWatchSentinel(t *testing.T) {
	h := harnessOn(t, ws.StartRelease(t, "3.4.23"))
	vh := openView(h, view.DecodeBytes)
	vh.kv.FailNext(status.Error(codes.PermissionDenied, "etcdserver: permission denied"))
	err := vh.v.Sync(context.Background())
	require.ErrorIs(t, err, etcdwatch.ErrPermissionDenied)
	require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
}

// TestListingRefusedForItsTokenIsTriedOnce: a listing, or a Sync's read,
// refused for its token (expired: package dial then drops it) is made once
// more at once, as a Stream re-creates a watch refused for its token; a
// second refusal is final. Catches: a view ended by its token's TTL.
func TestListingRefusedForItsTokenIsTriedOnce(t *testing.T) {
	expired := status.Error(codes.Unauthenticated, "etcdserver: invalid auth token")
	h := newHarness(t)
	putKeys(h.server.KV(), 2)
	h.server.KV().FailNext(expired)
	vh := openView(h, view.DecodeBytes)
	require.Equal(t, 2, vh.v.Len())
	vh.kv.Put("w/elsewhere", "x") // for the Sync to wait for
	vh.kv.FailNext(expired)
	synced := callAsync(func() error { return vh.v.Sync(context.Background()) })
	require.NotNil(t, vh.srv.Recv(t).GetProgressRequest())
	vh.srv.Send(t, ws.Progress(-1, vh.kv.Revision()))
	require.NoError(t, recv(t, synced, "Sync"))
	vh.kv.FailNext(expired, expired)
	require.ErrorIs(t, vh.v.Sync(context.Background()), etcdwatch.ErrUnauthenticated)
}

// TestNewRefusedMatchesTheWatchSentinel: a view whose listing the server
// refuses ends New with an error that matches what a Watch refused for
// the same cause matches (errors.Is with the root's sentinels, errors.As
// with *etcdwatch.ServerError), and keeps the gRPC status.
func TestNewRefusedMatchesTheWatchSentinel(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want error
	}{
		{status.Error(codes.PermissionDenied, "etcdserver: permission denied"), etcdwatch.ErrPermissionDenied},
		{status.Error(codes.Unauthenticated, "etcdserver: invalid auth token"), etcdwatch.ErrUnauthenticated},
		{status.Error(codes.InvalidArgument, "etcdserver: user name is empty"), etcdwatch.ErrUnauthenticated},
	} {
		h := newHarness(t)
		h.server.KV().FailNext(tc.err, tc.err) // a refused token is tried once more (package dial drops it): refused twice
		_, err := view.New(context.Background(), h.s, etcdwatch.Prefix("v/"), view.DecodeBytes)
		require.ErrorIs(t, err, tc.want, "%v", err)
		var se *etcdwatch.ServerError
		require.ErrorAs(t, err, &se)
		require.Equal(t, status.Code(tc.err), status.Code(err))
	}
}

// TestSyncRetriesAnUnavailableRead: a Sync whose read fails for a reason
// that may pass (a member's outage: Unavailable) reads again after the
// Stream's retry delay, as a listing does, and returns once the view has
// the store's revision; with every read failing, it gives up when its
// context ends, with the context's cause and the last failure. Both where
// Sync reads the store's revision (3.7) and where it reads the range
// (3.4.23, no safe progress).
func TestSyncRetriesAnUnavailableRead(t *testing.T) {
	unavailable := status.Error(codes.Unavailable, "keepalive ping failed to receive ACK within timeout")
	for _, release := range []string{"", "3.4.23"} {
		t.Run("release "+release, func(t *testing.T) {
			h := harnessOn(t, ws.StartRelease(t, release), etcdwatch.WithReconnectBackoff(time.Millisecond, 10*time.Millisecond))
			vh := openView(h, view.DecodeBytes)
			vh.kv.FailNext(unavailable, unavailable)
			require.NoError(t, vh.v.Sync(context.Background()))
			require.GreaterOrEqual(t, vh.v.Revision(), vh.kv.Revision())

			failing := make([]error, 1000)
			for i := range failing {
				failing[i] = unavailable
			}
			vh.kv.FailNext(failing...)
			before := len(vh.kv.Requests())
			ctx, cancel := context.WithCancelCause(context.Background())
			done := make(chan error, 1)
			go func() { done <- vh.v.Sync(ctx) }()
			require.Eventually(t, func() bool { return len(vh.kv.Requests()) >= before+3 }, ws.Timeout, time.Millisecond,
				"Sync read again after a failure")
			gaveUp := errors.New("gave up")
			cancel(gaveUp)
			var err error
			select {
			case err = <-done:
			case <-time.After(ws.Timeout):
				t.Fatal("Sync did not end with its context")
			}
			require.ErrorIs(t, err, gaveUp)
			require.Equal(t, codes.Unavailable, status.Code(err), "the last failure, kept: %v", err)
		})
	}
}

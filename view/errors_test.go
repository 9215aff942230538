package view_test

import (
	"context"
	"testing"

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
		h.server.KV().FailNext(tc.err)
		_, err := view.New(context.Background(), h.s, etcdwatch.Prefix("v/"), view.DecodeBytes)
		require.ErrorIs(t, err, tc.want, "%v", err)
		var se *etcdwatch.ServerError
		require.ErrorAs(t, err, &se)
		require.Equal(t, status.Code(tc.err), status.Code(err))
	}
}

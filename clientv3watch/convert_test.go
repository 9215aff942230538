package clientv3watch

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/etcdwatch/etcdwatch"
)

// TestFinalOfAFailedStream: a stream etcdwatch ends for good with a gRPC
// error gives the response clientv3 gives for the error that ends its
// stream, Err() included; a code clientv3 would retry for ever (its stream
// never ends on it) keeps a canceled response with the reason.
func TestFinalOfAFailedStream(t *testing.T) {
	for _, c := range []struct {
		name   string
		err    error
		reason bool // the response carries the reason, not clientv3's error
		check  func(t *testing.T, err error)
	}{
		{name: "connection closed", err: status.Error(codes.Canceled, "grpc: the client connection is closing"), check: func(t *testing.T, err error) {
			require.Equal(t, status.Error(codes.Canceled, "grpc: the client connection is closing"), err)
		}},
		{name: "over the receive limit", err: status.Error(codes.ResourceExhausted, "grpc: received message larger than max (2 vs. 1)"), check: func(t *testing.T, err error) {
			require.Equal(t, codes.ResourceExhausted, status.Code(err))
		}},
		{name: "an etcd error: rpctypes' own", err: rpctypes.ErrGRPCPermissionDenied, check: func(t *testing.T, err error) {
			require.ErrorIs(t, err, rpctypes.ErrPermissionDenied)
		}},
		{name: "Unavailable: clientv3 retries", err: status.Error(codes.Unavailable, "connection refused"), reason: true, check: func(t *testing.T, err error) {
			require.ErrorContains(t, err, "connection refused")
		}},
		{name: "Internal: clientv3 retries", err: status.Error(codes.Internal, "bad frame"), reason: true, check: func(t *testing.T, err error) {
			require.ErrorContains(t, err, "bad frame")
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			resp, ok := final(fmt.Errorf("%w: %w", etcdwatch.ErrStreamFailed, c.err), nil)
			require.True(t, ok)
			require.True(t, resp.Canceled)
			require.NotNil(t, resp.Header)
			require.Zero(t, resp.Header.Revision)
			require.Zero(t, resp.Header.MemberId)
			require.Empty(t, resp.Events)
			require.Equal(t, c.reason, resp.CancelReason != "", "reason %q", resp.CancelReason)
			c.check(t, resp.Err())
		})
	}
}

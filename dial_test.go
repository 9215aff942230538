package etcdwatch_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/etcdwatch/etcdwatch"
)

// TestDialEndpoints: Dial takes host:port with or without a scheme, and
// refuses an endpoint it would have to guess the port of.
func TestDialEndpoints(t *testing.T) {
	plain := grpc.WithTransportCredentials(insecure.NewCredentials())
	for _, tc := range []struct {
		endpoint string
		ok       bool
	}{
		{"127.0.0.1:2379", true},
		{"localhost:2379", true},
		{"[::1]:2379", true},
		{"http://127.0.0.1:2379", true},
		{"https://etcd.example:2379", true},
		{"", false},
		{"localhost", false},
		{"http://localhost", false},
		{"localhost:", false},
		{"localhost:http", false},
		{"localhost:70000", false},
		{"http://", false},
	} {
		conn, err := etcdwatch.Dial([]string{"127.0.0.1:2379", tc.endpoint}, plain)
		if tc.ok {
			require.NoError(t, err, tc.endpoint)
			require.NoError(t, conn.Close())
			continue
		}
		require.ErrorIs(t, err, etcdwatch.ErrInvalidArgument, "endpoint %q", tc.endpoint)
		require.Contains(t, err.Error(), tc.endpoint)
	}
	_, err := etcdwatch.Dial(nil, plain)
	require.ErrorIs(t, err, etcdwatch.ErrInvalidArgument)
}

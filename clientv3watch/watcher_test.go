package clientv3watch

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
)

// TestRecvLimit: the receive limit read from a client is the one clientv3
// puts on its calls: Config.MaxCallRecvMsgSize, or math.MaxInt32 for 0.
// (The contract suite shows a configured one kept on a real etcd.)
func TestRecvLimit(t *testing.T) {
	for _, c := range []struct{ configured, want int }{{0, math.MaxInt32}, {3 << 19, 3 << 19}} {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:1"}, MaxCallRecvMsgSize: c.configured}) // no call is made
		require.NoError(t, err)
		require.Equal(t, grpc.MaxCallRecvMsgSize(c.want), recvLimit(cli))
		cli.Close()
	}
}

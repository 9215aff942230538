package e2e

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/server/v3/proxy/grpcproxy"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/etcdwatch/etcdwatch"
)

// grpcProxy serves etcd's own gRPC watch proxy (what `etcd grpc-proxy`
// runs) on a loopback port in front of the shared member, until the test
// ends, and returns its address.
func grpcProxy(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	pctx, cancel := context.WithCancel(context.Background())
	wp, done := grpcproxy.NewWatchProxy(pctx, zap.NewNop(), client(t))
	srv := grpc.NewServer()
	pb.RegisterWatchServer(srv, wp)
	served := make(chan struct{})
	go func() { // ends with Stop
		defer close(served)
		_ = srv.Serve(lis)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-served
		cancel()
		select {
		case <-done:
		case <-time.After(wait):
			t.Error("the gRPC proxy did not stop")
		}
	})
	return lis.Addr().String()
}

// TestThroughEtcdGRPCProxy: etcd's gRPC proxy picks its own watch ids and
// answers a create that joins a range it already watches before earlier
// creates. Watches opened together through it, from goroutines or by one
// WatchAll, must each get their own events, never another watch's.
func TestThroughEtcdGRPCProxy(t *testing.T) {
	t.Run("Watch", func(t *testing.T) { throughGRPCProxy(t, false) })
	t.Run("WatchAll", func(t *testing.T) { throughGRPCProxy(t, true) })
}

func throughGRPCProxy(t *testing.T, watchAll bool) {
	leakCheck(t)
	s := openOn(t, []string{grpcProxy(t)})
	kv, ctx := client(t), ctx(t)
	const n = 40
	prefix := unique("gproxy")
	key := func(i int) string { return fmt.Sprintf("%s%02d", prefix, i%(n/2)) } // two watches per key
	watches := make([]*etcdwatch.Watch, n)
	if watchAll {
		watches = watchAllKeys(t, s, n, key)
	} else {
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				w, err := s.Watch(ctx, etcdwatch.Key(key(i)))
				if assert.NoError(t, err) {
					watches[i] = w
				}
			})
		}
		wg.Wait()
	}
	require.NotContains(t, watches, (*etcdwatch.Watch)(nil))
	require.True(t, s.Stats().IDsRewritten, "the proxy's own ids went unnoticed")
	for i := range n / 2 {
		_, err := kv.Put(ctx, key(i), fmt.Sprint("v", i))
		require.NoError(t, err)
	}
	for i, w := range watches {
		events := nextEvents(t, w)
		require.Len(t, events, 1)
		require.Equal(t, key(i), string(events[0].Key), "watch %d got another watch's event", i)
		require.Equal(t, fmt.Sprint("v", i%(n/2)), string(events[0].Value))
	}
	t.Logf("stats %+v", s.Stats())
}

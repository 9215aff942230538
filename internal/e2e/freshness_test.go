package e2e

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"

	"github.com/etcdwatch/etcdwatch"
	"github.com/etcdwatch/etcdwatch/dial"
	"github.com/etcdwatch/etcdwatch/view"
)

// readCounter counts the linearizable reads a view's Sync falls back to
// (a Range sorted by ModRevision), through an interceptor on the
// connection.
type readCounter struct{ n atomic.Int64 }

func (c *readCounter) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoke grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if r, ok := req.(*pb.RangeRequest); ok && r.SortTarget == pb.RangeRequest_MOD {
		c.n.Add(1)
	}
	return invoke(ctx, method, req, reply, cc, opts...)
}

// TestNeighboursCannotStarveAViewsProgress: on one Stream, one watch
// catching up from thousands of revisions back and one waiting for a
// future revision hold up every progress request of the Stream's main
// gRPC stream (etcd answers none until every watch on it is synced). A
// view's watch is isolated, so its Sync and WaitForRevision, of a
// revision written outside its range, are answered by progress all the
// same: no fallback read, and the view's revision moves to the write.
// The Stream-wide RequestProgress, which covers every watch, waits.
func TestNeighboursCannotStarveAViewsProgress(t *testing.T) {
	leakCheck(t)
	kv := client(t)
	var reads readCounter
	conn, err := dial.New([]string{etcd.Endpoint}, dial.WithInsecure(),
		dial.WithGRPCOptions(grpc.WithChainUnaryInterceptor(reads.unary)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	s, err := etcdwatch.Open(conn)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })

	backlog := unique("backlog")
	from := currentRevision(t, kv) + 1
	var wg sync.WaitGroup
	for g := range 8 { // 4,000 revisions: a watch from the first catches up for about 0.4s
		wg.Go(func() {
			for i := range 500 {
				if _, err := kv.Put(ctx(t), backlog+string(rune('a'+g)), string(rune(i))); !assert.NoError(t, err) {
					return // not require: this is not the test's goroutine
				}
			}
		})
	}
	wg.Wait()
	head := currentRevision(t, kv)

	v, err := view.New(ctx(t), s, etcdwatch.Prefix(unique("idle")), view.DecodeBytes)
	require.NoError(t, err)
	t.Cleanup(func() { v.Close() })
	future, err := s.Watch(ctx(t), etcdwatch.Key(unique("future")).FromRevision(head+1_000_000))
	require.NoError(t, err)
	catchingUp, err := s.Watch(ctx(t), etcdwatch.Prefix(backlog).FromRevision(from))
	require.NoError(t, err)
	var caughtUp atomic.Bool
	consumed := make(chan struct{})
	go func() { // reads the neighbour until it ends, with the Stream
		defer close(consumed)
		for r := range catchingUp.Responses() {
			if r.Revision >= head {
				caughtUp.Store(true)
			}
		}
	}()
	t.Cleanup(func() { catchingUp.Cancel(); <-consumed })

	rev := put(t, kv, unique("elsewhere"), "x")
	require.NoError(t, v.WaitForRevision(ctx(t), rev))
	require.GreaterOrEqual(t, v.Revision(), rev)
	require.NoError(t, v.Sync(ctx(t)))
	require.GreaterOrEqual(t, v.Revision(), rev)
	require.Zero(t, reads.n.Load(), "the view fell back to reading: its progress was held up")
	if caughtUp.Load() {
		// Not a failure: the future watch alone holds up the main gRPC
		// stream's progress (etcd answers none while a watch waits for a
		// revision the store has not reached), as the request below shows.
		t.Log("the catching-up neighbour had caught up before the view's calls returned")
	}

	short, cancel := context.WithTimeout(ctx(t), time.Second)
	defer cancel()
	_, err = s.RequestProgress(short)
	require.ErrorIs(t, err, context.DeadlineExceeded, "the Stream-wide progress covers the future watch, which etcd never answers for")
	require.NoError(t, future.Err())
}

package e2e

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/etcdwatch/etcdwatch"
	"github.com/etcdwatch/etcdwatch/dial"
	"github.com/etcdwatch/etcdwatch/view"
)

// pageSpy refuses RangeStream, as etcd before 3.7 does, and records the
// Limit of every Range of a listing (its requests with a Limit and no
// sort: the freshness reads sort).
type pageSpy struct {
	mu     sync.Mutex
	limits []int64
}

func (p *pageSpy) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoke grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if r, ok := req.(*pb.RangeRequest); ok && r.Limit > 0 && r.SortTarget == pb.RangeRequest_KEY && r.SortOrder == pb.RangeRequest_NONE {
		p.mu.Lock()
		p.limits = append(p.limits, r.Limit)
		p.mu.Unlock()
	}
	return invoke(ctx, method, req, reply, cc, opts...)
}

func (p *pageSpy) stream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	if method == pb.KV_RangeStream_FullMethodName {
		return nil, status.Error(codes.Unimplemented, "refused by the test: listing in pages")
	}
	return streamer(ctx, desc, cc, method, opts...)
}

func (p *pageSpy) pages() []int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]int64(nil), p.limits...)
}

// TestViewInitialSyncInGrowingPagesUnderWrites lists 20,000 keys in pages,
// as before etcd 3.7, while writers change them: a first page of
// WithPageSize keys, then pages of about WithPageBytes, each pinned to the
// first page's revision and asked for while the view takes the one before.
// Catches: a page read at another revision (the view would differ from a
// Range at its revision), a key lost or taken twice where two pages meet,
// pages that do not grow.
func TestViewInitialSyncInGrowingPagesUnderWrites(t *testing.T) {
	leakCheck(t)
	const n, first = 20_000, 100
	kv := client(t)
	prefix := unique("view-pages")
	t.Cleanup(func() { deleteKeys(t, kv, prefix, n+n/10) })
	lease, err := kv.Grant(ctx(t), 3600)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = kv.Revoke(context.Background(), lease.ID) })
	loadKeys(t, kv, prefix, n, lease.ID)

	var spy pageSpy
	conn, err := dial.New([]string{etcd.Endpoint}, dial.WithInsecure(),
		dial.WithGRPCOptions(grpc.WithChainUnaryInterceptor(spy.unary), grpc.WithChainStreamInterceptor(spy.stream)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	s, err := etcdwatch.Open(conn)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })

	w := startChurn(t, kv, prefix, n, 2, lease.ID)
	require.Eventually(t, func() bool { return w.commits.Load() >= 10 }, wait, time.Millisecond, "the writers do not write")
	before := w.commits.Load()
	v := newView(t, s, etcdwatch.Prefix(prefix), view.DecodeBytes, view.WithPageSize(first), view.WithPageBytes(64<<10))
	require.Positive(t, w.commits.Load()-before, "no write overlapped the listing")
	snap := v.Snapshot()
	requireEqualsServer(t, kv, v, snap)

	limits := spy.pages()
	require.Greater(t, len(limits), 2, "a listing of several pages: %v", limits)
	require.EqualValues(t, first, limits[0], "the first page is of WithPageSize keys")
	for _, l := range limits[1:] {
		require.Greater(t, l, int64(first), "later pages of about 64 KiB, more keys than the first: %v", limits)
	}
	last := w.Stop()
	require.NoError(t, v.Sync(ctx(t)))
	require.GreaterOrEqual(t, v.Revision(), last)
	requireEqualsServer(t, kv, v, v.Snapshot())
	t.Logf("%d keys in %d pages: %v", snap.Len(), len(limits), limits)
}

package view

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/grpc"

	ws "github.com/etcdwatch/etcdwatch/internal/watchserver"
)

// pagedLister is a lister of the range v/ on a scripted server holding n
// keys v/00, v/01, ... with one-byte values (37 bytes a key with the 32
// the lister adds for revisions and framing), which lists
// in pages of page keys and then of about bytes bytes.
func pagedLister(t *testing.T, n, page, bytes int) (*lister, *ws.KV) {
	server := ws.Start(t)
	kv := server.KV()
	for i := range n {
		kv.Put(fmt.Sprintf("v/%02d", i), fmt.Sprint(i%10))
	}
	l := &lister{
		kv: pb.NewKVClient(server.Dial(t)), key: []byte("v/"), end: []byte("v0"),
		page: int64(page), bytes: int64(bytes), paged: true,
		call: []grpc.CallOption{grpc.MaxCallRecvMsgSize(math.MaxInt32)},
	}
	return l, kv
}

func limits(reqs []*pb.RangeRequest) []int64 {
	var ls []int64
	for _, r := range reqs {
		ls = append(ls, r.Limit)
	}
	return ls
}

// TestPagesAskForTheNextPageFirst: the next page is asked for as soon as a
// page arrives, while its keys are still being taken. Catches: pages asked
// for one after another, the server idle while the client takes a page.
func TestPagesAskForTheNextPageFirst(t *testing.T) {
	l, kv := pagedLister(t, 6, 2, 0)
	var keys []string
	rev, err := l.pages(context.Background(), listing{}, func(kv2 *mvccpb.KeyValue) error {
		if len(keys) == 0 {
			kv.AwaitRequests(t, func(r []*pb.RangeRequest) bool { return len(r) >= 2 })
		}
		keys = append(keys, string(kv2.Key))
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, kv.Revision(), rev)
	require.Equal(t, []string{"v/00", "v/01", "v/02", "v/03", "v/04", "v/05"}, keys)
	require.Equal(t, []int64{2, 2, 2}, limits(kv.Requests()), "pages of WithPageSize keys when WithPageBytes is 0")
}

// TestPagesGrowToTheirBytes: after the first page, a page asks for as many
// keys as the byte target holds at the mean size read so far, and never
// fewer than the first. Catches: fixed pages, a limit from the last page
// alone, or one below WithPageSize.
func TestPagesGrowToTheirBytes(t *testing.T) {
	for _, tc := range []struct {
		name        string
		page, bytes int
		want        []int64
	}{
		{"grows to 4 keys of 37 bytes", 2, 4 * 37, []int64{2, 4, 4}},
		{"never below the first page", 3, 5, []int64{3, 3, 3, 3}},
		{"one page holds the rest", 2, 1 << 20, []int64{2, (1 << 20) / 37}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, kv := pagedLister(t, 10, tc.page, tc.bytes)
			n := 0
			_, err := l.pages(context.Background(), listing{}, func(*mvccpb.KeyValue) error { n++; return nil })
			require.NoError(t, err)
			require.Equal(t, 10, n)
			require.Equal(t, tc.want, limits(kv.Requests()))
		})
	}
}

// TestPagesEndWithTheTakersError: an error from fn ends the listing and is
// returned as it is, after the page already asked for has come back or
// been given up (goleak checks that its goroutine is gone).
func TestPagesEndWithTheTakersError(t *testing.T) {
	l, kv := pagedLister(t, 6, 2, 0)
	stop := errors.New("stop")
	_, err := l.pages(context.Background(), listing{}, func(*mvccpb.KeyValue) error { return stop })
	require.Same(t, stop, err)
	require.LessOrEqual(t, len(kv.Requests()), 2, "no page asked for after the failure")
}

// TestPagesShrinkBackWhenTooLarge: a grown page above the Stream's receive
// limit is asked for again at the first page's size, and so are the pages
// after it; every key is taken once, in order. Catches: a listing that
// fails (view.New would, for good: a refusal as too large is not retried)
// on a page only this listing made that large.
func TestPagesShrinkBackWhenTooLarge(t *testing.T) {
	l, kv := pagedLister(t, 0, 2, 1<<20)
	for i := range 10 {
		kv.Put(fmt.Sprintf("v/%02d", i), strings.Repeat("x", 100))
	}
	l.call = append(l.call, grpc.MaxCallRecvMsgSize(600)) // 2 keys fit, 4 do not
	var keys []string
	_, err := l.pages(context.Background(), listing{}, func(kv *mvccpb.KeyValue) error {
		keys = append(keys, string(kv.Key))
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, []string{"v/00", "v/01", "v/02", "v/03", "v/04", "v/05", "v/06", "v/07", "v/08", "v/09"}, keys)
	ls := limits(kv.Requests())
	require.Greater(t, ls[1], int64(2), "the second page grew: %v", ls)
	require.Equal(t, []int64{2, 2, 2, 2, 2}, append(ls[:1:1], ls[2:]...), "the refused page again, and the rest, at the first's size")
}

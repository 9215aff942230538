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
// the lister adds for revisions and framing), which lists in pages of page
// keys and then of about bytes bytes.
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
// keys as the byte target holds at the mean size of the page before, never
// fewer than the first and at most twice the page before. Catches: fixed
// pages, a limit below WithPageSize, a page grown past twice the one
// before (keys that grow large after small ones would make it huge).
func TestPagesGrowToTheirBytes(t *testing.T) {
	for _, tc := range []struct {
		name        string
		page, bytes int
		want        []int64
	}{
		{"grows to 4 keys of 37 bytes", 2, 4 * 37, []int64{2, 4, 4}},
		{"never below the first page", 3, 5, []int64{3, 3, 3, 3}},
		{"at most twice the page before", 2, 1 << 20, []int64{2, 4, 8}},
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
	var want []string
	for i := range 20 {
		kv.Put(fmt.Sprintf("v/%02d", i), strings.Repeat("x", 100))
		want = append(want, fmt.Sprintf("v/%02d", i))
	}
	l.call = append(l.call, grpc.MaxCallRecvMsgSize(600)) // 4 keys of about 120 bytes fit, 8 do not
	var keys []string
	_, err := l.pages(context.Background(), listing{}, func(kv *mvccpb.KeyValue) error {
		keys = append(keys, string(kv.Key))
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, want, keys)
	require.Equal(t, []int64{2, 4, 8, 2, 2, 2, 2, 2, 2, 2}, limits(kv.Requests()),
		"pages of 2 and 4 keys; 8 refused, asked for again, and the rest, at the first's size")
}

// TestPagesShrinkWhenKeysGrow: a page is sized by the page before, so
// pages grow while keys are small and shrink back, not below the first,
// once they are large. Catches: a size from the mean of the whole listing
// (keys that grow large after many small ones would make pages huge).
func TestPagesShrinkWhenKeysGrow(t *testing.T) {
	l, kv := pagedLister(t, 0, 2, 4096)
	for i := range 16 {
		value := "x" // 37 bytes a key
		if i >= 4 {
			value = strings.Repeat("x", 1000) // 1,036
		}
		kv.Put(fmt.Sprintf("v/%02d", i), value)
	}
	n := 0
	_, err := l.pages(context.Background(), listing{}, func(*mvccpb.KeyValue) error { n++; return nil })
	require.NoError(t, err)
	require.Equal(t, 16, n)
	// 2 small; then twice that; 2 small and 2 large (536 a key): 7; 7 large: 3.
	require.Equal(t, []int64{2, 4, 7, 3}, limits(kv.Requests()))
}

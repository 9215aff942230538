package view

import (
	"context"
	"io"
	"math"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/etcdwatch/etcdwatch/internal/rpcerr"
)

// lister reads a view's range at one revision, in key order: with the
// RangeStream RPC of etcd 3.7 and later, which reads the whole range from
// one snapshot, or else with pages of Range all pinned to the revision of
// the first. It belongs to the goroutine that calls list.
type lister struct {
	kv       pb.KVClient
	key, end []byte
	page     int64 // keys in the first page, and at least in each
	bytes    int64 // bytes a later page aims at (WithPageBytes); 0: page keys each
	call     []grpc.CallOption
	paged    bool   // the server has no RangeStream: use pages
	cluster  uint64 // the cluster ID in the last listing's header, for saves (WithSave)
}

func newLister(src Source, key, end []byte, page, bytes int) *lister {
	return &lister{
		kv:    pb.NewKVClient(src.Conn()),
		key:   key,
		end:   end,
		page:  int64(page),
		bytes: int64(bytes),
		// A page holds as many values as it holds, up to etcd's own limits;
		// the Source's own call options come after, and may lower that.
		call: []grpc.CallOption{grpc.MaxCallRecvMsgSize(math.MaxInt32)},
	}
}

// listing is one read of the range: at rev, or at the newest revision
// (linearizable) for 0; keysOnly leaves the values out.
type listing struct {
	rev      int64
	keysOnly bool
}

// list calls fn for every key of the range at one revision, in key order, and
// returns that revision. fn may keep the KeyValue. An error from fn ends the
// listing and is returned as it is.
func (l *lister) list(ctx context.Context, at listing, fn func(*mvccpb.KeyValue) error) (int64, error) {
	if !l.paged {
		rev, err := l.stream(ctx, at, fn)
		if status.Code(err) != codes.Unimplemented {
			return rev, err
		}
		l.paged = true // before 3.7; nothing was read
	}
	return l.pages(ctx, at, fn)
}

func (l *lister) request(at listing) *pb.RangeRequest {
	return &pb.RangeRequest{Key: l.key, RangeEnd: l.end, Revision: at.rev, KeysOnly: at.keysOnly}
}

// stream reads the range with one RangeStream call, and returns the
// revision it read at: at.rev when pinned, else the header's, which its
// last message carries. (The header of a pinned read says the store's
// revision, not the one read at.)
func (l *lister) stream(ctx context.Context, at listing, fn func(*mvccpb.KeyValue) error) (int64, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	rs, err := l.kv.RangeStream(ctx, l.request(at), l.call...)
	if err != nil {
		return 0, err
	}
	rev := int64(0)
	for {
		m, err := rs.Recv()
		if err == io.EOF {
			if rev == 0 {
				return 0, status.Error(codes.Internal, "etcdwatch/view: RangeStream ended without a header")
			}
			if at.rev > 0 {
				return at.rev, nil
			}
			return rev, nil
		}
		if err != nil {
			return 0, err
		}
		r := m.GetRangeResponse()
		for _, kv := range r.GetKvs() {
			if err := fn(kv); err != nil {
				return 0, err
			}
		}
		if h := r.GetHeader(); h != nil {
			rev, l.cluster = h.Revision, h.ClusterId
		}
	}
}

// freshness is what a linearizable read says of the range now: its revision,
// how many keys it holds, and the highest ModRevision among them. A state at
// revision v with as many keys, none changed after v, is the range's state at
// rev too: any change after v would have left either a newer key or fewer.
type freshness struct {
	rev, count, newest int64
}

// seenBy reports whether a state at rev holding keys keys is the one the
// read f saw, or a later one: it is at f's revision or later, or it holds
// as many keys, none changed after rev. Any change to the range after rev
// would have left either a newer key or another count.
func (f freshness) seenBy(rev int64, keys int) bool {
	return rev >= f.rev || (int64(keys) == f.count && f.newest <= rev)
}

// fresh reads the range's freshness with one Range: the key with the newest
// ModRevision, without values, and the count of all.
func (l *lister) fresh(ctx context.Context) (freshness, error) {
	r, err := l.kv.Range(ctx, &pb.RangeRequest{
		Key: l.key, RangeEnd: l.end, Limit: 1, KeysOnly: true,
		SortTarget: pb.RangeRequest_MOD, SortOrder: pb.RangeRequest_DESCEND,
	}, l.call...)
	if err != nil {
		return freshness{}, err
	}
	f := freshness{rev: r.GetHeader().GetRevision(), count: r.Count}
	if len(r.Kvs) > 0 {
		f.newest = r.Kvs[0].ModRevision
	}
	return f, nil
}

// revision reads the store's revision now: header's.
func (l *lister) revision(ctx context.Context) (int64, error) {
	_, rev, err := l.header(ctx)
	return rev, err
}

// listRetryable reports whether a failed listing may succeed if tried again:
// anything but a refusal of the caller or of the request, or a response
// above the Stream's receive limit (grpc.MaxCallRecvMsgSize), which would
// come as large every time. A revision compacted during a paged listing
// (OutOfRange) is retried at a newer one.
func listRetryable(err error) bool {
	return !rpcerr.Final(err) && !rpcerr.Canceled(err) && !rpcerr.TooLarge(err)
}

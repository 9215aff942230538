package clientv3watch

import (
	"bytes"
	"context"
	"errors"
	"strings"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/etcdwatch/etcdwatch"
)

// watchSpec is a clientv3 watch call translated for etcdwatch.
type watchSpec struct {
	req           etcdwatch.Request
	createdNotify bool
	// refusal is the cancel reason etcd gives for a create it refuses
	// whatever the stream (which etcdwatch refuses before sending it).
	refusal string
}

// reasonEmptyRange is etcd's cancel reason for a range with key >= end.
const reasonEmptyRange = "mvcc: watcher range is empty"

// specOf reads the watch options through clientv3.OpWatch, as clientv3's
// Watch does (so it panics where clientv3 does), and its accessors,
// and normalises key and end as etcd does.
func specOf(key string, opts []clientv3.OpOption) watchSpec {
	op := clientv3.OpWatch(key, opts...)
	k, end := op.KeyBytes(), op.RangeBytes()
	if len(k) == 0 {
		k = []byte{0} // etcd's smallest key
	}
	if len(end) == 0 {
		end = nil // one key
	}
	sp := watchSpec{
		req: etcdwatch.Request{
			Key:            k,
			End:            end,
			Revision:       op.Rev(),
			PrevKV:         op.IsPrevKV(),
			NoPut:          op.IsFilterPut(),
			NoDelete:       op.IsFilterDelete(),
			ProgressNotify: op.IsProgressNotify(),
			Fragment:       op.IsFragment(),
		},
		createdNotify: op.IsCreatedNotify(),
	}
	fromKey := len(end) == 1 && end[0] == 0
	switch {
	case sp.req.Revision < 0:
		sp.refusal = rpctypes.ErrCompacted.Error() // what etcd answers
	case end != nil && !fromKey && bytes.Compare(k, end) >= 0:
		sp.refusal = reasonEmptyRange
	default:
		if err := sp.req.Validate(); err != nil {
			sp.refusal = err.Error()
		}
	}
	return sp
}

// createdResponse is the notification of WithCreatedNotify. Its header
// revision is the store's when the server created the watch, whatever
// revision the watch starts from, as clientv3's is: a program takes it as
// its start point. etcdwatch does not pass the rest of the created
// response's header on, so the cluster, member and term are zero.
func createdResponse(ew *etcdwatch.Watch) clientv3.WatchResponse {
	return clientv3.WatchResponse{Header: &pb.ResponseHeader{Revision: ew.CreatedRevision()}, Created: true}
}

// eventBox holds one event and its key-values in one allocation, so that a
// consumer keeping one event's Kv keeps nothing of the others.
type eventBox struct {
	ev       mvccpb.Event
	kv, prev mvccpb.KeyValue
}

func toHeader(h etcdwatch.Header) *pb.ResponseHeader {
	return &pb.ResponseHeader{ClusterId: h.ClusterID, MemberId: h.MemberID, Revision: h.Revision, RaftTerm: h.RaftTerm}
}

func setKV(dst *mvccpb.KeyValue, src *etcdwatch.KeyValue) {
	dst.Key, dst.Value = src.Key, src.Value
	dst.CreateRevision, dst.ModRevision, dst.Version, dst.Lease = src.CreateRevision, src.ModRevision, src.Version, src.Lease
}

// toResponse converts events or a bookmark. The byte slices are etcdwatch's
// own, which belong to the consumer: they are not copied.
func toResponse(r etcdwatch.Response) clientv3.WatchResponse {
	wr := clientv3.WatchResponse{Header: toHeader(r.Header)}
	if len(r.Events) == 0 {
		return wr
	}
	wr.Events = make([]*mvccpb.Event, len(r.Events))
	for i := range r.Events {
		e := &r.Events[i]
		b := new(eventBox)
		b.ev.Type = mvccpb.Event_EventType(e.Type)
		setKV(&b.kv, &e.KeyValue)
		b.ev.Kv = &b.kv
		if e.PrevKV != nil {
			setKV(&b.prev, e.PrevKV)
			b.ev.PrevKv = &b.prev
		}
		wr.Events[i] = &b.ev
	}
	return wr
}

// canceled is a final response whose Err() is rpctypes.Error of reason:
// the etcd error with that text if there is one (ErrNoLeader,
// ErrPermissionDenied, ErrCompacted, ...).
func canceled(reason string) clientv3.WatchResponse {
	return clientv3.WatchResponse{Header: &pb.ResponseHeader{}, Canceled: true, CancelReason: reason}
}

// final returns the response clientv3 sends when a watch ends for err, if
// it sends one: none when the watch was canceled or closed. last is the
// header of the last response delivered, for the compaction response.
func final(err error, last *etcdwatch.Header) (clientv3.WatchResponse, bool) {
	var (
		ce *etcdwatch.CompactedError
		se *etcdwatch.ServerError
	)
	switch {
	case err == nil, errors.Is(err, etcdwatch.ErrCanceled), errors.Is(err, etcdwatch.ErrClosed),
		errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return clientv3.WatchResponse{}, false
	case errors.Is(err, errLeaderLost):
		return canceled(rpctypes.ErrNoLeader.Error()), true
	case errors.As(err, &ce):
		h := toHeader(ce.Header)                    // the server's own
		if ce.Header.MemberID == 0 && last != nil { // a compaction the Stream met on resuming, with no response of its own
			h = toHeader(*last)
		}
		h.Revision = 0 // as etcd sends it
		return clientv3.WatchResponse{Header: h, CompactRevision: ce.CompactRevision, Canceled: true}, true
	case errors.As(err, &se):
		return canceled(reasonOr(se.Reason, se.Error())), true
	default: // the stream failed for good: a closed connection, a response over the receive limit, a refused permission
		var ge grpcError
		if errors.As(err, &ge) && halts(ge) {
			return streamEnded(ge), true
		}
		if s, ok := status.FromError(err); ok {
			return canceled(reasonOr(s.Message(), err.Error())), true
		}
		return canceled(err.Error()), true
	}
}

// grpcError is gRPC's status error, which etcdwatch wraps in the error that
// ends the watches of a stream that failed for good.
type grpcError interface {
	error
	GRPCStatus() *status.Status
}

// halts reports whether clientv3 ends its watch stream for err, rather
// than opening another: any code but Unavailable and Internal (its
// isHaltErr). etcdwatch retries more: it ends a stream for good only on
// PermissionDenied, Unauthenticated, InvalidArgument, Unimplemented, a
// response above the receive limit (ResourceExhausted) or a closed
// connection (Canceled), and opens another on the
// rest, where clientv3 ends its watches (see README). So the errors that
// reach streamEnded halt.
func halts(err grpcError) bool {
	switch err.GRPCStatus().Code() {
	case codes.OK, codes.Unavailable, codes.Internal:
		return false
	}
	return true
}

// streamEnded is the final response clientv3 sends on each watch of a
// stream it ended for the gRPC error err: Canceled, an empty header, no
// reason, and Err() returning err as rpctypes.Error gives it (gRPC's own
// status error, or the etcd error its text names). Err() reads that error
// from a field only clientv3 can set, so clientv3 makes the response: a
// clientv3 Watcher whose Watch RPC fails with err answers its one Watch
// with it at once, and ends. err must halt (see halts); clientv3 would
// retry the others for ever.
func streamEnded(err grpcError) clientv3.WatchResponse {
	w := clientv3.NewWatchFromWatchClient(failedWatch{err}, nil)
	defer w.Close() // its stream's goroutine has ended, or is ending, by the time Watch returns
	return <-w.Watch(context.Background(), "")
}

// failedWatch is a WatchClient whose RPC fails with err.
type failedWatch struct{ err error }

func (f failedWatch) Watch(context.Context, ...grpc.CallOption) (grpc.BidiStreamingClient[pb.WatchRequest, pb.WatchResponse], error) {
	return nil, f.err
}

// reasonOr is the server's reason without the gRPC status text etcd 3.7
// wraps some in ("rpc error: code = PermissionDenied desc = etcdserver:
// permission denied"), so that rpctypes.Error recognises it; or, if there
// is no reason, fallback.
func reasonOr(reason, fallback string) string {
	if strings.HasPrefix(reason, "rpc error: code = ") {
		if _, desc, ok := strings.Cut(reason, " desc = "); ok {
			reason = desc
		}
	}
	if reason == "" {
		return fallback
	}
	return reason
}

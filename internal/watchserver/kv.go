package watchserver

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// KV is a scripted KV service: it serves Range (and, once turned on,
// RangeStream) from keys the test sets, at a revision the test sets. It does
// not keep history: a Range at an older revision gets the current keys, so
// that a test can make a listing disagree with the watch it follows. Every
// request is recorded.
type KV struct {
	mu       sync.Mutex
	keys     map[string]*mvccpb.KeyValue
	rev      int64
	streams  bool // RangeStream is served
	chunk    int  // keys per RangeStream message
	requests []*pb.RangeRequest
	fail     []error       // returned, in turn, by the next Range or RangeStream calls
	asked    chan struct{} // closed, and replaced, at each request
	cluster  uint64        // the cluster ID in Range headers; Header's when 0
}

func newKV() *KV {
	return &KV{keys: make(map[string]*mvccpb.KeyValue), rev: 1, chunk: 2, asked: make(chan struct{})}
}

// AwaitRequests waits until cond holds for the requests received so far,
// checking it at each request, and fails t after Timeout.
func (k *KV) AwaitRequests(t testing.TB, cond func([]*pb.RangeRequest) bool) {
	t.Helper()
	deadline := time.After(Timeout)
	for {
		k.mu.Lock()
		asked, ok := k.asked, cond(k.requests)
		k.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-asked:
		case <-deadline:
			t.Fatalf("watchserver: the requests awaited did not come within %v", Timeout)
		}
	}
}

// KV returns the server's KV service.
func (s *Server) KV() *KV { return s.kv }

// Put sets key to value at a new revision and returns the revision.
func (k *KV) Put(key, value string) int64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.rev++
	kv := &mvccpb.KeyValue{Key: []byte(key), Value: []byte(value), CreateRevision: k.rev, ModRevision: k.rev, Version: 1}
	if old, ok := k.keys[key]; ok {
		kv.CreateRevision, kv.Version = old.CreateRevision, old.Version+1
	}
	k.keys[key] = kv
	return k.rev
}

// Delete removes key at a new revision and returns the revision.
func (k *KV) Delete(key string) int64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.rev++
	delete(k.keys, key)
	return k.rev
}

// Revision returns the store's revision.
func (k *KV) Revision() int64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.rev
}

// SetClusterID makes Range and RangeStream answer as a member of cluster id
// (Header's cluster otherwise); the Watch service's headers do not change.
func (k *KV) SetClusterID(id uint64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.cluster = id
}

// ServeStreams turns RangeStream on, chunk keys to a message.
func (k *KV) ServeStreams(chunk int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.streams, k.chunk = true, chunk
}

// FailNext makes the next len(errs) calls fail with errs, in turn; a nil
// error lets its call through.
func (k *KV) FailNext(errs ...error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.fail = append(k.fail, errs...)
}

// Requests returns the requests received so far, RangeStream's included.
func (k *KV) Requests() []*pb.RangeRequest {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.requests)
}

// Range implements pb.KVServer.
func (svc kvService) Range(_ context.Context, r *pb.RangeRequest) (*pb.RangeResponse, error) {
	k := svc.kv
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.rangeLocked(r)
}

// RangeStream implements pb.KVServer: chunks of keys, the header and count on
// the last, as etcd 3.7 does.
func (svc kvService) RangeStream(r *pb.RangeRequest, srv grpc.ServerStreamingServer[pb.RangeStreamResponse]) error {
	k := svc.kv
	k.mu.Lock()
	if !k.streams {
		k.mu.Unlock()
		return status.Error(codes.Unimplemented, "watchserver: RangeStream off")
	}
	resp, err := k.rangeLocked(r)
	chunk := k.chunk
	k.mu.Unlock()
	if err != nil {
		return err
	}
	kvs := resp.Kvs
	for len(kvs) > chunk {
		if err := srv.Send(&pb.RangeStreamResponse{RangeResponse: &pb.RangeResponse{Kvs: kvs[:chunk]}}); err != nil {
			return err
		}
		kvs = kvs[chunk:]
	}
	resp.Kvs = kvs
	return srv.Send(&pb.RangeStreamResponse{RangeResponse: resp})
}

func (k *KV) rangeLocked(r *pb.RangeRequest) (*pb.RangeResponse, error) {
	k.requests = append(k.requests, r)
	close(k.asked)
	k.asked = make(chan struct{})
	if len(k.fail) > 0 {
		err := k.fail[0]
		k.fail = k.fail[1:]
		if err != nil {
			return nil, err
		}
	}
	if r.Revision > k.rev {
		return nil, status.Error(codes.OutOfRange, "etcdserver: mvcc: required revision is a future revision")
	}
	kvs := k.inRange(r)
	resp := &pb.RangeResponse{Header: Header(k.rev), Count: int64(len(kvs))}
	if k.cluster != 0 {
		resp.Header.ClusterId = k.cluster
	}
	if r.SortTarget == pb.RangeRequest_MOD && r.SortOrder == pb.RangeRequest_DESCEND {
		slices.SortFunc(kvs, func(a, b *mvccpb.KeyValue) int { return int(b.ModRevision - a.ModRevision) })
	}
	if r.Limit > 0 && int64(len(kvs)) > r.Limit {
		kvs, resp.More = kvs[:r.Limit], true
	}
	for _, kv := range kvs {
		c := &mvccpb.KeyValue{Key: kv.Key, CreateRevision: kv.CreateRevision, ModRevision: kv.ModRevision, Version: kv.Version, Lease: kv.Lease}
		if !r.KeysOnly {
			c.Value = kv.Value
		}
		resp.Kvs = append(resp.Kvs, c)
	}
	return resp, nil
}

// inRange returns the keys of r's range, in key order.
func (k *KV) inRange(r *pb.RangeRequest) []*mvccpb.KeyValue {
	var kvs []*mvccpb.KeyValue
	for key, kv := range k.keys {
		if inRange(key, string(r.Key), r.RangeEnd) {
			kvs = append(kvs, kv)
		}
	}
	slices.SortFunc(kvs, func(a, b *mvccpb.KeyValue) int { return strings.Compare(string(a.Key), string(b.Key)) })
	return kvs
}

func inRange(key, start string, end []byte) bool {
	switch {
	case end == nil:
		return key == start
	case len(end) == 1 && end[0] == 0:
		return key >= start
	}
	return key >= start && key < string(end)
}

// kvService serves a KV over gRPC.
type kvService struct {
	pb.UnimplementedKVServer
	kv *KV
}

// PutEvent puts key=value, as Put does, and returns the event a watch
// would report for it.
func (k *KV) PutEvent(key, value string) *mvccpb.Event {
	k.Put(key, value)
	k.mu.Lock()
	defer k.mu.Unlock()
	kv := k.keys[key]
	return &mvccpb.Event{Type: mvccpb.PUT, Kv: &mvccpb.KeyValue{
		Key: kv.Key, Value: kv.Value, CreateRevision: kv.CreateRevision, ModRevision: kv.ModRevision, Version: kv.Version}}
}

// DeleteEvent deletes key, as Delete does, and returns the event.
func (k *KV) DeleteEvent(key string) *mvccpb.Event { return Del(key, k.Delete(key)) }

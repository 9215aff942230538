package group

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/peer"
)

// tracked is the connection one Stream of the group is opened on: the
// caller's, passed through, except that it notes the member each of the
// Stream's Watch RPCs is on. Placement reads it (where); nothing else
// changes: every RPC, its options and its messages go through as they are.
//
// The member is the RPC's peer address, read from the RPC's context once
// the first response has arrived (before that the context may belong to
// an attempt gRPC retries), and forgotten when the RPC ends.
type tracked struct {
	conn grpc.ClientConnInterface

	mu    sync.Mutex
	rpcs  map[*watchRPC]string // open Watch RPCs that have answered, and their member
	order []*watchRPC          // the same, oldest first
}

func newTracked(conn grpc.ClientConnInterface) *tracked {
	return &tracked{conn: conn, rpcs: map[*watchRPC]string{}}
}

// where returns the member the newest open Watch RPC answered from, ""
// while none has.
func (t *tracked) where() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if n := len(t.order); n > 0 {
		return t.rpcs[t.order[n-1]]
	}
	return ""
}

func (t *tracked) answered(rpc *watchRPC, member string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.rpcs[rpc] = member
	t.order = append(t.order, rpc)
}

func (t *tracked) ended(rpc *watchRPC) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.rpcs[rpc]; ok {
		delete(t.rpcs, rpc)
		t.order = slices.DeleteFunc(t.order, func(r *watchRPC) bool { return r == rpc })
	}
}

func (t *tracked) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	return t.conn.Invoke(ctx, method, args, reply, opts...)
}

func (t *tracked) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	cs, err := t.conn.NewStream(ctx, desc, method, opts...)
	if err != nil || method != pb.Watch_Watch_FullMethodName {
		return cs, err
	}
	return &watchRPC{ClientStream: cs, t: t}, nil
}

// watchRPC is one Watch RPC of the Stream. Its RecvMsg is called by one
// goroutine at a time (gRPC's rule), which alone reads and writes seen.
type watchRPC struct {
	grpc.ClientStream
	t    *tracked
	seen bool // a response has arrived
}

func (w *watchRPC) RecvMsg(m any) error {
	err := w.ClientStream.RecvMsg(m)
	if err == nil && !w.seen {
		w.seen = true
		ctx := w.Context() // the attempt is committed once a response arrived
		if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
			w.t.answered(w, p.Addr.String())
			// The context ends with the RPC however it ends: an error
			// here, or the Stream canceling it. The function only
			// forgets the RPC, and returns at once.
			context.AfterFunc(ctx, func() { w.t.ended(w) })
		}
	}
	return err
}

// stateConn is what a Stream uses of a *grpc.ClientConn beyond
// grpc.ClientConnInterface, when the connection has it (see etcdwatch.Open).
type stateConn interface {
	GetState() connectivity.State
	WaitForStateChange(ctx context.Context, source connectivity.State) bool
	ResetConnectBackoff()
}

// trackedState is tracked over a connection with a state, which it passes
// on, so that the Stream sees the connection's state as it would without
// the group.
type trackedState struct {
	*tracked
	state stateConn
}

func (t trackedState) GetState() connectivity.State { return t.state.GetState() }
func (t trackedState) WaitForStateChange(ctx context.Context, source connectivity.State) bool {
	return t.state.WaitForStateChange(ctx, source)
}
func (t trackedState) ResetConnectBackoff() { t.state.ResetConnectBackoff() }

// track returns the connection to open a Stream on, over conn, and its
// tracker.
func track(conn grpc.ClientConnInterface) (grpc.ClientConnInterface, *tracked) {
	t := newTracked(conn)
	if s, ok := conn.(stateConn); ok {
		return trackedState{t, s}, t
	}
	return t, t
}

// turns sends each RPC on the next of conns in turn. Its methods are safe
// for concurrent use.
type turns struct {
	conns []grpc.ClientConnInterface // fixed once the group is made
	next  atomic.Uint64
}

func (t *turns) conn() grpc.ClientConnInterface {
	return t.conns[(t.next.Add(1)-1)%uint64(len(t.conns))]
}

func (t *turns) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	return t.conn().Invoke(ctx, method, args, reply, opts...)
}

func (t *turns) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	return t.conn().NewStream(ctx, desc, method, opts...)
}

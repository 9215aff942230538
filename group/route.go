package group

import (
	"context"
	"errors"
	"sync"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"

	"github.com/etcdwatch/etcdwatch/internal/rpcerr"
)

// memberState is what a route knows of one member when it chooses where
// an RPC goes.
type memberState struct {
	state connectivity.State // its connection's, now
	// fresh: its connection has been neither ready nor failed since
	// Dial, so it is making its first attempt.
	fresh bool
	// leaderless: a Watch RPC on it was refused or ended for want of a
	// leader (WithRequireLeader), or its Status named no leader
	// (members.probe), and it has not been seen with one since.
	leaderless bool
}

// choose returns the index in ms of the member an RPC goes to, ms being a
// Stream's members in its order, its home first. The rule:
//  1. the first that is ready, or making its first attempt to connect,
//     and not known leaderless: so that a Stream opened with its group
//     waits for its home rather than taking the first member to answer;
//  2. else the first connecting (or idle) and not known leaderless: it
//     may be up in a moment, and an RPC on it waits for its connection;
//  3. else the first ready, though leaderless: with no member better,
//     it may have its leader back by the time the RPC reaches it;
//  4. else the home: every connection is down. An RPC that fails fast
//     fails there as anywhere; one that waits for a ready connection
//     waits for the route's (route.call), not for the home's.
func choose(ms []memberState) int {
	tiers := []func(memberState) bool{
		func(h memberState) bool {
			return (h.state == connectivity.Ready || h.fresh && h.state != connectivity.TransientFailure) && !h.leaderless
		},
		func(h memberState) bool {
			return (h.state == connectivity.Connecting || h.state == connectivity.Idle) && !h.leaderless
		},
		func(h memberState) bool { return h.state == connectivity.Ready },
	}
	for _, usable := range tiers {
		for i, h := range ms {
			if usable(h) {
				return i
			}
		}
	}
	return 0
}

// errHome is the cause with which a route ends a Watch RPC away from its
// home member once the home is back (members.check).
var errHome = errors.New("etcdwatch/group: going back to the stream's own member")

// route is the connection of one of Dial's Streams, and of the pinned
// Streams opened on it: each RPC goes to the member choose picks over the
// Stream's members, its home first then the others in Dial's order, so
// that a Stream moves on when its member is down or has no leader. It
// records its open Watch RPCs so that members can end those away from
// home once the home is back. Its methods are safe for concurrent use.
type route struct {
	ms    *members
	order []int // indices in ms.conns, home first; fixed

	mu   sync.Mutex
	rpcs map[*routedRPC]struct{} // open Watch RPCs; guarded by mu
}

// pick returns the index in ms.conns of the member an RPC goes to now.
func (r *route) pick() int {
	hs := make([]memberState, len(r.order))
	for k, i := range r.order {
		hs[k] = r.ms.memberState(i)
	}
	return r.order[choose(hs)]
}

func (r *route) home() int { return r.order[0] }

func (r *route) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	return r.call(ctx, opts, func(m int, opts []grpc.CallOption) error {
		return r.ms.conns[m].Invoke(ctx, method, args, reply, opts...)
	})
}

func (r *route) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	if method == pb.Watch_Watch_FullMethodName {
		return r.newWatch(ctx, desc, opts)
	}
	var cs grpc.ClientStream
	err := r.call(ctx, opts, func(m int, opts []grpc.CallOption) error {
		var err error
		cs, err = r.ms.conns[m].NewStream(ctx, desc, method, opts...)
		return err
	})
	return cs, err
}

// call makes one attempt of an RPC on the member pick chooses. An RPC
// that waits for a ready connection (grpc.WaitForReady(true)) waits for
// the route's, not for one member's: each attempt fails fast, and one
// refused for want of a connection (its member's no longer ready) is made
// again on the member then chosen, after waiting for a change while the
// route has no connection to offer. An Unavailable from a member still
// connected is the server's answer, and returned.
func (r *route) call(ctx context.Context, opts []grpc.CallOption, attempt func(m int, opts []grpc.CallOption) error) error {
	if !rpcerr.WaitsForReady(opts) {
		return attempt(r.pick(), opts)
	}
	failFast := append(opts[:len(opts):len(opts)], grpc.WaitForReady(false))
	for {
		changed := r.ms.changes()
		m := r.pick()
		err := attempt(m, failFast)
		if status.Code(err) != codes.Unavailable || r.ms.conns[m].GetState() == connectivity.Ready {
			return err
		}
		if r.GetState() != connectivity.TransientFailure {
			continue
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err() // its code, as gRPC's own wait
		}
	}
}

// newWatch opens a Watch RPC on the member pick chooses, and records it
// until it ends. The Stream opens its Watch RPCs failing fast, and waits
// for the route's state itself (GetState, WaitForStateChange), unless its
// call options make them wait for a ready connection: then call waits for
// the route's, not for one member's.
func (r *route) newWatch(ctx context.Context, desc *grpc.StreamDesc, opts []grpc.CallOption) (grpc.ClientStream, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	var (
		m  int
		cs grpc.ClientStream
	)
	err := r.call(ctx, opts, func(i int, opts []grpc.CallOption) error {
		var err error
		m = i
		cs, err = r.ms.conns[i].NewStream(ctx, desc, pb.Watch_Watch_FullMethodName, opts...)
		return err
	})
	if err != nil {
		cancel(nil)
		return nil, err
	}
	rpc := &routedRPC{ClientStream: cs, r: r, member: m, ctx: ctx, cancel: cancel}
	r.mu.Lock()
	r.rpcs[rpc] = struct{}{}
	r.mu.Unlock()
	// ctx ends with the RPC: when the Stream ends it, or once RecvMsg
	// has returned its last error. The function only forgets the RPC.
	context.AfterFunc(ctx, func() {
		r.mu.Lock()
		delete(r.rpcs, rpc)
		r.mu.Unlock()
	})
	return rpc, nil
}

// away returns the route's open Watch RPCs on a member other than its
// home.
func (r *route) away() []*routedRPC {
	r.mu.Lock()
	defer r.mu.Unlock()
	var away []*routedRPC
	for rpc := range r.rpcs {
		if rpc.member != r.home() {
			away = append(away, rpc)
		}
	}
	return away
}

// goHome ends the Watch RPCs away: their Streams open new ones, which go
// home, and resume their watches there.
func goHome(away []*routedRPC) {
	for _, rpc := range away {
		rpc.cancel(errHome)
	}
}

// GetState is the state of the connection of the member an RPC would go
// to now, so that a Stream waits for a connection only while the route
// has none to offer.
func (r *route) GetState() connectivity.State { return r.ms.conns[r.pick()].GetState() }

// WaitForStateChange waits until GetState is not source, or ctx ends, and
// reports which.
func (r *route) WaitForStateChange(ctx context.Context, source connectivity.State) bool {
	for {
		changed := r.ms.changes()
		if r.GetState() != source {
			return true
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return false
		}
	}
}

// ResetConnectBackoff makes every connection of the route that waits to
// reconnect try now.
func (r *route) ResetConnectBackoff() {
	for _, i := range r.order {
		if cc := r.ms.conns[i]; cc.GetState() == connectivity.TransientFailure {
			cc.ResetConnectBackoff()
		}
	}
}

// routedRPC is one Watch RPC of a route, on one member. Its RecvMsg is
// called by one goroutine at a time (gRPC's rule), which alone reads and
// writes heard.
type routedRPC struct {
	grpc.ClientStream
	r      *route
	member int // index in ms.conns
	ctx    context.Context
	cancel context.CancelCauseFunc
	heard  bool // a response has arrived
}

// RecvMsg tells members what the RPC shows of its member's leader, and
// ends an RPC ended for going home with an error the Stream replaces its
// stream for.
func (rpc *routedRPC) RecvMsg(m any) error {
	err := rpc.ClientStream.RecvMsg(m)
	if err == nil {
		if !rpc.heard {
			rpc.heard = true
			rpc.r.ms.setLeaderless(rpc.member, false)
		}
		return nil
	}
	if rpcerr.NoLeader(err) {
		rpc.r.ms.setLeaderless(rpc.member, true)
	}
	if errors.Is(context.Cause(rpc.ctx), errHome) {
		err = status.Error(codes.Unavailable, errHome.Error())
	}
	rpc.cancel(nil)
	return err
}

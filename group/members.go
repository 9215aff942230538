package group

import (
	"context"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"

	"github.com/etcdwatch/etcdwatch/internal/clock"
)

// members is Dial's connections, one per endpoint and each to that member
// alone, the routes of the group's Streams over them, and what the group
// knows of each member's health. One goroutine per member (watch) follows
// its connection, and moves the Streams whose home it is back to it once
// it has been up for the settle time.
type members struct {
	conns  []*grpc.ClientConn // one per endpoint, in Dial's order; fixed
	routes []*route           // one per own Stream; fixed once Dial has made them
	settle time.Duration      // WithHoming's; 0: never go home
	clock  clock.Clock

	mu         sync.Mutex
	state      []connectivity.State // per member: its connection's, as watch last saw it; guarded by mu
	tried      []bool               // per member: watch has seen it ready or failed; guarded by mu
	leaderless []bool               // per member: see memberState; guarded by mu
	up         []time.Time          // per member: since when ready and not leaderless, zero while not; guarded by mu
	changed    chan struct{}        // closed, and replaced, at each change a route's GetState may show; guarded by mu

	wg sync.WaitGroup // the watch goroutines; run adds, wait waits
}

func newMembers(conns []*grpc.ClientConn, settle time.Duration) *members {
	return &members{
		conns:      conns,
		settle:     settle,
		clock:      clock.Real,
		state:      make([]connectivity.State, len(conns)),
		tried:      make([]bool, len(conns)),
		leaderless: make([]bool, len(conns)),
		up:         make([]time.Time, len(conns)),
		changed:    make(chan struct{}),
	}
}

// route returns a new route whose home is member home, then the members
// after it in Dial's order, then those before it.
func (ms *members) route(home int) *route {
	r := &route{ms: ms, rpcs: map[*routedRPC]struct{}{}}
	for k := range ms.conns {
		r.order = append(r.order, (home+k)%len(ms.conns))
	}
	ms.routes = append(ms.routes, r)
	return r
}

// changes returns a channel closed at the next change of a member's
// connection state or leader.
func (ms *members) changes() <-chan struct{} {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	return ms.changed
}

// broadcast closes changed and replaces it; mu is held.
func (ms *members) broadcast() {
	close(ms.changed)
	ms.changed = make(chan struct{})
}

// closed wakes the calls waiting for a change (route.call,
// WaitForStateChange) once Close has closed the connections: no watch
// goroutine is left to, and their next attempt fails as the connection
// is closing.
func (ms *members) closed() {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	ms.broadcast()
}

// memberState is what a route knows of member i now.
func (ms *members) memberState(i int) memberState {
	s := ms.conns[i].GetState()
	ms.mu.Lock()
	defer ms.mu.Unlock()
	return memberState{state: s, fresh: !ms.tried[i], leaderless: ms.leaderless[i]}
}

// setLeaderless records whether member i is known to have no leader.
func (ms *members) setLeaderless(i int, none bool) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if ms.leaderless[i] == none {
		return
	}
	ms.leaderless[i] = none
	ms.noteUp(i, !none && ms.state[i] == connectivity.Ready)
	ms.broadcast()
}

// setState records member i's connection state.
func (ms *members) setState(i int, s connectivity.State) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if ms.state[i] == s {
		return
	}
	ms.state[i] = s
	if s == connectivity.Ready || s == connectivity.TransientFailure {
		ms.tried[i] = true
	}
	ms.noteUp(i, s == connectivity.Ready && !ms.leaderless[i])
	ms.broadcast()
}

// noteUp keeps when member i came up, for homeward; mu is held.
func (ms *members) noteUp(i int, up bool) {
	switch {
	case !up:
		ms.up[i] = time.Time{}
	case ms.up[i].IsZero():
		ms.up[i] = ms.clock.Now()
	}
}

// run starts a watch goroutine per member; each returns once ctx ends.
func (ms *members) run(ctx context.Context) {
	for i := range ms.conns {
		ms.wg.Add(1)
		go func() { // returns once ctx ends (Close); wait waits
			defer ms.wg.Done()
			_ = ms.watch(ctx, i) // only ends with ctx
		}()
	}
}

// wait waits for run's goroutines.
func (ms *members) wait() { ms.wg.Wait() }

// tick is how often a member's goroutine looks again without a change of
// its connection: to ask whether a member known leaderless has its leader
// back, and whether a home member has been up long enough.
func (ms *members) tick() time.Duration {
	if ms.settle > 0 && ms.settle/2 < time.Second {
		return max(ms.settle/2, time.Millisecond)
	}
	return time.Second
}

// watch follows member i's connection until ctx ends: it keeps it
// connecting (a connection left idle would wait for an RPC to try), tells
// the routes of each change, asks a ready member known leaderless or
// wanted home whether it has a leader, and sends home the Streams whose
// home it is once it has been up for the settle time.
func (ms *members) watch(ctx context.Context, i int) error {
	cc := ms.conns[i]
	for {
		s := cc.GetState()
		if s == connectivity.Idle {
			cc.Connect()
		}
		ms.setState(i, s)
		if s == connectivity.Ready {
			ms.check(ctx, i)
		}
		wait, cancel := context.WithTimeout(ctx, ms.tick())
		cc.WaitForStateChange(wait, s)
		cancel()
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
	}
}

// check asks ready member i for its leader when that matters (it is known
// leaderless, or Streams whose home it is are away), and sends those
// Streams home when they may go.
func (ms *members) check(ctx context.Context, i int) {
	var away []*routedRPC // of the Streams whose home i is
	for _, r := range ms.routes {
		if ms.settle > 0 && r.home() == i {
			away = append(away, r.away()...)
		}
	}
	if !ms.memberState(i).leaderless && len(away) == 0 {
		return
	}
	if ms.probe(ctx, i) && ms.homeDue(i) {
		goHome(away)
	}
}

// probe asks member i for its leader, records the answer, and reports
// whether it named one. A member that answers without a leader is known
// leaderless until it names one, so that its settle time counts from its
// leader; one that does not answer is left as it was.
func (ms *members) probe(ctx context.Context, i int) bool {
	leader, answered := ms.hasLeader(ctx, i)
	if answered {
		ms.setLeaderless(i, !leader)
	}
	return leader
}

// homeDue reports whether Streams may go back to member i: homing is on,
// and i has been ready, and not known leaderless, for the settle time.
func (ms *members) homeDue(i int) bool {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	return homeDue(ms.settle, ms.up[i], ms.clock.Now())
}

// homeDue is the homing policy: a member up since up (zero: not up) takes
// its Streams back at now once it has been up for settle; a settle of 0
// never does.
func homeDue(settle time.Duration, up, now time.Time) bool {
	return settle > 0 && !up.IsZero() && now.Sub(up) >= settle
}

// statusTimeout bounds hasLeader's Status call, whatever the tick: a
// member farther away than a short settle time still answers.
const statusTimeout = 5 * time.Second

// hasLeader asks member i whether it knows its leader (etcd's Status):
// answered is false when it did not answer within statusTimeout.
func (ms *members) hasLeader(ctx context.Context, i int) (leader, answered bool) {
	ctx, cancel := context.WithTimeout(ctx, statusTimeout)
	defer cancel()
	st, err := pb.NewMaintenanceClient(ms.conns[i]).Status(ctx, &pb.StatusRequest{}, grpc.WaitForReady(false))
	return err == nil && st.Leader != 0, err == nil
}

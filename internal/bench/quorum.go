package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdwatch/etcdwatch"
	"github.com/etcdwatch/etcdwatch/etcdwatchtest"
)

var (
	quorumWatches = flag.Int("quorum-watches", 10, "quorum: watches on the written prefix")
	quorumOutage  = flag.Duration("quorum-outage", 2*time.Second, "quorum: how long the served member stays without a leader before a member restarts")
	quorumRetry   = flag.Duration("quorum-retry", 50*time.Millisecond, "quorum: clientv3's and raw's wait before watching again after a failure")
	quorumReps    = flag.Int("quorum-reps", 3, "quorum: repetitions per contender, whatever -reps says (each starts a 3-member cluster and loses its quorum)")
)

// runQuorum starts a 3-member cluster and watches, with require-leader, on
// a member that is not the leader, over a connection to that member only.
// It stops the two other members together (embedded's Stop, in this
// process: etcd's Close, not a SIGKILL), waits until the served member
// reports no leader (its Status), then -quorum-outage more: etcd ends
// require-leader streams after three checks one election timeout apart
// (monitorLeader; 200 ms in these members), so by then every contender has
// had its stream ended and has been refused again for over a second. It restarts one member and, while
// that member starts, puts once every 10 ms until a put is acknowledged:
// quorum is back. The figure is the time from that acknowledgement to when
// every watch has got its revision (0 if the event came first).
//
// What each contender does meanwhile: etcdwatch keeps its watches and
// reconnects by itself (WithRequireLeader, default options otherwise). raw
// opens its next stream -quorum-retry after a failed one and re-creates
// every watch from its next revision. clientv3 closes the watch channels
// after a canceled response (ErrNoLeader); the application then watches
// again, from its last event's revision + 1, -quorum-retry after each
// closed channel, as a careful application would.
func runQuorum(c contender, rep int) (result, error) {
	dir, err := os.MkdirTemp("", "etcdwatch-bench-quorum-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	members, err := etcdwatchtest.StartClusterIn(dir, 3)
	if err != nil {
		return nil, err
	}
	defer func() {
		for _, m := range members { // together, the last to stop would wait for a quorum
			m.Stop()
		}
	}()
	served, others := notLeader(members)
	conn, kv, closeAll, err := connAndWriter(served.Endpoint, served.Endpoint)
	if err != nil {
		return nil, err
	}
	defer closeAll()
	ctx, cancel := timeout()
	defer cancel()
	prefix := fmt.Sprintf("bench/quorum/%s/%d/", c.name(), rep)
	log := newDeliveryLog(*quorumWatches, 16)
	stop, err := requireLeader(c, served.Endpoint).watch(ctx, conn, repeat(*quorumWatches, spec{key: prefix, prefix: true}), log.sink)
	if err != nil {
		return nil, err
	}
	defer stop()
	resp, err := kv.Put(ctx, prefix+"k", "before")
	if err != nil {
		return nil, err
	}
	if _, err := log.wait(resp.Header.Revision, time.Minute); err != nil {
		return nil, fmt.Errorf("before the outage: %w", err)
	}
	stopMembers(others)
	if err := waitNoLeader(ctx, kv, served.Endpoint); err != nil {
		return nil, err
	}
	time.Sleep(*quorumOutage)
	restarted := make(chan error, 1)
	go func() { restarted <- others[0].Restart() }()
	defer func() { <-restarted }() // before the members stop
	rev, ack, err := putUntilAcked(ctx, kv, prefix+"k")
	if err != nil {
		return nil, err
	}
	got, err := log.wait(rev, time.Minute)
	if err != nil {
		return nil, fmt.Errorf("after quorum came back: %w", err)
	}
	return result{"ms": ms(max(got.Sub(ack), 0))}, nil
}

// requireLeader configures c for runQuorum, watching through addr.
func requireLeader(c contender, addr string) contender {
	switch c := c.(type) {
	case rawClient:
		return rawClient{requireLeader: true, retry: *quorumRetry}
	case clientv3Client:
		return clientv3Client{endpoints: []string{addr}, requireLeader: true, rewatch: *quorumRetry}
	case clientv3watchClient: // the same application code as clientv3's, on the drop-in
		c.requireLeader, c.rewatch = true, *quorumRetry
		return c
	case etcdwatchClient: // with its Handler, if it has one
		c.opts = append(slices.Clone(c.opts), etcdwatch.WithRequireLeader())
		return c
	default:
		panic(fmt.Sprintf("quorum: no require-leader form of %s", c.name()))
	}
}

// stopMembers stops the members together: one at a time, a leader's stop
// waits for a leadership transfer, which costs a second and measures
// nothing.
func stopMembers(members []*etcdwatchtest.Server) {
	var wg sync.WaitGroup
	for _, m := range members {
		wg.Go(m.Stop)
	}
	wg.Wait()
}

// notLeader returns a member that is not the leader, and the others.
func notLeader(members []*etcdwatchtest.Server) (*etcdwatchtest.Server, []*etcdwatchtest.Server) {
	k := 0
	for members[k].IsLeader() {
		k++
	}
	var others []*etcdwatchtest.Server
	for i, m := range members {
		if i != k {
			others = append(others, m)
		}
	}
	return members[k], others
}

// waitNoLeader polls the member at addr until its Status names no leader.
func waitNoLeader(ctx context.Context, kv *clientv3.Client, addr string) error {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		st, err := kv.Status(ctx, addr)
		if err == nil && st.Leader == 0 {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return errors.New("the served member still has a leader after 30s")
}

// putUntilAcked puts key every 10 ms (each put given a second) until one is
// acknowledged, and returns its revision and when its response came.
func putUntilAcked(ctx context.Context, kv *clientv3.Client, key string) (int64, time.Time, error) {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		resp, err := kv.Put(pctx, key, "after")
		cancel()
		if err == nil {
			return resp.Header.Revision, time.Now(), nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return 0, time.Time{}, errors.New("no put acknowledged within a minute of the restart")
}

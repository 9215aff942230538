package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdwatch/etcdwatch"
	"github.com/etcdwatch/etcdwatch/dial"
	"github.com/etcdwatch/etcdwatch/etcdwatchtest"
	"github.com/etcdwatch/etcdwatch/group"
)

// The spread workload (issue 20): one Stream against a group of Streams
// (package group, Dial: Stream i on member i), on a 3-member cluster the
// workload starts for each repetition. Each member is reached through a
// fault proxy of its own; the writer goes straight to the members.
//
//   - Fanout: -spread-fanout watches on one key, -spread-puts puts to it,
//     as fanout does: events/s and put-to-delivery p50/p99. The group's
//     watches are spread over its Streams, so over the members' send
//     loops; the single Stream's are all on one member.
//   - Member failure: -spread-watches watches on a prefix, a put every
//     -spread-put-every carrying its send time, from -spread-window before
//     the failure to -spread-window after it (or past the resume). The member that serves the most watches is
//     made unreachable: its proxy cuts every connection and refuses new
//     ones, as a member that died would be (the member itself runs on,
//     so that no election or restart is measured; a leader is first made
//     to hand over, so the victim is a follower either way). resume_ms:
//     from the cut until every watch that was on that member has
//     delivered a put sent after the cut. moved_share: the share of
//     watches that were on it (1 for a single Stream). before_p99_ms:
//     put-to-delivery over every watch, for the puts sent within
//     -spread-window before the cut: delivery without a failure.
//     during_p50_ms, during_p99_ms: the same for the puts sent within
//     -spread-window after the cut. others_p99_ms: the same over the
//     watches that were not on the failed member (0: there are none).
//
// The contenders (spreadNames) run one after another on the same cluster,
// in an order that rotates each repetition.

var (
	spreadStreams = flag.Int("spread-streams", 3, "spread: Streams of the group (one per member of the 3)")
	spreadFanout  = flag.Int("spread-fanout", 1000, "spread: watches on one key, fanout half")
	spreadPuts    = flag.Int("spread-puts", 300, "spread: puts to that key")
	spreadWatches = flag.Int("spread-watches", 300, "spread: watches on a prefix, member-failure half")
	spreadWindow  = flag.Duration("spread-window", 500*time.Millisecond, "spread: how long before and after the failure puts count for delivery latency")
	spreadEvery   = flag.Duration("spread-put-every", 10*time.Millisecond, "spread: the writer's interval between puts, member-failure half")
)

// spreadNames are the contenders: a Stream over dial.New's round_robin
// connection to the members, as a program opens one today; a group of one
// Stream (group.Dial, so a route over connections of its own), the same
// connection machinery as the group's with one Stream; and the group of
// -spread-streams.
var spreadNames = []string{"stream", "group-1", "group"}

// spreadCluster is a 3-member cluster, a fault proxy in front of each
// member, and a writer's client straight to the members.
type spreadCluster struct {
	members []*etcdwatchtest.Server
	proxies []*etcdwatchtest.Proxy
	addrs   []string // the proxies', in member order
	ids     []uint64 // the members' ids, in member order
	kv      *clientv3.Client
}

func startSpreadCluster(dir string) (*spreadCluster, error) {
	members, err := etcdwatchtest.StartClusterIn(dir, 3)
	if err != nil {
		return nil, err
	}
	c := &spreadCluster{members: members}
	var endpoints []string
	for _, m := range members {
		p, err := etcdwatchtest.ListenProxy(m.Endpoint)
		if err != nil {
			c.stop()
			return nil, err
		}
		c.proxies = append(c.proxies, p)
		c.addrs = append(c.addrs, p.Addr())
		endpoints = append(endpoints, m.Endpoint)
	}
	if c.kv, err = clientv3.New(clientv3.Config{Endpoints: endpoints}); err != nil {
		c.stop()
		return nil, err
	}
	ctx, cancel := timeout()
	defer cancel()
	for _, ep := range endpoints {
		st, err := c.kv.Status(ctx, ep)
		if err != nil {
			c.stop()
			return nil, err
		}
		c.ids = append(c.ids, st.Header.MemberId)
	}
	return c, nil
}

func (c *spreadCluster) stop() {
	if c.kv != nil {
		c.kv.Close()
	}
	for _, p := range c.proxies {
		p.Close()
	}
	etcdwatchtest.StopAll(c.members...)
}

// ensureFollower makes member i hand its leadership over, if it has it.
func (c *spreadCluster) ensureFollower(ctx context.Context, i int) error {
	if !c.members[i].IsLeader() {
		return nil
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{c.members[i].Endpoint}})
	if err != nil {
		return err
	}
	defer cli.Close()
	if _, err := cli.MoveLeader(ctx, c.ids[(i+1)%3]); err != nil {
		return err
	}
	for deadline := time.Now().Add(30 * time.Second); c.members[i].IsLeader(); {
		if time.Now().After(deadline) {
			return errors.New("spread: leadership not handed over in 30s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}

// spreadWatcher is what a contender watches with: one Stream, or a group.
type spreadWatcher struct {
	watchAll func(ctx context.Context, rs ...etcdwatch.Request) ([]*etcdwatch.Watch, error)
	stats    func() etcdwatch.Stats
	close    func()
}

func openSpread(name string, addrs []string) (*spreadWatcher, error) {
	if name != "stream" {
		n := *spreadStreams
		if name == "group-1" {
			n = 1
		}
		g, err := group.Dial(addrs, group.WithStreams(n), group.WithDialOptions(dial.WithInsecure()))
		if err != nil {
			return nil, err
		}
		return &spreadWatcher{g.WatchAll, g.Stats, func() { g.Close() }}, nil
	}
	conn, err := dial.New(addrs, dial.WithInsecure())
	if err != nil {
		return nil, err
	}
	s, err := etcdwatch.Open(conn)
	if err != nil {
		conn.Close()
		return nil, err
	}
	return &spreadWatcher{s.WatchAll, s.Stats, func() { s.Close(); conn.Close() }}, nil
}

// consume reads every watch until it ends, handing each response to f
// with the watch's index and the time it came; it returns a function that
// waits for the readers.
func consume(watches []*etcdwatch.Watch, f func(i int, r etcdwatch.Response, at time.Time)) (wait func()) {
	var wg sync.WaitGroup
	for i, w := range watches {
		wg.Go(func() { // ends with the watch: the contender's close ends it
			for r := range w.Responses() {
				f(i, r, time.Now())
			}
		})
	}
	return wg.Wait
}

func runSpread(_ []contender, rep int) (map[string]result, error) {
	dir, err := os.MkdirTemp("", "etcdwatch-bench-spread-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	c, err := startSpreadCluster(dir)
	if err != nil {
		return nil, err
	}
	defer c.stop()
	out := map[string]result{}
	for k := range spreadNames { // the order rotates each repetition
		name := spreadNames[(k+rep)%len(spreadNames)]
		watchers, streams := serverWatchers()
		fan, err := spreadFanoutOnce(c, name, rep)
		settle(watchers, streams)
		if err != nil {
			return nil, fmt.Errorf("%s fanout: %w", name, err)
		}
		fail, err := spreadFailureOnce(c, name, rep)
		settle(watchers, streams)
		if err != nil {
			return nil, fmt.Errorf("%s member failure: %w", name, err)
		}
		for m, v := range fail {
			fan[m] = v
		}
		out[name] = fan
	}
	return out, nil
}

// spreadFanoutOnce is fanout's measurement over the cluster.
func spreadFanoutOnce(c *spreadCluster, name string, rep int) (result, error) {
	ctx, cancel := timeout()
	defer cancel()
	sw, err := openSpread(name, c.addrs)
	if err != nil {
		return nil, err
	}
	key := fmt.Sprintf("bench/spread/fanout/%s/%d", name, rep)
	watches, err := sw.watchAll(ctx, slices.Repeat([]etcdwatch.Request{etcdwatch.Key(key)}, *spreadFanout)...)
	if err != nil {
		sw.close()
		return nil, err
	}
	total := int64(len(watches) * *spreadPuts)
	lat := make([]int64, total)
	var got atomic.Int64
	done := make(chan struct{})
	wait := consume(watches, func(_ int, r etcdwatch.Response, at time.Time) {
		for _, e := range r.Events {
			sent, _ := strconv.ParseInt(string(e.Value), 10, 64)
			if i := got.Add(1); i <= total {
				lat[i-1] = at.UnixNano() - sent
				if i == total {
					close(done)
				}
			}
		}
	})
	defer func() { sw.close(); wait() }()
	start := time.Now()
	for range *spreadPuts {
		if _, err := c.kv.Put(ctx, key, strconv.FormatInt(time.Now().UnixNano(), 10)); err != nil {
			return nil, err
		}
	}
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		return nil, fmt.Errorf("%d of %d events", got.Load(), total)
	}
	took := time.Since(start)
	slices.Sort(lat)
	q := func(x float64) float64 { return float64(lat[int(x*float64(len(lat)-1))]) / 1e6 }
	return result{"events_per_s": float64(total) / took.Seconds(), "p50_ms": q(0.50), "p99_ms": q(0.99)}, nil
}

// spreadLog is what each watch of the member-failure half delivered.
type spreadLog struct {
	member atomic.Uint64 // the member that sent its last response
	mu     sync.Mutex
	sent   []int64     // each event's put send time, Unix ns
	at     []time.Time // when it was delivered
}

// firstAfter returns when the watch delivered the first put sent at or
// after t.
func (l *spreadLog) firstAfter(t time.Time) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := slices.IndexFunc(l.sent, func(s int64) bool { return s >= t.UnixNano() })
	if k < 0 {
		return time.Time{}, false
	}
	return l.at[k], true
}

// latencies appends to out the put-to-delivery times, in ms, of the puts
// sent in [from, to).
func (l *spreadLog) latencies(out []float64, from, to time.Time) []float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	for k, s := range l.sent {
		if s >= from.UnixNano() && s < to.UnixNano() {
			out = append(out, float64(l.at[k].UnixNano()-s)/1e6)
		}
	}
	return out
}

// spreadFailureOnce makes the member serving the most watches unreachable
// under a writer, and times what its watches and the others do.
func spreadFailureOnce(c *spreadCluster, name string, rep int) (result, error) {
	ctx, cancel := timeout()
	defer cancel()
	sw, err := openSpread(name, c.addrs)
	if err != nil {
		return nil, err
	}
	prefix := fmt.Sprintf("bench/spread/failure/%s/%d/", name, rep)
	watches, err := sw.watchAll(ctx, slices.Repeat([]etcdwatch.Request{etcdwatch.Prefix(prefix)}, *spreadWatches)...)
	if err != nil {
		sw.close()
		return nil, err
	}
	logs := make([]spreadLog, len(watches))
	wait := consume(watches, func(i int, r etcdwatch.Response, at time.Time) {
		l := &logs[i]
		l.member.Store(r.Header.MemberID)
		l.mu.Lock()
		for _, e := range r.Events {
			sent, _ := strconv.ParseInt(string(e.Value), 10, 64)
			l.sent = append(l.sent, sent)
			l.at = append(l.at, at)
		}
		l.mu.Unlock()
	})
	defer func() { sw.close(); wait() }()
	put := func() error {
		_, err := c.kv.Put(ctx, prefix+"k", strconv.FormatInt(time.Now().UnixNano(), 10))
		return err
	}
	// allAfter waits until every watch of ws has delivered a put sent at
	// or after t, and returns when the last did.
	allAfter := func(ws []int, t time.Time) (time.Time, error) {
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Millisecond) { // polling: the times were logged on delivery
			var last time.Time
			all := true
			for _, i := range ws {
				at, ok := logs[i].firstAfter(t)
				if !ok {
					all = false
					break
				}
				if at.After(last) {
					last = at
				}
			}
			if all {
				return last, nil
			}
			if time.Now().After(deadline) {
				return time.Time{}, fmt.Errorf("watches short of the puts sent after %v", t)
			}
		}
	}
	every := make([]int, len(watches))
	for i := range every {
		every[i] = i
	}
	first := time.Now()
	if err := put(); err != nil {
		return nil, err
	}
	if _, err := allAfter(every, first); err != nil {
		return nil, err
	}
	// The victim: the member serving the most watches, as a follower.
	count := make([]int, 3)
	for i := range logs {
		count[slices.Index(c.ids, logs[i].member.Load())]++
	}
	victim := 0
	for m := range count {
		if count[m] > count[victim] {
			victim = m
		}
	}
	if err := c.ensureFollower(ctx, victim); err != nil {
		return nil, err
	}
	var moved, stayed []int
	for i := range logs {
		if logs[i].member.Load() == c.ids[victim] {
			moved = append(moved, i)
		} else {
			stayed = append(stayed, i)
		}
	}

	writing := make(chan struct{})
	var writer sync.WaitGroup
	var writeErr error
	writer.Go(func() { // puts every -spread-put-every until writing is closed; waited for below
		tick := time.NewTicker(*spreadEvery)
		defer tick.Stop()
		for {
			select {
			case <-writing:
				return
			case <-tick.C:
				if err := put(); err != nil {
					writeErr = err
					return
				}
			}
		}
	})
	time.Sleep(*spreadWindow) // the writer runs a window before the cut: what delivery is without a failure
	cut := time.Now()
	c.proxies[victim].Refuse(true)
	c.proxies[victim].Cut()
	defer c.proxies[victim].Refuse(false)
	resumed, err := allAfter(moved, cut)
	if err != nil {
		close(writing)
		writer.Wait()
		return nil, err
	}
	// Write on through the window, and past the resume.
	time.Sleep(time.Until(cut.Add(max(*spreadWindow, resumed.Sub(cut)+100*time.Millisecond))))
	close(writing)
	writer.Wait()
	if writeErr != nil {
		return nil, writeErr
	}
	last := time.Now()
	if err := put(); err != nil {
		return nil, err
	}
	if _, err := allAfter(every, last); err != nil {
		return nil, err
	}
	var before, during, others []float64
	for i := range logs {
		before = logs[i].latencies(before, cut.Add(-*spreadWindow), cut)
		during = logs[i].latencies(during, cut, cut.Add(*spreadWindow))
	}
	for _, i := range stayed {
		others = logs[i].latencies(others, cut, cut.Add(*spreadWindow))
	}
	slices.Sort(before)
	slices.Sort(during)
	slices.Sort(others)
	r := result{
		"before_p99_ms": quantile(before, 0.99),
		"resume_ms":     ms(resumed.Sub(cut)),
		"moved_share":   float64(len(moved)) / float64(len(watches)),
		"during_p50_ms": quantile(during, 0.50),
		"during_p99_ms": quantile(during, 0.99),
	}
	if len(others) > 0 {
		r["others_p99_ms"] = quantile(others, 0.99)
	}
	if *verbose {
		st := sw.stats()
		fmt.Printf("# spread %s: member %d failed, %d of %d watches on it; reconnects %d, moved %d\n",
			name, victim, len(moved), len(watches), st.Reconnects, st.Moved)
	}
	return r, nil
}

// spreadRatios prints group/stream and group/group-1 for each metric.
func spreadRatios(medians map[string]map[string]float64) {
	ratio := func(a, b, m string) string {
		x, okA := medians[a][m]
		y, okB := medians[b][m]
		if !okA || !okB || y == 0 {
			return "n/a"
		}
		return fmt.Sprintf("%.2f", x/y)
	}
	for _, m := range []string{"events_per_s", "p50_ms", "p99_ms", "resume_ms", "moved_share", "before_p99_ms", "during_p50_ms", "during_p99_ms"} {
		fmt.Printf("RATIO spread %s group/stream=%s group/group-1=%s\n", m, ratio("group", "stream", m), ratio("group", "group-1", m))
	}
}

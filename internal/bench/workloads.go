package main

import (
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"

	"github.com/etcdwatch/etcdwatch/etcdwatchtest"
)

// runCreate times opening N watches on distinct keys until all are confirmed.
func runCreate(c contender, rep int) (result, error) {
	conn, err := plainConn(etcdEndpoint)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	specs := make([]spec, *createN)
	for i := range specs {
		specs[i] = spec{key: fmt.Sprintf("bench/create/%s/%d/%d", c.name(), rep, i)}
	}
	ctx, cancel := timeout()
	defer cancel()
	start := time.Now()
	stop, err := withEndpoint(c, etcdEndpoint).watch(ctx, conn, specs, nil) // no consumers: their goroutines are not creation
	if err != nil {
		return nil, err
	}
	took := time.Since(start)
	stop()
	return result{"seconds": took.Seconds(), "watches_per_s": float64(len(specs)) / took.Seconds()}, nil
}

// arrivals tracks when every watch has delivered a revision >= target.
type arrivals struct {
	target  atomic.Int64
	gen     []atomic.Int64 // per watch: the last target it reached
	pending atomic.Int64
	done    chan struct{}
}

func newArrivals(n int) *arrivals { return &arrivals{gen: make([]atomic.Int64, n)} }

// expect arms the tracker for target before the write that produces it.
func (a *arrivals) expect(target int64) {
	a.done = make(chan struct{})
	a.pending.Store(int64(len(a.gen)))
	a.target.Store(target)
}

func (a *arrivals) sink(i, _ int, rev int64, _ []byte) {
	t := a.target.Load()
	if rev >= t && a.gen[i].Swap(t+1) != t+1 && a.pending.Add(-1) == 0 {
		close(a.done)
	}
}

func (a *arrivals) wait(d time.Duration) error {
	select {
	case <-a.done:
		return nil
	case <-time.After(d):
		return fmt.Errorf("%d watches short of revision %d", a.pending.Load(), a.target.Load())
	}
}

// runResume cuts every connection under N live watches and times until
// every watch has delivered a write made after the cut.
func runResume(c contender, rep int) (result, error) {
	proxy, err := etcdwatchtest.ListenProxy(etcdEndpoint)
	if err != nil {
		return nil, err
	}
	defer proxy.Close()
	conn, kv, closeAll, err := connAndWriter(proxy.Addr(), etcdEndpoint)
	if err != nil {
		return nil, err
	}
	defer closeAll()
	prefix := fmt.Sprintf("bench/resume/%s/%d/", c.name(), rep)
	specs := repeat(*resumeN, spec{key: prefix, prefix: true})
	ctx, cancel := timeout()
	defer cancel()
	a := newArrivals(len(specs))
	a.expect(1 << 62)
	stop, err := withEndpoint(c, proxy.Addr()).watch(ctx, conn, specs, a.sink)
	if err != nil {
		return nil, err
	}
	defer stop()
	put := func(v string) (int64, error) {
		resp, err := kv.Put(ctx, prefix+"k", v)
		if err != nil {
			return 0, err
		}
		return resp.Header.Revision, nil
	}
	// Flowing before the cut: the tracker is armed below the next revision.
	a.expect(0)
	if _, err := put("before"); err != nil {
		return nil, err
	}
	if err := a.wait(time.Minute); err != nil {
		return nil, fmt.Errorf("before the cut: %w", err)
	}
	st, err := kv.Get(ctx, prefix+"k")
	if err != nil {
		return nil, err
	}
	a.expect(st.Header.Revision + 1)
	start, cpu := time.Now(), cpuTime()
	proxy.Cut()
	if _, err := put("after"); err != nil {
		return nil, err
	}
	if err := a.wait(2 * time.Minute); err != nil {
		return nil, fmt.Errorf("after the cut: %w", err)
	}
	return result{"seconds": time.Since(start).Seconds(), "cpu_seconds": (cpuTime() - cpu).Seconds()}, nil
}

// cpuTime returns the CPU time, user and system, the process has used: the
// embedded etcd's as well as the contender's, since both run in it.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// connAndWriter returns a watch connection to addr and an official client
// writing to writeAddr (straight to the member, not through a proxy), and
// a function that closes both.
func connAndWriter(addr, writeAddr string) (*grpc.ClientConn, *clientv3.Client, func(), error) {
	conn, err := plainConn(addr)
	if err != nil {
		return nil, nil, nil, err
	}
	kv, err := clientv3.New(clientv3.Config{Endpoints: []string{writeAddr}})
	if err != nil {
		conn.Close()
		return nil, nil, nil, err
	}
	return conn, kv, func() { kv.Close(); conn.Close() }, nil
}

// repeat returns n copies of sp.
func repeat(n int, sp spec) []spec {
	specs := make([]spec, n)
	for i := range specs {
		specs[i] = sp
	}
	return specs
}

// runFanout puts to one key watched N times and measures delivery rate and
// put-to-delivery latency.
func runFanout(c contender, rep int) (result, error) {
	conn, kv, closeAll, err := connAndWriter(etcdEndpoint, etcdEndpoint)
	if err != nil {
		return nil, err
	}
	defer closeAll()
	key := fmt.Sprintf("bench/fanout/%s/%d", c.name(), rep)
	specs := repeat(*fanoutN, spec{key: key})
	total := int64(len(specs) * *fanoutPuts)
	lat := make([]int64, total)
	sent := make([]atomic.Int64, *fanoutPuts) // when each put was sent, by its index, which is its value
	var got atomic.Int64
	done := make(chan struct{})
	// Each event is timed from its own put: a response's n events on the
	// one key are the last n puts, ending with the one its value names
	// (the puts go one after another, and the watch loses none).
	sink := func(_ int, n int, _ int64, value []byte) {
		last, _ := strconv.Atoi(string(value))
		now := time.Now().UnixNano()
		for k := last - n + 1; k <= last; k++ {
			if i := got.Add(1); i <= total {
				lat[i-1] = now - sent[max(k, 0)].Load()
				if i == total {
					close(done)
				}
			}
		}
	}
	ctx, cancel := timeout()
	defer cancel()
	stop, err := withEndpoint(c, etcdEndpoint).watch(ctx, conn, specs, sink)
	if err != nil {
		return nil, err
	}
	defer stop()
	start := time.Now()
	for k := range *fanoutPuts {
		sent[k].Store(time.Now().UnixNano())
		if _, err := kv.Put(ctx, key, strconv.Itoa(k)); err != nil {
			return nil, err
		}
	}
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		return nil, fmt.Errorf("fanout: %d of %d events", got.Load(), total)
	}
	took := time.Since(start)
	slices.Sort(lat)
	ms := func(q float64) float64 { return float64(lat[int(q*float64(len(lat)-1))]) / 1e6 }
	return result{"events_per_s": float64(total) / took.Seconds(), "p50_ms": ms(0.50), "p99_ms": ms(0.99)}, nil
}

// runClientOnly streams events from the scripted server to one watch whose
// consumer counts them, at 100 and at 1 event per response.
func runClientOnly(c contender, _ int) (result, error) {
	r := result{}
	for _, x := range []struct {
		events, per int
		suffix      string
	}{{*events100, 100, "100"}, {*events1, 1, "1"}} {
		rate, allocs, err := clientOnly(c, x.events, x.per)
		if err != nil {
			return nil, err
		}
		r["events_per_s_"+x.suffix] = rate
		r["allocs_per_event_"+x.suffix] = allocs
	}
	return r, nil
}

func clientOnly(c contender, events, per int) (rate, allocs float64, err error) {
	srv := startScripted(events, per)
	defer srv.stop()
	conn, err := srv.dial()
	if err != nil {
		return 0, 0, err
	}
	defer conn.Close()
	var got atomic.Int64
	done := make(chan struct{})
	var once sync.Once
	sink := func(_ int, n int, _ int64, _ []byte) {
		if got.Add(int64(n)) >= int64(events) {
			once.Do(func() { close(done) })
		}
	}
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	ctx, cancel := timeout()
	defer cancel()
	start := time.Now()
	stop, err := c.watch(ctx, conn, []spec{{key: "key-"}}, sink)
	if err != nil {
		return 0, 0, err
	}
	defer stop()
	select {
	case <-done:
	case <-time.After(5 * time.Minute):
		return 0, 0, fmt.Errorf("clientonly: %d of %d events", got.Load(), events)
	}
	took := time.Since(start)
	runtime.ReadMemStats(&after)
	return float64(events) / took.Seconds(), float64(after.Mallocs-before.Mallocs) / float64(events), nil
}

// runMemory measures what N idle watches cost the client, in a child
// process of its own so that nothing else in this one counts: heap and
// stack in use after GC, and goroutines, against the scripted server.
func runMemory(c contender, _ int) (result, error) {
	return runChild("-memory-child", c.name(), "-memory", strconv.Itoa(*memoryN))
}

// memoryChild is the child's side of runMemory. It prints bytes and
// goroutines per watch and exits without closing the watches.
func memoryChild(c contender) {
	srv := startScripted(0, 0)
	conn, err := srv.dial()
	check(err)
	specs := make([]spec, *memoryN)
	for i := range specs {
		specs[i] = spec{key: fmt.Sprintf("bench/memory/%d", i)}
	}
	inUse := func() (uint64, int) {
		runtime.GC()
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapInuse + m.StackInuse, runtime.NumGoroutine()
	}
	ctx, cancel := timeout()
	defer cancel()
	// Connect first: the in-memory connection's buffers are not the watches'.
	conn.Connect()
	for s := conn.GetState(); s != connectivity.Ready; s = conn.GetState() {
		conn.WaitForStateChange(ctx, s)
	}
	bytes0, g0 := inUse()
	_, err = c.watch(ctx, conn, specs, nil)
	check(err)
	bytes1, g1 := inUse()
	// Per-stream costs (the gRPC stream, the client's own goroutines) are
	// spread over the watches; at 10,000 watches they weigh little.
	n := float64(len(specs))
	printResult(result{"bytes_per_watch": float64(int64(bytes1)-int64(bytes0)) / n, "goroutines_per_watch": float64(g1-g0) / n})
}

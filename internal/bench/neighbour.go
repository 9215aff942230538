package main

import (
	"context"
	"flag"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

var (
	neighbourTxns    = flag.Int("neighbour-txns", 2000, "neighbour: transactions written")
	neighbourPerTxn  = flag.Int("neighbour-per-txn", 10, "neighbour: puts per transaction")
	neighbourValue   = flag.Int("neighbour-value", 2048, "neighbour: bytes per value")
	neighbourChildOf = flag.String("neighbour-child", "", "internal: run neighbour for this contender, print its result and exit")
	childEndpoint    = flag.String("endpoint", "", "internal: the etcd endpoint of a child process")
	childPrefix      = flag.String("prefix", "", "internal: the key prefix of a child process")
)

// runNeighbour runs neighbourChild in a process of its own, against this
// process's etcd, so that the heap it measures holds the contender (and the
// child's writer and bookkeeping, alike for every contender) but not etcd.
func runNeighbour(c contender, rep int) (result, error) {
	return runChild("-neighbour-child", c.name(), "-endpoint", etcdEndpoint,
		"-prefix", fmt.Sprintf("bench/neighbour/%s/%d/", c.name(), rep),
		"-neighbour-txns", strconv.Itoa(*neighbourTxns),
		"-neighbour-per-txn", strconv.Itoa(*neighbourPerTxn),
		"-neighbour-value", strconv.Itoa(*neighbourValue))
}

// neighbourChild opens two watches on one stream on the same prefix and
// writes -neighbour-txns transactions of -neighbour-per-txn puts to it, one
// transaction at a time. Watch 1's consumer stops in its first delivery
// (so it has taken one response) until every write is acknowledged, then
// reads everything. Watch 0's consumer reads at once; its latency is, for
// each transaction, the time from the transaction's response to the
// delivery of the response holding its revision (0 when the event came
// first). The heap: HeapAlloc after two GCs (heapAfterGC) with the watches
// open and idle, before the writes; the highest HeapAlloc sampled every
// 10 ms, without GC, from then until watch 1 has drained; and after two
// GCs once it has, the watches still open.
func neighbourChild(c contender) {
	ctx, cancel := timeout()
	defer cancel()
	conn, err := plainConn(*childEndpoint)
	check(err)
	kv, err := clientv3.New(clientv3.Config{Endpoints: []string{*childEndpoint}})
	check(err)
	if raw, ok := c.(rawClient); ok {
		// raw calls its sink from its one loop: a stopped consumer would
		// stop every watch. An application would queue, as clientv3 does.
		raw.queued = true
		c = raw
	}
	txns := *neighbourTxns
	log := newDeliveryLog(2, txns+10)
	acks := make([]time.Time, 0, txns)
	revs := make([]int64, 0, txns)
	release := make(chan struct{})
	sink := func(i, n int, rev int64, v []byte) {
		if i == 1 {
			<-release
		}
		log.sink(i, n, rev, v)
	}
	stop, err := withEndpoint(c, *childEndpoint).watch(ctx, conn, repeat(2, spec{key: *childPrefix, prefix: true}), sink)
	check(err)
	defer stop()
	value := strings.Repeat("v", *neighbourValue)
	// One write first: the writer's first request initializes protobuf's
	// descriptors of etcd's messages (about 0.2 MiB, by a heap profile),
	// which a contender decoding with generated code has done already and
	// one with a codec of its own has not. That memory is the writer's.
	_, err = kv.Txn(ctx).Then(neighbourOps(value)...).Commit()
	check(err)
	before := heapAfterGC()
	peak, stopSampling := sampleHeap(10 * time.Millisecond)
	for range txns {
		resp, err := kv.Txn(ctx).Then(neighbourOps(value)...).Commit()
		check(err)
		acks, revs = append(acks, time.Now()), append(revs, resp.Header.Revision)
	}
	close(release)
	_, err = log.wait(revs[len(revs)-1], 2*time.Minute)
	check(err)
	stopSampling()
	after := heapAfterGC()
	lat := make([]float64, len(acks))
	for k, rev := range revs {
		got, _ := log.first(0, rev)
		lat[k] = ms(max(got.Sub(acks[k]), 0))
	}
	slices.Sort(lat)
	mib := func(b uint64) float64 { return float64(b) / (1 << 20) }
	printResult(result{
		"p50_ms": quantile(lat, 0.5), "p99_ms": quantile(lat, 0.99), "max_ms": lat[len(lat)-1],
		"heap_before_mib": mib(before), "heap_peak_mib": mib(peak.Load()), "heap_after_mib": mib(after),
		"heap_after_over_before": float64(after) / float64(before),
	})
}

// neighbourOps returns one transaction's puts, built as it is sent: they
// are garbage once it is acknowledged, and never in the heap after GC.
func neighbourOps(value string) []clientv3.Op {
	ops := make([]clientv3.Op, *neighbourPerTxn)
	for p := range ops {
		ops[p] = clientv3.OpPut(*childPrefix+"k"+strconv.Itoa(p), value)
	}
	return ops
}

// sampleHeap reads HeapAlloc every interval and keeps the highest, until
// the returned function is called (it waits for the sampler to stop).
func sampleHeap(interval time.Duration) (*atomic.Uint64, func()) {
	var peak atomic.Uint64
	ctx, cancel := context.WithCancel(context.Background())
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		var m runtime.MemStats
		for sleepCtx(ctx, interval) {
			runtime.ReadMemStats(&m)
			if m.HeapAlloc > peak.Load() {
				peak.Store(m.HeapAlloc)
			}
		}
	}()
	return &peak, func() { cancel(); <-exited }
}

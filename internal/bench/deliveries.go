package main

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// deliveryLog records, for each watch, when its consumer got each response:
// the response's last revision and the time. Workloads read it afterwards,
// so that the measurement itself does nothing but append.
type deliveryLog struct {
	watches []watchLog
}

type watchLog struct {
	mu   sync.Mutex
	revs []int64
	at   []time.Time
}

// newDeliveryLog makes a log for n watches with room for capacity
// responses each before it grows.
func newDeliveryLog(n, capacity int) *deliveryLog {
	d := &deliveryLog{watches: make([]watchLog, n)}
	for i := range d.watches {
		d.watches[i].revs = make([]int64, 0, capacity)
		d.watches[i].at = make([]time.Time, 0, capacity)
	}
	return d
}

// sink is the contenders' sink: it logs the response at once.
func (d *deliveryLog) sink(i, _ int, rev int64, _ []byte) {
	now := time.Now()
	w := &d.watches[i]
	w.mu.Lock()
	w.revs = append(w.revs, rev)
	w.at = append(w.at, now)
	w.mu.Unlock()
}

// first returns when watch i first got a response whose last revision was
// at least rev: when it got the events of revision rev, if the watch sees
// that revision.
func (d *deliveryLog) first(i int, rev int64) (time.Time, bool) {
	w := &d.watches[i]
	w.mu.Lock()
	defer w.mu.Unlock()
	k := slices.IndexFunc(w.revs, func(r int64) bool { return r >= rev })
	if k < 0 {
		return time.Time{}, false
	}
	return w.at[k], true
}

// allGot returns when the last of the watches got revision rev (as first
// does), or false if one has not yet.
func (d *deliveryLog) allGot(rev int64) (time.Time, bool) {
	var last time.Time
	for i := range d.watches {
		t, ok := d.first(i, rev)
		if !ok {
			return time.Time{}, false
		}
		if t.After(last) {
			last = t
		}
	}
	return last, true
}

// wait polls until every watch has got revision rev, for up to d. Polling
// costs no precision: the times were logged on delivery.
func (d *deliveryLog) wait(rev int64, timeout time.Duration) (time.Time, error) {
	deadline := time.Now().Add(timeout)
	for {
		if t, ok := d.allGot(rev); ok {
			return t, nil
		}
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("watches short of revision %d after %v", rev, timeout)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// quantile returns the q-quantile of sorted, the same way fanout does.
func quantile(sorted []float64, q float64) float64 {
	return sorted[int(q*float64(len(sorted)-1))]
}

// ms converts a duration to milliseconds, for metrics.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// heapAfterGC returns HeapAlloc after two collections: the first moves
// sync.Pool contents (gRPC's buffer pools among them) to the victim cache,
// the second frees them, so pooled buffers do not count.
func heapAfterGC() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// runChild runs this program again with args and parses what it prints,
// "metric=value" fields, into a result. Workloads that measure the heap
// run there, away from the embedded etcd's.
func runChild(args ...string) (result, error) {
	cmd := exec.Command(os.Args[0], args...)
	out, err := cmd.Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			err = fmt.Errorf("%w: %s", err, lastLines(ee.Stderr, 5))
		}
		return nil, fmt.Errorf("child %v: %w", args, err)
	}
	r := result{}
	for _, f := range strings.Fields(string(out)) {
		k, v, ok := strings.Cut(f, "=")
		x, err := strconv.ParseFloat(v, 64)
		if !ok || err != nil {
			return nil, fmt.Errorf("child %v said %q", args, out)
		}
		r[k] = x
	}
	return r, nil
}

// printResult is a child's side of runChild.
func printResult(r result) {
	var fs []string
	for k, v := range r {
		fs = append(fs, fmt.Sprintf("%s=%g", k, v))
	}
	fmt.Println(strings.Join(fs, " "))
}

// lastLines returns the last n lines of b.
func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

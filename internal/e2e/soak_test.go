package e2e

import (
	"bytes"
	"log/slog"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/etcdwatch/etcdwatch"
	"github.com/etcdwatch/etcdwatch/etcdwatchtest"
)

// TestSoak mixes faults at random for ETCDWATCH_SOAK (a duration, e.g. 5m)
// against a 3-member cluster while a writer runs, then checks every watch's
// whole history. `make soak` runs it; `make test` skips it.
func TestSoak(t *testing.T) {
	leakCheck(t)
	d, err := time.ParseDuration(os.Getenv("ETCDWATCH_SOAK"))
	if err != nil || d <= 0 {
		t.Skip("set ETCDWATCH_SOAK to a duration to soak")
	}
	members := etcdwatchtest.StartCluster(t, 3)
	var endpoints, proxyAddrs []string
	var proxies []*etcdwatchtest.Proxy
	for _, m := range members {
		endpoints = append(endpoints, m.Endpoint)
		p := etcdwatchtest.NewProxy(t, m.Endpoint)
		proxies = append(proxies, p)
		proxyAddrs = append(proxyAddrs, p.Addr())
	}
	kv := clientFor(t, endpoints...)
	opts := []etcdwatch.Option{fastRetry, etcdwatch.WithRequireLeader(), etcdwatch.WithLiveness(time.Second, time.Second)}
	logged := func(buf *syncBuffer) etcdwatch.Option {
		return etcdwatch.WithLogger(slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	}
	var logBuf, tightLog syncBuffer
	s := openOn(t, proxyAddrs, append(opts, logged(&logBuf))...)
	tight := openOn(t, proxyAddrs, append(opts, etcdwatch.WithBufferLimit(32), logged(&tightLog))...)
	var recs []*recording
	defer func() { // on failure, while the watches still run
		if t.Failed() {
			t.Logf("stats %+v\nlog of the first stream:\n%s", s.Stats(), logBuf.String())
			t.Logf("tight stream stats %+v\nlog of the tight stream:\n%s", tight.Stats(), tightLog.String())
			for _, r := range recs {
				t.Logf("watch %s: id %d, revision %d, err %v", r.w.Request(), r.w.ID(), r.w.Revision(), r.w.Err())
			}
		}
	}()
	start := currentRevision(t, kv) + 1
	// The tight stream's consumers are slower than the writer every other
	// second: they pause, then catch up.
	recs = append(watchSet(t, s, "soak/", start), slowWatchSet(t, tight, "soak/", start, 2*time.Millisecond)...)
	w := startWriter(t, kv, "soak/", 20)

	counts := map[string]int{}
	var compacted int64 // the last compaction's revision
	faultsList := []struct {
		name string
		do   func()
	}{
		{"cut-all", func() {
			for _, p := range proxies {
				p.Cut()
			}
		}},
		{"cut-one", func() { proxies[rand.IntN(len(proxies))].Cut() }},
		{"blackhole-one", func() { proxies[rand.IntN(len(proxies))].Blackhole() }},
		{"restart-member", func() {
			m := members[rand.IntN(len(members))]
			m.Stop()
			require.NoError(t, m.Restart())
		}},
		{"compact", func() {
			low := recs[0].Last()
			for _, r := range recs {
				low = min(low, r.Last())
			}
			// etcd refuses to compact at or below its last compaction, and
			// the slowest watch may not have moved since then.
			if low > max(start, compacted) {
				_, err := kv.Compact(ctx(t), low)
				require.NoError(t, err)
				compacted = low
			}
		}},
	}
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		progressed(t, recs[0], w.Last())
		f := faultsList[rand.IntN(len(faultsList))]
		t.Logf("%s: %s (writer at %d, first watch at %d)", time.Now().Format("15:04:05.000"), f.name, w.Last(), recs[0].Last())
		f.do()
		counts[f.name]++
		select {
		case <-time.After(time.Duration(200+rand.IntN(1800)) * time.Millisecond): // pacing between faults
		case <-t.Context().Done():
			return
		}
	}
	progressed(t, recs[0], w.Last())
	events := finish(t, w, recs)
	total := 0
	for _, n := range counts {
		total += n
	}
	a, b := s.Stats(), tight.Stats()
	t.Logf("SOAK %v: faults %d %v; transactions %d; events checked %d over %d watches; lost 0, duplicated 0; reconnects %d; stalls %d; pauses %d; duplicates dropped %d",
		d, total, counts, w.txns, events, len(recs), a.Reconnects+b.Reconnects, a.Stalls+b.Stalls, a.Pauses+b.Pauses, a.DuplicatesDropped+b.DuplicatesDropped)
}

// syncBuffer is a bytes.Buffer safe for a logger and a reader.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdwatch/etcdwatch"
	"github.com/etcdwatch/etcdwatch/dial"
	"github.com/etcdwatch/etcdwatch/etcdwatchtest"
	"github.com/etcdwatch/etcdwatch/group"
	"github.com/etcdwatch/etcdwatch/view"
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
	// The outage view's Stream has proxies of its own, which the
	// view-outage fault holds down while the store is compacted past it.
	var outageAddrs []string
	var outageProxies []*etcdwatchtest.Proxy
	for _, m := range members {
		p := etcdwatchtest.NewProxy(t, m.Endpoint)
		outageProxies = append(outageProxies, p)
		outageAddrs = append(outageAddrs, p.Addr())
	}
	outage := openOn(t, outageAddrs, opts...)
	tight := openOn(t, proxyAddrs, append(opts, etcdwatch.WithBufferLimit(32), logged(&tightLog))...)
	// A group of Streams through the same proxies: each of its Streams
	// moves off its member when that member's proxy fails it, and goes
	// home once it is back for the settle time.
	g, err := group.Dial(proxyAddrs, group.WithDialOptions(dial.WithInsecure()), group.WithStreamOptions(opts...),
		group.WithHoming(500*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, g.Close()) })
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
	recs = append(recs, watchGroup(t, "soak group", g, "soak/", start).recs...)
	views := soakViews(t, s, tight, outage)
	defer func() {
		if t.Failed() {
			for _, sv := range views {
				t.Logf("view %s: revision %d, err %v, stats %+v", sv.name, sv.v.Revision(), sv.v.Err(), sv.v.Stats())
			}
		}
	}()
	w := startWriter(t, kv, "soak/", 20)

	counts := map[string]int{}
	var compacted int64 // the last compaction's revision
	slowest := func() int64 {
		low := recs[0].Last()
		for _, r := range recs {
			low = min(low, r.Last())
		}
		return low
	}
	compactBelowWatches := func() {
		// etcd refuses to compact at or below its last compaction, and
		// the slowest watch may not have moved since then.
		if low := slowest(); low > max(start, compacted) {
			_, err := kv.Compact(ctx(t), low)
			require.NoError(t, err)
			compacted = low
		}
	}
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
		{"isolate-one", func() {
			// A member cut off from its peers loses its leader while
			// clients still reach it: every Stream requires a leader, so
			// those on it move, and the group's goes home once it rejoins.
			m := members[rand.IntN(len(members))]
			m.Isolate()
			require.Eventually(t, func() bool { return !m.HasLeader() }, wait, time.Millisecond, "the isolated member kept its leader")
			time.Sleep(time.Duration(rand.IntN(1500)) * time.Millisecond) // how long the partition lasts: not synchronisation
			m.Rejoin()
			require.Eventually(t, m.HasLeader, wait, time.Millisecond, "the member did not rejoin")
		}},
		{"compact", func() { compactBelowWatches() }},
		{"view-outage", func() {
			// The outage view is held off while the store is compacted
			// past its next revision: on its return its watch is compacted,
			// and it lists again (Relisted, checked by checkViews like every
			// batch). A compaction at its next revision itself would not do:
			// its watch is created again from there (the trap).
			ov := views[len(views)-1].v
			relists := ov.Stats().Relists
			for _, p := range outageProxies {
				p.Refuse(true)
				p.Cut()
			}
			require.Eventually(t, func() bool { return !outage.State().Connected }, wait, time.Millisecond, "the outage went unnoticed")
			held := ov.Revision()
			require.Eventually(t, func() bool { return slowest() > max(held+1, compacted) }, wait, time.Millisecond, "the watches did not pass the outage view")
			compactBelowWatches()
			for _, p := range outageProxies {
				p.Refuse(false)
			}
			require.Eventually(t, func() bool { return ov.Stats().Relists > relists }, time.Minute, time.Millisecond, "the outage view did not list again")
		}},
	}
	deadline := time.Now().Add(d)
	checked := time.Now()
	for time.Now().Before(deadline) {
		progressed(t, recs[0], w.Last())
		if time.Since(checked) > 3*time.Second {
			checkViews(t, kv, views)
			checked = time.Now()
		}
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
	// Faults over, every Stream of the group goes home: a blackholed
	// connection first has to be given up by gRPC's keepalive (15s).
	var streams []group.StreamInfo // as last seen, for the failure message
	home := assert.Eventually(t, func() bool {
		streams = g.Streams()
		for i, st := range streams[:len(proxyAddrs)] {
			if st.Member != proxyAddrs[i] {
				return false
			}
		}
		return true
	}, time.Minute, 10*time.Millisecond)
	require.True(t, home, "the group's Streams did not all go home (proxies %v): %+v", proxyAddrs, streams)
	events := finish(t, w, recs)
	for _, sv := range views {
		require.NoError(t, sv.v.Sync(ctx(t)), "view %s", sv.name)
		require.GreaterOrEqual(t, sv.v.Revision(), w.Last(), "view %s synced", sv.name)
	}
	checkViews(t, kv, views)
	total := 0
	for _, n := range counts {
		total += n
	}
	a, b := s.Stats(), tight.Stats()
	t.Logf("SOAK %v: faults %d %v; transactions %d; events checked %d over %d watches; lost 0, duplicated 0; reconnects %d; stalls %d; pauses %d; duplicates dropped %d",
		d, total, counts, w.txns, events, len(recs), a.Reconnects+b.Reconnects, a.Stalls+b.Stalls, a.Pauses+b.Pauses, a.DuplicatesDropped+b.DuplicatesDropped)
	t.Logf("VIEWS %s", viewCounts(views))
	gs := g.Stats()
	t.Logf("GROUP 3 Streams, 21 watches: reconnects %d, watches moved %d; every Stream home at the end", gs.Reconnects, gs.Moved)
}

// soakView is a view the soak checks, with the replay of a subscription
// to it, or nil.
type soakView struct {
	name   string
	v      *testView[[]byte]
	rp     *replayer
	checks int // comparisons with the server
}

// soakViews starts the soak's views: two of the whole prefix, one on each
// stream, each with a subscriber from the start, one of part of it, and,
// last, one on the outage stream with a subscriber.
func soakViews(t *testing.T, s, tight, outage *etcdwatch.Stream) []*soakView {
	t.Helper()
	views := []*soakView{
		{name: "prefix", v: newView(t, s, etcdwatch.Prefix("soak/"), view.DecodeBytes)},
		{name: "tight", v: newView(t, tight, etcdwatch.Prefix("soak/"), view.DecodeBytes,
			view.WithHistoryBytes(16<<10), view.WithIntegrityCheck(time.Second))},
		{name: "range", v: newView(t, s, etcdwatch.Range("soak/k00", "soak/k05"), view.DecodeBytes,
			view.WithBookmarkInterval(200*time.Millisecond))},
		{name: "outage", v: newView(t, outage, etcdwatch.Prefix("soak/"), view.DecodeBytes)},
	}
	for _, sv := range []*soakView{views[0], views[1], views[3]} {
		sv.rp = replay(sv.v.Subscribe(context.Background(), 0))
	}
	return views
}

// checkViews requires every view to equal the server at its revision, and
// every replay to equal its view's state there. Every revision of the
// writer has a change under soak/ (its sequence key), so a replay of the
// whole prefix gets a batch at or after any revision its view reaches.
func checkViews(t *testing.T, kv *clientv3.Client, views []*soakView) {
	t.Helper()
	for _, sv := range views {
		require.NoError(t, sv.v.Err(), "view %s ended", sv.name)
		snap := requireEqualsServer(t, kv, sv.v, sv.v.Snapshot())
		sv.checks++
		if sv.rp == nil {
			continue
		}
		require.Eventually(t, func() bool { return sv.rp.reached(snap.Revision()) }, wait, time.Millisecond,
			"view %s: the subscriber did not reach revision %d", sv.name, snap.Revision())
		m, ok, err := sv.rp.stateAt(snap.Revision())
		require.NoError(t, err, "view %s: subscriber", sv.name)
		if ok {
			require.Empty(t, stateDiff(m, snap), "view %s: the subscriber's replay at %d", sv.name, snap.Revision())
		}
	}
}

// viewCounts sums up the views' checks and counters for the VIEWS line.
func viewCounts(views []*soakView) string {
	var checks, replays, skipped, batches int
	var relists, resyncs, integrity, mismatches uint64
	var per []string
	for _, sv := range views {
		st := sv.v.Stats()
		checks += sv.checks
		relists += st.Relists
		resyncs += st.Resyncs
		integrity += st.IntegrityChecks
		mismatches += st.IntegrityMismatches
		line := fmt.Sprintf("%s: %d keys at %d, relists %d", sv.name, st.Keys, st.Revision, st.Relists)
		if sv.rp != nil {
			sv.rp.mu.Lock()
			replays += sv.rp.checks
			skipped += sv.rp.skipped
			batches += sv.rp.batches
			line += fmt.Sprintf(", replay of %d batches (%d relisted, %d resyncs)", sv.rp.batches, sv.rp.relisted, sv.rp.resyncs)
			sv.rp.mu.Unlock()
		}
		per = append(per, line)
	}
	return fmt.Sprintf("%d views: %d checks against the server, %d replay checks (%d skipped after a resync), %d batches replayed; relists %d, resyncs %d; integrity checks %d, mismatches %d [%s]",
		len(views), checks, replays, skipped, batches, relists, resyncs, integrity, mismatches, strings.Join(per, "; "))
}

// replayer applies a subscription's batches, from its first Resync on, to a
// replica in the background, and keeps the states the replica went through
// since the last check.
type replayer struct {
	done chan struct{}

	mu     sync.Mutex
	rep    *replica[[]byte]
	states []replayState
	err    error // the first batch that did not apply, or the subscription's end
	// counts
	batches, relisted, resyncs int
	checks, skipped            int
}

// replayState is the replica after a batch.
type replayState struct {
	kind      view.BatchKind
	from, rev int64
	m         map[string]view.Entry[[]byte]
}

func replay(sub *view.Subscription[[]byte]) *replayer {
	p := &replayer{done: make(chan struct{}), rep: &replica[[]byte]{}}
	go func() { // returns when the subscription ends: its view's Close ends it
		defer close(p.done)
		for {
			b, err := sub.Next(context.Background())
			p.mu.Lock()
			if err != nil {
				if !errors.Is(err, view.ErrClosed) {
					p.err = fmt.Errorf("the subscription ended: %w", err)
				}
				p.mu.Unlock()
				return
			}
			if !p.rep.started && b.Kind != view.Resync {
				p.mu.Unlock()
				continue
			}
			if err := p.rep.apply(b); err != nil {
				p.err = err
				p.mu.Unlock()
				return
			}
			p.batches++
			switch b.Kind {
			case view.Relisted:
				p.relisted++
			case view.Resync:
				p.resyncs++
			}
			p.states = append(p.states, replayState{kind: b.Kind, from: b.From, rev: b.Revision, m: maps.Clone(p.rep.m)})
			p.mu.Unlock()
		}
	}()
	return p
}

// reached reports whether the replay has gone to rev or beyond, or failed.
func (p *replayer) reached(rev int64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err != nil || (len(p.states) > 0 && p.states[len(p.states)-1].rev >= rev)
}

// stateAt returns the replica's state at rev, which the replay has reached:
// the state after the last batch up to rev. ok is false when a Resync took
// the replica over rev. States before it are dropped.
func (p *replayer) stateAt(rev int64) (m map[string]view.Entry[[]byte], ok bool, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err != nil {
		return nil, false, p.err
	}
	i := sort.Search(len(p.states), func(i int) bool { return p.states[i].rev > rev }) - 1
	if i < 0 { // the replay began after rev
		p.skipped++
		return nil, false, nil
	}
	at := p.states[i]
	p.states = p.states[i:]
	if at.rev < rev && len(p.states) > 1 {
		switch next := p.states[1]; {
		case next.kind == view.Resync:
			p.skipped++
			return nil, false, nil
		case next.from < rev:
			// The view published its state at rev; the batch after it
			// must start there or later.
			return nil, false, fmt.Errorf("%s batch %d..%d spans revision %d, a state the view published", next.kind, next.from, next.rev, rev)
		}
	}
	p.checks++
	return at.m, true, nil
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

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/metadata"

	"github.com/etcdwatch/etcdwatch"
	"github.com/etcdwatch/etcdwatch/view"
)

// The freshness workloads (issue 18): how soon a view of a range nobody
// writes knows the store has reached a revision written elsewhere, beside
// a hand-written clientv3 loop (a Get of the range, a watch from its
// revision with progress notifications, and RequestProgress asked every
// 250ms until the watch reaches the revision wanted).
//
//   - fresh: WaitForRevision of a write made just before, and Sync after
//     such a write, each timed -fresh-n times: p50, p99, max.
//   - starve: the same Sync while a neighbour on the same Stream (for the
//     loop: on the same clientv3 stream, and on one of its own) catches up
//     from -starve-back revisions back.

var (
	freshN     = flag.Int("fresh-n", 200, "fresh, starve: calls timed per repetition and contender")
	starveBack = flag.Int("starve-back", 100000, "starve: revisions the neighbour catches up from")
)

var (
	freshNames  = []string{"loop", "view"}
	starveNames = []string{"loop-shared", "loop-own-stream", "view"}
)

// freshLoop is the hand-written clientv3 loop: it knows the revision up
// to which its watch has delivered the range.
type freshLoop struct {
	cli    *clientv3.Client
	prefix string
	md     context.Context // whose metadata picks the watch's gRPC stream, for RequestProgress
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	rev     int64         // every event of the range up to rev has come
	changed chan struct{} // closed, and replaced, when rev moves
}

// at returns rev, and the channel closed when it moves.
func (l *freshLoop) at() (int64, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rev, l.changed
}

func (l *freshLoop) reached(rev int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if rev > l.rev {
		l.rev = rev
		close(l.changed)
		l.changed = make(chan struct{})
	}
}

// startLoop lists prefix and watches it from there with progress
// notifications, in ctx (whose metadata picks clientv3's gRPC stream).
func startLoop(ctx context.Context, cli *clientv3.Client, prefix string) (*freshLoop, error) {
	resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return nil, err
	}
	l := &freshLoop{cli: cli, prefix: prefix, md: ctx, done: make(chan struct{}), rev: resp.Header.Revision, changed: make(chan struct{})}
	ctx, l.cancel = context.WithCancel(ctx)
	ch := cli.Watch(ctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1), clientv3.WithProgressNotify())
	go func() { // ends with the loop's ctx
		defer close(l.done)
		for r := range ch {
			rev := r.Header.Revision
			if len(r.Events) > 0 {
				rev = r.Events[len(r.Events)-1].Kv.ModRevision
			}
			l.reached(rev)
		}
	}()
	return l, nil
}

func (l *freshLoop) stop() {
	l.cancel()
	<-l.done
}

// waitFor asks for progress every 250ms until the watch has reached rev.
func (l *freshLoop) waitFor(ctx context.Context, rev int64) error {
	for {
		at, changed := l.at()
		if at >= rev {
			return nil
		}
		// On the watch's own gRPC stream: clientv3 picks it by metadata.
		if err := l.cli.RequestProgress(metadataOf(l.md, ctx)); err != nil {
			return err
		}
		retry := time.NewTimer(250 * time.Millisecond)
		for waiting := true; waiting; {
			select {
			case <-changed:
				if at, changed = l.at(); at >= rev {
					retry.Stop()
					return nil
				}
			case <-retry.C:
				waiting = false
			case <-ctx.Done():
				retry.Stop()
				return ctx.Err()
			}
		}
	}
}

// metadataOf returns ctx carrying md's outgoing gRPC metadata.
func metadataOf(md, ctx context.Context) context.Context {
	if m, ok := metadata.FromOutgoingContext(md); ok {
		return metadata.NewOutgoingContext(ctx, m)
	}
	return ctx
}

// sync is the loop's read of its own writes: a linearizable read's
// revision, then waitFor it.
func (l *freshLoop) sync(ctx context.Context) error {
	resp, err := l.cli.Get(ctx, l.prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return err
	}
	return l.waitFor(ctx, resp.Header.Revision)
}

// latencies is p50, p99 and max of ds, in milliseconds, under name.
func latencies(name string, ds []time.Duration) result {
	ms := make([]float64, len(ds))
	for i, d := range ds {
		ms[i] = float64(d) / float64(time.Millisecond)
	}
	slices.Sort(ms)
	return result{name + "_p50_ms": quantile(ms, 0.5), name + "_p99_ms": quantile(ms, 0.99), name + "_max_ms": ms[len(ms)-1]}
}

// timeCalls times n calls of f, each after a write elsewhere, whose
// revision it gets.
func timeCalls(ctx context.Context, kv *clientv3.Client, n int, f func(rev int64) error) ([]time.Duration, error) {
	var ds []time.Duration
	for i := range n {
		resp, err := kv.Put(ctx, fmt.Sprintf("bench/fresh/elsewhere/%d", i%10), "x")
		if err != nil {
			return nil, err
		}
		start := time.Now()
		if err := f(resp.Header.Revision); err != nil {
			return nil, err
		}
		ds = append(ds, time.Since(start))
	}
	return ds, nil
}

// runFresh times WaitForRevision and Sync of an idle view and of the loop.
func runFresh(_ []contender, rep int) (map[string]result, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	kv, err := clientv3.New(clientv3.Config{Endpoints: []string{etcdEndpoint}})
	if err != nil {
		return nil, err
	}
	defer kv.Close()
	prefix := fmt.Sprintf("bench/fresh/idle-%d/", rep)
	out := map[string]result{}
	for _, name := range rotate(freshNames, rep) {
		var wait, sync func(int64) error
		var stop func()
		switch name {
		case "loop":
			l, err := startLoop(ctx, kv, prefix)
			if err != nil {
				return nil, err
			}
			wait, sync, stop = func(rev int64) error { return l.waitFor(ctx, rev) }, func(int64) error { return l.sync(ctx) }, l.stop
		case "view":
			v, _, closeView, err := openIdleView(ctx, prefix)
			if err != nil {
				return nil, err
			}
			wait, sync, stop = func(rev int64) error { return v.WaitForRevision(ctx, rev) }, func(int64) error { return v.Sync(ctx) }, closeView
		}
		w, err := timeCalls(ctx, kv, *freshN, wait)
		if err == nil {
			var s []time.Duration
			if s, err = timeCalls(ctx, kv, *freshN, sync); err == nil {
				out[name] = merge(latencies("wait", w), latencies("sync", s))
			}
		}
		stop()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
	}
	return out, nil
}

// openIdleView opens a Stream and a view of prefix on a connection of its
// own, and returns them and what closes them.
func openIdleView(ctx context.Context, prefix string) (*view.View[[]byte], *etcdwatch.Stream, func(), error) {
	conn, err := viewDial(etcdEndpoint)
	if err != nil {
		return nil, nil, nil, err
	}
	s, err := etcdwatch.Open(conn)
	if err != nil {
		conn.Close()
		return nil, nil, nil, err
	}
	v, err := view.New(ctx, s, etcdwatch.Prefix(prefix), view.DecodeBytes)
	if err != nil {
		s.Close()
		conn.Close()
		return nil, nil, nil, err
	}
	return v, s, func() { v.Close(); s.Close(); conn.Close() }, nil
}

// rotate returns names from the rep-th on, so that the order of the
// contenders rotates every repetition.
func rotate(names []string, rep int) []string {
	k := rep % len(names)
	return slices.Concat(names[k:], names[:k])
}

func merge(rs ...result) result {
	m := result{}
	for _, r := range rs {
		for k, v := range r {
			m[k] = v
		}
	}
	return m
}

func freshRatios(med map[string]map[string]float64) {
	fmt.Printf("RATIO fresh wait_p99_ms view=%s (target <= 20) view/loop=%s\n", valueOf(med, "view", "wait_p99_ms"), ratioOf(med, "view", "loop", "wait_p99_ms"))
	fmt.Printf("RATIO fresh sync_p99_ms view/loop=%s (target <= 2)\n", ratioOf(med, "view", "loop", "sync_p99_ms"))
}

// starveBacklog is the revision after which -starve-back revisions were
// written for starve, once per run.
var starveBacklog struct {
	once sync.Once
	from int64
	err  error
}

// writeBacklog writes -starve-back revisions under bench/starve/, one put
// each, from 16 goroutines; the first's revision is where the neighbour
// starts.
func writeBacklog(kv *clientv3.Client) (int64, error) {
	starveBacklog.once.Do(func() {
		ctx := context.Background()
		resp, err := kv.Get(ctx, "bench/starve/", clientv3.WithCountOnly())
		if err != nil {
			starveBacklog.err = err
			return
		}
		starveBacklog.from = resp.Header.Revision + 1
		var wg sync.WaitGroup
		var failed atomic.Pointer[error]
		for g := range 16 {
			wg.Go(func() {
				for i := g; i < *starveBack; i += 16 {
					if _, err := kv.Put(ctx, fmt.Sprintf("bench/starve/%d", i%1000), "x"); err != nil {
						failed.Store(&err)
						return
					}
				}
			})
		}
		wg.Wait()
		if e := failed.Load(); e != nil {
			starveBacklog.err = *e
		}
	})
	return starveBacklog.from, starveBacklog.err
}

// runStarve times Syncs of an idle view while a neighbour catches up from
// -starve-back revisions back: for etcdwatch, a watch on the view's own
// Stream; for the loop, a watch on the same clientv3 gRPC stream
// (loop-shared) or on a stream of its own (loop-own-stream, what
// Kubernetes' watch cache once did). Syncs are timed until -fresh-n are
// done or the neighbour has caught up, whichever comes first; caught
// says which.
func runStarve(_ []contender, rep int) (map[string]result, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	kv, err := clientv3.New(clientv3.Config{Endpoints: []string{etcdEndpoint}})
	if err != nil {
		return nil, err
	}
	defer kv.Close()
	from, err := writeBacklog(kv)
	if err != nil {
		return nil, err
	}
	out := map[string]result{}
	for _, name := range rotate(starveNames, rep) {
		r, err := starveOne(ctx, kv, name, from, fmt.Sprintf("bench/starve-idle-%d-%s/", rep, name))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		out[name] = r
	}
	return out, nil
}

func starveOne(ctx context.Context, kv *clientv3.Client, name string, from int64, prefix string) (result, error) {
	head, err := kv.Get(ctx, "bench/starve/", clientv3.WithCountOnly())
	if err != nil {
		return nil, err
	}
	end := head.Header.Revision
	var sync func() error
	var caughtUp atomic.Bool
	var stop []func()
	defer func() {
		for _, f := range slices.Backward(stop) {
			f()
		}
	}()
	switch name {
	case "loop-shared", "loop-own-stream":
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcdEndpoint}})
		if err != nil {
			return nil, err
		}
		stop = append(stop, func() { cli.Close() })
		lctx := ctx
		if name == "loop-own-stream" {
			lctx = clientv3.WithRequireLeader(ctx) // other metadata: clientv3 opens another gRPC stream
		}
		l, err := startLoop(lctx, cli, prefix)
		if err != nil {
			return nil, err
		}
		stop = append(stop, l.stop)
		nctx, ncancel := context.WithCancel(ctx)
		stop = append(stop, ncancel)
		ch := cli.Watch(nctx, "bench/starve/", clientv3.WithPrefix(), clientv3.WithRev(from))
		go func() { // ends with nctx
			for r := range ch {
				if n := len(r.Events); n > 0 && r.Events[n-1].Kv.ModRevision >= end {
					caughtUp.Store(true)
				}
			}
		}()
		sync = func() error { return l.sync(ctx) }
	case "view":
		v, s, closeView, err := openIdleView(ctx, prefix)
		if err != nil {
			return nil, err
		}
		stop = append(stop, closeView)
		w, err := s.Watch(ctx, etcdwatch.Prefix("bench/starve/").FromRevision(from))
		if err != nil {
			return nil, err
		}
		stop = append(stop, w.Cancel)
		go func() { // ends when the watch is canceled
			for r := range w.Responses() {
				if r.Revision >= end {
					caughtUp.Store(true)
				}
			}
		}()
		sync = func() error { return v.Sync(ctx) }
	}
	var ds []time.Duration
	for i := 0; i < *freshN && !caughtUp.Load(); i++ {
		if _, err := kv.Put(ctx, "bench/starve-elsewhere", "x"); err != nil { // outside every idle prefix
			return nil, err
		}
		start := time.Now()
		if err := sync(); err != nil {
			return nil, err
		}
		ds = append(ds, time.Since(start))
	}
	if len(ds) == 0 {
		return nil, errors.New("the neighbour caught up before the first Sync")
	}
	r := latencies("sync", ds)
	r["syncs"] = float64(len(ds))
	r["during_catch_up"] = 0
	if !caughtUp.Load() {
		r["during_catch_up"] = 1
	}
	return r, nil
}

func starveRatios(med map[string]map[string]float64) {
	fmt.Printf("RATIO starve sync_p99_ms view=%s (target <= 20) loop-own-stream=%s loop-shared=%s\n",
		valueOf(med, "view", "sync_p99_ms"), valueOf(med, "loop-own-stream", "sync_p99_ms"), valueOf(med, "loop-shared", "sync_p99_ms"))
}

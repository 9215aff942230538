package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/etcdwatch/etcdwatch"
	"github.com/etcdwatch/etcdwatch/clientv3watch"
)

// spec is one watch to open: a key or a prefix.
type spec struct {
	key    string
	prefix bool
}

// sink receives a watch's events: how many, the last one's revision and
// value. It is called from any goroutine, never concurrently for one watch.
// A nil sink leaves the watches idle, with no consumer.
type sink func(watch, events int, rev int64, value []byte)

// contender is a watch client under test. watch opens every spec on one
// stream over conn and returns once the server has confirmed them all.
type contender interface {
	name() string
	watch(ctx context.Context, conn *grpc.ClientConn, specs []spec, out sink) (stop func(), err error)
}

// etcdwatchClient is this repository's client: a goroutine of the
// application's reading each watch's channel, or (handler) one Handler
// for all of them.
type etcdwatchClient struct {
	opts    []etcdwatch.Option
	handler bool
}

func (c etcdwatchClient) name() string {
	if c.handler {
		return "etcdwatch-handler"
	}
	return "etcdwatch"
}

func (c etcdwatchClient) watch(ctx context.Context, conn *grpc.ClientConn, specs []spec, out sink) (func(), error) {
	s, err := etcdwatch.Open(conn, c.opts...)
	if err != nil {
		return nil, err
	}
	var hd *etcdwatch.Handler
	if c.handler {
		if out != nil && *callers > 0 {
			return nil, fmt.Errorf("etcdwatch-handler: -callers opens one Handle call per watch, whose function cannot tell the watches apart: idle watches only")
		}
		hd = newHandler(out)
	}
	watches, err := openAll(ctx, s, specs, hd)
	if err != nil {
		s.Close()
		return nil, err
	}
	var wg sync.WaitGroup
	for i, w := range watches {
		if out == nil || hd != nil {
			break // idle watches: no consumers; or the Handler's
		}
		wg.Go(func() { // the application's consumer; ends when the Stream closes
			for r := range w.Responses() {
				if n := len(r.Events); n > 0 {
					out(i, n, r.Events[n-1].ModRevision, r.Events[n-1].Value)
				}
			}
		})
	}
	return func() {
		if *verbose {
			st := s.Stats()
			fmt.Printf("# etcdwatch: %d responses, %d stalls, %d pauses, %d reconnects\n", st.Responses, st.Stalls, st.Pauses, st.Reconnects)
		}
		s.Close()
		wg.Wait()
		if hd != nil {
			hd.Wait()
		}
	}, nil
}

// newHandler returns a Handler passing each watch's events to out, the
// watch known by its request's index. Idle watches (out nil) get one that
// is never called.
func newHandler(out sink) *etcdwatch.Handler {
	return etcdwatch.NewHandler(func(_ *etcdwatch.Watch, i int, r etcdwatch.Response) {
		if n := len(r.Events); n > 0 && out != nil {
			out(i, n, r.Events[n-1].ModRevision, r.Events[n-1].Value)
		}
	})
}

// clientv3Client is the official client with its default settings: every
// watch of a Watcher on one stream.
type clientv3Client struct {
	// endpoints, when set, make it a clientv3.New client of its own, as an
	// application would have; otherwise its Watcher runs on the shared conn.
	endpoints []string
	// requireLeader opens the watches under clientv3.WithRequireLeader.
	requireLeader bool
	// rewatch, when set, makes the application watch again, from the
	// revision after the last event it got, each time a watch's channel
	// closes (clientv3 closes it after a canceled response, for instance
	// ErrNoLeader), waiting rewatch before each attempt.
	rewatch time.Duration
}

func (clientv3Client) name() string { return "clientv3" }

func (c clientv3Client) watch(ctx context.Context, conn *grpc.ClientConn, specs []spec, out sink) (func(), error) {
	var (
		w       clientv3.Watcher
		closeFn func()
	)
	if len(c.endpoints) > 0 {
		cli, err := clientv3.New(clientv3.Config{Endpoints: c.endpoints})
		if err != nil {
			return nil, err
		}
		w, closeFn = cli.Watcher, func() { cli.Close() }
	} else {
		w = clientv3.NewWatchFromWatchClient(pb.NewWatchClient(conn), clientv3.NewCtxClient(context.Background()))
		closeFn = func() { w.Close() }
	}
	return c.watchOn(ctx, w, closeFn, specs, out)
}

// watchOn is the application's code on a clientv3.Watcher: one Watch call
// after another, each waiting for its created notification.
func (c clientv3Client) watchOn(ctx context.Context, w clientv3.Watcher, closeFn func(), specs []spec, out sink) (func(), error) {
	// One context, so one stream: clientv3 shares a stream among watches
	// whose contexts carry the same metadata.
	wctx, cancel := context.WithCancel(context.Background())
	if c.requireLeader {
		wctx = clientv3.WithRequireLeader(wctx)
	}
	open := func(s spec, rev int64) clientv3.WatchChan {
		opts := []clientv3.OpOption{clientv3.WithCreatedNotify(), clientv3.WithRev(rev)}
		if s.prefix {
			opts = append(opts, clientv3.WithPrefix())
		}
		return w.Watch(wctx, s.key, opts...)
	}
	chans := make([]clientv3.WatchChan, len(specs))
	for i, s := range specs {
		chans[i] = open(s, 0)
	}
	next := make([]int64, len(specs)) // per watch: where a re-watch starts
	for i, ch := range chans {        // the created notification comes first
		select {
		case r, ok := <-ch:
			if !ok || !r.Created {
				cancel()
				closeFn()
				return nil, fmt.Errorf("clientv3 watch %d not created: %v", i, r.Err())
			}
			// etcd reads this header after registering the watch, so a
			// write racing the create may sit exactly there.
			next[i] = r.Header.Revision
		case <-ctx.Done():
			cancel()
			closeFn()
			return nil, ctx.Err()
		}
	}
	var (
		wg        sync.WaitGroup
		rewatches atomic.Int64
	)
	for i, ch := range chans {
		if out == nil {
			break
		}
		wg.Go(func() {
			for {
				for r := range ch {
					if n := len(r.Events); n > 0 {
						e := r.Events[n-1]
						next[i] = e.Kv.ModRevision + 1
						out(i, n, e.Kv.ModRevision, e.Kv.Value)
					}
				}
				if c.rewatch == 0 || !sleepCtx(wctx, c.rewatch) {
					return
				}
				rewatches.Add(1)
				ch = open(specs[i], next[i])
			}
		})
	}
	return func() {
		if out == nil { // clientv3 blocks closing watches whose channels nobody reads
			for _, ch := range chans {
				wg.Go(func() {
					for range ch {
					}
				})
			}
		}
		closeFn() // before cancel: clientv3 can hang closing watches whose shared context ended
		cancel()
		wg.Wait()
		if *verbose && c.rewatch > 0 {
			fmt.Printf("# clientv3: %d re-watches\n", rewatches.Load())
		}
	}, nil
}

// clientv3watchClient is clientv3's application code, unchanged, on the
// drop-in Watcher: what the one-line switch buys a clientv3 program.
type clientv3watchClient struct {
	opts []etcdwatch.Option
	// requireLeader and rewatch are clientv3Client's, for the same
	// application code.
	requireLeader bool
	rewatch       time.Duration
}

func (clientv3watchClient) name() string { return "clientv3watch" }

func (c clientv3watchClient) watch(ctx context.Context, conn *grpc.ClientConn, specs []spec, out sink) (func(), error) {
	w := clientv3watch.NewFromConn(conn, c.opts...)
	app := clientv3Client{requireLeader: c.requireLeader, rewatch: c.rewatch}
	return app.watchOn(ctx, w, func() { w.Close() }, specs, out)
}

// sleepCtx waits d and reports true, or false if ctx ends first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// openAll opens a watch for each spec: by one WatchAll, or with -callers
// goroutines calling Watch.
func openAll(ctx context.Context, s *etcdwatch.Stream, specs []spec, hd *etcdwatch.Handler) ([]*etcdwatch.Watch, error) {
	rs := make([]etcdwatch.Request, len(specs))
	for i, sp := range specs {
		rs[i] = etcdwatch.Key(sp.key)
		if sp.prefix {
			rs[i] = etcdwatch.Prefix(sp.key)
		}
	}
	if *callers == 0 && hd != nil {
		return s.Handle(ctx, hd, rs...)
	}
	if *callers == 0 {
		return s.WatchAll(ctx, rs...)
	}
	watches := make([]*etcdwatch.Watch, len(specs))
	err := parallel(len(specs), func(i int) error {
		var w *etcdwatch.Watch
		var err error
		if hd != nil { // a Handle call per watch, for idle watches: its function is told index 0
			var ws []*etcdwatch.Watch
			if ws, err = s.Handle(ctx, hd, rs[i]); err == nil {
				w = ws[0]
			}
		} else {
			w, err = s.Watch(ctx, rs[i])
		}
		watches[i] = w
		return err
	})
	return watches, err
}

// parallel runs f(0..n-1) on -callers goroutines and returns the first
// error. The goroutines take indices from a shared counter, so that handing
// them out costs no channel operation of its own.
func parallel(n int, f func(i int) error) error {
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
		next  atomic.Int64
	)
	for range min(n, *callers) {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				if err := f(i); err != nil {
					once.Do(func() { first = err })
				}
			}
		})
	}
	wg.Wait()
	return first
}

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/etcdwatch/etcdwatch/etcdwatchtest"
)

var (
	cutsN        = flag.Int("cuts", 10, "cuts: connection cuts in a series")
	cutsEvery    = flag.Duration("cuts-every", 400*time.Millisecond, "cuts: mean time between cuts (each gap drawn from ±1/8 of it)")
	cutsDelay    = flag.Duration("cuts-delay", 2*time.Millisecond, "cuts: delay the proxy adds each way")
	cutsWatches  = flag.Int("cuts-watches", 1, "cuts: watches on the written prefix")
	cutsPutEvery = flag.Duration("cuts-put-every", time.Millisecond, "cuts: the writer's interval between puts")
)

// runCuts runs every contender through the same series of cuts at once:
// each watches the prefix through a fault proxy of its own, which adds
// -cuts-delay each way, and -cuts times, about -cuts-every apart, every
// proxy closes both sides of every connection, one right after another (in
// an order that rotates). A writer puts to the prefix every -cuts-put-every,
// straight to etcd, not through a proxy.
//
// The contenders go together because a watch re-created from a past
// revision catches up through etcd's unsynced-watcher loop, which runs every
// 100 ms: a resume includes up to that much, depending on where the cut
// falls in that period. Cut together, the contenders meet the same period
// at the same phase, so that what differs between them is their own doing;
// and the gaps between cuts vary, so that a series meets every phase.
//
// A cut's resume is the time from the cut to when every watch of a
// contender has got the first event committed after it. "Committed after
// the cut" is judged from the writer's side, which writes one put at a time:
// R is the revision of the last put that was sent before the cut (whether it
// was acknowledged before or after), and the first new event is revision
// R+1, which could only be committed after the cut. When resumes take
// longer than -cuts-every, a cut's resume ends after the next cut; each is
// still timed from its own cut.
func runCuts(cs []contender, rep int) (map[string]result, error) {
	kv, err := clientv3.New(clientv3.Config{Endpoints: []string{etcdEndpoint}})
	if err != nil {
		return nil, err
	}
	defer kv.Close()
	prefix := fmt.Sprintf("bench/cuts/%d/", rep)
	ctx, cancel := timeout()
	defer cancel()
	series := *cutsEvery * time.Duration(*cutsN)
	watchers := make([]*cutWatcher, len(cs))
	for i, c := range cs {
		cw, err := startCutWatcher(ctx, c, prefix, int(series / *cutsPutEvery)+100)
		if err != nil {
			return nil, err
		}
		defer cw.close()
		watchers[i] = cw
	}
	w := startWriter(ctx, kv, prefix, *cutsPutEvery)
	defer w.stop()
	flowing, err := w.lastSentBefore(time.Now())
	if err != nil {
		return nil, err
	}
	for _, cw := range watchers {
		if _, err := cw.log.wait(flowing, time.Minute); err != nil {
			return nil, fmt.Errorf("%s, before the cuts: %w", cw.name, err)
		}
	}
	cuts := make([]time.Time, *cutsN)
	next := time.Now()
	for i := range cuts {
		time.Sleep(time.Until(next))
		cuts[i] = time.Now()
		for k := range watchers {
			watchers[(k+i)%len(watchers)].proxy.Cut()
		}
		next = next.Add(cutGap(*cutsEvery))
	}
	results := map[string]result{}
	for _, cw := range watchers {
		r, err := cw.resumes(w, cuts)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", cw.name, err)
		}
		results[cw.name] = r
	}
	return results, w.stop()
}

// cutWatcher is one contender's watches in a cut series, behind a proxy of
// their own.
type cutWatcher struct {
	name  string
	proxy *etcdwatchtest.Proxy
	conn  *grpc.ClientConn
	log   *deliveryLog
	stop  func()
}

func startCutWatcher(ctx context.Context, c contender, prefix string, capacity int) (*cutWatcher, error) {
	proxy, err := etcdwatchtest.ListenProxy(etcdEndpoint)
	if err != nil {
		return nil, err
	}
	proxy.SetDelay(*cutsDelay)
	conn, err := plainConn(proxy.Addr())
	if err != nil {
		proxy.Close()
		return nil, err
	}
	cw := &cutWatcher{name: c.name(), proxy: proxy, conn: conn, log: newDeliveryLog(*cutsWatches, capacity)}
	cw.stop, err = withEndpoint(c, proxy.Addr()).watch(ctx, conn, repeat(*cutsWatches, spec{key: prefix, prefix: true}), cw.log.sink)
	if err != nil {
		conn.Close()
		proxy.Close()
		return nil, err
	}
	return cw, nil
}

// resumes returns the median and the highest resume over cuts.
func (cw *cutWatcher) resumes(w *writer, cuts []time.Time) (result, error) {
	resumes := make([]float64, len(cuts))
	for i, at := range cuts {
		r, err := w.lastSentBefore(at)
		if err != nil {
			return nil, err
		}
		got, err := cw.log.wait(r+1, time.Minute)
		if err != nil {
			return nil, fmt.Errorf("after cut %d: %w", i, err)
		}
		resumes[i] = ms(got.Sub(at))
	}
	slices.Sort(resumes)
	return result{"p50_ms": quantile(resumes, 0.5), "max_ms": resumes[len(resumes)-1]}, nil
}

func (cw *cutWatcher) close() {
	cw.stop()
	cw.conn.Close()
	cw.proxy.Close()
}

// cutGap returns a gap between cuts: uniform within ±1/8 of every. Cuts at a
// fixed interval that is a multiple of etcd's 100 ms sync period would all
// fall at one phase of it, and a series would measure one resume ten times.
func cutGap(every time.Duration) time.Duration {
	return every - every/8 + rand.N(every/4+1)
}

// writer puts to a prefix at an interval, one put at a time, and records
// when it sent each put and the revision etcd gave it.
type writer struct {
	mu     sync.Mutex
	sent   []time.Time // of the acknowledged puts, in order
	revs   []int64
	err    error
	done   chan struct{} // closed by stop
	exited chan struct{} // closed when the goroutine returns
	once   sync.Once
}

// startWriter starts the writer's goroutine, which returns when stop is
// called or a put fails.
func startWriter(ctx context.Context, kv *clientv3.Client, prefix string, every time.Duration) *writer {
	w := &writer{done: make(chan struct{}), exited: make(chan struct{})}
	go func() {
		defer close(w.exited)
		t := time.NewTicker(every)
		defer t.Stop()
		for i := 0; ; i++ {
			sent := time.Now()
			resp, err := kv.Put(ctx, fmt.Sprintf("%sk%d", prefix, i%100), "v")
			w.mu.Lock()
			if w.err = err; err == nil {
				w.sent, w.revs = append(w.sent, sent), append(w.revs, resp.Header.Revision)
			}
			w.mu.Unlock()
			if err != nil {
				return
			}
			select {
			case <-w.done:
				return
			case <-t.C:
			}
		}
	}()
	return w
}

// lastSentBefore returns the revision of the last put sent before t (0 if
// none was). It waits until a put sent after t is acknowledged: puts go
// one at a time, so every put sent before t has been acknowledged by then.
func (w *writer) lastSentBefore(t time.Time) (int64, error) {
	for {
		w.mu.Lock()
		if err := w.err; err != nil {
			w.mu.Unlock()
			return 0, err
		}
		if n := len(w.sent); n > 0 && w.sent[n-1].After(t) {
			k, _ := slices.BinarySearchFunc(w.sent, t, time.Time.Compare)
			var rev int64
			if k > 0 {
				rev = w.revs[k-1]
			}
			w.mu.Unlock()
			return rev, nil
		}
		w.mu.Unlock()
		select {
		case <-w.exited:
			return 0, errors.New("writer stopped")
		case <-time.After(time.Millisecond):
		}
	}
}

// stop ends the writer and returns its error, if a put failed.
func (w *writer) stop() error {
	w.once.Do(func() { close(w.done) })
	<-w.exited
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

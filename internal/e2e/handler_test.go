package e2e

import (
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdwatch/etcdwatch"
)

// handled is what a Handler's calls recorded for each watch, by its
// request's index.
type handled struct {
	mu      sync.Mutex
	values  [][]int // each watch's event values, in the order handed over
	revs    [][]int64
	calling []bool
	broken  []string      // two calls at once for one watch
	ended   []error       // what Ended was told, in order
	changed chan struct{} // closed and replaced at each call
}

func newHandled(n int) *handled {
	return &handled{values: make([][]int, n), revs: make([][]int64, n), calling: make([]bool, n),
		changed: make(chan struct{})}
}

func (h *handled) update(f func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	f()
	close(h.changed)
	h.changed = make(chan struct{})
}

// await waits until cond holds, checked under h's lock at each call.
func (h *handled) await(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.After(2 * wait)
	for {
		h.mu.Lock()
		ok, changed := cond(), h.changed
		h.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("not in time: %s", what)
		}
	}
}

// TestHandlerOnARealServer: 300 watches consumed by one Handler with two
// goroutines get every event of their prefix, in order, one call at a time
// each; the first watch's calls block until all the others have every
// event, so that it falls behind its buffer limit and is paused on the
// server, and once they return it resumes from its own revision and has
// every event too. Close tells the Handler of each end.
func TestHandlerOnARealServer(t *testing.T) {
	leakCheck(t)
	const watches, rounds = 300, 10
	s, kv, ctx := open(t, etcdwatch.WithBufferLimit(3)), client(t), ctx(t)
	rec := newHandled(watches)
	gate := make(chan struct{})
	hd := etcdwatch.NewHandler(func(w *etcdwatch.Watch, i int, r etcdwatch.Response) {
		if i == 0 {
			<-gate
		}
		rec.update(func() {
			if rec.calling[i] {
				rec.broken = append(rec.broken, fmt.Sprintf("two calls at once for watch %d", i))
			}
			rec.calling[i] = true
		})
		rec.update(func() {
			for _, e := range r.Events {
				v, err := strconv.Atoi(string(e.Value))
				if err != nil || string(e.Key) != fmt.Sprintf("handler/%03d/k", i) {
					rec.broken = append(rec.broken, fmt.Sprintf("watch %d got %s=%s", i, e.Key, e.Value))
				}
				rec.values[i] = append(rec.values[i], v)
				rec.revs[i] = append(rec.revs[i], e.ModRevision)
			}
			rec.calling[i] = false
		})
	}, etcdwatch.WithGoroutines(2), etcdwatch.WithEnded(func(_ *etcdwatch.Watch, err error) {
		rec.update(func() { rec.ended = append(rec.ended, err) })
	}))
	rs := make([]etcdwatch.Request, watches)
	for i := range rs {
		rs[i] = etcdwatch.Prefix(fmt.Sprintf("handler/%03d/", i))
	}
	ws, err := s.Handle(ctx, hd, rs...)
	require.NoError(t, err)
	require.Len(t, ws, watches)

	for r := range rounds {
		for from := 0; from < watches; from += 100 {
			var ops []clientv3.Op
			for i := from; i < min(from+100, watches); i++ {
				ops = append(ops, clientv3.OpPut(fmt.Sprintf("handler/%03d/k", i), strconv.Itoa(r)))
			}
			_, err := kv.Txn(ctx).Then(ops...).Commit()
			require.NoError(t, err)
		}
	}
	want := make([]int, rounds)
	for r := range want {
		want[r] = r
	}
	rec.await(t, func() bool {
		for i := 1; i < watches; i++ {
			if len(rec.values[i]) < rounds {
				return false
			}
		}
		return true
	}, "every watch but the first has every event")
	require.Positive(t, s.Stats().Pauses, "the first watch, blocked, was paused on the server")
	close(gate)
	rec.await(t, func() bool { return len(rec.values[0]) >= rounds }, "the first watch caught up")
	rec.mu.Lock()
	for i := range watches {
		require.Equal(t, want, rec.values[i], "watch %d: every event, in order, once", i)
		require.IsIncreasing(t, rec.revs[i])
	}
	require.Empty(t, rec.broken)
	rec.mu.Unlock()

	require.NoError(t, s.Close())
	hd.Wait()
	require.Len(t, rec.ended, watches, "Ended once for each watch")
	for _, err := range rec.ended {
		require.ErrorIs(t, err, etcdwatch.ErrClosed)
	}
}

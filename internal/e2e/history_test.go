package e2e

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdwatch/etcdwatch"
)

// truthEvent is one change the writer committed. Only the writer writes
// under its prefix, so the history it records is exact.
type truthEvent struct {
	rev   int64
	typ   etcdwatch.EventType
	key   string
	value string
	prev  *string // value before the change; nil if the key did not exist
}

// writer commits random transactions of puts and deletes under a prefix and
// records every committed change with its revision. A transaction whose
// outcome is unknown (the connection failed under it) is resolved by reading
// the sequence key every transaction writes last.
type writer struct {
	t      *testing.T
	kv     *clientv3.Client
	prefix string
	keys   int

	stop     chan struct{}
	stopOnce sync.Once
	done     chan struct{}

	mu     sync.Mutex
	events []truthEvent      // in revision order, then operation order
	last   int64             // highest committed revision
	model  map[string]string // the keys' current values
	txns   int
}

func startWriter(t *testing.T, kv *clientv3.Client, prefix string, keys int) *writer {
	w := &writer{t: t, kv: kv, prefix: prefix, keys: keys, stop: make(chan struct{}), done: make(chan struct{}), model: map[string]string{}}
	t.Cleanup(func() { w.Stop() }) // if the test ends early
	go func() {                    // exits when stop is closed; Stop waits on done
		defer close(w.done)
		for seq := 1; ; seq++ {
			select {
			case <-w.stop:
				return
			default:
			}
			if !w.commit(seq) {
				return
			}
		}
	}()
	return w
}

// Stop stops the writer and returns the last committed revision. It may be
// called more than once.
func (w *writer) Stop() int64 {
	w.stopOnce.Do(func() { close(w.stop) })
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.last
}

// Last returns the last committed revision so far.
func (w *writer) Last() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.last
}

type plannedOp struct {
	del        bool
	key, value string
}

func (w *writer) plan(seq int) []plannedOp {
	n := 1 + rand.IntN(3)
	var ops []plannedOp
	for _, k := range rand.Perm(w.keys)[:n] {
		key := fmt.Sprintf("%sk%02d", w.prefix, k)
		w.mu.Lock()
		_, exists := w.model[key]
		w.mu.Unlock()
		if exists && rand.IntN(4) == 0 {
			ops = append(ops, plannedOp{del: true, key: key})
		} else {
			ops = append(ops, plannedOp{key: key, value: fmt.Sprintf("v%d.%d", seq, k)})
		}
	}
	return append(ops, plannedOp{key: w.prefix + "seq", value: strconv.Itoa(seq)})
}

// commit writes transaction seq until it is known to be committed. It
// returns false when the writer is stopped first.
func (w *writer) commit(seq int) bool {
	ops := w.plan(seq)
	var txn []clientv3.Op
	for _, op := range ops {
		if op.del {
			txn = append(txn, clientv3.OpDelete(op.key))
		} else {
			txn = append(txn, clientv3.OpPut(op.key, op.value))
		}
	}
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		resp, err := w.kv.Txn(ctx).Then(txn...).Commit()
		cancel()
		if err == nil {
			w.record(resp.Header.Revision, ops)
			return true
		}
		rev, committed, ok := w.resolve(seq)
		if !ok {
			return false
		}
		if committed {
			w.record(rev, ops)
			return true
		}
	}
}

// resolve finds out whether transaction seq committed, retrying the read
// until it succeeds or the writer is stopped.
func (w *writer) resolve(seq int) (rev int64, committed, ok bool) {
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		resp, err := w.kv.Get(ctx, w.prefix+"seq")
		cancel()
		if err == nil {
			if len(resp.Kvs) == 1 && string(resp.Kvs[0].Value) == strconv.Itoa(seq) {
				return resp.Kvs[0].ModRevision, true, true
			}
			return 0, false, true
		}
		select {
		case <-w.stop:
			return 0, false, false
		case <-time.After(50 * time.Millisecond): // pacing retries against a member that is down
		}
	}
}

func (w *writer) record(rev int64, ops []plannedOp) {
	w.mu.Lock()
	defer w.mu.Unlock()
	assert.Greater(w.t, rev, w.last, "revisions must grow") // not require: this is the writer's goroutine
	for _, op := range ops {
		e := truthEvent{rev: rev, key: op.key, value: op.value, typ: etcdwatch.Put}
		if prev, ok := w.model[op.key]; ok {
			e.prev = &prev
		}
		if op.del {
			e.typ, e.value = etcdwatch.Delete, ""
			delete(w.model, op.key)
		} else {
			w.model[op.key] = op.value
		}
		w.events = append(w.events, e)
	}
	w.last = rev
	w.txns++
}

// lastMatching returns the revision of the last change up to upTo that r's
// watch must deliver, or 0 if there is none.
func (w *writer) lastMatching(r *recording, upTo int64) int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := len(w.events) - 1; i >= 0; i-- {
		e := w.events[i]
		if e.rev <= upTo && e.rev >= r.start && matches(r.w.Request(), e) {
			return e.rev
		}
	}
	return 0
}

// recording is what one watch delivered over its whole life.
type recording struct {
	w     *etcdwatch.Watch
	start int64 // the first revision the watch asked for

	mu    sync.Mutex
	resps []etcdwatch.Response
	last  int64 // highest Response.Revision seen
	done  chan struct{}
}

// record reads w until its channel closes.
func record(w *etcdwatch.Watch, start int64) *recording { return recordSlowly(w, start, 0) }

// recordSlowly is record with a consumer that, every other second, takes
// pause per event: it falls behind, then catches up. (Per event, not per
// response: responses waiting for a consumer that is behind are joined.
// And the clock is read per event: a replay of thousands of events, which
// can come in one response, must not make a slow second last for minutes.)
func recordSlowly(w *etcdwatch.Watch, start int64, pause time.Duration) *recording {
	r := &recording{w: w, start: start, done: make(chan struct{})}
	go func() { // exits when the watch ends; Cancel ends it
		defer close(r.done)
		for resp := range w.Responses() {
			for range resp.Events {
				if pause > 0 && time.Now().Unix()%2 == 0 {
					time.Sleep(pause) // a slow consumer, on purpose
				}
			}
			r.mu.Lock()
			r.resps = append(r.resps, resp)
			r.last = max(r.last, resp.Revision)
			r.mu.Unlock()
		}
	}()
	return r
}

// Last returns the highest revision the watch has delivered.
func (r *recording) Last() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last
}

// events returns how many events the watch has delivered.
func (r *recording) events() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, resp := range r.resps {
		n += len(resp.Events)
	}
	return n
}

// matches reports whether the watch's request selects e.
func matches(req etcdwatch.Request, e truthEvent) bool {
	k := []byte(e.key)
	switch {
	case req.NoPut && e.typ == etcdwatch.Put, req.NoDelete && e.typ == etcdwatch.Delete:
		return false
	case req.End == nil:
		return bytes.Equal(k, req.Key)
	case len(req.End) == 1 && req.End[0] == 0:
		return bytes.Compare(k, req.Key) >= 0
	default:
		return bytes.Compare(k, req.Key) >= 0 && bytes.Compare(k, req.End) < 0
	}
}

// check verifies what etcd's robustness tests verify of a watch, against the
// writer's history up to upTo: ordered, unique, reliable (exactly the
// matching events from its start revision), atomic (no revision split over
// two responses), bookmarkable (a bookmark R comes after every event <= R),
// filters and PrevKV right. It returns how many events it checked.
func (w *writer) check(t *testing.T, r *recording, upTo int64) int {
	t.Helper()
	<-r.done
	w.mu.Lock()
	var want []truthEvent
	perRev := map[int64]int{}
	for _, e := range w.events {
		if e.rev >= r.start && e.rev <= upTo && matches(r.w.Request(), e) {
			want = append(want, e)
			perRev[e.rev]++
		}
	}
	w.mu.Unlock()
	req := r.w.Request()
	got := 0
	for i, resp := range r.resps {
		if resp.IsProgress() {
			delivered := got
			expected := len(slices.DeleteFunc(slices.Clone(want), func(e truthEvent) bool { return e.rev > resp.Revision }))
			require.Equal(t, expected, delivered, "%s: bookmark %d came before every event up to it", req, resp.Revision)
			continue
		}
		inResp := map[int64]int{}
		for _, e := range resp.Events {
			require.Less(t, got, len(want), "%s: event beyond the history: %s@%d", req, e.Key, e.ModRevision)
			x := want[got]
			desc := fmt.Sprintf("%s: event %d (response %d)", req, got, i)
			require.Equal(t, x.rev, e.ModRevision, desc+": revision (lost, repeated or reordered)")
			require.Equal(t, x.key, string(e.Key), desc)
			require.Equal(t, x.typ, e.Type, desc)
			require.Equal(t, x.value, string(e.Value), desc)
			if req.PrevKV {
				if x.prev == nil {
					require.Nil(t, e.PrevKV, desc+": PrevKV of a new key")
				} else {
					require.NotNil(t, e.PrevKV, desc+": PrevKV missing")
					require.Equal(t, *x.prev, string(e.PrevKV.Value), desc+": PrevKV")
				}
			}
			inResp[e.ModRevision]++
			got++
		}
		for rev, n := range inResp {
			require.Equal(t, perRev[rev], n, "%s: revision %d split across responses", req, rev)
		}
	}
	require.Equal(t, len(want), got, "%s: lost events at the end", req)
	return got
}

// waitDelivered waits until every recording has delivered up to rev.
// On failure it says where each watch short of rev was when the wait began
// and where it is, to tell a stuck watch from a slow consumer.
func waitDelivered(t *testing.T, rev int64, recs ...*recording) {
	t.Helper()
	from := make([]int64, len(recs))
	for i, r := range recs {
		from[i] = r.Last()
	}
	reached := func() bool {
		for _, r := range recs {
			if r.Last() < rev {
				return false
			}
		}
		return true
	}
	if assert.Eventually(t, reached, wait, time.Millisecond, "watches did not reach revision %d", rev) {
		return
	}
	for i, r := range recs {
		if r.Last() < rev {
			t.Logf("watch %s (id %d): at %d when the wait began, %d now", r.w.Request(), r.w.ID(), from[i], r.Last())
		}
	}
	t.FailNow()
}

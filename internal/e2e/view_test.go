package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdwatch/etcdwatch"
	"github.com/etcdwatch/etcdwatch/etcdwatchtest"
	"github.com/etcdwatch/etcdwatch/view"
)

// testView is a View with what a test needs to check it against the server:
// its range and its decode function.
type testView[T any] struct {
	*view.View[T]
	r      etcdwatch.Request
	decode view.Decoder[T]
}

// newView starts a view, closed when the test ends.
func newView[T any](t *testing.T, s *etcdwatch.Stream, r etcdwatch.Request, decode view.Decoder[T], opts ...view.Option) *testView[T] {
	t.Helper()
	v, err := view.New(ctx(t), s, r, decode, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { v.Close() })
	return &testView[T]{View: v, r: r, decode: decode}
}

// share returns another View of v's state (View.Share), closed when the
// test ends.
func (v *testView[T]) share(t *testing.T) *testView[T] {
	u := v.View.Share()
	t.Cleanup(func() { u.Close() })
	return &testView[T]{View: u, r: v.r, decode: v.decode}
}

// getRange reads r's range at rev (0: the newest), linearizably, in key order.
func getRange(c context.Context, kv *clientv3.Client, r etcdwatch.Request, rev int64) (*clientv3.GetResponse, error) {
	opts := []clientv3.OpOption{clientv3.WithRev(rev)}
	if r.End != nil {
		opts = append(opts, clientv3.WithRange(string(r.End)))
	}
	return kv.Get(c, string(r.Key), opts...)
}

// requireEqualsServer requires snap, a state of v, to hold exactly what a Get
// of v's range at snap's revision returns: every key with its value (as v
// decodes it, or a decode error where v has one), CreateRevision,
// ModRevision, Version and Lease, and no other key. If that revision has been
// compacted it syncs v and compares v's newer state instead; a read that
// fails otherwise (a member restarting under the soak) is tried again. It
// returns the state it compared.
func requireEqualsServer[T any](t *testing.T, kv *clientv3.Client, v *testView[T], snap *view.Snapshot[T]) *view.Snapshot[T] {
	t.Helper()
	for failures := 0; ; {
		c, cancel := context.WithTimeout(context.Background(), wait)
		resp, err := getRange(c, kv, v.r, snap.Revision())
		cancel()
		switch {
		case errors.Is(err, rpctypes.ErrCompacted):
			require.NoError(t, v.Sync(ctx(t)))
			newer := v.Snapshot()
			require.Greater(t, newer.Revision(), snap.Revision(), "revision %d is compacted, yet the synced view is still there", snap.Revision())
			snap = newer
			continue
		case err != nil:
			failures++
			require.Less(t, failures, 50, "reading %s at %d: %v", v.r, snap.Revision(), err)
			time.Sleep(100 * time.Millisecond) // pacing retries of a failed read, not synchronisation
			continue
		}
		diffs := snapshotDiff(snap, resp.Kvs, v.decode)
		require.Empty(t, diffs, "view of %s at revision %d differs from the server's state at that revision", v.r, snap.Revision())
		require.Equal(t, resp.Count, int64(snap.Len()), "keys of %s at %d", v.r, snap.Revision())
		return snap
	}
}

// snapshotDiff returns (up to 10 of) the differences between snap and kvs,
// the server's state of its range in key order.
func snapshotDiff[T any](snap *view.Snapshot[T], kvs []*mvccpb.KeyValue, decode view.Decoder[T]) []string {
	var diffs []string
	note := func(format string, args ...any) {
		if len(diffs) < 10 {
			diffs = append(diffs, fmt.Sprintf(format, args...))
		}
	}
	i := 0
	for k, e := range snap.All() {
		for i < len(kvs) && string(kvs[i].Key) < k {
			note("%q: on the server, not in the view", kvs[i].Key)
			i++
		}
		if i < len(kvs) && string(kvs[i].Key) == k {
			if d := entryDiff(e, kvs[i], decode); d != "" {
				note("%s", d)
			}
			i++
			continue
		}
		note("%q: in the view, not on the server", k)
	}
	for ; i < len(kvs); i++ {
		note("%q: on the server, not in the view", kvs[i].Key)
	}
	return diffs
}

// entryDiff says how e differs from kv as decode makes it; "" if it does not.
func entryDiff[T any](e view.Entry[T], kv *mvccpb.KeyValue, decode view.Decoder[T]) string {
	want, err := decode(kv.Key, slices.Clone(kv.Value))
	if err != nil {
		var zero T
		want = zero
	}
	switch {
	case e.Key != string(kv.Key):
		return fmt.Sprintf("%q: entry named %q", kv.Key, e.Key)
	case e.CreateRevision != kv.CreateRevision || e.ModRevision != kv.ModRevision || e.Version != kv.Version || e.Lease != kv.Lease:
		return fmt.Sprintf("%q: create %d mod %d version %d lease %x; server: create %d mod %d version %d lease %x",
			kv.Key, e.CreateRevision, e.ModRevision, e.Version, e.Lease, kv.CreateRevision, kv.ModRevision, kv.Version, kv.Lease)
	case (e.Err != nil) != (err != nil):
		return fmt.Sprintf("%q: decode error %v; the server's value gives %v", kv.Key, e.Err, err)
	case !sameValue(e.Value, want):
		return fmt.Sprintf("%q: value %v; server %v", kv.Key, e.Value, want)
	}
	return ""
}

func sameValue[T any](a, b T) bool {
	if x, ok := any(a).([]byte); ok {
		return bytes.Equal(x, any(b).([]byte))
	}
	return reflect.DeepEqual(a, b)
}

func sameEntry[T any](a, b view.Entry[T]) bool {
	return a.Key == b.Key && a.CreateRevision == b.CreateRevision && a.ModRevision == b.ModRevision &&
		a.Version == b.Version && a.Lease == b.Lease && (a.Err == nil) == (b.Err == nil) && sameValue(a.Value, b.Value)
}

// replica is a copy of a view built from a subscription's batches alone;
// apply checks each batch against the state it applies to.
type replica[T any] struct {
	m       map[string]view.Entry[T]
	rev     int64
	started bool // it holds a state: a Resync's, or the one it was made from
}

// replicaOf starts a replica from a state of the view.
func replicaOf[T any](snap *view.Snapshot[T]) *replica[T] {
	r := &replica[T]{m: map[string]view.Entry[T]{}, rev: snap.Revision(), started: true}
	for k, e := range snap.All() {
		r.m[k] = e
	}
	return r
}

func (r *replica[T]) apply(b view.Batch[T]) error {
	switch b.Kind {
	case view.Resync:
		if r.started && b.Revision < r.rev {
			return fmt.Errorf("resync at %d, behind the state at %d", b.Revision, r.rev)
		}
		m := make(map[string]view.Entry[T], len(b.Changes))
		for _, ch := range b.Changes {
			if ch.Kind != view.Created || ch.Entry == nil || ch.Prev != nil || ch.Entry.Key != ch.Key || ch.Entry.ModRevision > b.Revision {
				return fmt.Errorf("resync at %d: change %s %q (entry %v, prev %v) is not a key's state", b.Revision, ch.Kind, ch.Key, ch.Entry, ch.Prev)
			}
			if _, dup := m[ch.Key]; dup {
				return fmt.Errorf("resync at %d: %q twice", b.Revision, ch.Key)
			}
			m[ch.Key] = *ch.Entry
		}
		r.m, r.rev, r.started = m, b.Revision, true
		return nil
	case view.Events, view.Relisted:
	default:
		return fmt.Errorf("batch kind %s", b.Kind)
	}
	if !r.started {
		return fmt.Errorf("%s batch %d..%d before any state", b.Kind, b.From, b.Revision)
	}
	if b.From < r.rev || b.Revision < b.From {
		return fmt.Errorf("%s batch %d..%d after the state at %d", b.Kind, b.From, b.Revision, r.rev)
	}
	last := b.From
	for _, ch := range b.Changes {
		what := fmt.Sprintf("%s batch %d..%d: %s %q at %d", b.Kind, b.From, b.Revision, ch.Kind, ch.Key, ch.Revision)
		if b.Kind == view.Events {
			if ch.Revision <= b.From || ch.Revision > b.Revision || ch.Revision < last {
				return errors.New(what + ": revision out of the batch's order")
			}
			last = ch.Revision
			if ch.Entry != nil && ch.Entry.ModRevision != ch.Revision {
				return fmt.Errorf("%s: entry's ModRevision %d", what, ch.Entry.ModRevision)
			}
		} else if ch.Entry == nil && ch.Revision != b.Revision {
			return errors.New(what + ": a relisted delete not at the listing's revision")
		} else if ch.Entry != nil && (ch.Revision != ch.Entry.ModRevision || ch.Revision <= b.From || ch.Revision > b.Revision) {
			return fmt.Errorf("%s: a relisted put not at its ModRevision %d, after From and by the listing", what, ch.Entry.ModRevision)
		}
		cur, exists := r.m[ch.Key]
		if (ch.Kind == view.Created) == exists {
			return fmt.Errorf("%s: the key exists: %v", what, exists)
		}
		if (ch.Entry == nil) != (ch.Kind == view.Deleted) || (ch.Prev == nil) != (ch.Kind == view.Created) {
			return fmt.Errorf("%s: entry %v, prev %v", what, ch.Entry, ch.Prev)
		}
		if ch.Prev != nil && !sameEntry(*ch.Prev, cur) {
			return fmt.Errorf("%s: prev %+v, the key was %+v", what, *ch.Prev, cur)
		}
		if ch.Entry == nil {
			delete(r.m, ch.Key)
			continue
		}
		if ch.Entry.Key != ch.Key {
			return fmt.Errorf("%s: entry named %q", what, ch.Entry.Key)
		}
		r.m[ch.Key] = *ch.Entry
	}
	r.rev = b.Revision
	return nil
}

// stateDiff returns (up to 10 of) the differences between m and snap.
func stateDiff[T any](m map[string]view.Entry[T], snap *view.Snapshot[T]) []string {
	var diffs []string
	note := func(format string, args ...any) {
		if len(diffs) < 10 {
			diffs = append(diffs, fmt.Sprintf(format, args...))
		}
	}
	for k, e := range snap.All() {
		got, ok := m[k]
		switch {
		case !ok:
			note("%q: missing", k)
		case !sameEntry(got, e):
			note("%q: %+v, view %+v", k, got, e)
		}
	}
	for k := range m {
		if _, ok := snap.Get(k); !ok {
			note("%q: not in the view", k)
		}
	}
	return diffs
}

// requireReplicaEquals requires r to hold snap's state, at its revision.
func requireReplicaEquals[T any](t *testing.T, r *replica[T], snap *view.Snapshot[T]) {
	t.Helper()
	require.Equal(t, snap.Revision(), r.rev, "replica's revision")
	require.Empty(t, stateDiff(r.m, snap), "replica at %d differs from the view", r.rev)
}

// nextBatch returns the subscription's next batch.
func nextBatch[T any](t *testing.T, sub *view.Subscription[T]) view.Batch[T] {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	b, err := sub.Next(c)
	require.NoError(t, err, "no batch")
	return b
}

// put writes key and returns the revision.
func put(t *testing.T, kv *clientv3.Client, key, value string, opts ...clientv3.OpOption) int64 {
	t.Helper()
	resp, err := kv.Put(ctx(t), key, value, opts...)
	require.NoError(t, err)
	return resp.Header.Revision
}

// del deletes key and returns the revision.
func del(t *testing.T, kv *clientv3.Client, key string) int64 {
	t.Helper()
	resp, err := kv.Delete(ctx(t), key)
	require.NoError(t, err)
	return resp.Header.Revision
}

// deleteWhenDone deletes everything under prefix when the test ends, so that
// the shared member stays small for the tests after.
func deleteWhenDone(t *testing.T, kv *clientv3.Client, prefix string) {
	t.Cleanup(func() {
		_, err := kv.Delete(context.Background(), prefix, clientv3.WithPrefix())
		require.NoError(t, err)
	})
}

// churn puts, deletes and creates again random keys of a prefix from a few
// goroutines until stopped.
type churn struct {
	stop    chan struct{}
	wg      sync.WaitGroup
	commits atomic.Int64
	last    atomic.Int64 // highest revision committed
}

func startChurn(t *testing.T, kv *clientv3.Client, prefix string, keys, goroutines int, lease clientv3.LeaseID) *churn {
	c := &churn{stop: make(chan struct{})}
	for g := range goroutines {
		c.wg.Go(func() { // returns when stop is closed; Stop waits
			for seq := 0; ; seq++ {
				select {
				case <-c.stop:
					return
				default:
				}
				key := fmt.Sprintf("%sk%06d", prefix, rand.IntN(keys+keys/10)) // a tenth are new keys
				value := fmt.Sprintf("churn %d.%d %s", g, seq, strings.Repeat("x", 40))
				var rev int64
				switch n := rand.IntN(10); {
				case n < 3:
					resp, err := kv.Delete(context.Background(), key)
					if err != nil {
						t.Error(err)
						return
					}
					rev = resp.Header.Revision
				default:
					var opts []clientv3.OpOption
					if n < 5 {
						opts = append(opts, clientv3.WithLease(lease))
					}
					resp, err := kv.Put(context.Background(), key, value, opts...)
					if err != nil {
						t.Error(err)
						return
					}
					rev = resp.Header.Revision
				}
				c.commits.Add(1)
				for old := c.last.Load(); rev > old && !c.last.CompareAndSwap(old, rev); old = c.last.Load() {
				}
			}
		})
	}
	t.Cleanup(func() { c.Stop() })
	return c
}

// Stop stops the goroutines and returns the highest revision they committed.
func (c *churn) Stop() int64 {
	select {
	case <-c.stop:
	default:
		close(c.stop)
	}
	c.wg.Wait()
	return c.last.Load()
}

// loadKeys writes keys k000000.. under prefix, 128 puts a transaction (etcd's
// default limit), every tenth with lease, from four goroutines.
func loadKeys(t *testing.T, kv *clientv3.Client, prefix string, n int, lease clientv3.LeaseID) {
	t.Helper()
	const perTxn = 128
	value := strings.Repeat("v", 64)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for start := g * perTxn; start < n; start += 4 * perTxn {
				var ops []clientv3.Op
				for i := start; i < min(start+perTxn, n); i++ {
					var opts []clientv3.OpOption
					if i%10 == 0 {
						opts = append(opts, clientv3.WithLease(lease))
					}
					ops = append(ops, clientv3.OpPut(fmt.Sprintf("%sk%06d", prefix, i), value, opts...))
				}
				if _, err := kv.Txn(context.Background()).Then(ops...).Commit(); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	require.False(t, t.Failed())
}

// deleteKeys deletes the keys loadKeys and startChurn write, a few thousand
// a request (one request for all would outlast etcd's request timeout), then
// compacts the store.
func deleteKeys(t *testing.T, kv *clientv3.Client, prefix string, n int) {
	const per = 5000
	for i := 0; i < n; i += per {
		_, err := kv.Delete(context.Background(), fmt.Sprintf("%sk%06d", prefix, i), clientv3.WithRange(fmt.Sprintf("%sk%06d", prefix, i+per)))
		require.NoError(t, err)
	}
	resp, err := kv.Delete(context.Background(), prefix, clientv3.WithPrefix())
	require.NoError(t, err)
	// And their history, which would slow down the tests after (and this
	// one under -count).
	_, err = kv.Compact(context.Background(), resp.Header.Revision)
	require.NoError(t, err)
}

// TestViewInitialSyncUnderWrites lists 100,000 keys while writers put,
// delete and create keys again in the range. Catches: a listing that mixes
// revisions, a watch that does not start right after the listed revision
// (lost or doubled changes), entries with wrong revisions, version or lease.
//
// ETCDWATCH_VIEW_KEYS sets another count. The embedded etcd is built with
// -race too: on 2 idle cores the test takes some 22s, 60-80s when other
// processes load them.
func TestViewInitialSyncUnderWrites(t *testing.T) {
	leakCheck(t)
	n := 100_000
	if env := os.Getenv("ETCDWATCH_VIEW_KEYS"); env != "" {
		var err error
		n, err = strconv.Atoi(env)
		require.NoError(t, err)
	}
	kv := client(t)
	prefix := unique("view-large")
	t.Cleanup(func() { deleteKeys(t, kv, prefix, n+n/10) })
	lease, err := kv.Grant(ctx(t), 3600)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = kv.Revoke(context.Background(), lease.ID) })
	began := time.Now()
	loadKeys(t, kv, prefix, n, lease.ID)
	loaded := time.Since(began)

	s := open(t)
	w := startChurn(t, kv, prefix, n, 2, lease.ID)
	require.Eventually(t, func() bool { return w.commits.Load() >= 10 }, wait, time.Millisecond, "the writers do not write")
	before := w.commits.Load()
	began = time.Now()
	v := newView(t, s, etcdwatch.Prefix(prefix), view.DecodeBytes)
	during := w.commits.Load() - before
	listed := time.Since(began)
	require.Positive(t, during, "no write overlapped the listing")
	snap := v.Snapshot()
	require.Greater(t, snap.Len(), n/2)
	requireEqualsServer(t, kv, v, snap)

	last := w.Stop()
	require.NoError(t, v.Sync(ctx(t)))
	require.GreaterOrEqual(t, v.Revision(), last, "Sync returned before the last write")
	final := requireEqualsServer(t, kv, v, v.Snapshot())
	st := v.Stats()
	require.Zero(t, st.Relists)
	require.Equal(t, final.Len(), st.Keys)
	t.Logf("%d keys loaded in %v; view.New %v, during which %d writes committed; %d writes in all; view at %d with %d keys, %d bytes",
		n, loaded, listed, during, w.commits.Load(), final.Revision(), final.Len(), st.Bytes)
}

// TestViewRelistAfterCompactionWhileDisconnected changes every kind of key
// while the view is cut off, then compacts. Catches: a view that ends or
// skips on compaction instead of listing again, a Relisted batch that is not
// the exact difference (unchanged keys in it, a recreated key as an update,
// a key created and deleted in the gap reported), a wrong From/Revision, a
// view that stops following after the relist.
func TestViewRelistAfterCompactionWhileDisconnected(t *testing.T) {
	leakCheck(t)
	kv := client(t)
	prefix := unique("view-relist")
	deleteWhenDone(t, kv, prefix)
	for _, k := range []string{"same1", "same2", "same3", "upd1", "upd2", "del1", "del2", "re1", "re2"} {
		put(t, kv, prefix+k, "old "+k)
	}
	proxy := etcdwatchtest.NewProxy(t, etcd.Endpoint)
	s := openOn(t, []string{proxy.Addr()}, fastRetry)
	v := newView(t, s, etcdwatch.Prefix(prefix), view.DecodeBytes)
	require.Equal(t, 9, v.Len())
	sub := v.Subscribe(context.Background(), v.Revision())
	defer sub.Close()

	proxy.Refuse(true)
	require.Positive(t, proxy.Cut())
	require.Eventually(t, func() bool { return !s.State().Connected }, wait, time.Millisecond, "the cut went unnoticed")
	from := v.Revision()
	put(t, kv, prefix+"upd1", "new upd1")
	put(t, kv, prefix+"upd2", "newer upd2")
	put(t, kv, prefix+"upd2", "new upd2") // twice: one Updated
	del(t, kv, prefix+"del1")
	del(t, kv, prefix+"del2")
	put(t, kv, prefix+"new1", "new new1")
	put(t, kv, prefix+"new2", "new new2")
	for _, k := range []string{"re1", "re2"} {
		del(t, kv, prefix+k)
		put(t, kv, prefix+k, "new "+k)
	}
	put(t, kv, prefix+"ghost", "created and deleted in the gap")
	compactAt := del(t, kv, prefix+"ghost")
	_, err := kv.Compact(ctx(t), compactAt)
	require.NoError(t, err)
	proxy.Refuse(false)

	b := nextBatch(t, sub)
	require.Equal(t, view.Relisted, b.Kind, "%+v", b)
	require.Equal(t, from, b.From)
	require.GreaterOrEqual(t, b.Revision, compactAt)
	got := map[string][]view.ChangeKind{}
	for _, ch := range b.Changes {
		k := strings.TrimPrefix(ch.Key, prefix)
		got[k] = append(got[k], ch.Kind)
		if ch.Entry != nil {
			require.Equal(t, ch.Entry.ModRevision, ch.Revision, "%s %s: a put's revision is its key's", ch.Kind, k)
		} else {
			require.Equal(t, b.Revision, ch.Revision, "%s %s: a delete's is the listing's", ch.Kind, k)
		}
		if ch.Entry != nil {
			require.Equal(t, "new "+k, string(ch.Entry.Value), k)
		}
		if ch.Prev != nil {
			require.Equal(t, "old "+k, string(ch.Prev.Value), k)
		}
	}
	d, c, u := view.Deleted, view.Created, view.Updated
	require.Equal(t, map[string][]view.ChangeKind{
		"upd1": {u}, "upd2": {u}, "del1": {d}, "del2": {d}, "new1": {c}, "new2": {c}, "re1": {d, c}, "re2": {d, c},
	}, got)
	require.Equal(t, uint64(1), v.Stats().Relists)
	require.Equal(t, b.Revision, requireEqualsServer(t, kv, v, v.Snapshot()).Revision())

	rev := put(t, kv, prefix+"after", "after the relist")
	b2 := nextBatch(t, sub)
	require.Equal(t, view.Events, b2.Kind)
	require.Equal(t, b.Revision, b2.From)
	require.Equal(t, rev, b2.Revision)
	require.Len(t, b2.Changes, 1)
	require.Equal(t, prefix+"after", b2.Changes[0].Key)
	require.Equal(t, view.Created, b2.Changes[0].Kind)
	require.Equal(t, uint64(1), v.Stats().Relists)
}

// TestViewStoppedSubscriberGetsResync: of two subscribers, one reads every
// batch and the other stops reading while the view goes far beyond its
// history. Catches: a view held up by a stopped subscriber, an unbounded
// history, a reader given gaps or a resync it did not need, a stopped one
// given changes it missed half of instead of a Resync of the whole state.
func TestViewStoppedSubscriberGetsResync(t *testing.T) {
	leakCheck(t)
	kv := client(t)
	prefix := unique("view-resync")
	deleteWhenDone(t, kv, prefix)
	for i := range 10 {
		put(t, kv, fmt.Sprintf("%sk%02d", prefix, i), "initial")
	}
	s := open(t)
	const limit = 4 << 10
	v := newView(t, s, etcdwatch.Prefix(prefix), view.DecodeBytes, view.WithHistoryBytes(limit))
	start := v.Snapshot()
	reading, stopped := v.Subscribe(context.Background(), start.Revision()), v.Subscribe(context.Background(), start.Revision())
	defer reading.Close()
	defer stopped.Close()
	rep := replicaOf(start)

	const writes = 300 // each batch weighs some 250 bytes: the history holds a dozen
	pad := strings.Repeat("p", 100)
	for i := range writes {
		key := fmt.Sprintf("%sk%02d", prefix, rand.IntN(20))
		var rev int64
		if _, exists := rep.m[key]; exists && i%5 == 0 {
			rev = del(t, kv, key)
		} else {
			rev = put(t, kv, key, fmt.Sprintf("%d %s", i, pad))
		}
		b := nextBatch(t, reading) // one write at a time: the reader never falls behind
		require.Equal(t, view.Events, b.Kind)
		require.Equal(t, rep.rev, b.From, "a gap before batch %d..%d", b.From, b.Revision)
		require.Equal(t, rev, b.Revision)
		require.Len(t, b.Changes, 1)
		require.NoError(t, rep.apply(b))
		require.LessOrEqual(t, v.Stats().HistoryBytes, int64(limit), "history beyond its bound")
	}
	require.NoError(t, v.Sync(ctx(t)))
	now := requireEqualsServer(t, kv, v, v.Snapshot())
	requireReplicaEquals(t, rep, now)

	b := nextBatch(t, stopped)
	require.Equal(t, view.Resync, b.Kind, "%s batch %d..%d", b.Kind, b.From, b.Revision)
	late := &replica[[]byte]{}
	require.NoError(t, late.apply(b))
	for late.rev < now.Revision() {
		require.NoError(t, late.apply(nextBatch(t, stopped)))
	}
	requireReplicaEquals(t, late, now)
	st := v.Stats()
	require.Equal(t, uint64(1), st.Resyncs, "only the stopped subscriber needed a resync")
	require.Equal(t, 2, st.Subscribers)

	rev := put(t, kv, prefix+"k00", "after")
	for _, r := range []struct {
		sub *view.Subscription[[]byte]
		rep *replica[[]byte]
	}{{reading, rep}, {stopped, late}} {
		b := nextBatch(t, r.sub)
		require.Equal(t, view.Events, b.Kind)
		require.Equal(t, r.rep.rev, b.From)
		require.Equal(t, rev, b.Revision)
		require.NoError(t, r.rep.apply(b))
	}
	require.NoError(t, v.WaitForRevision(ctx(t), rev))
	requireReplicaEquals(t, rep, v.Snapshot())
	requireReplicaEquals(t, late, v.Snapshot())
	require.Equal(t, uint64(1), v.Stats().Resyncs)
}

type num struct{ N int }

// TestViewDecodeErrors: values the decode function refuses are in the view
// with their error. Catches: keys dropped or a stale value kept on a decode
// error, a non-zero Value beside an error, miscounted errors, an error kept
// after the value is fixed, changes that do not carry the error.
func TestViewDecodeErrors(t *testing.T) {
	leakCheck(t)
	kv := client(t)
	prefix := unique("view-decode")
	deleteWhenDone(t, kv, prefix)
	good := map[string]int{"a": 1, "c": 3, "e": 5}
	for k, n := range good {
		put(t, kv, prefix+k, fmt.Sprintf(`{"N":%d}`, n))
	}
	put(t, kv, prefix+"b", `{"N":`)
	put(t, kv, prefix+"d", `not json`)
	s := open(t)
	v := newView(t, s, etcdwatch.Prefix(prefix), view.DecodeJSON[num])
	require.Equal(t, 5, v.Len())
	for k, n := range good {
		e, ok := v.Get(prefix + k)
		require.True(t, ok)
		require.NoError(t, e.Err)
		require.Equal(t, n, e.Value.N)
	}
	for _, k := range []string{"b", "d"} {
		e, ok := v.Get(prefix + k)
		require.True(t, ok, "a key whose value cannot be decoded is still in the view")
		require.Error(t, e.Err)
		require.Zero(t, e.Value)
	}
	require.Equal(t, uint64(2), v.Stats().DecodeErrors)
	requireEqualsServer(t, kv, v, v.Snapshot())

	sub := v.Subscribe(context.Background(), v.Revision())
	defer sub.Close()
	rev := put(t, kv, prefix+"b", `{"N":2}`)
	b := nextBatch(t, sub)
	require.Equal(t, rev, b.Revision)
	require.Len(t, b.Changes, 1)
	ch := b.Changes[0]
	require.Equal(t, view.Updated, ch.Kind)
	require.NoError(t, ch.Entry.Err)
	require.Equal(t, 2, ch.Entry.Value.N)
	require.Error(t, ch.Prev.Err)
	e, _ := v.Get(prefix + "b")
	require.NoError(t, e.Err, "fixing the value clears the error")
	require.Equal(t, 2, e.Value.N)

	rev = put(t, kv, prefix+"c", `{"N":"three"}`)
	b = nextBatch(t, sub)
	require.Equal(t, rev, b.Revision)
	ch = b.Changes[0]
	require.Error(t, ch.Entry.Err, "the change carries the decode error")
	require.Zero(t, ch.Entry.Value)
	require.Equal(t, 3, ch.Prev.Value.N)
	require.Equal(t, uint64(3), v.Stats().DecodeErrors)
	e, _ = v.Get(prefix + "d")
	require.Error(t, e.Err)
	requireEqualsServer(t, kv, v, v.Snapshot())
}

// TestViewSyncSeesEveryWrite: after Sync, the view holds every write made
// before it, with and without another watch keeping the stream busy.
// Catches: a Sync that returns on an older progress answer, on another
// watch's bookmark, or before the view applied the revision answered.
func TestViewSyncSeesEveryWrite(t *testing.T) {
	leakCheck(t)
	kv := client(t)
	s := open(t)
	prefix := unique("view-sync")
	deleteWhenDone(t, kv, prefix)
	v := newView(t, s, etcdwatch.Prefix(prefix), view.DecodeBytes)
	syncEach := func(t *testing.T) {
		for i := range 200 {
			rev := put(t, kv, prefix+"k", fmt.Sprint(i))
			require.NoError(t, v.Sync(ctx(t)))
			e, ok := v.Get(prefix + "k")
			require.True(t, ok)
			require.Equal(t, rev, e.ModRevision, "write %d", i)
			require.Equal(t, fmt.Sprint(i), string(e.Value))
		}
	}
	t.Run("quiet", syncEach)
	t.Run("busy", func(t *testing.T) {
		busy := prefix + "busy/" // inside the view's range too
		other := unique("view-sync-other")
		deleteWhenDone(t, kv, other)
		bw, err := s.Watch(t.Context(), etcdwatch.Prefix(other))
		require.NoError(t, err)
		drained := make(chan struct{})
		go func() { // drains the busy watch until it is canceled
			defer close(drained)
			for range bw.Responses() {
			}
		}()
		stop := make(chan struct{})
		var writers sync.WaitGroup
		for _, p := range []string{busy, other} {
			writers.Go(func() { // writes until stop is closed
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					if _, err := kv.Put(context.Background(), fmt.Sprintf("%sk%d", p, i%10), fmt.Sprint(i)); err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		syncEach(t)
		close(stop)
		writers.Wait()
		bw.Cancel()
		<-drained
		require.NoError(t, v.Sync(ctx(t)))
		requireEqualsServer(t, kv, v, v.Snapshot())
	})
	require.Zero(t, v.Stats().Relists)

	// Behind a proxy that delays every chunk, a write's event reaches the
	// view well after the write returns: a Sync that did not wait for it
	// would fail here at once, where on loopback the event may win the race.
	t.Run("delayed", func(t *testing.T) {
		p := etcdwatchtest.NewProxy(t, etcd.Endpoint)
		p.SetDelay(5 * time.Millisecond)
		slow := openOn(t, []string{p.Addr()})
		dv := newView(t, slow, etcdwatch.Prefix(prefix), view.DecodeBytes)
		for i := range 30 {
			rev := put(t, kv, prefix+"k", fmt.Sprint(i))
			require.NoError(t, dv.Sync(ctx(t)))
			e, ok := dv.Get(prefix + "k")
			require.True(t, ok)
			require.Equal(t, rev, e.ModRevision, "write %d", i)
		}
	})
}

// TestViewIdlePrefixSurvivesCompaction: nobody writes the view's range while
// the store moves on and is compacted, then the connection is cut. Catches:
// a view whose revision (and its watch's resume revision) does not follow
// the store through bookmarks, which must then relist after the compaction.
func TestViewIdlePrefixSurvivesCompaction(t *testing.T) {
	leakCheck(t)
	kv := client(t)
	prefix := unique("view-idle")
	noise := strings.TrimSuffix(prefix, "/") + "-noise/" // outside the view's range
	deleteWhenDone(t, kv, prefix)
	deleteWhenDone(t, kv, noise)
	put(t, kv, prefix+"k", "idle")
	proxy := etcdwatchtest.NewProxy(t, etcd.Endpoint)
	s := openOn(t, []string{proxy.Addr()}, fastRetry)
	v := newView(t, s, etcdwatch.Prefix(prefix), view.DecodeBytes, view.WithBookmarkInterval(100*time.Millisecond))
	listed := v.Revision()
	var last int64
	for i := range 100 {
		last = put(t, kv, fmt.Sprintf("%sk%d", noise, i%10), fmt.Sprint(i))
	}
	c, cancel := context.WithTimeout(ctx(t), wait)
	defer cancel()
	require.NoError(t, v.WaitForRevision(c, last), "the idle view's revision did not follow the store (listed at %d)", listed)
	_, err := kv.Compact(ctx(t), last)
	require.NoError(t, err)
	created := s.Stats().Created
	require.Positive(t, proxy.Cut())
	require.Eventually(t, func() bool { return s.Stats().Created > created }, wait, time.Millisecond, "the watch was not created again")
	rev := put(t, kv, prefix+"k", "written after the compaction")
	require.NoError(t, v.WaitForRevision(ctx(t), rev))
	e, ok := v.Get(prefix + "k")
	require.True(t, ok)
	require.Equal(t, rev, e.ModRevision)
	require.Zero(t, v.Stats().Relists, "the view had to list again")
	require.Positive(t, s.Stats().Reconnects)
	requireEqualsServer(t, kv, v, v.Snapshot())
}

// TestViewShare: a View and its Share follow one state through one
// server-side watch, released by the last Close; each New has a state and
// a watch of its own, even with the same decode function. Catches: a watch
// per Share, a Share that lists again or decodes otherwise, a shared state
// ended by the first Close or kept after the last, a closed View whose
// state and Stats go on moving with the others'.
func TestViewShare(t *testing.T) {
	leakCheck(t)
	kv := client(t)
	prefix := unique("view-share")
	deleteWhenDone(t, kv, prefix)
	s := open(t)
	tagged := func(tag string) view.Decoder[string] {
		return func(_, value []byte) (string, error) { return tag + string(value), nil }
	}
	v1 := newView(t, s, etcdwatch.Prefix(prefix), tagged("a:"))
	v2 := v1.share(t)
	require.Equal(t, int64(1), s.Stats().Watches, "one server-side watch for both")
	rev := put(t, kv, prefix+"k", "one")
	for _, v := range []*testView[string]{v1, v2} {
		require.NoError(t, v.WaitForRevision(ctx(t), rev))
		e, ok := v.Get(prefix + "k")
		require.True(t, ok)
		require.Equal(t, "a:one", e.Value)
	}
	require.NoError(t, v1.Close())
	require.NoError(t, v2.Err(), "closing one view ended the other")
	closedSnap, closedStats := v1.Snapshot(), v1.Stats()
	rev = put(t, kv, prefix+"k", "two")
	put(t, kv, prefix+"k2", "two")
	require.NoError(t, v2.WaitForRevision(ctx(t), rev+1))
	e, _ := v2.Get(prefix + "k")
	require.Equal(t, "a:two", e.Value)
	// The closed View answers from the state as it left it, though the
	// state goes on (its values followed the state, and so did the
	// etcdwatchprom gauges read from its Stats).
	require.Same(t, closedSnap, v1.Snapshot())
	e, _ = v1.Get(prefix + "k")
	require.Equal(t, "a:one", e.Value)
	require.Equal(t, 1, v1.Len())
	require.Equal(t, closedStats, v1.Stats())
	require.Equal(t, 2, v2.Len())
	require.Equal(t, int64(1), s.Stats().Watches)
	require.NoError(t, v2.Close())
	require.Eventually(t, func() bool { return s.Stats().Watches == 0 }, wait, time.Millisecond, "the watch outlived its views")

	decode := tagged("b:")
	va := newView(t, s, etcdwatch.Prefix(prefix), decode)
	vb := newView(t, s, etcdwatch.Prefix(prefix), decode)
	require.Equal(t, int64(2), s.Stats().Watches, "each New has a watch of its own")
	rev = put(t, kv, prefix+"k", "three")
	for _, v := range []*testView[string]{va, vb} {
		require.NoError(t, v.WaitForRevision(ctx(t), rev))
		e, _ := v.Get(prefix + "k")
		require.Equal(t, "b:three", e.Value)
	}
	require.NoError(t, va.Close())
	rev = put(t, kv, prefix+"k", "four")
	require.NoError(t, vb.WaitForRevision(ctx(t), rev), "closing one New ended another")
}

// TestShareOfAClosingViewIsClosedAlike: Share of a View whose Close is
// under way returns a View ended as it is, which answers from the state
// the Close left, not from the state that another View keeps going.
// Catches: the copy made between Close's cancel and its keeping of the
// state, which followed the live state.
func TestShareOfAClosingViewIsClosedAlike(t *testing.T) {
	leakCheck(t)
	kv := client(t)
	prefix := unique("view-share-closing")
	deleteWhenDone(t, kv, prefix)
	keep := newView(t, open(t), etcdwatch.Prefix(prefix), view.DecodeBytes)
	for i := range 50 {
		v := keep.View.Share()
		closed := make(chan struct{})
		go func() { v.Close(); close(closed) }() // returns once v's state is kept
		var u *view.View[[]byte]
		for u == nil { // Share until it catches v closing
			if c := v.Share(); c.Err() != nil {
				u = c
			} else {
				c.Close()
			}
		}
		<-closed
		rev := put(t, kv, prefix+"k", strconv.Itoa(i))
		require.NoError(t, keep.WaitForRevision(ctx(t), rev))
		require.ErrorIs(t, u.Err(), view.ErrClosed)
		require.Equal(t, v.Revision(), u.Revision(), "round %d: the Share of the closed View answers from the live state, at %d", i, keep.Revision())
	}
}

// TestShareFromADecoderWhileClosing: a Decoder may call Share of its View
// while that View's Close waits for the state's goroutines, the Decoder's
// among them. Catches a Share that waited for that Close to finish: a
// deadlock.
func TestShareFromADecoderWhileClosing(t *testing.T) {
	leakCheck(t)
	kv := client(t)
	prefix := unique("view-share-decoder")
	deleteWhenDone(t, kv, prefix)
	var vp atomic.Pointer[view.View[[]byte]]
	entered, release := make(chan struct{}), make(chan struct{})
	decode := func(_, val []byte) ([]byte, error) {
		if string(val) == "share" {
			close(entered)
			<-release
			vp.Load().Share().Close()
		}
		return val, nil
	}
	v, err := view.New(ctx(t), open(t), etcdwatch.Prefix(prefix), decode)
	require.NoError(t, err)
	vp.Store(v)
	sub := v.Subscribe(ctx(t), 0)
	put(t, kv, prefix+"k", "share")
	<-entered
	closed := make(chan struct{})
	go func() { v.Close(); close(closed) }() // waits for the Decoder
	// Close is under way once it has ended v's subscriptions. (Not a Share
	// made to find out: one made before Close began would hold the state,
	// and its own Close, as the last, would wait for the held Decoder.)
	require.Eventually(t, func() bool { return errors.Is(sub.Err(), view.ErrClosed) }, wait, time.Millisecond)
	close(release)
	select {
	case <-closed:
	case <-time.After(wait):
		t.Fatal("Close waits for the Decoder, whose Share waits for Close")
	}
}

// TestViewIntegrityCheck compares the view with the server every 50ms while
// writes go on. Catches: checks that never run, and checks that compare
// with the wrong revision (false mismatches, needless relists).
func TestViewIntegrityCheck(t *testing.T) {
	leakCheck(t)
	kv := client(t)
	prefix := unique("view-integrity")
	deleteWhenDone(t, kv, prefix)
	s := open(t)
	v := newView(t, s, etcdwatch.Prefix(prefix), view.DecodeBytes, view.WithIntegrityCheck(50*time.Millisecond))
	w := startChurn(t, kv, prefix, 50, 2, clientv3.NoLease)
	require.Eventually(t, func() bool { return v.Stats().IntegrityChecks > 3 }, wait, time.Millisecond, "no integrity checks")
	checksDuringWrites := v.Stats().IntegrityChecks
	w.Stop()
	require.NoError(t, v.Sync(ctx(t)))
	st := v.Stats()
	require.Zero(t, st.IntegrityMismatches)
	require.Zero(t, st.Relists)
	requireEqualsServer(t, kv, v, v.Snapshot())
	t.Logf("%d checks during %d writes", checksDuringWrites, w.commits.Load())
}

// TestViewOfOneKeyAndFromKey: a Key view holds that key only, a FromKey view
// every key from its start on. Catches: a Key view treated as a prefix, a
// FromKey view bounded or starting at the wrong key.
func TestViewOfOneKeyAndFromKey(t *testing.T) {
	leakCheck(t)
	kv := client(t)
	s := open(t)
	t.Run("key", func(t *testing.T) {
		prefix := unique("view-key")
		deleteWhenDone(t, kv, prefix)
		k := prefix + "k"
		put(t, kv, prefix+"j", "before")
		v := newView(t, s, etcdwatch.Key(k), view.DecodeBytes)
		require.Zero(t, v.Len())
		sub := v.Subscribe(context.Background(), v.Revision())
		defer sub.Close()
		var want []view.ChangeKind
		var got []view.ChangeKind
		var last int64
		exists := false
		for i, op := range []string{"put", "other", "put", "del", "other", "put"} {
			switch op {
			case "put":
				last = put(t, kv, k, fmt.Sprint(i))
				if exists {
					want = append(want, view.Updated)
				} else {
					want = append(want, view.Created)
				}
				exists = true
				require.NoError(t, v.WaitForRevision(ctx(t), last))
				e, ok := v.Get(k)
				require.True(t, ok)
				require.Equal(t, fmt.Sprint(i), string(e.Value))
			case "del":
				last = del(t, kv, k)
				want = append(want, view.Deleted)
				exists = false
				require.NoError(t, v.WaitForRevision(ctx(t), last))
				_, ok := v.Get(k)
				require.False(t, ok)
			case "other": // keys around k, one with k as its prefix
				put(t, kv, k+"0", "other")
				put(t, kv, prefix+"j", "other")
			}
		}
		for len(got) < len(want) {
			for _, ch := range nextBatch(t, sub).Changes {
				require.Equal(t, k, ch.Key)
				got = append(got, ch.Kind)
			}
		}
		require.Equal(t, want, got)
		require.NoError(t, v.Sync(ctx(t)))
		require.Equal(t, 1, requireEqualsServer(t, kv, v, v.Snapshot()).Len())
	})
	t.Run("fromkey", func(t *testing.T) {
		// Above every other test's keys, so that the range holds this
		// test's only.
		start := fmt.Sprintf("\xfeview-fromkey-%d/", time.Now().UnixNano())
		below := strings.TrimSuffix(start, "/")
		deleteWhenDone(t, kv, start)
		t.Cleanup(func() {
			_, err := kv.Delete(context.Background(), below)
			require.NoError(t, err)
		})
		put(t, kv, below, "below")
		put(t, kv, start, "the start key")
		put(t, kv, start+"a", "a")
		v := newView(t, s, etcdwatch.FromKey(start), view.DecodeBytes)
		require.Equal(t, 2, v.Len())
		_, ok := v.Get(below)
		require.False(t, ok)
		sub := v.Subscribe(context.Background(), v.Revision())
		defer sub.Close()
		put(t, kv, below, "below again")
		put(t, kv, start+"b", "b")
		del(t, kv, start+"a")
		last := put(t, kv, start+"\xff\xff", "far")
		var got []string
		for len(got) < 3 {
			for _, ch := range nextBatch(t, sub).Changes {
				got = append(got, ch.Kind.String()+" "+strings.TrimPrefix(ch.Key, start))
			}
		}
		require.Equal(t, []string{"created b", "deleted a", "created \xff\xff"}, got)
		require.NoError(t, v.WaitForRevision(ctx(t), last))
		require.Equal(t, 3, requireEqualsServer(t, kv, v, v.Snapshot()).Len())
	})
}

// TestViewEndsWithStream: closing the Stream ends its views. Catches: views
// (and their goroutines) outliving the Stream, a wrong Err, subscribers
// losing the batches published before the end, or waiting forever.
func TestViewEndsWithStream(t *testing.T) {
	leakCheck(t)
	kv := client(t)
	prefix := unique("view-end")
	deleteWhenDone(t, kv, prefix)
	s := open(t)
	v := newView(t, s, etcdwatch.Prefix(prefix), view.DecodeBytes)
	sub := v.Subscribe(context.Background(), v.Revision())
	defer sub.Close()
	var revs []int64
	for i := range 3 {
		revs = append(revs, put(t, kv, fmt.Sprintf("%sk%d", prefix, i), "v"))
	}
	require.NoError(t, v.WaitForRevision(ctx(t), revs[2]))
	require.NoError(t, s.Close())
	select {
	case <-v.Done():
	case <-time.After(wait):
		t.Fatal("the view outlived its Stream")
	}
	require.ErrorIs(t, v.Err(), etcdwatch.ErrClosed)
	require.ErrorIs(t, v.WaitForRevision(ctx(t), revs[2]+1), etcdwatch.ErrClosed)
	var got []int64
	for {
		b, err := sub.Next(ctx(t))
		if err != nil {
			require.ErrorIs(t, err, etcdwatch.ErrClosed)
			break
		}
		for _, ch := range b.Changes {
			got = append(got, ch.Revision)
		}
	}
	require.Equal(t, revs, got, "the batches published before the end")
	_, err := view.New(ctx(t), s, etcdwatch.Prefix(prefix), view.DecodeBytes)
	require.ErrorIs(t, err, etcdwatch.ErrClosed)
}

// TestViewCloseEndsOnlyThatView: of two views sharing a state (Share), the
// one closed has ended (Err view.ErrClosed, Done closed) and the other runs.
// Catches: Done and Err of a closed View that follow the shared state
// instead, so that a closed view looks alive while another shares it.
func TestViewCloseEndsOnlyThatView(t *testing.T) {
	leakCheck(t)
	s := open(t)
	prefix := unique("view-close")
	v1 := newView(t, s, etcdwatch.Prefix(prefix), view.DecodeBytes)
	v2 := v1.share(t)
	require.NoError(t, v1.Close())
	require.ErrorIs(t, v1.Err(), view.ErrClosed, "library bug: a closed View's Err is its shared state's")
	select {
	case <-v1.Done():
	case <-time.After(wait):
		t.Fatal("library bug: a closed View's Done stays open while another View shares its state")
	}
	require.NoError(t, v2.Err())
}

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdwatch/etcdwatch"
	"github.com/etcdwatch/etcdwatch/etcdwatchtest"
	"github.com/etcdwatch/etcdwatch/view"
)

// warmKeys is how many keys the warm-restart tests save: enough for the
// saved state (about 100 bytes a key) to span several of the loader's
// 256 KiB buffers.
const warmKeys = 8000

// TestViewWarmRestart saves a view of 8,000 keys (WithStateFile, at its
// Close), changes the range, and starts a view from the file on another
// Stream, as a restarted process would. The restored view must equal a
// Get at its revision; a subscriber from the saved revision, replaying
// onto the saved state, must reach the view exactly, with first one batch
// of what changed since the save: Events as the watch reported them, or
// after a compaction a Relisted difference; and further changes after it.
// Catches: changes since the save lost, doubled or in a wrong batch, a
// watch that resumes at the wrong revision, entries restored with wrong
// revisions, version, lease or value, a compacted history not noticed, a
// listing made when none is needed.
func TestViewWarmRestart(t *testing.T) {
	leakCheck(t)
	kv := client(t)
	lease, err := kv.Grant(ctx(t), 3600)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = kv.Revoke(ctx(t), lease.ID) })
	d, c, u := view.Deleted, view.Created, view.Updated
	for _, tc := range []struct {
		name    string
		change  func(t *testing.T, prefix string) // after the save
		compact bool
		want    map[string][]view.ChangeKind // the first batch, by key under the prefix
	}{
		{name: "nothing changed", change: func(*testing.T, string) {}, want: map[string][]view.ChangeKind{}},
		{name: "writes", change: func(t *testing.T, p string) {
			put(t, kv, p+"k000007", "updated")
			put(t, kv, p+"k000008", "updated once")
			put(t, kv, p+"k000008", "updated twice")
			put(t, kv, p+"new", "created")
			put(t, kv, p+"k000009", "now with a lease", clientv3.WithLease(lease.ID))
		}, want: map[string][]view.ChangeKind{"k000007": {u}, "k000008": {u, u}, "new": {c}, "k000009": {u}}},
		{name: "deletes and recreations", change: func(t *testing.T, p string) {
			del(t, kv, p+"k000001")
			del(t, kv, p+"k000002")
			put(t, kv, p+"k000002", "created again")
			put(t, kv, p+"ghost", "created")
			del(t, kv, p+"ghost")
		}, want: map[string][]view.ChangeKind{"k000001": {d}, "k000002": {d, c}, "ghost": {c, d}}},
		{name: "compacted", compact: true, change: func(t *testing.T, p string) {
			put(t, kv, p+"k000007", "updated")
			del(t, kv, p+"k000001")
			del(t, kv, p+"k000002")
			put(t, kv, p+"k000002", "created again")
			put(t, kv, p+"new", "created")
			put(t, kv, p+"ghost", "created")
			del(t, kv, p+"ghost")
		}, want: map[string][]view.ChangeKind{"k000007": {u}, "k000001": {d}, "k000002": {d, c}, "new": {c}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prefix := unique("view-warm")
			t.Cleanup(func() { deleteKeys(t, kv, prefix, warmKeys) })
			loadKeys(t, kv, prefix, warmKeys, lease.ID)
			path := filepath.Join(t.TempDir(), "view.state")

			first := newView(t, open(t), etcdwatch.Prefix(prefix), view.DecodeBytes, view.WithStateFile(path, 0))
			rev, err := first.Restored()
			require.Zero(t, rev)
			require.NoError(t, err, "no file yet")
			saved := first.Snapshot()
			require.NoError(t, first.Close()) // saves
			tc.change(t, prefix)
			moved := put(t, kv, unique("view-warm-elsewhere")+"k", "the cluster moves on")
			if tc.compact {
				_, err := kv.Compact(ctx(t), moved)
				require.NoError(t, err)
			}

			v := newView(t, open(t), etcdwatch.Prefix(prefix), view.DecodeBytes, view.WithStateFile(path, 0))
			rev, err = v.Restored()
			require.NoError(t, err)
			require.Equal(t, saved.Revision(), rev)
			snap := v.Snapshot()
			require.GreaterOrEqual(t, snap.Revision(), moved, "New returned caught up")
			requireEqualsServer(t, kv, v, snap)

			sub := v.Subscribe(context.Background(), rev)
			defer sub.Close()
			rep := replicaOf(saved)
			b := nextBatch(t, sub)
			require.NoError(t, rep.apply(b))
			require.Equal(t, rev, b.From)
			require.Equal(t, snap.Revision(), b.Revision, "one batch to the state New returned")
			requireReplicaEquals(t, rep, snap)
			got := map[string][]view.ChangeKind{}
			for _, ch := range b.Changes {
				k := strings.TrimPrefix(ch.Key, prefix)
				got[k] = append(got[k], ch.Kind)
			}
			require.Equal(t, tc.want, got)
			st := v.Stats()
			if tc.compact {
				require.Equal(t, view.Relisted, b.Kind)
				require.EqualValues(t, 1, st.Relists)
			} else {
				require.Equal(t, view.Events, b.Kind)
				require.Zero(t, st.Relists)
			}
			require.Zero(t, st.RestoreRefusals)

			after := put(t, kv, prefix+"after", "after the restart")
			b = nextBatch(t, sub)
			require.NoError(t, rep.apply(b))
			require.Equal(t, after, b.Revision)
			requireReplicaEquals(t, rep, requireEqualsServer(t, kv, v, v.Snapshot()))
		})
	}
}

// TestViewWarmRestartRefusesAnotherCluster: a state saved from one cluster
// is refused by a view on another (its own embedded etcd, with its own
// ID), for that reason first: the view lists that cluster's range, and
// nothing of the file.
func TestViewWarmRestartRefusesAnotherCluster(t *testing.T) {
	leakCheck(t)
	kv := client(t)
	prefix := unique("view-warm-cluster")
	deleteWhenDone(t, kv, prefix)
	for i := range 10 {
		put(t, kv, fmt.Sprintf("%sk%02d", prefix, i), "first cluster")
	}
	path := filepath.Join(t.TempDir(), "view.state")
	first := newView(t, open(t), etcdwatch.Prefix(prefix), view.DecodeBytes, view.WithStateFile(path, 0))
	require.NoError(t, first.Close())

	other := etcdwatchtest.StartEtcd(t)
	okv, err := clientv3.New(clientv3.Config{Endpoints: []string{other.Endpoint}, DialTimeout: wait})
	require.NoError(t, err)
	t.Cleanup(func() { okv.Close() })
	put(t, okv, prefix+"k00", "other cluster")
	v := newView(t, openOn(t, []string{other.Endpoint}), etcdwatch.Prefix(prefix), view.DecodeBytes, view.WithStateFile(path, 0))
	rev, err := v.Restored()
	require.Zero(t, rev)
	require.ErrorIs(t, err, view.ErrSavedCluster)
	require.EqualValues(t, 1, v.Stats().RestoreRefusals)
	require.Equal(t, 1, v.Len())
	requireEqualsServer(t, okv, v, v.Snapshot())
}

// TestRestoreCatchUpWhileItsWatchIsPaused: a view restored from a saved
// state with more changes since than a watch buffers (1,024 events), whose
// load takes longer than the Stream's stall budget (100 ms), has its watch
// paused while it loads, and a paused watch is not covered by the progress
// answer that said how far to catch up: the bookmark at that revision
// never reaches it. The store has moved on outside the range, so the
// range's own events stop below it. Catches a catch-up that never asked
// again: New waited until its context ended (or the next write to the
// range, or etcd's own progress notification, 10 minutes by default).
func TestRestoreCatchUpWhileItsWatchIsPaused(t *testing.T) {
	leakCheck(t)
	kv := client(t)
	prefix, other := unique("paused-restore"), unique("paused-restore-other")
	deleteWhenDone(t, kv, prefix)
	deleteWhenDone(t, kv, other)
	put(t, kv, prefix+"a", "1")
	first, err := view.New(ctx(t), open(t), etcdwatch.Prefix(prefix), view.DecodeBytes, view.WithSave())
	require.NoError(t, err)
	var saved bytes.Buffer
	require.NoError(t, first.Save(&saved))
	require.NoError(t, first.Close())
	for i := range 30 { // 3,000 events in 30 revisions
		var ops []clientv3.Op
		for j := range 100 {
			ops = append(ops, clientv3.OpPut(fmt.Sprintf("%sk%02d-%03d", prefix, i, j), "v"))
		}
		_, err := kv.Txn(ctx(t)).Then(ops...).Commit()
		require.NoError(t, err)
	}
	rev := put(t, kv, other+"x", "after") // the store moves on outside the range

	s := open(t)
	gate := make(chan struct{})
	var once sync.Once
	decode := func(_, v []byte) ([]byte, error) {
		once.Do(func() { <-gate }) // the load's first decode waits
		return v, nil
	}
	go func() { // lets the load go on once the restore's watch, which it keeps from being read, is paused
		defer close(gate)
		assert.Eventually(t, func() bool { return s.Stats().Pauses > 0 }, wait, time.Millisecond, "the restore's watch was not paused")
	}()
	c, cancel := context.WithTimeout(ctx(t), 10*time.Second) // far beyond the catch-up's progressWait (1 s)
	defer cancel()
	v, err := view.New(c, s, etcdwatch.Prefix(prefix), decode, view.WithRestore(&saved))
	require.NoError(t, err, "New of a restored view did not return; stream stats %+v", s.Stats())
	defer v.Close()
	restored, err := v.Restored()
	require.NoError(t, err)
	require.Equal(t, first.Revision(), restored, "restored, not listed")
	require.GreaterOrEqual(t, v.Revision(), rev, "caught up to the revision vouched for")
	require.Equal(t, 3001, v.Len())
}

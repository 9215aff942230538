package etcdwatchprom_test

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/etcdwatch/etcdwatch"
	"github.com/etcdwatch/etcdwatch/dial"
	"github.com/etcdwatch/etcdwatch/etcdwatchprom"
	"github.com/etcdwatch/etcdwatch/etcdwatchtest"
	"github.com/etcdwatch/etcdwatch/view"
)

// fixedView is a ViewSource with given values.
type fixedView view.Stats

func (f fixedView) Stats() view.Stats { return view.Stats(f) }

// TestViewEveryField: each field of view.Stats lands in its own metric,
// with its type, help and the view and range labels.
func TestViewEveryField(t *testing.T) {
	src := fixedView{
		Keys: 7, Bytes: 1234, Revision: 99, Lag: 3, Relists: 2, Resyncs: 4,
		DecodeErrors: 5, IntegrityChecks: 11, IntegrityMismatches: 1,
		Subscribers: 6, HistoryBytes: 4096, RestoreRefusals: 8, SaveFailures: 9,
	}
	want := `
# HELP etcdwatch_view_bytes Bytes of the view's keys and values as stored.
# TYPE etcdwatch_view_bytes gauge
etcdwatch_view_bytes{range="keys [\"a/\", \"a0\")",view="v"} 1234
# HELP etcdwatch_view_decode_errors_total Values the view's decode function refused.
# TYPE etcdwatch_view_decode_errors_total counter
etcdwatch_view_decode_errors_total{range="keys [\"a/\", \"a0\")",view="v"} 5
# HELP etcdwatch_view_history_bytes Bytes of changes kept for subscribers.
# TYPE etcdwatch_view_history_bytes gauge
etcdwatch_view_history_bytes{range="keys [\"a/\", \"a0\")",view="v"} 4096
# HELP etcdwatch_view_integrity_checks_total Comparisons of the view with the server completed.
# TYPE etcdwatch_view_integrity_checks_total counter
etcdwatch_view_integrity_checks_total{range="keys [\"a/\", \"a0\")",view="v"} 11
# HELP etcdwatch_view_integrity_mismatches_total Comparisons that found the view wrong, each repaired by a relist.
# TYPE etcdwatch_view_integrity_mismatches_total counter
etcdwatch_view_integrity_mismatches_total{range="keys [\"a/\", \"a0\")",view="v"} 1
# HELP etcdwatch_view_keys Keys in the view.
# TYPE etcdwatch_view_keys gauge
etcdwatch_view_keys{range="keys [\"a/\", \"a0\")",view="v"} 7
# HELP etcdwatch_view_lag_revisions The highest revision its Stream has seen minus the view's revision.
# TYPE etcdwatch_view_lag_revisions gauge
etcdwatch_view_lag_revisions{range="keys [\"a/\", \"a0\")",view="v"} 3
# HELP etcdwatch_view_relists_total Listings of the range that replaced a state (a restored one too): after compactions, and repairs.
# TYPE etcdwatch_view_relists_total counter
etcdwatch_view_relists_total{range="keys [\"a/\", \"a0\")",view="v"} 2
# HELP etcdwatch_view_resyncs_total Whole states given to subscribers that fell behind the history.
# TYPE etcdwatch_view_resyncs_total counter
etcdwatch_view_resyncs_total{range="keys [\"a/\", \"a0\")",view="v"} 4
# HELP etcdwatch_view_restore_refusals_total Saved states not used at a warm start (corrupt, another format, range or cluster, ahead of the cluster, or let go when the server failed the start from it): the view listed instead.
# TYPE etcdwatch_view_restore_refusals_total counter
etcdwatch_view_restore_refusals_total{range="keys [\"a/\", \"a0\")",view="v"} 8
# HELP etcdwatch_view_save_failures_total Saves of the view's state (WithStateFile) that failed.
# TYPE etcdwatch_view_save_failures_total counter
etcdwatch_view_save_failures_total{range="keys [\"a/\", \"a0\")",view="v"} 9
# HELP etcdwatch_view_revision The view's revision: every change of its range up to it is applied.
# TYPE etcdwatch_view_revision gauge
etcdwatch_view_revision{range="keys [\"a/\", \"a0\")",view="v"} 99
# HELP etcdwatch_view_subscribers Open subscriptions to the view's changes.
# TYPE etcdwatch_view_subscribers gauge
etcdwatch_view_subscribers{range="keys [\"a/\", \"a0\")",view="v"} 6
`
	c := etcdwatchprom.NewView("v", etcdwatch.Prefix("a/"), src)
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(want)))
	require.Equal(t, 13, testutil.CollectAndCount(c))
	require.Equal(t, reflect.TypeFor[view.Stats]().NumField(), testutil.CollectAndCount(c), "a metric for each field of view.Stats")
	lint, err := testutil.CollectAndLint(c)
	require.NoError(t, err)
	require.Empty(t, lint)
}

// TestSeveralViews: views of different names or ranges share a registry
// with a Stream's Collector; the same name and range twice are refused.
func TestSeveralViews(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(etcdwatchprom.New("main", fixed{}))
	reg.MustRegister(etcdwatchprom.NewView("config", etcdwatch.Prefix("config/"), fixedView{Keys: 3}))
	reg.MustRegister(etcdwatchprom.NewView("config", etcdwatch.Key("flags"), fixedView{Keys: 1}))
	reg.MustRegister(etcdwatchprom.NewView("leases", etcdwatch.FromKey("lease/"), fixedView{Keys: 5}))
	var dup prometheus.AlreadyRegisteredError
	require.ErrorAs(t, reg.Register(etcdwatchprom.NewView("config", etcdwatch.Prefix("config/"), fixedView{})), &dup)
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP etcdwatch_view_keys Keys in the view.
# TYPE etcdwatch_view_keys gauge
etcdwatch_view_keys{range="key \"flags\"",view="config"} 1
etcdwatch_view_keys{range="keys [\"config/\", \"config0\")",view="config"} 3
etcdwatch_view_keys{range="keys >= \"lease/\"",view="leases"} 5
`), "etcdwatch_view_keys"))
}

// TestViewValuesMove scrapes a ViewCollector over a view on a real etcd as
// keys change, a subscriber falls behind, and a compaction during a cut
// makes the view list again.
func TestViewValuesMove(t *testing.T) {
	member := etcdwatchtest.StartEtcd(t)
	proxy := etcdwatchtest.NewProxy(t, member.Endpoint)
	conn, err := dial.New([]string{proxy.Addr()}, dial.WithInsecure())
	require.NoError(t, err)
	defer conn.Close()
	s, err := etcdwatch.Open(conn, etcdwatch.WithReconnectBackoff(time.Millisecond, 10*time.Millisecond))
	require.NoError(t, err)
	defer s.Close()
	direct, err := member.Dial()
	require.NoError(t, err)
	defer direct.Close()
	kv := pb.NewKVClient(direct)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	put := func(k, v string) int64 {
		t.Helper()
		r, err := kv.Put(ctx, &pb.PutRequest{Key: []byte(k), Value: []byte(v)})
		require.NoError(t, err)
		return r.Header.Revision
	}
	put("v/a", "1")
	put("v/b", "22")
	rev := put("v/bad", "{")
	put("w/out", "1") // outside the range

	r := etcdwatch.Prefix("v/")
	v, err := view.New(ctx, s, r, view.DecodeJSON[int], view.WithHistoryBytes(400))
	require.NoError(t, err)
	defer v.Close()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(etcdwatchprom.NewView("numbers", r, v))
	value := func(name string) float64 {
		t.Helper()
		families, err := reg.Gather()
		require.NoError(t, err)
		for _, f := range families {
			if f.GetName() == name {
				m := f.GetMetric()[0]
				if m.GetCounter() != nil {
					return m.GetCounter().GetValue()
				}
				return m.GetGauge().GetValue()
			}
		}
		t.Fatalf("no %s", name)
		return 0
	}

	require.Equal(t, 3.0, value("etcdwatch_view_keys"))
	require.Equal(t, float64(len("v/a1v/b22v/bad{")), value("etcdwatch_view_bytes"))
	require.GreaterOrEqual(t, value("etcdwatch_view_revision"), float64(rev))
	require.Equal(t, 1.0, value("etcdwatch_view_decode_errors_total"))
	require.Zero(t, value("etcdwatch_view_subscribers"))
	require.Zero(t, value("etcdwatch_view_relists_total"))

	// A subscriber that reads nothing falls behind the history's 400
	// bytes (30 changes of 19 bytes and more): it counts as a subscriber,
	// and gets a Resync.
	slow := v.Subscribe(context.Background(), v.Revision())
	defer slow.Close()
	require.Equal(t, 1.0, value("etcdwatch_view_subscribers"))
	for range 30 { // each revision applied before the next: a batch each
		rev = put("v/a", "1234567890123456")
		require.NoError(t, v.WaitForRevision(ctx, rev))
	}
	require.Equal(t, float64(rev), value("etcdwatch_view_revision"))
	require.Equal(t, float64(len("v/a1234567890123456v/b22v/bad{")), value("etcdwatch_view_bytes"))
	require.Greater(t, value("etcdwatch_view_history_bytes"), 0.0)
	b, err := slow.Next(ctx)
	require.NoError(t, err)
	require.Equal(t, view.Resync, b.Kind)
	require.Equal(t, 1.0, value("etcdwatch_view_resyncs_total"))

	// A compaction while the view's watch is cut off: it lists again.
	follow := v.Subscribe(context.Background(), rev)
	defer follow.Close()
	proxy.Refuse(true)
	require.Equal(t, 1, proxy.Cut())
	put("v/c", "3")
	_, err = kv.DeleteRange(ctx, &pb.DeleteRangeRequest{Key: []byte("v/bad")})
	require.NoError(t, err)
	rev = put("w/out", "2")
	_, err = kv.Compact(ctx, &pb.CompactionRequest{Revision: rev})
	require.NoError(t, err)
	proxy.Refuse(false)
	b, err = follow.Next(ctx)
	require.NoError(t, err)
	require.Equal(t, view.Relisted, b.Kind)
	require.Equal(t, 1.0, value("etcdwatch_view_relists_total"))
	require.Equal(t, 3.0, value("etcdwatch_view_keys"))
	require.Equal(t, float64(len("v/a1234567890123456v/b22v/c3")), value("etcdwatch_view_bytes"))
	require.GreaterOrEqual(t, value("etcdwatch_view_revision"), float64(rev))
	require.Equal(t, 1.0, value("etcdwatch_view_decode_errors_total"), "a count since the view started")
	require.Equal(t, 2.0, value("etcdwatch_view_subscribers"))

	// Closed, the view's values stay as they were while its Stream goes on
	// (a lag that grew would raise the lag alert for a view that is gone).
	w, err := s.Watch(ctx, etcdwatch.Prefix("w/"))
	require.NoError(t, err)
	require.NoError(t, v.Close())
	lag := value("etcdwatch_view_lag_revisions")
	for range 3 {
		rev = put("w/out", "3")
		for got := int64(0); got < rev; {
			select {
			case r, ok := <-w.Responses():
				if !ok {
					t.Fatalf("the Stream's other watch ended: %v", w.Err())
				}
				got = r.Revision
			case <-ctx.Done():
				t.Fatal("the Stream's other watch delivered nothing")
			}
		}
	}
	require.Equal(t, lag, value("etcdwatch_view_lag_revisions"))
}

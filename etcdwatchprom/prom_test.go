package etcdwatchprom_test

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/etcdwatch/etcdwatch"
	"github.com/etcdwatch/etcdwatch/dial"
	"github.com/etcdwatch/etcdwatch/etcdwatchprom"
	"github.com/etcdwatch/etcdwatch/etcdwatchtest"
)

// fixed is a Source with given values.
type fixed struct {
	stats etcdwatch.Stats
	state etcdwatch.State
}

func (f fixed) Stats() etcdwatch.Stats { return f.stats }
func (f fixed) State() etcdwatch.State { return f.state }

// TestEveryField: each field of Stats and State lands in its own metric,
// with its type, help and the stream label; the timestamps that do not
// exist yet are left out.
func TestEveryField(t *testing.T) {
	src := fixed{
		stats: etcdwatch.Stats{
			Watches: 7, Paused: 2, Created: 9, Stalls: 3, Pauses: 4, Resumes: 5,
			Responses: 100, Events: 250, Fragments: 6, DuplicatesDropped: 8,
			UnknownResponses: 10, IDsRewritten: true, Reconnects: 11, Moved: 12, Revision: 4242,
			LastMessage: time.Unix(1700000000, 500_000_000),
		},
		state: etcdwatch.State{
			Connected: true, Since: time.Unix(1700000001, 0),
			LastError: errors.New("refused"), LastErrorAt: time.Unix(1699999998, 0),
			Failed: errors.New("failed for good"),
		},
	}
	want := `
# HELP etcdwatch_connected 1 while the server answers on the Watch stream (State.Connected), else 0.
# TYPE etcdwatch_connected gauge
etcdwatch_connected{stream="s"} 1
# HELP etcdwatch_creates_total Created responses accepted from the server, resumes included.
# TYPE etcdwatch_creates_total counter
etcdwatch_creates_total{stream="s"} 9
# HELP etcdwatch_duplicates_dropped_total Events at or below a watch's revision that were dropped.
# TYPE etcdwatch_duplicates_dropped_total counter
etcdwatch_duplicates_dropped_total{stream="s"} 8
# HELP etcdwatch_events_total Events queued for consumers.
# TYPE etcdwatch_events_total counter
etcdwatch_events_total{stream="s"} 250
# HELP etcdwatch_failed 1 once the Watch stream failed for good (State.Failed): its watches ended, new ones are refused; else 0.
# TYPE etcdwatch_failed gauge
etcdwatch_failed{stream="s"} 1
# HELP etcdwatch_fragments_total Fragment responses joined into whole revisions.
# TYPE etcdwatch_fragments_total counter
etcdwatch_fragments_total{stream="s"} 6
# HELP etcdwatch_ids_rewritten 1 if the server chose its own watch ids (a gRPC proxy), else 0.
# TYPE etcdwatch_ids_rewritten gauge
etcdwatch_ids_rewritten{stream="s"} 1
# HELP etcdwatch_last_error_timestamp_seconds When the last error ended a Watch stream or kept one from opening, in Unix time.
# TYPE etcdwatch_last_error_timestamp_seconds gauge
etcdwatch_last_error_timestamp_seconds{stream="s"} 1.699999998e+09
# HELP etcdwatch_last_message_timestamp_seconds When the last response arrived, in Unix time.
# TYPE etcdwatch_last_message_timestamp_seconds gauge
etcdwatch_last_message_timestamp_seconds{stream="s"} 1.7000000005e+09
# HELP etcdwatch_paused_watches Watches paused now because their consumer fell behind.
# TYPE etcdwatch_paused_watches gauge
etcdwatch_paused_watches{stream="s"} 2
# HELP etcdwatch_pauses_total Times a watch was paused because its consumer fell behind.
# TYPE etcdwatch_pauses_total counter
etcdwatch_pauses_total{stream="s"} 4
# HELP etcdwatch_reconnects_total gRPC Watch streams replaced after they ended.
# TYPE etcdwatch_reconnects_total counter
etcdwatch_reconnects_total{stream="s"} 11
# HELP etcdwatch_responses_total Responses received from the server.
# TYPE etcdwatch_responses_total counter
etcdwatch_responses_total{stream="s"} 100
# HELP etcdwatch_resumes_total Times a paused watch was re-created.
# TYPE etcdwatch_resumes_total counter
etcdwatch_resumes_total{stream="s"} 5
# HELP etcdwatch_stalls_total Times the stream waited for a consumer at its buffer limit.
# TYPE etcdwatch_stalls_total counter
etcdwatch_stalls_total{stream="s"} 3
# HELP etcdwatch_revision How far the store is known to be: the highest revision the server has reported.
# TYPE etcdwatch_revision gauge
etcdwatch_revision{stream="s"} 4242
# HELP etcdwatch_state_since_timestamp_seconds When etcdwatch_connected last changed, in Unix time.
# TYPE etcdwatch_state_since_timestamp_seconds gauge
etcdwatch_state_since_timestamp_seconds{stream="s"} 1.700000001e+09
# HELP etcdwatch_unknown_responses_total Responses for watch ids the stream did not know.
# TYPE etcdwatch_unknown_responses_total counter
etcdwatch_unknown_responses_total{stream="s"} 10
# HELP etcdwatch_watches Watches running now: creating, active or paused.
# TYPE etcdwatch_watches gauge
etcdwatch_watches{stream="s"} 7
# HELP etcdwatch_watches_moved_total Watches re-created on a new stream after a reconnect, once it confirmed them.
# TYPE etcdwatch_watches_moved_total counter
etcdwatch_watches_moved_total{stream="s"} 12
`
	c := etcdwatchprom.New("s", src)
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(want)))
	// A metric for each field of Stats and State but State.LastError,
	// whose text is no label (State.Failed is a 0 or 1): a field added
	// without one fails here.
	fields := reflect.TypeFor[etcdwatch.Stats]().NumField() + reflect.TypeFor[etcdwatch.State]().NumField() - 1
	require.Equal(t, fields, testutil.CollectAndCount(c))
	lint, err := testutil.CollectAndLint(c)
	require.NoError(t, err)
	require.Empty(t, lint)

	// Before the first response and the first error, their timestamps are
	// absent rather than 0 (which would read as 1970).
	fresh := etcdwatchprom.New("s", fixed{state: etcdwatch.State{Since: time.Unix(1700000001, 0)}})
	require.Equal(t, fields-2, testutil.CollectAndCount(fresh))
	require.Zero(t, testutil.CollectAndCount(fresh, "etcdwatch_last_message_timestamp_seconds", "etcdwatch_last_error_timestamp_seconds"))
}

// TestSeveralStreams: Collectors of different streams share a registry and
// one scrape; the same name twice is refused.
func TestSeveralStreams(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(etcdwatchprom.New("config", fixed{stats: etcdwatch.Stats{Events: 3}}))
	reg.MustRegister(etcdwatchprom.New("leases", fixed{stats: etcdwatch.Stats{Events: 5}}))
	err := reg.Register(etcdwatchprom.New("config", fixed{}))
	var dup prometheus.AlreadyRegisteredError
	require.ErrorAs(t, err, &dup)

	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	require.NoError(t, testutil.ScrapeAndCompare(srv.URL, strings.NewReader(`
# HELP etcdwatch_events_total Events queued for consumers.
# TYPE etcdwatch_events_total counter
etcdwatch_events_total{stream="config"} 3
etcdwatch_events_total{stream="leases"} 5
`), "etcdwatch_events_total"))
}

// TestValuesMove scrapes a Collector over a Stream on a real etcd, through
// promhttp on a loopback port, as events flow and across a cut connection.
func TestValuesMove(t *testing.T) {
	member := etcdwatchtest.StartEtcd(t)
	proxy := etcdwatchtest.NewProxy(t, member.Endpoint)
	conn, err := dial.New([]string{proxy.Addr()}, dial.WithInsecure())
	require.NoError(t, err)
	defer conn.Close()
	s, err := etcdwatch.Open(conn)
	require.NoError(t, err)
	defer s.Close()
	direct, err := member.Dial()
	require.NoError(t, err)
	defer direct.Close()
	kv := pb.NewKVClient(direct)

	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(etcdwatchprom.New("main", s))
	web := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer web.Close()
	scrape := func(want string, names ...string) {
		t.Helper()
		require.NoError(t, testutil.ScrapeAndCompare(web.URL, strings.NewReader(want), names...))
	}
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
		return -1 // absent
	}

	require.Zero(t, value("etcdwatch_watches"))
	require.Zero(t, value("etcdwatch_events_total"))
	require.Equal(t, -1.0, value("etcdwatch_last_message_timestamp_seconds"))

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	w, err := s.Watch(ctx, etcdwatch.Prefix("k/"))
	require.NoError(t, err)
	scrape(`
# HELP etcdwatch_watches Watches running now: creating, active or paused.
# TYPE etcdwatch_watches gauge
etcdwatch_watches{stream="main"} 1
# HELP etcdwatch_connected 1 while the server answers on the Watch stream (State.Connected), else 0.
# TYPE etcdwatch_connected gauge
etcdwatch_connected{stream="main"} 1
# HELP etcdwatch_creates_total Created responses accepted from the server, resumes included.
# TYPE etcdwatch_creates_total counter
etcdwatch_creates_total{stream="main"} 1
`, "etcdwatch_watches", "etcdwatch_connected", "etcdwatch_creates_total")

	// Three writes, three events: the counters move by what arrived.
	events := 0
	read := func(n int) {
		t.Helper()
		for want := events + n; events < want; {
			select {
			case r, ok := <-w.Responses():
				if !ok {
					t.Fatalf("watch ended: %v", w.Err())
				}
				events += len(r.Events)
			case <-ctx.Done():
				t.Fatal(ctx.Err())
			}
		}
	}
	for i := range 3 {
		_, err := kv.Put(ctx, &pb.PutRequest{Key: fmt.Appendf(nil, "k/%d", i), Value: []byte("v")})
		require.NoError(t, err)
	}
	read(3)
	require.Equal(t, 3.0, value("etcdwatch_events_total"))
	require.GreaterOrEqual(t, value("etcdwatch_responses_total"), 2.0) // the created response and at least one of events
	require.GreaterOrEqual(t, value("etcdwatch_last_message_timestamp_seconds"), float64(start.Unix()))
	require.Zero(t, value("etcdwatch_reconnects_total"))
	require.Equal(t, -1.0, value("etcdwatch_last_error_timestamp_seconds"))

	// A cut connection: the watch resumes on a new stream, and the
	// reconnect, the resumed watch and the error's time show.
	require.Equal(t, 1, proxy.Cut())
	_, err = kv.Put(ctx, &pb.PutRequest{Key: []byte("k/after-cut"), Value: []byte("v")})
	require.NoError(t, err)
	read(1)
	require.Equal(t, 4.0, value("etcdwatch_events_total"))
	require.GreaterOrEqual(t, value("etcdwatch_reconnects_total"), 1.0)
	require.GreaterOrEqual(t, value("etcdwatch_watches_moved_total"), 1.0)
	require.GreaterOrEqual(t, value("etcdwatch_creates_total"), 2.0)
	require.GreaterOrEqual(t, value("etcdwatch_last_error_timestamp_seconds"), float64(start.Unix()))
	require.Equal(t, 1.0, value("etcdwatch_connected"))
	require.Zero(t, value("etcdwatch_duplicates_dropped_total"))

	// A canceled watch stops counting once the dispatcher has the cancel:
	// a later command (RequestProgress, which finds no watch) says it has.
	w.Cancel()
	_, err = s.RequestProgress(ctx)
	require.ErrorIs(t, err, etcdwatch.ErrNoWatches)
	require.Zero(t, value("etcdwatch_watches"))
	require.NoError(t, s.Close())
	require.Equal(t, 4.0, value("etcdwatch_events_total")) // a closed Stream keeps its counts
}

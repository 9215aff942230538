package etcdwatchprom_test

import (
	"context"
	"fmt"
	"net/http/httptest"
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
	"github.com/etcdwatch/etcdwatch/group"
)

// fixedGroup is a GroupSource with given Streams.
type fixedGroup []group.StreamInfo

func (f fixedGroup) Streams() []group.StreamInfo { return f }

// TestGroupEveryStream: each Stream of a group gets a Collector's metrics
// labelled name/<its name>, the pinned Streams together as name/pinned,
// and where a Stream's member is known, etcdwatch_member_info says it. The
// metrics share a registry with a single Stream's Collector; a second
// group of the same name is refused.
func TestGroupEveryStream(t *testing.T) {
	since := time.Unix(1700000001, 0)
	g := fixedGroup{
		{Name: "0", Member: "10.0.0.1:2379", Stats: etcdwatch.Stats{Watches: 3, Events: 30, Reconnects: 1, Moved: 3}, State: etcdwatch.State{Connected: true, Since: since}},
		{Name: "1", Member: "", Stats: etcdwatch.Stats{Watches: 2, Events: 20}, State: etcdwatch.State{Since: since}},
		{Name: "pinned", Stats: etcdwatch.Stats{Watches: 1, Events: 7, Created: 4}, State: etcdwatch.State{Connected: true, Since: since}},
	}
	c := etcdwatchprom.NewGroup("w", g)
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(`
# HELP etcdwatch_events_total Events queued for consumers.
# TYPE etcdwatch_events_total counter
etcdwatch_events_total{stream="w/0"} 30
etcdwatch_events_total{stream="w/1"} 20
etcdwatch_events_total{stream="w/pinned"} 7
# HELP etcdwatch_watches_moved_total Watches re-created on a new stream after a reconnect, once it confirmed them.
# TYPE etcdwatch_watches_moved_total counter
etcdwatch_watches_moved_total{stream="w/0"} 3
etcdwatch_watches_moved_total{stream="w/1"} 0
etcdwatch_watches_moved_total{stream="w/pinned"} 0
# HELP etcdwatch_connected 1 while the server answers on the Watch stream (State.Connected), else 0.
# TYPE etcdwatch_connected gauge
etcdwatch_connected{stream="w/0"} 1
etcdwatch_connected{stream="w/1"} 0
etcdwatch_connected{stream="w/pinned"} 1
# HELP etcdwatch_member_info 1 for the member, by address, the Stream's Watch RPC is on.
# TYPE etcdwatch_member_info gauge
etcdwatch_member_info{member="10.0.0.1:2379",stream="w/0"} 1
`), "etcdwatch_events_total", "etcdwatch_watches_moved_total", "etcdwatch_connected", "etcdwatch_member_info"))
	require.Equal(t, 3*18+1, testutil.CollectAndCount(c)) // 18 metrics each without timestamps not yet set, and one member
	lint, err := testutil.CollectAndLint(c)
	require.NoError(t, err)
	require.Empty(t, lint)

	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	reg.MustRegister(etcdwatchprom.New("single", fixed{stats: etcdwatch.Stats{Events: 5}}))
	reg.MustRegister(etcdwatchprom.NewGroup("other", g))
	var dup prometheus.AlreadyRegisteredError
	require.ErrorAs(t, reg.Register(etcdwatchprom.NewGroup("w", g)), &dup)
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() == "etcdwatch_events_total" {
			require.Len(t, f.GetMetric(), 7) // w and other's three, single's one
		}
	}
}

// TestGroupValuesMove scrapes a GroupCollector over a Group of two Streams
// on a real etcd, through promhttp: each Stream's events, and its member.
func TestGroupValuesMove(t *testing.T) {
	member := etcdwatchtest.StartEtcd(t)
	g, err := group.Dial([]string{member.Endpoint}, group.WithStreams(2), group.WithDialOptions(dial.WithInsecure()))
	require.NoError(t, err)
	defer g.Close()
	direct, err := member.Dial()
	require.NoError(t, err)
	defer direct.Close()
	kv := pb.NewKVClient(direct)

	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(etcdwatchprom.NewGroup("g", g))
	web := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer web.Close()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Two watches on the first Stream, one on the second.
	ws, err := g.WatchAll(ctx, etcdwatch.Prefix("k/"), etcdwatch.Prefix("k/"), etcdwatch.Prefix("k/"))
	require.NoError(t, err)
	for i := range 2 {
		_, err := kv.Put(ctx, &pb.PutRequest{Key: fmt.Appendf(nil, "k/%d", i), Value: []byte("v")})
		require.NoError(t, err)
	}
	for _, w := range ws {
		for got := 0; got < 2; {
			select {
			case r, ok := <-w.Responses():
				if !ok {
					t.Fatalf("watch ended: %v", w.Err())
				}
				got += len(r.Events)
			case <-ctx.Done():
				t.Fatal(ctx.Err())
			}
		}
	}
	require.NoError(t, testutil.ScrapeAndCompare(web.URL, strings.NewReader(fmt.Sprintf(`
# HELP etcdwatch_events_total Events queued for consumers.
# TYPE etcdwatch_events_total counter
etcdwatch_events_total{stream="g/0"} 4
etcdwatch_events_total{stream="g/1"} 2
etcdwatch_events_total{stream="g/pinned"} 0
# HELP etcdwatch_watches Watches running now: creating, active or paused.
# TYPE etcdwatch_watches gauge
etcdwatch_watches{stream="g/0"} 2
etcdwatch_watches{stream="g/1"} 1
etcdwatch_watches{stream="g/pinned"} 0
# HELP etcdwatch_member_info 1 for the member, by address, the Stream's Watch RPC is on.
# TYPE etcdwatch_member_info gauge
etcdwatch_member_info{member=%q,stream="g/0"} 1
etcdwatch_member_info{member=%q,stream="g/1"} 1
`, member.Endpoint, member.Endpoint)), "etcdwatch_events_total", "etcdwatch_watches", "etcdwatch_member_info"))
}

// changingGroup is a GroupSource whose Streams change after NewGroup.
type changingGroup struct{ now []group.StreamInfo }

func (g *changingGroup) Streams() []group.StreamInfo { return g.now }

// TestGroupIgnoresStreamsUnknownAtNewGroup: NewGroup reads the names once;
// a Stream of another name at a later scrape is left out, not a panic.
// Catches a Collect that looks up every name it is given.
func TestGroupIgnoresStreamsUnknownAtNewGroup(t *testing.T) {
	g := &changingGroup{now: []group.StreamInfo{{Name: "0", Stats: etcdwatch.Stats{Events: 1}}}}
	c := etcdwatchprom.NewGroup("w", g)
	g.now = append(g.now, group.StreamInfo{Name: "1", Member: "10.0.0.2:2379", Stats: etcdwatch.Stats{Events: 9}})
	require.NotPanics(t, func() {
		require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(`
# HELP etcdwatch_events_total Events queued for consumers.
# TYPE etcdwatch_events_total counter
etcdwatch_events_total{stream="w/0"} 1
`), "etcdwatch_events_total", "etcdwatch_member_info"))
	})
}

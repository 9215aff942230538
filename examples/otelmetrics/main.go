// Command otelmetrics exports a Stream's Stats and State as OpenTelemetry
// metrics: observable instruments whose one callback reads Stats and State
// when the SDK collects, so nothing runs between collections.
//
// The demo starts an embedded etcd, watches a prefix, writes a few keys and
// prints what an SDK reader collected before and after. A program would
// give its MeterProvider a periodic reader and an exporter (OTLP, or
// Prometheus through go.opentelemetry.io/otel/exporters/prometheus)
// instead of the manual reader used here; register is the part to copy.
//
//	go run ./otelmetrics
package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"os"
	"slices"
	"strings"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/etcdwatch/etcdwatch"
	"github.com/etcdwatch/etcdwatch/etcdwatchtest"
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := run(ctx, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// register creates observable instruments over s on meter, each observed
// with the attribute stream=name, so that several Streams can share a
// meter. Their callback reads Stats and State once per collection. The
// caller unregisters them when s is closed.
//
// Counters (monotonic sums) and up-down counters are named as OpenTelemetry
// names them, without the _total that a Prometheus exporter adds.
func register(meter metric.Meter, name string, s *etcdwatch.Stream) (metric.Registration, error) {
	type counter struct {
		inst metric.Int64ObservableCounter
		get  func(etcdwatch.Stats) uint64
	}
	var (
		counters []counter
		insts    []metric.Observable
		errs     []error
	)
	addCounter := func(n, unit, desc string, get func(etcdwatch.Stats) uint64) {
		c, err := meter.Int64ObservableCounter("etcdwatch."+n, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		counters = append(counters, counter{c, get})
		insts = append(insts, c)
	}
	addCounter("events", "{event}", "Events queued for consumers.", func(st etcdwatch.Stats) uint64 { return st.Events })
	addCounter("responses", "{response}", "Responses received from the server.", func(st etcdwatch.Stats) uint64 { return st.Responses })
	addCounter("creates", "{response}", "Created responses accepted, resumes included.", func(st etcdwatch.Stats) uint64 { return st.Created })
	addCounter("stalls", "{stall}", "Times the stream waited for a consumer at its buffer limit.", func(st etcdwatch.Stats) uint64 { return st.Stalls })
	addCounter("pauses", "{pause}", "Times a watch was paused because its consumer fell behind.", func(st etcdwatch.Stats) uint64 { return st.Pauses })
	addCounter("resumes", "{resume}", "Times a paused watch was re-created.", func(st etcdwatch.Stats) uint64 { return st.Resumes })
	addCounter("fragments", "{response}", "Fragment responses joined into whole revisions.", func(st etcdwatch.Stats) uint64 { return st.Fragments })
	addCounter("duplicates_dropped", "{event}", "Events at or below a watch's revision that were dropped.", func(st etcdwatch.Stats) uint64 { return st.DuplicatesDropped })
	addCounter("unknown_responses", "{response}", "Responses for watch ids the stream did not know.", func(st etcdwatch.Stats) uint64 { return st.UnknownResponses })
	addCounter("reconnects", "{stream}", "gRPC Watch streams replaced after they ended.", func(st etcdwatch.Stats) uint64 { return st.Reconnects })
	addCounter("watches_moved", "{watch}", "Watches re-created on a new stream after a reconnect.", func(st etcdwatch.Stats) uint64 { return st.Moved })

	watches, err := meter.Int64ObservableUpDownCounter("etcdwatch.watches", metric.WithUnit("{watch}"),
		metric.WithDescription("Watches running now: creating, active or paused."))
	errs = append(errs, err)
	paused, err := meter.Int64ObservableUpDownCounter("etcdwatch.paused_watches", metric.WithUnit("{watch}"),
		metric.WithDescription("Watches paused now because their consumer fell behind."))
	errs = append(errs, err)
	gauge := func(n, unit, desc string) metric.Int64ObservableGauge {
		g, err := meter.Int64ObservableGauge("etcdwatch."+n, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		insts = append(insts, g)
		return g
	}
	connected := gauge("connected", "", "1 while the server answers on the current Watch stream, else 0.")
	failed := gauge("failed", "", "1 once the Watch stream failed for good (its watches ended; no new stream is tried), else 0.")
	revision := gauge("revision", "{revision}", "The highest revision seen in a response header, or a compaction's if higher.")
	rewritten := gauge("ids_rewritten", "", "1 if the server chose its own watch ids (a gRPC proxy), else 0.")
	timestamp := func(n, desc string) metric.Float64ObservableGauge {
		g, err := meter.Float64ObservableGauge("etcdwatch."+n, metric.WithUnit("s"), metric.WithDescription(desc))
		errs = append(errs, err)
		insts = append(insts, g)
		return g
	}
	lastError := timestamp("last_error_timestamp", "When the last error ended a Watch stream or kept one from opening, in Unix time; absent before the first.")
	lastMessage := timestamp("last_message_timestamp", "When the last response arrived, in Unix time; absent before the first.")
	since := timestamp("state_since_timestamp", "When connected last changed, in Unix time; the Stream's opening at first.")
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	insts = append(insts, watches, paused)

	attrs := metric.WithAttributeSet(attribute.NewSet(attribute.String("stream", name)))
	return meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		st, state := s.Stats(), s.State()
		for _, c := range counters {
			o.ObserveInt64(c.inst, int64(c.get(st)), attrs)
		}
		o.ObserveInt64(watches, st.Watches, attrs)
		o.ObserveInt64(paused, st.Paused, attrs)
		o.ObserveInt64(connected, one(state.Connected), attrs)
		o.ObserveInt64(failed, one(state.Failed != nil), attrs)
		o.ObserveInt64(revision, st.Revision, attrs)
		o.ObserveInt64(rewritten, one(st.IDsRewritten), attrs)
		stamp := func(g metric.Float64ObservableGauge, at time.Time) {
			if !at.IsZero() {
				o.ObserveFloat64(g, float64(at.UnixNano())/1e9, attrs)
			}
		}
		stamp(lastError, state.LastErrorAt)
		stamp(lastMessage, st.LastMessage)
		stamp(since, state.Since)
		return nil
	}, insts...)
}

// one is 1 for true, 0 for false: a gauge of a condition.
func one(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// run is the demo: an embedded etcd, a Stream with its instruments, three
// writes, and the values collected before and after them.
func run(ctx context.Context, out io.Writer) error {
	dir, err := os.MkdirTemp("", "otelmetrics-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	member, err := etcdwatchtest.StartEtcdIn(dir)
	if err != nil {
		return err
	}
	defer member.Stop()
	conn, err := member.Dial()
	if err != nil {
		return err
	}
	defer conn.Close()
	s, err := etcdwatch.Open(conn)
	if err != nil {
		return err
	}
	defer s.Close()

	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer provider.Shutdown(context.Background())
	reg, err := register(provider.Meter("github.com/etcdwatch/etcdwatch/examples/otelmetrics"), "demo", s)
	if err != nil {
		return err
	}
	defer reg.Unregister()
	show := func(when string) error {
		values, err := collect(ctx, reader)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "%s:", when)
		for _, name := range []string{"etcdwatch.watches", "etcdwatch.events", "etcdwatch.reconnects"} {
			fmt.Fprintf(out, " %s=%v", name, values[name+`{stream=demo}`])
		}
		fmt.Fprintln(out)
		return nil
	}

	if err := show("before"); err != nil {
		return err
	}
	w, err := s.Watch(ctx, etcdwatch.Prefix("demo/"))
	if err != nil {
		return err
	}
	kv := pb.NewKVClient(conn)
	for i := range 3 {
		if _, err := kv.Put(ctx, &pb.PutRequest{Key: fmt.Appendf(nil, "demo/%d", i), Value: []byte("v")}); err != nil {
			return err
		}
	}
	for n := 0; n < 3; {
		select {
		case r, ok := <-w.Responses():
			if !ok {
				return w.Err() // ended: say why, rather than wait for ctx on a closed channel
			}
			n += len(r.Events)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return show("after three writes")
}

// collect reads every data point from reader, keyed by instrument name and
// attributes, as in etcdwatch.events{stream=demo}.
func collect(ctx context.Context, reader sdkmetric.Reader) (map[string]float64, error) {
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		return nil, err
	}
	values := make(map[string]float64)
	key := func(name string, set attribute.Set) string {
		var kvs []string
		for _, kv := range set.ToSlice() {
			kvs = append(kvs, string(kv.Key)+"="+kv.Value.String())
		}
		slices.Sort(kvs)
		return name + "{" + strings.Join(kvs, ",") + "}"
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch data := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range data.DataPoints {
					values[key(m.Name, p.Attributes)] = float64(p.Value)
				}
			case metricdata.Gauge[int64]:
				for _, p := range data.DataPoints {
					values[key(m.Name, p.Attributes)] = float64(p.Value)
				}
			case metricdata.Gauge[float64]:
				for _, p := range data.DataPoints {
					values[key(m.Name, p.Attributes)] = p.Value
				}
			}
		}
	}
	return values, nil
}

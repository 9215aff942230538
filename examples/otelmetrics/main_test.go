package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.uber.org/goleak"

	"github.com/etcdwatch/etcdwatch"
	"github.com/etcdwatch/etcdwatch/dial"
	"github.com/etcdwatch/etcdwatch/etcdwatchtest"
)

// TestMain checks that nothing outlives the tests but the idle peer HTTP
// connections of stopped etcd members, which close on their own.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, etcdwatchtest.LeakOptions()...)
}

// TestDemo runs the program as `go run ./otelmetrics` does.
func TestDemo(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out bytes.Buffer
	require.NoError(t, run(ctx, &out))
	require.Equal(t, `before: etcdwatch.watches=0 etcdwatch.events=0 etcdwatch.reconnects=0
after three writes: etcdwatch.watches=1 etcdwatch.events=3 etcdwatch.reconnects=0
`, out.String())
}

// TestValuesMove collects, with the SDK's manual reader, the instruments of
// two Streams on one meter, as events flow on one of them and its
// connection is cut.
func TestValuesMove(t *testing.T) {
	member := etcdwatchtest.StartEtcd(t)
	proxy := etcdwatchtest.NewProxy(t, member.Endpoint)
	conn, err := dial.New([]string{proxy.Addr()}, dial.WithInsecure())
	require.NoError(t, err)
	defer conn.Close()
	busy, err := etcdwatch.Open(conn)
	require.NoError(t, err)
	defer busy.Close()
	direct, err := member.Dial()
	require.NoError(t, err)
	defer direct.Close()
	idle, err := etcdwatch.Open(direct)
	require.NoError(t, err)
	defer idle.Close()

	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer provider.Shutdown(context.Background())
	meter := provider.Meter("test")
	for name, s := range map[string]*etcdwatch.Stream{"busy": busy, "idle": idle} {
		reg, err := register(meter, name, s)
		require.NoError(t, err)
		defer reg.Unregister()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	values := func() map[string]float64 {
		t.Helper()
		v, err := collect(ctx, reader)
		require.NoError(t, err)
		return v
	}

	opened := time.Now()
	v := values()
	require.Equal(t, 0.0, v["etcdwatch.events{stream=busy}"])
	require.Equal(t, 0.0, v["etcdwatch.events{stream=idle}"])
	require.NotContains(t, v, "etcdwatch.last_error_timestamp{stream=busy}")
	require.NotContains(t, v, "etcdwatch.last_message_timestamp{stream=idle}", "no response yet")
	require.Contains(t, v, "etcdwatch.state_since_timestamp{stream=idle}")

	w, err := busy.Watch(ctx, etcdwatch.Prefix("k/"))
	require.NoError(t, err)
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
	kv := pb.NewKVClient(direct)
	put := func(key string) {
		t.Helper()
		_, err := kv.Put(ctx, &pb.PutRequest{Key: []byte(key), Value: []byte("v")})
		require.NoError(t, err)
	}
	for _, k := range []string{"k/a", "k/b", "k/c"} {
		put(k)
	}
	read(3)
	v = values()
	require.Equal(t, 1.0, v["etcdwatch.watches{stream=busy}"])
	require.Equal(t, 3.0, v["etcdwatch.events{stream=busy}"])
	require.GreaterOrEqual(t, v["etcdwatch.responses{stream=busy}"], 2.0)
	require.Equal(t, 1.0, v["etcdwatch.connected{stream=busy}"])
	require.GreaterOrEqual(t, v["etcdwatch.revision{stream=busy}"], 4.0, "three puts seen")
	require.Equal(t, 0.0, v["etcdwatch.failed{stream=busy}"])
	require.Contains(t, v, "etcdwatch.failed{stream=idle}")
	require.Equal(t, 0.0, v["etcdwatch.ids_rewritten{stream=busy}"])
	require.GreaterOrEqual(t, v["etcdwatch.last_message_timestamp{stream=busy}"], float64(opened.Unix()))
	require.Equal(t, 0.0, v["etcdwatch.watches{stream=idle}"])
	require.Equal(t, 0.0, v["etcdwatch.events{stream=idle}"])

	start := time.Now()
	require.Equal(t, 1, proxy.Cut())
	put("k/after-cut")
	read(1)
	v = values()
	require.Equal(t, 4.0, v["etcdwatch.events{stream=busy}"])
	require.GreaterOrEqual(t, v["etcdwatch.reconnects{stream=busy}"], 1.0)
	require.GreaterOrEqual(t, v["etcdwatch.watches_moved{stream=busy}"], 1.0)
	require.GreaterOrEqual(t, v["etcdwatch.last_error_timestamp{stream=busy}"], float64(start.Unix()))
	require.Equal(t, 0.0, v["etcdwatch.reconnects{stream=idle}"])
}

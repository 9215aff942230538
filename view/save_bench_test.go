package view_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/etcdwatch/etcdwatch"
	ws "github.com/etcdwatch/etcdwatch/internal/watchserver"
	"github.com/etcdwatch/etcdwatch/view"
)

type sized struct{ N int }

// BenchmarkSaveMemory reports what WithSave costs a view in heap per key:
// a view of 50,000 keys of 256-byte JSON values, with and without it, for
// a Decoder that keeps its value (DecodeBytes: the saved value is that
// buffer) and one that does not (DecodeJSON: the saved value is kept for
// itself). Run with -benchtime 1x; each iteration lists afresh.
func BenchmarkSaveMemory(b *testing.B) {
	const keys = 50_000
	value := `{"N":1,"pad":"` + strings.Repeat("x", 256-len(`{"N":1,"pad":""}`)) + `"}`
	for _, c := range []struct {
		name string
		open func(ctx context.Context, s *etcdwatch.Stream, opts ...view.Option) (any, error)
	}{
		{"bytes", func(ctx context.Context, s *etcdwatch.Stream, opts ...view.Option) (any, error) {
			return view.New(ctx, s, etcdwatch.Prefix("v/"), view.DecodeBytes, opts...)
		}},
		{"json", func(ctx context.Context, s *etcdwatch.Stream, opts ...view.Option) (any, error) {
			return view.New(ctx, s, etcdwatch.Prefix("v/"), view.DecodeJSON[sized], opts...)
		}},
	} {
		for _, save := range []bool{false, true} {
			b.Run(fmt.Sprintf("%s/save=%v", c.name, save), func(b *testing.B) {
				server := ws.Start(b)
				kv := server.KV()
				kv.ServeStreams(1000)
				for i := range keys {
					kv.Put(fmt.Sprintf("v/%06d", i), value)
				}
				s, err := etcdwatch.Open(server.Dial(b))
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { s.Close() })
				go serveStreams(b, server, kv) // returns when the benchmark ends
				var opts []view.Option
				if save {
					opts = append(opts, view.WithSave())
				}
				var perKey float64
				for b.Loop() {
					before := heapAfterGC()
					v, err := c.open(context.Background(), s, opts...)
					if err != nil {
						b.Fatal(err)
					}
					perKey = float64(int64(heapAfterGC())-int64(before)) / keys
					v.(interface{ Close() error }).Close()
				}
				b.ReportMetric(perKey, "B/key")
			})
		}
	}
}

// serveStreams serves every Watch stream opened on server with
// serveCreates (a view's watch is on a stream of its own, for isolated
// watches), until tb's Context ends.
func serveStreams(tb testing.TB, server *ws.Server, kv *ws.KV) {
	for {
		select {
		case st := <-server.Streams():
			go serveCreates(tb, st, kv) // returns when the stream ends
		case <-tb.Context().Done():
			return
		}
	}
}

// serveCreates confirms every create, and answers every progress request
// (New asks once its watch is confirmed), at the KV's revision, until the
// stream ends.
func serveCreates(tb testing.TB, st *ws.Stream, kv *ws.KV) {
	for req := range st.Requests() {
		switch {
		case req.GetCreateRequest() != nil:
			st.Send(tb, ws.Created(req.GetCreateRequest().WatchId, kv.Revision()))
		case req.GetProgressRequest() != nil:
			st.Send(tb, ws.Progress(-1, kv.Revision()))
		}
	}
}

func heapAfterGC() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// BenchmarkViewMemory reports a view's heap per key beyond its keys' and
// values' own bytes (Stats.Bytes), as the bench program's viewsync does
// against etcd: 100,000 keys named as viewsync's (17 bytes), of 1 KiB
// values, DecodeBytes, listed from the scripted server's RangeStream. Run
// with -benchtime 1x; each iteration lists afresh.
func BenchmarkViewMemory(b *testing.B) {
	const keys = 100_000
	value := strings.Repeat("v", 1024)
	server := ws.Start(b)
	kv := server.KV()
	kv.ServeStreams(1000)
	for i := range keys {
		kv.Put(fmt.Sprintf("bench/view/%06d", i), value)
	}
	s, err := etcdwatch.Open(server.Dial(b))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	go serveStreams(b, server, kv) // returns when the benchmark ends
	var overhead float64
	for b.Loop() {
		before := heapAfterGC()
		v, err := view.New(context.Background(), s, etcdwatch.Prefix("bench/view/"), view.DecodeBytes)
		if err != nil {
			b.Fatal(err)
		}
		perKey := float64(int64(heapAfterGC())-int64(before)) / keys
		overhead = perKey - float64(v.Stats().Bytes)/keys
		v.Close()
	}
	b.ReportMetric(overhead, "overhead-B/key")
}

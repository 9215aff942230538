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
				go serveCreates(b, server.Accept(b), kv) // returns when the Stream ends
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

// serveCreates confirms every create at the KV's revision, until the
// stream ends.
func serveCreates(tb testing.TB, st *ws.Stream, kv *ws.KV) {
	for req := range st.Requests() {
		if c := req.GetCreateRequest(); c != nil {
			st.Send(tb, ws.Created(c.WatchId, kv.Revision()))
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

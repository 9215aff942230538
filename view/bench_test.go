package view_test

import (
	"context"
	"fmt"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/etcdwatch/etcdwatch"
	ws "github.com/etcdwatch/etcdwatch/internal/watchserver"
	"github.com/etcdwatch/etcdwatch/view"
)

// benchStream is a Stream on a scripted server, as the root package's
// BenchmarkDeliver has it, and the server.
func benchStream(b *testing.B, opts ...etcdwatch.Option) (*etcdwatch.Stream, *ws.Server) {
	server := ws.Start(b)
	s, err := etcdwatch.Open(server.Dial(b), opts...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	server.Accept(b) // the main stream, which the view does not use
	return s, server
}

// BenchmarkViewApply measures the path from a received response into a View
// with one subscriber that reads every batch, with 1 and 100 events
// (32-byte keys and values, over 10,000 keys) per response: compare it with
// the root package's BenchmarkDeliver, the Stream's own delivery, which
// runs the same server and events (go test -bench 'ViewApply|Deliver' . ./view).
func BenchmarkViewApply(b *testing.B) {
	for _, per := range []int{1, 100} {
		b.Run(fmt.Sprintf("events=%d", per), func(b *testing.B) {
			// No pauses: the scripted server does not re-create watches.
			s, server := benchStream(b, etcdwatch.WithBufferLimit(1<<30), etcdwatch.WithBufferBytes(1<<40))
			res := make(chan *view.View[[]byte], 1)
			go func() {
				// History enough for a subscriber scheduled late: at millions of events
				// a second, 8 MiB lasts a few milliseconds.
				v, err := view.New(context.Background(), s, etcdwatch.Prefix("key-"), view.DecodeBytes, view.WithHistoryBytes(1<<30))
				if err != nil {
					b.Error(err)
				}
				res <- v
			}()
			srv := server.Accept(b) // the isolated watches' stream, which the view's opens
			c := srv.RecvCreate(b)
			srv.Send(b, ws.Created(c.WatchId, 1))
			srv.Recv(b) // the progress request New makes once its watch is confirmed
			srv.Send(b, ws.Progress(-1, 1))
			v := <-res
			b.Cleanup(func() { v.Close() })
			sub := v.Subscribe(context.Background(), 1)
			evs := make([]*mvccpb.Event, per)
			for i := range evs {
				evs[i] = &mvccpb.Event{Kv: &mvccpb.KeyValue{Value: fmt.Appendf(nil, "value-%025d", i), CreateRevision: 2, Version: 1}}
			}
			keys := make([][]byte, 10000)
			for i := range keys {
				keys[i] = fmt.Appendf(nil, "key-%027d", i)
			}
			b.ReportAllocs()
			b.ResetTimer()
			go func() {
				resp := &pb.WatchResponse{Header: ws.Header(0), WatchId: c.WatchId, Events: evs}
				k := 0
				for rev := int64(2); rev < int64(b.N)+2; rev++ {
					resp.Header.Revision = rev
					for _, e := range evs {
						e.Kv.Key = keys[k%len(keys)]
						e.Kv.ModRevision = rev
						k++
					}
					srv.Send(b, resp)
				}
			}()
			for got := 0; got < b.N*per; {
				batch, err := sub.Next(context.Background())
				if err != nil {
					b.Fatal(err)
				}
				if batch.Kind == view.Resync {
					b.Fatal("the subscriber fell behind")
				}
				got += len(batch.Changes)
			}
			b.ReportMetric(float64(b.N*per)/b.Elapsed().Seconds(), "events/s")
		})
	}
}

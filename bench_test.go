package etcdwatch_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/etcdwatch/etcdwatch"
	ws "github.com/etcdwatch/etcdwatch/internal/watchserver"
)

// benchStream is a Stream on a scripted server that confirms every create.
func benchStream(b *testing.B, opts ...etcdwatch.Option) (*etcdwatch.Stream, *ws.Stream) {
	server := ws.Start(b)
	s, err := etcdwatch.Open(server.Dial(b), opts...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	return s, server.Accept(b)
}

// BenchmarkDeliver measures the path from a received response to the
// consumer, with 1 and 100 events (32-byte keys and values) per response.
// The scripted server's sending cost is included.
func BenchmarkDeliver(b *testing.B) {
	for _, per := range []int{1, 100} {
		b.Run(fmt.Sprintf("events=%d", per), func(b *testing.B) {
			s, srv := benchStream(b, etcdwatch.WithBufferLimit(1<<30))
			res := make(chan *etcdwatch.Watch, 1)
			go func() {
				w, err := s.Watch(context.Background(), etcdwatch.Prefix("key-"))
				if err != nil {
					b.Error(err)
				}
				res <- w
			}()
			c := srv.RecvCreate(b)
			srv.Send(b, ws.Created(c.WatchId, 1))
			w := <-res
			evs := make([]*mvccpb.Event, per)
			for i := range evs {
				evs[i] = &mvccpb.Event{Kv: &mvccpb.KeyValue{Key: fmt.Appendf(nil, "key-%027d", i), Value: fmt.Appendf(nil, "value-%025d", i)}}
			}
			b.ReportAllocs()
			b.ResetTimer()
			go func() {
				resp := &pb.WatchResponse{Header: ws.Header(0), WatchId: c.WatchId, Events: evs}
				for rev := int64(2); rev < int64(b.N)+2; rev++ {
					resp.Header.Revision = rev
					for _, e := range evs {
						e.Kv.ModRevision = rev
					}
					srv.Send(b, resp)
				}
			}()
			for got := 0; got < b.N; got++ {
				<-w.Responses()
			}
			b.ReportMetric(float64(b.N*per)/b.Elapsed().Seconds(), "events/s")
		})
	}
}

// BenchmarkCreate measures opening watches from 64 goroutines on one stream.
func BenchmarkCreate(b *testing.B) {
	s, srv := benchStream(b)
	go func() {
		for req := range srv.Requests() {
			if c := req.GetCreateRequest(); c != nil {
				srv.Send(b, ws.Created(c.WatchId, 1))
			}
		}
	}()
	b.ReportAllocs()
	b.ResetTimer()
	var wg sync.WaitGroup
	next := make(chan int)
	for range 64 {
		wg.Go(func() {
			for i := range next {
				if _, err := s.Watch(context.Background(), etcdwatch.Key(fmt.Sprint("k", i))); err != nil {
					b.Error(err)
				}
			}
		})
	}
	for i := range b.N {
		next <- i
	}
	close(next)
	wg.Wait()
}

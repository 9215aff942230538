package etcdwatch_test

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

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
			for got := 0; got < b.N*per; { // a consumer that is behind may take several responses in one
				r, ok := <-w.Responses()
				if !ok {
					b.Fatal(w.Err())
				}
				got += len(r.Events)
			}
			b.ReportMetric(float64(b.N*per)/b.Elapsed().Seconds(), "events/s")
		})
	}
}

// BenchmarkCreate measures opening watches on one stream: from 64
// goroutines calling Watch, from a goroutine each, and by WatchAll calls of
// 1,000 watches.
func BenchmarkCreate(b *testing.B) {
	b.Run("Watch-64-goroutines", func(b *testing.B) {
		s := confirmingStream(b)
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
	})
	b.Run("Watch-goroutine-each", func(b *testing.B) {
		// As an application that starts a goroutine per watch: each call
		// runs on a fresh goroutine's stack, which grows if the call needs
		// more than its first 2 KiB.
		s := confirmingStream(b)
		var wg sync.WaitGroup
		for i := range b.N {
			wg.Go(func() {
				if _, err := s.Watch(context.Background(), etcdwatch.Key(fmt.Sprint("k", i))); err != nil {
					b.Error(err)
				}
			})
		}
		wg.Wait()
	})
	b.Run("WatchAll-1000", func(b *testing.B) {
		s := confirmingStream(b)
		rs := make([]etcdwatch.Request, 1000)
		for i := range b.N {
			for j := range rs {
				rs[j] = etcdwatch.Key(fmt.Sprint("k", i, "/", j))
			}
			if _, err := s.WatchAll(context.Background(), rs...); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(rs)), "ns/watch")
	})
}

// confirmingStream is a Stream on a scripted server that confirms every
// create; the benchmark's timer starts when it returns.
func confirmingStream(b *testing.B) *etcdwatch.Stream {
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
	return s
}

// BenchmarkResume measures re-creating 5,000 watches on a new stream after
// the old one broke, until the server has confirmed every one.
func BenchmarkResume(b *testing.B) {
	const n = 5000
	server := ws.Start(b)
	// Streams break here faster than backoff forgives: retry at once.
	s, err := etcdwatch.Open(server.Dial(b), etcdwatch.WithReconnectBackoff(time.Microsecond, time.Microsecond))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	// confirm answers every create on st and reports each on created.
	confirm := func(st *ws.Stream, created chan<- struct{}) {
		for req := range st.Requests() {
			if c := req.GetCreateRequest(); c != nil {
				st.Send(b, ws.Created(c.WatchId, 1))
				created <- struct{}{}
			}
		}
	}
	created := make(chan struct{}, n)
	srv := server.Accept(b)
	go confirm(srv, created)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			if _, err := s.Watch(context.Background(), etcdwatch.Key(fmt.Sprint("k", i))); err != nil {
				b.Error(err)
			}
		})
	}
	wg.Wait()
	for range n {
		<-created
	}
	st := s.Stats()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		srv.Close(status.Error(codes.Unavailable, "member going away"))
		srv = server.Accept(b)
		go confirm(srv, created)
		for range n {
			<-created
		}
		for s.Stats().Created < st.Created+uint64(n) { // the last confirmations are being handled
			runtime.Gosched() // polling: a benchmark may, a test may not
		}
		st = s.Stats()
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*n), "µs/watch")
}

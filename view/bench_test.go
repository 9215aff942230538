package view_test

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

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
	return s, server
}

// applyKeys is how many distinct keys BenchmarkViewApply's events cycle
// over, and applyRound how many events each contender takes a round.
const (
	applyKeys  = 10_000
	applyRound = 20_000
)

// BenchmarkViewApply measures, side by side, the path from a received
// response into a View with one subscriber that reads every batch ("view"),
// the Stream's own delivery of the same responses to a bare Watch
// ("stream", as the root package's BenchmarkDeliver), and that delivery
// into a Go map ("map": the least any cache of the keys does, a floor for
// the view): 1 and 100 events per response, 32-byte keys (over 10,000
// keys) and values, from a scripted server sending as fast as it can. Each
// iteration is a round of 20,000 events for each contender, in an order
// that rotates, so that all see the same machine; it reports each one's
// events/s, view/stream (the target is at least 0.8), map/stream and
// view/map.
func BenchmarkViewApply(b *testing.B) {
	for _, per := range []int{1, 100} {
		b.Run(fmt.Sprintf("events=%d", per), func(b *testing.B) {
			feeds := [3]*applyFeed{newStreamFeed(b, per), newViewFeed(b, per), newMapFeed(b, per)}
			var took [3]time.Duration
			b.ReportAllocs()
			b.ResetTimer()
			round := 0
			for b.Loop() {
				for k := range feeds {
					i := (k + round) % len(feeds)
					took[i] += feeds[i].round(b)
				}
				round++
			}
			events := float64(round * applyRound)
			stream, view, cache := events/took[0].Seconds(), events/took[1].Seconds(), events/took[2].Seconds()
			b.ReportMetric(stream, "stream-events/s")
			b.ReportMetric(view, "view-events/s")
			b.ReportMetric(cache, "map-events/s")
			b.ReportMetric(view/stream, "view/stream")
			b.ReportMetric(cache/stream, "map/stream")
			b.ReportMetric(view/cache, "view/map")
		})
	}
}

// applyFeed is one contender of BenchmarkViewApply: a scripted watch
// stream, the watch's id on it, and the consumer, which takes n events.
type applyFeed struct {
	srv     *ws.Stream
	id      int64
	per     int
	consume func(b *testing.B, n int)
	rev     int64 // the last revision sent
	key     int   // the next key to send, of applyKeys
	evs     []*mvccpb.Event
	keys    [][]byte
}

func newFeed(srv *ws.Stream, id int64, per int) *applyFeed {
	f := &applyFeed{srv: srv, id: id, per: per, rev: 1, evs: make([]*mvccpb.Event, per), keys: make([][]byte, applyKeys)}
	for i := range f.evs {
		f.evs[i] = &mvccpb.Event{Kv: &mvccpb.KeyValue{Value: fmt.Appendf(nil, "value-%025d", i), CreateRevision: 2, Version: 1}}
	}
	for i := range f.keys {
		f.keys[i] = fmt.Appendf(nil, "key-%027d", i)
	}
	return f
}

// round sends a round of events from a goroutine of its own and returns
// how long the consumer took to have them all, from the first send.
func (f *applyFeed) round(b *testing.B) time.Duration {
	sent := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(sent)
		resp := &pb.WatchResponse{Header: ws.Header(0), WatchId: f.id, Events: f.evs}
		for range applyRound / f.per {
			f.rev++
			resp.Header.Revision = f.rev
			for _, e := range f.evs {
				e.Kv.Key = f.keys[f.key]
				e.Kv.ModRevision = f.rev
				f.key = (f.key + 1) % len(f.keys)
			}
			f.srv.Send(b, resp)
		}
	}()
	f.consume(b, applyRound)
	took := time.Since(start)
	<-sent
	return took
}

// newStreamFeed is the stream contender: a Watch whose consumer counts
// each Response's events.
func newStreamFeed(b *testing.B, per int) *applyFeed {
	f, w := watchFeed(b, per)
	f.consume = func(b *testing.B, n int) {
		for got := 0; got < n; { // a consumer that is behind may take several responses in one
			r, ok := <-w.Responses()
			if !ok {
				b.Fatal(w.Err())
			}
			got += len(r.Events)
		}
	}
	return f
}

// cached is what newMapFeed keeps of a key.
type cached struct {
	value                                       []byte
	createRevision, modRevision, version, lease int64
}

// newMapFeed is the map contender: a Watch whose consumer keeps each
// event's key and value in a map, as a hand-written cache would, with none
// of a view's snapshots, history or subscribers. It keeps each event's
// value as the Stream gave it (its buffer is the event's own), updates a
// key it holds in place, and makes a string of a key only when the key is
// new.
func newMapFeed(b *testing.B, per int) *applyFeed {
	f, w := watchFeed(b, per)
	keys := make(map[string]*cached, applyKeys)
	f.consume = func(b *testing.B, n int) {
		for got := 0; got < n; {
			r, ok := <-w.Responses()
			if !ok {
				b.Fatal(w.Err())
			}
			for _, e := range r.Events {
				if e.Type == etcdwatch.Delete {
					delete(keys, string(e.Key))
					continue
				}
				c := cached{e.Value, e.CreateRevision, e.ModRevision, e.Version, e.Lease}
				if held, ok := keys[string(e.Key)]; ok { // a lookup makes no string
					*held = c
				} else {
					keys[string(e.Key)] = &c
				}
			}
			got += len(r.Events)
		}
	}
	return f
}

// watchFeed opens a bare Watch of the feeds' keys on a scripted server and
// returns its feed, without a consumer, and the Watch.
func watchFeed(b *testing.B, per int) (*applyFeed, *etcdwatch.Watch) {
	s, server := benchStream(b, etcdwatch.WithBufferLimit(1<<30))
	srv := server.Accept(b)
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
	return newFeed(srv, c.WatchId, per), w
}

// newViewFeed is the view contender: a View of an empty range whose one
// subscriber reads every batch and counts its changes.
func newViewFeed(b *testing.B, per int) *applyFeed {
	// No pauses: the scripted server does not re-create watches.
	s, server := benchStream(b, etcdwatch.WithBufferLimit(1<<30), etcdwatch.WithBufferBytes(math.MaxInt))
	server.Accept(b) // the main stream, which the view does not use
	res := make(chan *view.View[[]byte], 1)
	go func() {
		// History for a subscriber scheduled late: a round is about 4 MiB of it.
		v, err := view.New(context.Background(), s, etcdwatch.Prefix("key-"), view.DecodeBytes, view.WithHistoryBytes(64<<20))
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
	f := newFeed(srv, c.WatchId, per)
	f.consume = func(b *testing.B, n int) {
		for got := 0; got < n; {
			batch, err := sub.Next(context.Background())
			if err != nil {
				b.Fatal(err)
			}
			if batch.Kind == view.Resync {
				b.Fatal("the subscriber fell behind")
			}
			got += len(batch.Changes)
		}
	}
	return f
}

package scenarios

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/etcdwatch/etcdwatch"
)

// progress: RequestProgress answers with a revision that covers every
// write made before the call, and every watch gets it as a bookmark after
// its events. A stream without watches gets ErrNoWatches.
//
// On a server with etcd #15220 the answer can overtake an event the server
// has not sent yet (see progressOrder), so there the Stream refuses
// RequestProgress with ErrProgressUnsupported, and the watch's event still
// arrives.
func progress(t *testing.T, e *Env) {
	s, ctx, prefix := open(t, e.Endpoint), t.Context(), unique("progress")
	_, err := s.RequestProgress(ctx)
	check(t, errors.Is(err, etcdwatch.ErrNoWatches), "RequestProgress without watches on etcd %s: %v", e.Version, err) // on every release, known or not yet
	var watches []*etcdwatch.Watch
	for i := range 3 {
		w, err := s.Watch(ctx, etcdwatch.Key(fmt.Sprint(prefix, i)))
		must(t, err)
		watches = append(watches, w)
	}
	put := e.put(t, prefix+"0", "v")
	if e.Version.ProgressRunsAhead() {
		_, err := s.RequestProgress(ctx)
		check(t, errors.Is(err, etcdwatch.ErrProgressUnsupported), "RequestProgress on etcd %s: %v", e.Version, err)
		events := nextEvents(t, watches[0])
		check(t, events[0].ModRevision == put, "event at %d, want %d", events[0].ModRevision, put)
		return
	}
	rev, err := s.RequestProgress(ctx)
	must(t, err)
	check(t, rev >= put, "progress at %d, below the write at %d", rev, put)
	for i, w := range watches {
		if i == 0 {
			r := next(t, w)
			check(t, !r.IsProgress() && r.Events[0].ModRevision == put, "watch 0: want its event at %d first, got %+v", put, r)
		}
		r := next(t, w)
		check(t, r.IsProgress() && r.Revision == rev, "watch %d: want a bookmark at %d, got %+v", i, rev, r)
	}
	again, err := s.RequestProgress(ctx)
	must(t, err)
	check(t, again >= rev, "a second answer went back: %d after %d", again, rev)
	for i, w := range watches {
		untilBookmark(t, w, again)
		check(t, w.Revision() == again, "watch %d: Revision %d after the bookmark at %d", i, w.Revision(), again)
	}
}

// load is a bounded burst of puts under one prefix from several writers.
type load struct {
	writers, each int
	mu            sync.Mutex
	revs          []int64
	err           error
}

// run writes, then returns the revisions written, in order.
func (l *load) run(ctx context.Context, e *Env, prefix string) []int64 {
	var wg sync.WaitGroup
	for g := range l.writers {
		wg.Go(func() {
			for i := range l.each {
				rev, err := e.tryPut(ctx, fmt.Sprint(prefix, g), fmt.Sprint(i))
				l.mu.Lock()
				if err != nil {
					l.err = err
					l.mu.Unlock()
					return
				}
				l.revs = append(l.revs, rev)
				l.mu.Unlock()
			}
		})
	}
	wg.Wait()
	slices.Sort(l.revs)
	return l.revs
}

// progressOrder asks for progress continuously while several writers keep
// a watch busy, and counts events that arrive at or below a progress
// answer already received: etcd #15220. On raw gRPC that is the server's
// order; through etcdwatch it is events lost, since a bookmark at R marks
// everything up to R delivered. Servers without the bug must show none;
// on those with it, the counts are logged as evidence.
func progressOrder(t *testing.T, e *Env) {
	t.Run("raw", func(t *testing.T) { progressOrderRaw(t, e) })
	t.Run("etcdwatch", func(t *testing.T) { progressOrderClient(t, e) })
}

func progressOrderRaw(t *testing.T, e *Env) {
	conn, err := Dial(e.Endpoint)
	must(t, err)
	defer conn.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 2*Wait)
	defer cancel()
	stream, err := pb.NewWatchClient(conn).Watch(ctx)
	must(t, err)
	prefix := unique("order-raw")
	must(t, stream.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: &pb.WatchCreateRequest{
		Key: []byte(prefix), RangeEnd: prefixEnd(prefix)}}}))
	created, err := stream.Recv()
	must(t, err)
	check(t, created.Created && !created.Canceled, "create: %+v", created)

	responses := make(chan *pb.WatchResponse, 64)
	var recvErr error
	go func() { // exits when the stream ends: ctx is canceled on return
		defer close(responses)
		for {
			r, err := stream.Recv()
			if err != nil {
				recvErr = err
				return
			}
			responses <- r
		}
	}()
	kick := make(chan struct{}, 1)
	sendDone := make(chan struct{})
	senderDone := make(chan struct{})
	var requests int
	go func() { // asks for progress after each response; exits when sendDone is closed
		defer close(senderDone)
		req := &pb.WatchRequest{RequestUnion: &pb.WatchRequest_ProgressRequest{ProgressRequest: &pb.WatchProgressRequest{}}}
		for {
			select {
			case <-kick:
				if stream.Send(req) != nil {
					return
				}
				requests++
			case <-sendDone:
				return
			}
		}
	}()
	l := &load{writers: 4, each: 150}
	written := make(chan []int64, 1)
	go func() { written <- l.run(ctx, e, prefix) }() // exits when the writers are done
	kick <- struct{}{}

	var revs []int64
	var final, lastProgress, maxEvent int64 = -1, 0, 0
	var progresses, ahead int
	for final < 0 || maxEvent < final {
		select {
		case w := <-written:
			must(t, l.err)
			final = w[len(w)-1]
			written = nil
			continue
		case r, ok := <-responses:
			if !ok {
				t.Fatalf("stream ended: %v", recvErr)
			}
			for _, ev := range r.Events {
				if ev.Kv.ModRevision <= lastProgress {
					ahead++
				}
				maxEvent = max(maxEvent, ev.Kv.ModRevision)
				revs = append(revs, ev.Kv.ModRevision)
			}
			if r.WatchId == -1 && len(r.Events) == 0 {
				progresses++
				lastProgress = max(lastProgress, r.Header.Revision)
			}
		case <-time.After(Wait):
			t.Fatalf("no response within %v", Wait)
		}
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	close(sendDone)
	<-senderDone
	cancel()
	for range responses { // until the receiver has exited
	}
	equal(t, l.revs, revs, "raw watch: revisions of its events")
	t.Logf("etcd %s: %d events, %d progress requests, %d answers; %d events arrived at or below an earlier answer",
		e.Version, len(revs), requests, progresses, ahead)
	if !e.Version.ProgressRunsAhead() {
		check(t, ahead == 0, "etcd %s ran a progress answer ahead of %d events, which etcd #15220 fixed", e.Version, ahead)
	} else if ahead > 0 {
		t.Logf("etcd #15220 seen on %s: %d events came after a progress answer that covered them", e.Version, ahead)
	}
}

func progressOrderClient(t *testing.T, e *Env) {
	s, prefix := open(t, e.Endpoint), unique("order-client")
	ctx, cancel := context.WithTimeout(t.Context(), 2*Wait)
	defer cancel()
	w, err := s.Watch(ctx, etcdwatch.Prefix(prefix))
	must(t, err)
	l := &load{writers: 4, each: 150}
	written := make(chan []int64, 1)
	go func() { written <- l.run(ctx, e, prefix) }() // exits when the writers are done
	stop := make(chan struct{})
	asked := make(chan int, 1)
	go func() { // calls RequestProgress until stop is closed
		n := 0
		defer func() { asked <- n }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := s.RequestProgress(ctx); err != nil {
				check(t, !e.Version.ProgressRunsAhead() || errors.Is(err, etcdwatch.ErrProgressUnsupported),
					"RequestProgress on etcd %s: %v", e.Version, err)
				return
			}
			n++
		}
	}()
	var revs []int64
	final, got := int64(-1), int64(0) // got: the last Response's revision (Watch.Revision may briefly trail it)
	for final < 0 || got < final {
		select {
		case all := <-written:
			must(t, l.err)
			final = all[len(all)-1]
			written = nil
		case r, ok := <-w.Responses():
			check(t, ok, "watch ended: %v", w.Err())
			got = r.Revision
			for _, ev := range r.Events {
				revs = append(revs, ev.ModRevision)
			}
		case <-time.After(Wait):
			t.Fatalf("no response within %v", Wait)
		}
	}
	close(stop)
	calls := <-asked
	lost := len(l.revs) - len(revs)
	st := s.Stats()
	t.Logf("etcd %s: %d events written, %d delivered, %d RequestProgress calls, %d duplicates dropped",
		e.Version, len(l.revs), len(revs), calls, st.DuplicatesDropped)
	check(t, lost == 0, "etcd %s: %d of %d events lost", e.Version, lost, len(l.revs))
	equal(t, l.revs, revs, "watch: revisions of its events")
}

// prefixEnd is the range end that makes key a prefix.
func prefixEnd(prefix string) []byte {
	end := []byte(prefix)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return []byte{0}
}

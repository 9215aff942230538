package etcdwatch_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/etcdwatch/etcdwatch"
)

// The examples that watch need an etcd at 127.0.0.1:2379, so they are
// compiled but not run here; internal/e2e runs the same code against an
// embedded etcd, and the etcdwatchtest module has runnable ones that start
// their own. The others are run, with their output checked.

func Example() {
	conn, err := grpc.NewClient("127.0.0.1:2379", grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	s, err := etcdwatch.Open(conn)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()

	w, err := s.Watch(context.Background(), etcdwatch.Prefix("app/").WithPrevKV())
	if err != nil {
		log.Fatal(err)
	}
	for r := range w.Responses() {
		for _, e := range r.Events {
			fmt.Printf("%s %s = %s (revision %d)\n", e.Type, e.Key, e.Value, e.ModRevision)
		}
	}
	var compacted *etcdwatch.CompactedError
	if errors.As(w.Err(), &compacted) {
		fmt.Printf("history before %d is gone: read the keys at a revision R, then watch from R+1\n", compacted.CompactRevision)
	}
}

func ExampleStream_WatchAll() {
	var s *etcdwatch.Stream // opened as in the package example
	tenants := []string{"acme", "globex", "initech"}
	rs := make([]etcdwatch.Request, len(tenants))
	for i, t := range tenants {
		rs[i] = etcdwatch.Prefix("tenants/" + t + "/")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt) // Ctrl-C ends every watch
	defer stop()
	ws, err := s.WatchAll(ctx, rs...) // one round trip for all of them
	if err != nil {
		log.Fatal(err) // none is open; errors.As finds a *etcdwatch.ServerError for a refusal
	}
	var wg sync.WaitGroup
	for i, w := range ws {
		wg.Go(func() {
			for r := range w.Responses() {
				fmt.Printf("%s: %d events up to revision %d\n", tenants[i], len(r.Events), r.Revision)
			}
		})
	}
	wg.Wait()
}

func ExampleStream_Handle() {
	var s *etcdwatch.Stream // opened as in the package example
	prefixes := []string{"tenants/acme/", "tenants/globex/", "tenants/initech/"}
	rs := make([]etcdwatch.Request, len(prefixes))
	for i, p := range prefixes {
		rs[i] = etcdwatch.Prefix(p)
	}
	seen := make([]int64, len(prefixes)) // one slot per watch, by its request's index: each written by one call at a time
	h := etcdwatch.NewHandler(func(w *etcdwatch.Watch, i int, r etcdwatch.Response) {
		seen[i] += int64(len(r.Events))
		fmt.Printf("%s: %d events up to revision %d\n", prefixes[i], len(r.Events), r.Revision)
	}, etcdwatch.WithGoroutines(2), etcdwatch.WithEnded(func(w *etcdwatch.Watch, err error) {
		fmt.Printf("watch %d ended: %v\n", w.ID(), err)
	}))
	ws, err := s.Handle(context.Background(), h, rs...) // no goroutine of ours per watch
	if err != nil {
		log.Fatal(err)
	}
	defer h.Wait() // after Close: every Ended call has returned
	defer s.Close()
	_ = ws
}

func ExampleStream_RequestProgress() {
	var s *etcdwatch.Stream // opened as in the package example
	rev, err := s.RequestProgress(context.Background())
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("every watch has delivered every event up to revision %d\n", rev)
}

func ExampleRequest() {
	r := etcdwatch.Prefix("jobs/").FromRevision(1200).WithoutDeletes()
	fmt.Println(r, r.Validate())
	fmt.Println(etcdwatch.Range("b", "a").Validate())
	// Output:
	// keys ["jobs/", "jobs0") <nil>
	// etcdwatch: invalid request: End "a" must sort after Key "b" (or be "\x00")
}

func ExampleOpen() {
	// grpc.NewClient connects lazily: nothing is dialed until a stream opens.
	conn, err := grpc.NewClient("127.0.0.1:2379", grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	// Options are validated together, before anything starts.
	_, err = etcdwatch.Open(conn, etcdwatch.WithBufferLimit(0))
	fmt.Println(errors.Is(err, etcdwatch.ErrInvalidArgument), err)
	// Output:
	// true etcdwatch: invalid argument: WithBufferLimit(0) must be at least 1
}

func ExampleStream_State() {
	var s *etcdwatch.Stream // opened as in the package example
	st := s.State()
	if !st.Connected && st.LastError != nil {
		fmt.Printf("watch stream down since %s: %v\n", st.Since.Format("15:04:05"), st.LastError)
	}
}

func ExampleWithCreateTimeout() {
	var conn *grpc.ClientConn // dialed as in the package example
	// Give up on a watch the server has not confirmed within 2s, but keep a
	// confirmed one for as long as its context lasts.
	s, err := etcdwatch.Open(conn, etcdwatch.WithCreateTimeout(2*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	w, err := s.Watch(context.Background(), etcdwatch.Key("config"))
	switch {
	case errors.Is(err, etcdwatch.ErrCreateTimeout):
		log.Fatalf("etcd did not confirm the watch in time: %v", err) // says why, if the stream could not open
	case err != nil:
		log.Fatalf("watch refused: %v", err) // a *ServerError, ErrClosed, ...
	}
	for r := range w.Responses() {
		fmt.Println(r.Revision)
	}
	log.Printf("watch ended: %v", w.Err())
}

func ExampleWatch_Cancel() {
	var w *etcdwatch.Watch // from Stream.Watch
	go func() {
		for r := range w.Responses() { // ends once Cancel returns
			fmt.Println(len(r.Events))
		}
	}()
	w.Cancel() // nothing is delivered after this returns
	fmt.Println(errors.Is(w.Err(), etcdwatch.ErrCanceled))
}

func ExampleEvent() {
	for _, e := range []etcdwatch.Event{
		{Type: etcdwatch.Put, KeyValue: etcdwatch.KeyValue{Key: []byte("a"), Value: []byte("1"), Version: 1, ModRevision: 5}},
		{Type: etcdwatch.Put, KeyValue: etcdwatch.KeyValue{Key: []byte("a"), Value: []byte("2"), Version: 2, ModRevision: 6},
			PrevKV: &etcdwatch.KeyValue{Key: []byte("a"), Value: []byte("1"), Version: 1, ModRevision: 5}},
		{Type: etcdwatch.Delete, KeyValue: etcdwatch.KeyValue{Key: []byte("a"), ModRevision: 7}},
	} {
		fmt.Println(e.Type, string(e.Key), e.ModRevision, e.IsCreate(), e.IsModify())
	}
	// Output:
	// PUT a 5 true false
	// PUT a 6 false true
	// DELETE a 7 false false
}

func ExampleResponse_IsProgress() {
	bookmark := etcdwatch.Response{Header: etcdwatch.Header{Revision: 42}, Revision: 42}
	fmt.Println(bookmark.IsProgress(), bookmark.Revision)
	// Output:
	// true 42
}

func ExampleCompactedError() {
	var err error = &etcdwatch.CompactedError{CompactRevision: 90, Revision: 12} // as Watch.Err may return
	var ce *etcdwatch.CompactedError
	if errors.As(err, &ce) {
		fmt.Printf("watch from %d: history starts at %d; read the keys, then watch from the read's revision + 1\n", ce.Revision, ce.CompactRevision)
	}
	fmt.Println(errors.Is(err, etcdwatch.ErrCompacted))
	// Output:
	// watch from 12: history starts at 90; read the keys, then watch from the read's revision + 1
	// true
}

func ExampleServerError() {
	var err error = &etcdwatch.ServerError{Reason: "etcdserver: no space"} // as a test might make one
	var se *etcdwatch.ServerError
	fmt.Println(errors.As(err, &se), se.Reason, errors.Is(err, etcdwatch.ErrServerCanceled))
	// Output:
	// true etcdserver: no space true
}

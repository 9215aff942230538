package etcdwatch_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/etcdwatch/etcdwatch"
)

// These examples need an etcd at 127.0.0.1:2379, so they are compiled but not
// run here; internal/e2e runs the same code against an embedded etcd.

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

package e2e

import (
	"context"
	"fmt"
	"log"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/etcdwatch/etcdwatch"
)

// Example runs the root package's example against the embedded etcd.
func Example() {
	conn, err := etcd.Dial()
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	s, err := etcdwatch.Open(conn)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	w, err := s.Watch(ctx, etcdwatch.Prefix("example/").WithPrevKV())
	if err != nil {
		log.Fatal(err)
	}
	kv := pb.NewKVClient(conn)
	for _, v := range []string{"blue", "green"} {
		if _, err := kv.Put(ctx, &pb.PutRequest{Key: []byte("example/color"), Value: []byte(v)}); err != nil {
			log.Fatal(err)
		}
	}
	for seen := 0; seen < 2; {
		r, ok := <-w.Responses()
		if !ok {
			log.Fatal(w.Err()) // the watch ended: why
		}
		for _, e := range r.Events {
			fmt.Printf("%s %s = %s", e.Type, e.Key, e.Value)
			if e.PrevKV != nil {
				fmt.Printf(" (was %s)", e.PrevKV.Value)
			}
			fmt.Println()
			seen++
		}
	}
	w.Cancel()
	fmt.Println(w.Err())
	// Output:
	// PUT example/color = blue
	// PUT example/color = green (was blue)
	// etcdwatch: watch canceled
}

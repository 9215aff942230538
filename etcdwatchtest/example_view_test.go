package etcdwatchtest_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/etcdwatch/etcdwatch"
	"github.com/etcdwatch/etcdwatch/etcdwatchtest"
	"github.com/etcdwatch/etcdwatch/view"
)

// A View against a real etcd: a local copy of a prefix, read without a
// round trip, made fresh with Sync after a write, and followed with a
// Subscription. On a new member the first write is revision 2.
func Example_view() {
	dir, err := os.MkdirTemp("", "etcdwatchtest-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	srv, err := etcdwatchtest.StartEtcdIn(dir)
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Stop()
	conn, err := srv.Dial()
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	s, err := etcdwatch.Open(conn)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kv := pb.NewKVClient(conn)
	put := func(key, value string) {
		if _, err := kv.Put(ctx, &pb.PutRequest{Key: []byte(key), Value: []byte(value)}); err != nil {
			log.Fatal(err)
		}
	}
	put("app/color", "blue")
	put("app/size", "large")

	// view.New returns once the prefix is listed: both keys are in.
	v, err := view.New(ctx, s, etcdwatch.Prefix("app/"), view.DecodeBytes)
	if err != nil {
		log.Fatal(err)
	}
	defer v.Close()
	fmt.Println(v.Len(), "keys at revision", v.Revision())
	for k, e := range v.All() {
		fmt.Printf("  %s = %s\n", k, e.Value)
	}

	// The view learns of a write through its watch, a moment later; Sync
	// waits for that moment, so Get then sees the write.
	seen := v.Revision()
	put("app/shape", "round")
	if err := v.Sync(ctx); err != nil {
		log.Fatal(err)
	}
	e, ok := v.Get("app/shape")
	fmt.Printf("after Sync: app/shape = %s (found %t, revision %d)\n", e.Value, ok, e.ModRevision)

	// A subscription may start from a revision the view has passed: its
	// history still holds the changes since.
	sub := v.Subscribe(context.Background(), seen)
	defer sub.Close()
	b, err := sub.Next(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("batch of %s from %d to %d:\n", b.Kind, b.From, b.Revision)
	for _, ch := range b.Changes {
		fmt.Printf("  %s %s = %s at %d\n", ch.Kind, ch.Key, ch.Entry.Value, ch.Revision)
	}
	// Output:
	// 2 keys at revision 3
	//   app/color = blue
	//   app/size = large
	// after Sync: app/shape = round (found true, revision 4)
	// batch of events from 3 to 4:
	//   created app/shape = round at 4
}

package clientv3watch_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdwatch/etcdwatch/clientv3watch"
	"github.com/etcdwatch/etcdwatch/etcdwatchtest"
)

// The one-line switch: an existing clientv3 program assigns the drop-in to
// its client's Watcher, and its watch code runs on etcdwatch unchanged.
func Example() {
	dir, err := os.MkdirTemp("", "clientv3watch-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	srv, err := etcdwatchtest.StartEtcdIn(dir) // an etcd for the example
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Stop()

	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close() // closes the Watcher too
	cli.Watcher = clientv3watch.New(cli)

	// The program's watch code, as it was.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	wch := cli.Watch(ctx, "app/", clientv3.WithPrefix(), clientv3.WithPrevKV(), clientv3.WithCreatedNotify())
	created := <-wch
	fmt.Println("created:", created.Created)
	if _, err := cli.Put(ctx, "app/color", "blue"); err != nil {
		log.Fatal(err)
	}
	if _, err := cli.Put(ctx, "app/color", "green"); err != nil {
		log.Fatal(err)
	}
	for n := 0; n < 2; {
		resp := <-wch
		if err := resp.Err(); err != nil {
			log.Fatal(err)
		}
		for _, ev := range resp.Events {
			n++
			fmt.Printf("%s %s=%s create=%v modify=%v", ev.Type, ev.Kv.Key, ev.Kv.Value, ev.IsCreate(), ev.IsModify())
			if ev.PrevKv != nil {
				fmt.Printf(" (was %s)", ev.PrevKv.Value)
			}
			fmt.Println()
		}
	}
	// Output:
	// created: true
	// PUT app/color=blue create=true modify=false
	// PUT app/color=green create=false modify=true (was blue)
}

// A compacted start revision gives the response clientv3 gives:
// CompactRevision set and Err() == rpctypes.ErrCompacted.
func ExampleNew_compacted() {
	dir, err := os.MkdirTemp("", "clientv3watch-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	srv, err := etcdwatchtest.StartEtcdIn(dir)
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Stop()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	cli.Watcher = clientv3watch.New(cli)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var last int64
	for _, v := range []string{"1", "2", "3"} {
		r, err := cli.Put(ctx, "k", v)
		if err != nil {
			log.Fatal(err)
		}
		last = r.Header.Revision
	}
	if _, err := cli.Compact(ctx, last); err != nil {
		log.Fatal(err)
	}
	resp := <-cli.Watch(ctx, "k", clientv3.WithRev(2))
	fmt.Println(resp.Canceled, resp.CompactRevision == last, resp.Err())
	// Output: true true etcdserver: mvcc: required revision has been compacted
}

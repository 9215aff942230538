package etcdwatchtest_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/etcdwatch/etcdwatch"
	"github.com/etcdwatch/etcdwatch/dial"
	"github.com/etcdwatch/etcdwatch/etcdwatchtest"
)

// A test of watch code against a real etcd: start a member, open a Stream
// on it, watch a prefix, write a key and see its event. In a test function,
//
//	srv := etcdwatchtest.StartEtcd(t)
//
// replaces the temporary directory, StartEtcdIn and the deferred Stop; an
// Example has no t, so this one uses the forms that return errors.
func Example() {
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
	w, err := s.Watch(ctx, etcdwatch.Prefix("app/"))
	if err != nil {
		log.Fatal(err)
	}

	kv := pb.NewKVClient(conn)
	if _, err := kv.Put(ctx, &pb.PutRequest{Key: []byte("app/color"), Value: []byte("blue")}); err != nil {
		log.Fatal(err)
	}
	r, ok := <-w.Responses()
	if !ok {
		log.Fatal(w.Err()) // the watch ended: why
	}
	for _, e := range r.Events {
		fmt.Println(e.Type, string(e.Key), string(e.Value), "at revision", e.ModRevision)
	}
	// Output: PUT app/color blue at revision 2
}

// A watch outlives its connection: the client watches through a Proxy,
// the Proxy cuts the connection, and the watch carries on over a new one
// from where it was, missing nothing. Writes go to the member directly,
// so that the cut does not touch them. In a test function,
// etcdwatchtest.NewProxy(t, srv.Endpoint) starts the Proxy and closes it
// when the test ends.
func ExampleProxy() {
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
	proxy, err := etcdwatchtest.ListenProxy(srv.Endpoint)
	if err != nil {
		log.Fatal(err)
	}
	defer proxy.Close()

	conn, err := dial.New([]string{proxy.Addr()}, dial.WithInsecure())
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
	w, err := s.Watch(ctx, etcdwatch.Prefix("app/"))
	if err != nil {
		log.Fatal(err)
	}

	direct, err := srv.Dial()
	if err != nil {
		log.Fatal(err)
	}
	defer direct.Close()
	kv := pb.NewKVClient(direct)
	put := func(key, value string) {
		if _, err := kv.Put(ctx, &pb.PutRequest{Key: []byte(key), Value: []byte(value)}); err != nil {
			log.Fatal(err)
		}
		r, ok := <-w.Responses()
		if !ok {
			log.Fatal(w.Err())
		}
		for _, e := range r.Events {
			fmt.Println(e.Type, string(e.Key), string(e.Value))
		}
	}
	put("app/color", "blue")
	fmt.Println("cut", proxy.Cut(), "connection")
	put("app/color", "green")
	fmt.Println("watch ended:", w.Err())
	// Output:
	// PUT app/color blue
	// cut 1 connection
	// PUT app/color green
	// watch ended: <nil>
}

// Command prefixwatch watches every key under a prefix and prints each
// event, like `etcdctl watch --prefix`.
//
// With -endpoints it watches that etcd, through any of the members given
// (comma-separated), until interrupted. Without, it starts an embedded etcd
// in a temporary directory, writes a few demo keys and exits once it has
// shown them arrive.
//
//	go run ./prefixwatch                                # demo on an embedded etcd
//	go run ./prefixwatch -endpoints 127.0.0.1:2379 -prefix app/
//	go run ./prefixwatch -endpoints 10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/etcdwatch/etcdwatch"
	"github.com/etcdwatch/etcdwatch/dial"
	"github.com/etcdwatch/etcdwatch/etcdwatchtest"
)

func main() {
	endpoints := flag.String("endpoints", "", "etcd endpoints, host:port[,host:port...]; empty starts an embedded etcd with demo writes")
	prefix := flag.String("prefix", "demo/", "key prefix to watch")
	rev := flag.Int64("rev", 0, "first revision to show; 0 shows changes from now on")
	prevKV := flag.Bool("prev-kv", false, "show each event's previous value")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	var eps []string
	if *endpoints != "" {
		eps = strings.Split(*endpoints, ",")
	}
	err := run(ctx, os.Stdout, eps, etcdwatch.Prefix(*prefix).FromRevision(*rev), *prevKV)
	if err != nil && ctx.Err() == nil { // after an interrupt, whatever the call in progress says
		log.Fatal(err)
	}
}

// run watches req through endpoints, or, with none, on an embedded etcd
// with demo writes.
func run(ctx context.Context, out io.Writer, endpoints []string, req etcdwatch.Request, prevKV bool) error {
	demo := len(endpoints) == 0
	if demo {
		dir, err := os.MkdirTemp("", "prefixwatch-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		srv, err := etcdwatchtest.StartEtcdIn(dir)
		if err != nil {
			return err
		}
		defer srv.Stop()
		endpoints = []string{srv.Endpoint}
		fmt.Fprintf(out, "started an embedded etcd at %s\n", srv.Endpoint)
	}
	return watch(ctx, out, endpoints, req, prevKV, demo)
}

// watch prints req's events until ctx ends, or, with demo, writes the demo
// keys and returns once they have arrived.
func watch(ctx context.Context, out io.Writer, endpoints []string, req etcdwatch.Request, prevKV, demo bool) error {
	conn, err := dial.New(endpoints, dial.WithInsecure())
	if err != nil {
		return err
	}
	defer conn.Close()

	// Warnings (an endpoint that cannot be reached, a watch that falls
	// behind) go to standard error, so that a watch that shows nothing
	// says why.
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	stream, err := etcdwatch.Open(conn, etcdwatch.WithLogger(logger))
	if err != nil {
		return err
	}
	defer stream.Close()
	if prevKV {
		req = req.WithPrevKV()
	}
	w, err := stream.Watch(ctx, req)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "watching %s (watch id %d)\n", req, w.ID())

	want := 0 // events the demo writes and waits for
	if demo {
		n, err := writeDemo(ctx, pb.NewKVClient(conn), string(req.Key))
		if err != nil {
			return err
		}
		want = n
	}
	for r := range w.Responses() {
		for _, e := range r.Events {
			printEvent(out, e)
			want--
		}
		if demo && want <= 0 {
			fmt.Fprintln(out, "demo done: every write arrived")
			return nil
		}
	}
	return w.Err()
}

func printEvent(out io.Writer, e etcdwatch.Event) {
	fmt.Fprintf(out, "%s %s rev=%d\n", e.Type, e.Key, e.ModRevision)
	if e.Type == etcdwatch.Put {
		fmt.Fprintf(out, "  value: %s\n", e.Value)
	}
	if e.PrevKV != nil {
		fmt.Fprintf(out, "  previous: %s\n", e.PrevKV.Value)
	}
}

// writeDemo creates, changes and deletes a few keys under prefix and returns
// how many events that makes.
func writeDemo(ctx context.Context, kv pb.KVClient, prefix string) (int, error) {
	ops := []*pb.RequestOp{
		put(prefix+"config/color", "blue"),
		put(prefix+"config/size", "large"),
		put(prefix+"config/color", "green"),
		{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: &pb.DeleteRangeRequest{Key: []byte(prefix + "config/size")}}},
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for _, op := range ops {
		if _, err := kv.Txn(ctx, &pb.TxnRequest{Success: []*pb.RequestOp{op}}); err != nil {
			return 0, fmt.Errorf("demo write: %w", err)
		}
	}
	return len(ops), nil
}

func put(key, value string) *pb.RequestOp {
	return &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte(key), Value: []byte(value)}}}
}

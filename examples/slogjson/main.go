// Command slogjson wires etcdwatch.WithLogger to a log/slog JSON handler,
// so that what a Stream logs lands as one JSON object a line, ready for
// any log pipeline that reads JSON.
//
// The demo starts an embedded etcd behind a fault proxy and makes the
// Stream log the two things operators most want to see: the server ending
// a watch (its start revision was compacted away, which its consumer is
// told), and a lost connection and its recovery, all at Info. Its standard
// output is nothing but the log lines:
//
//	go run ./slogjson | jq .
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/etcdwatch/etcdwatch"
	"github.com/etcdwatch/etcdwatch/dial"
	"github.com/etcdwatch/etcdwatch/etcdwatchtest"
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := run(ctx, newLogger(os.Stdout, nil)); err != nil {
		log.Fatal(err)
	}
}

// newLogger is the wiring to copy: a JSON handler at Info, which keeps the
// lines an operator acts on (Warn: a stream that cannot open, a watch the
// server refused; Info: a watch ended as compacted, a stream lost and
// back) and leaves out the Debug
// ones (each pause of a slow consumer, each probe of a quiet stream). The
// stream attribute tells apart the lines of several Streams. Durations
// (how long the watches were down, the delay before a new stream) are
// written as text, "1.85ms", rather than slog's default of nanoseconds.
// replace, if not nil, then rewrites attributes as
// slog.HandlerOptions.ReplaceAttr does.
func newLogger(w io.Writer, replace func(groups []string, a slog.Attr) slog.Attr) *slog.Logger {
	h := slog.NewJSONHandler(w, &slog.HandlerOptions{
		Level: slog.LevelInfo,
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if a.Value.Kind() == slog.KindDuration {
				a.Value = slog.StringValue(a.Value.Duration().String())
			}
			if replace != nil {
				a = replace(groups, a)
			}
			return a
		},
	})
	return slog.New(h).With("stream", "demo")
}

// run is the demo: a watch from a compacted revision, which the server
// ends, then a watch across a cut connection. It logs through logger only.
func run(ctx context.Context, logger *slog.Logger) error {
	dir, err := os.MkdirTemp("", "slogjson-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	member, err := etcdwatchtest.StartEtcdIn(dir)
	if err != nil {
		return err
	}
	defer member.Stop()
	proxy, err := etcdwatchtest.ListenProxy(member.Endpoint)
	if err != nil {
		return err
	}
	defer proxy.Close()
	direct, err := member.Dial()
	if err != nil {
		return err
	}
	defer direct.Close()
	kv := pb.NewKVClient(direct)
	put := func(key, value string) error {
		_, err := kv.Put(ctx, &pb.PutRequest{Key: []byte(key), Value: []byte(value)})
		return err
	}

	conn, err := dial.New([]string{proxy.Addr()}, dial.WithInsecure())
	if err != nil {
		return err
	}
	defer conn.Close()
	s, err := etcdwatch.Open(conn, etcdwatch.WithLogger(logger))
	if err != nil {
		return err
	}
	defer s.Close()

	// Revisions 2 to 4, then everything before 4 compacted: a watch from
	// revision 2 is confirmed, then ended by the server.
	for _, v := range []string{"blue", "green", "red"} {
		if err := put("demo/color", v); err != nil {
			return err
		}
	}
	if _, err := kv.Compact(ctx, &pb.CompactionRequest{Revision: 4, Physical: true}); err != nil {
		return err
	}
	old, err := s.Watch(ctx, etcdwatch.Prefix("demo/").FromRevision(2))
	if err != nil {
		return err
	}
	<-old.Done()
	var compacted *etcdwatch.CompactedError
	if !errors.As(old.Err(), &compacted) {
		return fmt.Errorf("the watch from a compacted revision ended with %v, not by the server", old.Err())
	}

	// A watch across a cut connection: the stream ends, a new one takes
	// over, and the next write arrives on it.
	w, err := s.Watch(ctx, etcdwatch.Prefix("demo/"))
	if err != nil {
		return err
	}
	proxy.Cut()
	if err := put("demo/color", "yellow"); err != nil {
		return err
	}
	select {
	case _, ok := <-w.Responses():
		if !ok {
			return w.Err() // ended rather than resumed: say why
		}
	case <-ctx.Done():
		return ctx.Err()
	}
	w.Cancel()
	return nil
}

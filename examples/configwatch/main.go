// Command configwatch keeps every key under a prefix as a live table, the
// way a service follows its configuration: it prints the table once, then
// each change as it happens, and carries on across compaction, printing
// what changed while it could not follow.
//
// With -endpoints it follows that etcd, through any of the members given
// (comma-separated), until interrupted. Without, it starts an embedded etcd
// in a temporary directory, writes a few keys, and then, unless -demo=false,
// changes them itself and exits once it has shown every change; with
// -demo=false it runs until interrupted, so that you can write to the
// endpoint it logs with etcdctl.
//
//	go run ./configwatch                                 # demo on an embedded etcd
//	go run ./configwatch -json                           # values as JSON objects, one of them broken
//	go run ./configwatch -endpoints 127.0.0.1:2379 -prefix app/config/
//
// The table and the changes go to standard output; what the program and the
// Stream log (the embedded etcd's address, reconnections) goes to standard
// error, with log/slog.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"iter"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"text/tabwriter"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/etcdwatch/etcdwatch"
	"github.com/etcdwatch/etcdwatch/dial"
	"github.com/etcdwatch/etcdwatch/etcdwatchtest"
	"github.com/etcdwatch/etcdwatch/view"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	err := run(ctx, os.Args[1:], os.Stdout)
	switch {
	case errors.Is(err, flag.ErrHelp):
		os.Exit(0)
	case errors.Is(err, errUsage):
		os.Exit(2) // the flag package has printed what was wrong, and the usage
	case err != nil:
		slog.Error("configwatch failed", "err", err)
		os.Exit(1)
	}
}

// config is what the command line asks for.
type config struct {
	endpoints []string
	prefix    string
	json      bool
	demo      bool
	level     slog.Level
}

// errUsage wraps the errors of a command line that cannot be run.
var errUsage = errors.New("usage")

func parseArgs(args []string) (config, error) {
	fs := flag.NewFlagSet("configwatch", flag.ContinueOnError)
	endpoints := fs.String("endpoints", "", "etcd endpoints, host:port[,host:port...]; empty starts an embedded etcd")
	var c config
	fs.StringVar(&c.prefix, "prefix", "config/", "key prefix to follow")
	fs.BoolVar(&c.json, "json", false, "decode values as JSON objects rather than plain strings")
	fs.BoolVar(&c.demo, "demo", true, "with the embedded etcd: make a few changes, show them and exit; false runs until interrupted")
	fs.TextVar(&c.level, "log-level", slog.LevelInfo, "lowest level logged to standard error: debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return config{}, err
		}
		return config{}, fmt.Errorf("%w: %w", errUsage, err)
	}
	if fs.NArg() > 0 {
		err := fmt.Errorf("unexpected arguments: %q", fs.Args())
		fmt.Fprintln(fs.Output(), err)
		fs.Usage()
		return config{}, fmt.Errorf("%w: %w", errUsage, err)
	}
	if *endpoints != "" {
		c.endpoints = strings.Split(*endpoints, ",")
	}
	if c.prefix == "" {
		err := errors.New("-prefix must not be empty")
		fmt.Fprintln(fs.Output(), err)
		return config{}, fmt.Errorf("%w: %w", errUsage, err)
	}
	return c, nil
}

// logOutput is where the program logs; tests read it.
var logOutput io.Writer = os.Stderr

// run is the program: it follows the prefix until ctx ends (then it returns
// nil) or, in the demo, until every demo change has been shown.
func run(ctx context.Context, args []string, stdout io.Writer) error {
	c, err := parseArgs(args)
	if err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(logOutput, &slog.HandlerOptions{Level: c.level}))
	embedded := len(c.endpoints) == 0
	if embedded {
		dir, err := os.MkdirTemp("", "configwatch-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		srv, err := etcdwatchtest.StartEtcdIn(dir)
		if err != nil {
			return err
		}
		defer srv.Stop()
		c.endpoints = []string{srv.Endpoint}
		logger.Info("started an embedded etcd", "endpoint", srv.Endpoint, "demo", c.demo)
	}

	conn, err := dial.New(c.endpoints, dial.WithInsecure())
	if err != nil {
		return err
	}
	defer conn.Close()
	stream, err := etcdwatch.Open(conn, etcdwatch.WithLogger(logger))
	if err != nil {
		return err
	}
	defer stream.Close()

	w := watcher{out: stdout, log: logger, stream: stream, prefix: c.prefix}
	if embedded {
		w.kv = pb.NewKVClient(conn)
		w.seed, w.steps = demoData(c.json)
		if !c.demo {
			w.steps = nil
		}
	}
	if c.json {
		err = follow(ctx, w, view.DecodeJSON[map[string]any], formatJSON)
	} else {
		err = follow(ctx, w, decodeString, formatString)
	}
	if ctx.Err() != nil {
		return nil // interrupted: the normal end, whatever it cut short
	}
	return err
}

// decodeString is the decoder of plain values.
func decodeString(_, value []byte) (string, error) { return string(value), nil }

func formatString(s string) string { return s }

// formatJSON writes a JSON object back, compact and with sorted keys.
func formatJSON(m map[string]any) string {
	b, err := json.Marshal(m)
	if err != nil {
		return fmt.Sprintf("%v", m)
	}
	return string(b)
}

// watcher is what follow needs besides the decoder.
type watcher struct {
	out    io.Writer
	log    *slog.Logger
	stream *etcdwatch.Stream
	prefix string
	kv     pb.KVClient // set with the embedded etcd: writes seed and steps
	seed   [][]write   // written before the view opens
	steps  [][]write   // the demo: written after it has been printed
}

// follow opens a view of the prefix, prints it, then prints its changes
// until ctx ends or, with demo steps, once it has shown them all.
func follow[T any](ctx context.Context, w watcher, decode view.Decoder[T], format func(T) string) error {
	if _, err := w.write(ctx, w.seed); err != nil {
		return err
	}
	// A view is a list of the prefix at a revision R, then its changes from
	// R+1: view.New returns once the list is in.
	v, err := view.New(ctx, w.stream, etcdwatch.Prefix(w.prefix), decode)
	if err != nil {
		return err
	}
	defer v.Close()
	defer func() {
		st := v.Stats()
		w.log.Info("view stats", "keys", st.Keys, "revision", st.Revision, "relists", st.Relists,
			"resyncs", st.Resyncs, "decode_errors", st.DecodeErrors)
	}()
	// The table and the subscription start from one snapshot, so that no
	// change is shown twice or missed between them.
	snap := v.Snapshot()
	w.log.Info("view ready", "prefix", w.prefix, "keys", snap.Len(), "revision", snap.Revision())
	fmt.Fprintf(w.out, "%s at rev %d: %d keys\n", w.prefix, snap.Revision(), snap.Len())
	printTable(w.out, snap.All(), format)
	sub := v.Subscribe(ctx, snap.Revision())
	defer sub.Close()

	last, err := w.write(ctx, w.steps)
	if err != nil {
		return err
	}
	// Without demo steps (last is 0), until ctx ends or the view does.
	for {
		b, err := sub.Next(ctx)
		if err != nil {
			return err
		}
		printBatch(w.out, b, format)
		if last > 0 && b.Revision >= last {
			break
		}
	}
	fmt.Fprintf(w.out, "demo done: %d keys at rev %d\n", v.Len(), v.Revision())
	return nil
}

// printTable prints entries as aligned columns: key, value, mod revision.
func printTable[T any](out io.Writer, entries iter.Seq2[string, view.Entry[T]], format func(T) string) {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tVALUE\tMOD REV")
	for k, e := range entries {
		fmt.Fprintf(tw, "%s\t%s\t%d\n", k, value(&e, format), e.ModRevision)
	}
	tw.Flush()
}

// printBatch prints a batch's changes, one a line, after a line saying why
// it came for the two kinds that are not plain events.
func printBatch[T any](out io.Writer, b view.Batch[T], format func(T) string) {
	switch b.Kind {
	case view.Relisted:
		fmt.Fprintf(out, "relisted at rev %d (after compaction): %d changes\n", b.Revision, len(b.Changes))
	case view.Resync:
		// The whole state, to replace what we showed: print it as a table.
		fmt.Fprintf(out, "resync at rev %d: %d keys\n", b.Revision, len(b.Changes))
		printTable(out, func(yield func(string, view.Entry[T]) bool) {
			for _, ch := range b.Changes {
				if !yield(ch.Key, *ch.Entry) {
					return
				}
			}
		}, format)
		return
	}
	for _, ch := range b.Changes {
		switch ch.Kind {
		case view.Created:
			if ch.Entry.Err != nil {
				fmt.Fprintf(out, "rev %d: created %s: cannot decode: %v\n", ch.Revision, ch.Key, ch.Entry.Err)
			} else {
				fmt.Fprintf(out, "rev %d: created %s = %s\n", ch.Revision, ch.Key, format(ch.Entry.Value))
			}
		case view.Updated:
			fmt.Fprintf(out, "rev %d: updated %s: %s -> %s\n", ch.Revision, ch.Key, value(ch.Prev, format), value(ch.Entry, format))
		case view.Deleted:
			fmt.Fprintf(out, "rev %d: deleted %s\n", ch.Revision, ch.Key)
		}
	}
}

// value is an entry's value as printed, or why it has none.
func value[T any](e *view.Entry[T], format func(T) string) string {
	if e.Err != nil {
		return "cannot decode: " + e.Err.Error()
	}
	return format(e.Value)
}

// write is one key to put, or to delete, relative to the prefix.
type write struct {
	key, value string
	delete     bool
}

// demoData returns the keys the embedded etcd starts with and the demo's
// changes: a key created, one updated, two changed in one transaction (so at
// one revision), one deleted; with JSON values, then one that is not JSON.
func demoData(jsonValues bool) (seed, steps [][]write) {
	if !jsonValues {
		seed = [][]write{{{key: "db/host", value: "db.internal"}}, {{key: "log/level", value: "info"}}, {{key: "ui/theme", value: "light"}}}
		steps = [][]write{
			{{key: "feature/beta", value: "on"}},
			{{key: "log/level", value: "debug"}},
			{{key: "db/host", value: "db2.internal"}, {key: "db/port", value: "5433"}},
			{{key: "ui/theme", delete: true}},
		}
		return seed, steps
	}
	seed = [][]write{
		{{key: "db", value: `{"host": "db.internal", "port": 5432}`}},
		{{key: "log", value: `{"level": "info"}`}},
		{{key: "ui", value: `{"theme": "light"}`}},
	}
	steps = [][]write{
		{{key: "feature", value: `{"beta": true}`}},
		{{key: "log", value: `{"level": "debug"}`}},
		{{key: "db", value: `{"host": "db2.internal", "port": 5433}`}, {key: "cache", value: `{"ttl": "30s"}`}},
		{{key: "ui", delete: true}},
		{{key: "broken", value: `{"level": "debug"`}},
	}
	return seed, steps
}

// write makes each step one transaction, so one revision, and returns the
// revision of the last; 0 when there are none.
func (w watcher) write(ctx context.Context, steps [][]write) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var rev int64
	for _, step := range steps {
		var ops []*pb.RequestOp
		for _, wr := range step {
			key := []byte(w.prefix + wr.key)
			if wr.delete {
				ops = append(ops, &pb.RequestOp{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: &pb.DeleteRangeRequest{Key: key}}})
			} else {
				ops = append(ops, &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: key, Value: []byte(wr.value)}}})
			}
		}
		resp, err := w.kv.Txn(ctx, &pb.TxnRequest{Success: ops})
		if err != nil {
			return 0, fmt.Errorf("demo write: %w", err)
		}
		rev = resp.Header.Revision
		w.log.Debug("demo write", "ops", len(ops), "revision", rev)
	}
	return rev, nil
}

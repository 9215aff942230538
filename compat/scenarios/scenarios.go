// Package scenarios holds etcdwatch's core real-server scenarios, written
// once and run against every supported etcd: the embedded 3.7, 3.6 and 3.5
// built from modules pinned to them, and Debian's 3.4 binary. Each test
// module starts its server and calls [Run] with the member's endpoint.
//
// The module depends on etcdwatch and etcd's API module only, never on
// etcd's server or client: a server of another release line cannot be
// linked beside the API module etcdwatch needs, so servers other than the
// embedded one run as child processes ([StartProcess]).
//
// Scenarios assert counts, orders and states, never durations; every wait
// is for a message, bounded by [Wait] only to turn a hang into a failure.
package scenarios

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"

	"github.com/etcdwatch/etcdwatch"
	"github.com/etcdwatch/etcdwatch/dial"
)

// Wait bounds every wait for a message.
const Wait = 30 * time.Second

// Scenario is one check against a server.
type Scenario struct {
	Name string
	Run  func(t *testing.T, e *Env)
}

// All is every scenario, in the order Run runs them.
var All = []Scenario{
	{"SeedRace", seedRace},
	{"ManyCreates", manyCreates},
	{"Compaction", compaction},
	{"Progress", progress},
	{"ProgressOrder", progressOrder},
	{"ResumeAfterCut", resumeAfterCut},
	{"ProgressAfterCut", progressAfterCut},
	{"Fragments", fragments},
	{"ViewList", viewList},
	{"ViewRelist", viewRelist},
	{"ViewRestoreAtCompaction", viewRestoreAtCompaction},
	{"ViewSync", viewSync},
}

// Env is the server under test, as the scenarios see it.
type Env struct {
	// Endpoint is the member's client host:port on loopback. The member
	// runs with --max-request-bytes MaxRequestBytes.
	Endpoint string
	// Version is what the member's Status RPC reported.
	Version Version

	kv pb.KVClient
}

// Run asks the member at endpoint for its version and runs every scenario
// against it as a subtest. It returns the version.
func Run(t *testing.T, endpoint string) Version {
	e := Connect(t, endpoint)
	t.Logf("etcd %s at %s", e.Version, endpoint)
	for _, s := range All {
		t.Run(s.Name, func(t *testing.T) { s.Run(t, e) })
	}
	return e.Version
}

// Connect returns the Env of the member at endpoint, with a connection for
// writes closed when the test ends.
func Connect(t *testing.T, endpoint string) *Env {
	t.Helper()
	conn, err := Dial(endpoint)
	must(t, err)
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), Wait)
	defer cancel()
	v, err := ServerVersion(ctx, conn)
	must(t, err)
	return &Env{Endpoint: endpoint, Version: v, kv: pb.NewKVClient(conn)}
}

// open returns a Stream on its own dial.New connection to endpoint,
// both closed when the test ends.
func open(t *testing.T, endpoint string, opts ...etcdwatch.Option) *etcdwatch.Stream {
	t.Helper()
	return openConn(t, endpoint, nil, opts...)
}

// openConn is open with gRPC options of the test's own added.
func openConn(t *testing.T, endpoint string, grpcOpts []grpc.DialOption, opts ...etcdwatch.Option) *etcdwatch.Stream {
	t.Helper()
	conn, err := dial.New([]string{endpoint}, dial.WithInsecure(),
		dial.WithGRPCOptions(grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20))),
		dial.WithGRPCOptions(grpcOpts...))
	must(t, err)
	s, err := etcdwatch.Open(conn, opts...)
	must(t, err)
	t.Cleanup(func() {
		check(t, s.Close() == nil, "Close failed")
		conn.Close()
	})
	return s
}

var runs atomic.Int64

// unique returns a key prefix no other scenario or run uses on a member.
func unique(name string) string {
	return fmt.Sprintf("%s-%d-%d/", name, time.Now().UnixNano(), runs.Add(1))
}

// put writes key and returns the revision.
func (e *Env) put(t *testing.T, key, value string) int64 {
	t.Helper()
	rev, err := e.tryPut(t.Context(), key, value)
	must(t, err)
	return rev
}

// tryPut is put for goroutines other than the test's.
func (e *Env) tryPut(ctx context.Context, key, value string) (int64, error) {
	resp, err := e.kv.Put(ctx, &pb.PutRequest{Key: []byte(key), Value: []byte(value)})
	if err != nil {
		return 0, err
	}
	return resp.Header.Revision, nil
}

// txn writes every key=value in one transaction and returns its revision.
func (e *Env) txn(t *testing.T, kvs ...[2]string) int64 {
	t.Helper()
	var ops []*pb.RequestOp
	for _, kv := range kvs {
		ops = append(ops, &pb.RequestOp{Request: &pb.RequestOp_RequestPut{
			RequestPut: &pb.PutRequest{Key: []byte(kv[0]), Value: []byte(kv[1])}}})
	}
	resp, err := e.kv.Txn(t.Context(), &pb.TxnRequest{Success: ops})
	must(t, err)
	return resp.Header.Revision
}

// next returns the watch's next response.
func next(t *testing.T, w *etcdwatch.Watch) etcdwatch.Response {
	t.Helper()
	select {
	case r, ok := <-w.Responses():
		if !ok {
			t.Fatalf("watch %d ended: %v", w.ID(), w.Err())
		}
		return r
	case <-time.After(Wait):
		t.Fatalf("watch %d: no response within %v", w.ID(), Wait)
		return etcdwatch.Response{}
	}
}

// nextEvents skips bookmarks and returns the next events.
func nextEvents(t *testing.T, w *etcdwatch.Watch) []etcdwatch.Event {
	t.Helper()
	for {
		if r := next(t, w); !r.IsProgress() {
			return r.Events
		}
	}
}

// untilBookmark reads the watch up to a bookmark at rev or above, and
// fails if any events come before it.
func untilBookmark(t *testing.T, w *etcdwatch.Watch, rev int64) {
	t.Helper()
	for {
		r := next(t, w)
		if !r.IsProgress() {
			t.Fatalf("watch on %s got stray events before the bookmark at %d: %v", w.Request(), rev, r.Events)
		}
		if r.Revision >= rev {
			return
		}
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func check(t testing.TB, ok bool, format string, args ...any) {
	t.Helper()
	if !ok {
		t.Fatalf(format, args...)
	}
}

func equal[T comparable](t testing.TB, want, got []T, what string) {
	t.Helper()
	if len(want) != len(got) {
		t.Fatalf("%s: want %d, got %d: %v", what, len(want), len(got), firstDiff(want, got))
	}
	for i := range want {
		if want[i] != got[i] {
			t.Fatalf("%s: %v", what, firstDiff(want, got))
		}
	}
}

func firstDiff[T comparable](want, got []T) string {
	for i := range min(len(want), len(got)) {
		if want[i] != got[i] {
			return fmt.Sprintf("first difference at %d: want %v, got %v", i, want[i], got[i])
		}
	}
	if len(want) > len(got) {
		return fmt.Sprintf("missing from %d on, first %v", len(got), want[len(got)])
	}
	if len(got) > len(want) {
		return fmt.Sprintf("extra from %d on, first %v", len(want), got[len(want)])
	}
	return "equal"
}

// compact compacts the member's history up to rev.
func (e *Env) compact(t *testing.T, rev int64) {
	t.Helper()
	_, err := e.kv.Compact(t.Context(), &pb.CompactionRequest{Revision: rev, Physical: true})
	must(t, err)
}

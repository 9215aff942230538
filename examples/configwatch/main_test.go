package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/etcdwatch/etcdwatch/etcdwatchtest"
)

// TestMain checks that nothing outlives the tests but the idle peer HTTP
// connections of stopped etcd members, which close on their own.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, etcdwatchtest.LeakOptions()...)
}

// wait bounds every wait for the program: a start, a line, an exit.
const wait = 30 * time.Second

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// TestDemo runs `go run ./configwatch` and checks its whole output: the
// seeded table, then every demo change in order, two of them at one
// revision.
func TestDemo(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, run(testContext(t), nil, &out))
	require.Equal(t, []string{
		"config/ at rev 4: 3 keys",
		"KEY               VALUE        MOD REV",
		"config/db/host    db.internal  2",
		"config/log/level  info         3",
		"config/ui/theme   light        4",
		"rev 5: created config/feature/beta = on",
		"rev 6: updated config/log/level: info -> debug",
		"rev 7: updated config/db/host: db.internal -> db2.internal",
		"rev 7: created config/db/port = 5433",
		"rev 8: deleted config/ui/theme",
		"demo done: 4 keys at rev 8",
	}, strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n"))
}

// TestDemoJSON: with -json the values are objects, printed back compact and
// with sorted keys, and a value that is not JSON is shown with its error,
// the key counted all the same.
func TestDemoJSON(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, run(testContext(t), []string{"-json", "-prefix", "svc/"}, &out))
	got := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	require.Len(t, got, 12, "%s", out.String())
	require.Equal(t, []string{
		"svc/ at rev 4: 3 keys",
		"KEY      VALUE                               MOD REV",
		`svc/db   {"host":"db.internal","port":5432}  2`,
		`svc/log  {"level":"info"}                    3`,
		`svc/ui   {"theme":"light"}                   4`,
		`rev 5: created svc/feature = {"beta":true}`,
		`rev 6: updated svc/log: {"level":"info"} -> {"level":"debug"}`,
		`rev 7: updated svc/db: {"host":"db.internal","port":5432} -> {"host":"db2.internal","port":5433}`,
		`rev 7: created svc/cache = {"ttl":"30s"}`,
		"rev 8: deleted svc/ui",
	}, got[:10])
	// The error's text is encoding/json's.
	require.True(t, strings.HasPrefix(got[10], "rev 9: created svc/broken: cannot decode: "), got[10])
	require.Greater(t, len(got[10]), len("rev 9: created svc/broken: cannot decode: "), "the error is printed")
	require.Equal(t, "demo done: 5 keys at rev 9", got[11])
}

// lineWriter hands what is written to it to the test a line at a time.
type lineWriter struct {
	mu    sync.Mutex
	buf   []byte        // an incomplete last line
	lines []string      // complete lines not yet taken
	more  chan struct{} // closed when a line comes
}

func newLineWriter() *lineWriter { return &lineWriter{more: make(chan struct{})} }

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		w.lines = append(w.lines, string(w.buf[:i]))
		w.buf = w.buf[i+1:]
		close(w.more)
		w.more = make(chan struct{})
	}
}

// next takes the next line, waiting for it.
func (w *lineWriter) next(t *testing.T) string {
	t.Helper()
	timeout := time.After(wait)
	for {
		w.mu.Lock()
		if len(w.lines) > 0 {
			line := w.lines[0]
			w.lines = w.lines[1:]
			w.mu.Unlock()
			return line
		}
		more := w.more
		w.mu.Unlock()
		select {
		case <-more:
		case <-timeout:
			t.Fatalf("no line within %v", wait)
		}
	}
}

// expect requires the next lines to be want, in order.
func (w *lineWriter) expect(t *testing.T, want ...string) {
	t.Helper()
	for _, line := range want {
		require.Equal(t, line, w.next(t))
	}
}

// rest is what was written and not taken yet.
func (w *lineWriter) rest() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Join(w.lines, "\n") + string(w.buf)
}

// start runs the program with args until the test ends, and returns its
// output and a function that interrupts it and returns what run returned.
func start(t *testing.T, args ...string) (*lineWriter, func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out := newLineWriter()
	errc := make(chan error, 1)
	go func() { errc <- run(ctx, args, out) }()
	var once sync.Once
	var err error
	stop := func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-errc:
			case <-time.After(wait):
				err = fmt.Errorf("run did not return within %v of its context's end", wait)
			}
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return out, stop
}

// TestEndpoints follows a prefix of an etcd the test runs, through a proxy:
// the table of what is there, the changes as they are made (none for keys
// outside the prefix), then, after a disconnection during which the
// history it needed was compacted, the difference as a relist, and changes
// again after it. An interruption ends it without an error.
func TestEndpoints(t *testing.T) {
	srv := etcdwatchtest.StartEtcd(t)
	proxy := etcdwatchtest.NewProxy(t, srv.Endpoint)
	conn, err := srv.Dial()
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	kv := pb.NewKVClient(conn)
	ctx := testContext(t)
	put := func(key, value string) int64 {
		t.Helper()
		resp, err := kv.Put(ctx, &pb.PutRequest{Key: []byte(key), Value: []byte(value)})
		require.NoError(t, err)
		return resp.Header.Revision
	}
	del := func(key string) int64 {
		t.Helper()
		resp, err := kv.DeleteRange(ctx, &pb.DeleteRangeRequest{Key: []byte(key)})
		require.NoError(t, err)
		require.EqualValues(t, 1, resp.Deleted)
		return resp.Header.Revision
	}

	ra := put("app/a", "1")
	rb := put("app/b", "two")
	rev := put("other/x", "not in the view")
	out, stop := start(t, "-endpoints", proxy.Addr(), "-prefix", "app/")
	out.expect(t,
		fmt.Sprintf("app/ at rev %d: 2 keys", rev),
		"KEY    VALUE  MOD REV",
		fmt.Sprintf("app/a  1      %d", ra),
		fmt.Sprintf("app/b  two    %d", rb))

	rev = put("app/c", "3")
	out.expect(t, fmt.Sprintf("rev %d: created app/c = 3", rev))
	put("other/y", "not in the view either")
	rev = put("app/a", "10")
	out.expect(t, fmt.Sprintf("rev %d: updated app/a: 1 -> 10", rev))
	rev = del("app/b")
	out.expect(t, fmt.Sprintf("rev %d: deleted app/b", rev))

	// Cut the program off, change the prefix and compact the changes away:
	// it can only list again, and shows the difference. app/e comes and
	// goes in the gap, so it is not in it.
	proxy.Refuse(true)
	require.Positive(t, proxy.Cut())
	ra = put("app/a", "11")
	del("app/c")
	rd := put("app/d", "4")
	put("app/e", "5")
	rev = del("app/e")
	_, err = kv.Compact(ctx, &pb.CompactionRequest{Revision: rev})
	require.NoError(t, err)
	proxy.Refuse(false)
	// A put's revision is its key's; a delete's is not known, only that it
	// came by the listing's.
	out.expect(t,
		fmt.Sprintf("relisted at rev %d (after compaction): 3 changes", rev),
		fmt.Sprintf("rev %d: updated app/a: 10 -> 11", ra),
		fmt.Sprintf("rev %d: deleted app/c", rev),
		fmt.Sprintf("rev %d: created app/d = 4", rd))
	rev = put("app/f", "6")
	out.expect(t, fmt.Sprintf("rev %d: created app/f = 6", rev))

	require.NoError(t, stop())
	require.Empty(t, out.rest(), "lines after the last change")
}

// TestNoDemo: on the embedded etcd with -demo=false, the program shows the
// seeded table, then writes nothing itself: the first change it shows is
// the test's, written to the endpoint it logs. It runs until interrupted.
func TestNoDemo(t *testing.T) {
	logs := newLineWriter()
	logOutput = logs
	t.Cleanup(func() { logOutput = os.Stderr })
	out, stop := start(t, "-demo=false")
	var endpoint string
	for endpoint == "" {
		line := logs.next(t)
		if strings.Contains(line, `msg="started an embedded etcd"`) {
			_, after, ok := strings.Cut(line, " endpoint=")
			require.True(t, ok, line)
			endpoint, _, _ = strings.Cut(after, " ")
		}
	}
	out.expect(t,
		"config/ at rev 4: 3 keys",
		"KEY               VALUE        MOD REV",
		"config/db/host    db.internal  2",
		"config/log/level  info         3",
		"config/ui/theme   light        4")

	conn, err := grpc.NewClient(endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	resp, err := pb.NewKVClient(conn).Put(testContext(t), &pb.PutRequest{Key: []byte("config/mine"), Value: []byte("yes")})
	require.NoError(t, err)
	require.EqualValues(t, 5, resp.Header.Revision)
	out.expect(t, "rev 5: created config/mine = yes")
	require.NoError(t, stop())
	require.Empty(t, out.rest(), "a change nobody made")
}

// TestUsage: a command line that cannot be run is refused before anything
// starts.
func TestUsage(t *testing.T) {
	for _, args := range [][]string{{"-nope"}, {"-prefix", ""}, {"extra"}, {"-log-level", "loud"}} {
		err := run(testContext(t), args, io.Discard)
		require.ErrorIs(t, err, errUsage, "%q", args)
	}
}

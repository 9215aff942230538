// Package e2e proves etcdwatch against a real etcd server, embedded in the
// test process.
package e2e

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/goleak"
	"google.golang.org/grpc"

	"github.com/etcdwatch/etcdwatch"
	"github.com/etcdwatch/etcdwatch/dial"
	"github.com/etcdwatch/etcdwatch/etcdwatchtest"
)

// wait bounds every wait; nothing is timed.
const wait = 30 * time.Second

// etcd is the member shared by the tests; each test uses its own key prefix.
var etcd *etcdwatchtest.Server

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "etcdwatch-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	etcd, err = etcdwatchtest.StartEtcdIn(dir, func(c *embed.Config) {
		c.MaxRequestBytes = maxRequestBytes
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	code := m.Run()
	etcd.Stop()
	if code == 0 {
		if err := goleak.Find(etcdwatchtest.LeakOptions()...); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			return 1
		}
	}
	return code
}

// leakCheck makes the test fail if a goroutine of the client (or of this
// module's test tools) started during the test outlives it. The shared etcd
// keeps goroutines of its own coming and going, so the check looks at our
// packages' stacks only; goleak checks the whole process once the package
// is done. Goroutines already there when the test began are another test's
// leak, reported by that test, so one leak fails one test. Call it first,
// so that it runs after every other cleanup.
func leakCheck(t *testing.T) {
	before := make(map[string]bool)
	for _, g := range ourGoroutines() {
		before[goroutineID(g)] = true
	}
	since := func() []string {
		var leaked []string
		for _, g := range ourGoroutines() {
			if !before[goroutineID(g)] {
				leaked = append(leaked, g)
			}
		}
		return leaked
	}
	t.Cleanup(func() {
		if !assert.Eventually(t, func() bool { return len(since()) == 0 }, wait, 10*time.Millisecond) {
			t.Errorf("goroutines left behind:\n%s", strings.Join(since(), "\n\n"))
		}
	})
}

// goroutineID returns the id in a stack's first line, "goroutine 7 [...]:".
func goroutineID(stack string) string {
	id, _, _ := strings.Cut(strings.TrimPrefix(stack, "goroutine "), " ")
	return id
}

// ourGoroutines returns the stacks of other goroutines running code of this
// repository.
func ourGoroutines() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var ours []string
	for i, g := range strings.Split(string(buf), "\n\n") {
		if i > 0 && strings.Contains(g, "github.com/etcdwatch/etcdwatch") && !strings.Contains(g, "testing.tRunner") {
			ours = append(ours, g)
		}
	}
	return ours
}

// maxRequestBytes lets a test write a 3 MiB transaction; the server then
// fragments watch responses above maxRequestBytes + 512 KiB.
const maxRequestBytes = 7 << 19

// open returns a Stream on its own connection to the shared member.
func open(t *testing.T, opts ...etcdwatch.Option) *etcdwatch.Stream {
	t.Helper()
	return openOn(t, []string{etcd.Endpoint}, opts...)
}

// openOn returns a Stream on its own dial.New connection, both closed
// when the test ends. Messages up to 64 MiB are accepted, for fragments.
func openOn(t *testing.T, endpoints []string, opts ...etcdwatch.Option) *etcdwatch.Stream {
	t.Helper()
	conn, err := dial.New(endpoints, dial.WithInsecure(),
		dial.WithGRPCOptions(grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20))))
	require.NoError(t, err)
	s, err := etcdwatch.Open(conn, opts...)
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, s.Close())
		require.NoError(t, conn.Close())
	})
	return s
}

// client returns an official client for writing, closed when the test ends.
func client(t *testing.T) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{
		Endpoints:          []string{etcd.Endpoint},
		DialTimeout:        wait,
		MaxCallSendMsgSize: 64 << 20,
	})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close()) })
	return c
}

func ctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*wait)
	t.Cleanup(cancel)
	return ctx
}

// next returns the watch's next response.
func next(t *testing.T, w *etcdwatch.Watch) etcdwatch.Response {
	t.Helper()
	select {
	case r, ok := <-w.Responses():
		require.True(t, ok, "watch ended: %v", w.Err())
		return r
	case <-time.After(wait):
		t.Fatalf("no response for watch %d", w.ID())
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

package e2e

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/etcdwatch/etcdwatch"
	"github.com/etcdwatch/etcdwatch/etcdwatchtest"
)

// fastRetry keeps reconnection delays short in tests.
var fastRetry = etcdwatch.WithReconnectBackoff(10*time.Millisecond, 200*time.Millisecond)

// clientFor returns an official client on endpoints, for writing; it
// reconnects to a restarted member within a second.
func clientFor(t *testing.T, endpoints ...string) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: wait, DialOptions: []grpc.DialOption{
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, MaxDelay: time.Second},
			MinConnectTimeout: time.Second,
		}),
	}})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close()) })
	return c
}

// watchSet is a varied set of watches on one prefix, all from revision start.
func watchSet(t *testing.T, s *etcdwatch.Stream, prefix string, start int64) []*recording {
	return slowWatchSet(t, s, prefix, start, 0)
}

// slowWatchSet is watchSet with consumers that, every other second, take
// pause per event (see recordSlowly).
func slowWatchSet(t *testing.T, s *etcdwatch.Stream, prefix string, start int64, pause time.Duration) []*recording {
	t.Helper()
	reqs := []etcdwatch.Request{
		etcdwatch.Prefix(prefix),
		etcdwatch.Prefix(prefix).WithPrevKV(),
		etcdwatch.Prefix(prefix).WithoutDeletes(),
		etcdwatch.Prefix(prefix).WithoutPuts().WithPrevKV(),
		etcdwatch.Key(prefix + "k01").WithPrevKV(),
		etcdwatch.Range(prefix+"k00", prefix+"k05"),
		etcdwatch.Prefix(prefix).WithFragment(),
	}
	var recs []*recording
	for _, r := range reqs {
		w, err := s.Watch(t.Context(), r.FromRevision(start)) // ends with the test, not before
		require.NoError(t, err)
		recs = append(recs, recordSlowly(w, start, pause))
	}
	return recs
}

// finish stops the writer, waits for every watch to deliver the whole
// history, ends the watches and checks each against the history.
func finish(t *testing.T, w *writer, recs []*recording) (events int) {
	t.Helper()
	last := w.Stop()
	for _, r := range recs {
		waitDelivered(t, w.lastMatching(r, last), r)
	}
	for _, r := range recs {
		r.w.Cancel()
		events += w.check(t, r, last)
	}
	return events
}

// unique returns a key prefix no earlier run used on the shared member, for
// tests whose writer must know every key under its prefix (-count=N).
func unique(name string) string { return fmt.Sprintf("%s-%d/", name, time.Now().UnixNano()) }

// currentRevision returns the store's revision now.
func currentRevision(t *testing.T, kv *clientv3.Client) int64 {
	t.Helper()
	resp, err := kv.Get(ctx(t), "\x00")
	require.NoError(t, err)
	return resp.Header.Revision
}

// progressed waits until the first recording delivers past rev.
func progressed(t *testing.T, r *recording, rev int64) {
	t.Helper()
	require.Eventually(t, func() bool { return r.Last() > rev }, wait, time.Millisecond, "no event after revision %d", rev)
}

// flowingAgain waits until the stream has re-created its n watches on a new
// gRPC stream since Stats showed created, and the first recording has then
// delivered a write made after that.
func flowingAgain(t *testing.T, s *etcdwatch.Stream, created uint64, n int, w *writer, r *recording) {
	t.Helper()
	require.Eventually(t, func() bool { return s.Stats().Created >= created+uint64(n) }, wait, time.Millisecond, "watches not re-created")
	progressed(t, r, w.Last())
}

// TestResumeAcrossConnectionCuts cuts every connection ten times while a
// writer runs; every watch must deliver its exact history.
func TestResumeAcrossConnectionCuts(t *testing.T) {
	leakCheck(t)
	kv := client(t)
	proxy := etcdwatchtest.NewProxy(t, etcd.Endpoint)
	s := openOn(t, []string{proxy.Addr()}, fastRetry)
	start := currentRevision(t, kv) + 1
	prefix := unique("cuts")
	recs := watchSet(t, s, prefix, start)
	w := startWriter(t, kv, prefix, 10)
	const cuts = 10
	progressed(t, recs[0], w.Last())
	for range cuts {
		created := s.Stats().Created
		require.Positive(t, proxy.Cut())
		flowingAgain(t, s, created, len(recs), w, recs[0])
	}
	events := finish(t, w, recs)
	st := s.Stats()
	require.GreaterOrEqual(t, st.Reconnects, uint64(cuts))
	t.Logf("%d cuts, %d transactions, %d events checked over %d watches; reconnects %d, resumed %d, duplicates dropped %d; lost 0, duplicated 0",
		cuts, w.txns, events, len(recs), st.Reconnects, st.Moved, st.DuplicatesDropped)
}

// TestResumeAfterMemberRestart stops and restarts the member a stream is on.
func TestResumeAfterMemberRestart(t *testing.T) {
	leakCheck(t)
	member := etcdwatchtest.StartEtcd(t)
	kv := clientFor(t, member.Endpoint)
	s := openOn(t, []string{member.Endpoint}, fastRetry)
	start := currentRevision(t, kv) + 1
	recs := watchSet(t, s, "restart/", start)
	w := startWriter(t, kv, "restart/", 10)
	progressed(t, recs[0], w.Last())
	for range 2 {
		created := s.Stats().Created
		member.Stop() // etcd waits up to its request timeout (5s) for open watch streams
		require.NoError(t, member.Restart())
		flowingAgain(t, s, created, len(recs), w, recs[0])
	}
	events := finish(t, w, recs)
	st := s.Stats()
	require.GreaterOrEqual(t, st.Reconnects, uint64(2))
	t.Logf("2 restarts, %d transactions, %d events checked; reconnects %d; lost 0, duplicated 0", w.txns, events, st.Reconnects)
}

// TestBlackholedConnectionIsReplaced: the connection under the stream
// silently stops carrying packets, as when a firewall drops the flow. Nothing
// reports an error; the stream must recover by itself. Over dial.New's
// connection that is gRPC keepalive's doing (the liveness checks are off
// here, so that they cannot do it instead: a probe can only open streams
// over the same dead connection, see TestConnectedIsFalseWhileBlackholed).
func TestBlackholedConnectionIsReplaced(t *testing.T) {
	leakCheck(t)
	kv := client(t)
	proxy := etcdwatchtest.NewProxy(t, etcd.Endpoint)
	s := openOn(t, []string{proxy.Addr()}, fastRetry, etcdwatch.WithLiveness(0, 0))
	start := currentRevision(t, kv) + 1
	prefix := unique("blackhole")
	recs := watchSet(t, s, prefix, start)
	w := startWriter(t, kv, prefix, 10)
	progressed(t, recs[0], w.Last())
	require.Positive(t, proxy.Blackhole())
	at := time.Now()
	// Events already in socket buffers still arrive; wait for writes made
	// well after the blackhole, which only a new connection can carry.
	after := max(w.Last(), recs[0].Last()) + 100
	require.Eventually(t, func() bool { return w.Last() >= after }, wait, time.Millisecond, "the writer stalled")
	require.Eventually(t, func() bool { return recs[0].Last() >= after }, time.Minute, 10*time.Millisecond,
		"the stream never recovered from the blackhole")
	recovered := time.Since(at)
	events := finish(t, w, recs)
	st := s.Stats()
	require.Positive(t, st.Reconnects)
	t.Logf("recovered %v after the blackhole (keepalive 10s+5s); %d events checked; reconnects %d", recovered, events, st.Reconnects)
}

// TestConnectedIsFalseWhileBlackholed: over a plain connection without
// keepalive, which gRPC never gives up, a blackhole is noticed only by the
// Stream's liveness probe; each stream it opens to replace the silent one
// goes over the same dead connection. State.Connected must say so: false
// from the first replacement on, through every later one, until a server
// answers again (here once the proxy cuts the dead connection and gRPC
// dials a new one).
func TestConnectedIsFalseWhileBlackholed(t *testing.T) {
	leakCheck(t)
	kv := client(t)
	proxy := etcdwatchtest.NewProxy(t, etcd.Endpoint)
	conn, err := grpc.NewClient(proxy.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	s, err := etcdwatch.Open(conn, fastRetry, etcdwatch.WithLiveness(300*time.Millisecond, 300*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	prefix := unique("connected")
	w, err := s.Watch(ctx(t), etcdwatch.Prefix(prefix))
	require.NoError(t, err)
	require.True(t, s.State().Connected, "the server has answered the create")

	require.Positive(t, proxy.Blackhole())
	require.Eventually(t, func() bool { return !s.State().Connected }, wait, time.Millisecond,
		"Connected stayed true over a blackholed connection")
	// Sample the state while three more streams open over the dead
	// connection and are given up: each is open for most of its life, and
	// a Connected that meant "open" would read true nearly all the time.
	sample := time.NewTicker(5 * time.Millisecond)
	defer sample.Stop()
	for before := s.Stats().Reconnects; s.Stats().Reconnects < before+3; <-sample.C {
		require.False(t, s.State().Connected, "a stream over the dead connection was reported Connected")
	}

	proxy.Cut() // the dead connection ends; gRPC dials anew
	require.Eventually(t, func() bool { return s.State().Connected }, wait, time.Millisecond, "Connected never came back")
	rev := put(t, kv, prefix+"k", "v")
	for {
		r := next(t, w)
		if len(r.Events) > 0 && r.Events[len(r.Events)-1].ModRevision >= rev {
			break
		}
	}
}

// TestCompactionWhileDisconnected: history the watch needs is compacted
// while it cannot reach the server; it must end with *CompactedError naming
// both revisions, never skip.
func TestCompactionWhileDisconnected(t *testing.T) {
	leakCheck(t)
	kv := client(t)
	proxy := etcdwatchtest.NewProxy(t, etcd.Endpoint)
	s := openOn(t, []string{proxy.Addr()}, fastRetry)
	first, err := kv.Put(ctx(t), "gap/k", "0")
	require.NoError(t, err)
	wt, err := s.Watch(ctx(t), etcdwatch.Key("gap/k").FromRevision(first.Header.Revision))
	require.NoError(t, err)
	require.Equal(t, first.Header.Revision, nextEvents(t, wt)[0].ModRevision)

	proxy.Refuse(true)
	proxy.Cut()
	// The next stream waits for the connection, which the proxy refuses.
	require.Eventually(t, func() bool { return s.Stats().Reconnects >= 1 }, wait, time.Millisecond, "the cut went unnoticed")
	var last int64
	for i := range 5 {
		resp, err := kv.Put(ctx(t), "gap/k", fmt.Sprint(i+1))
		require.NoError(t, err)
		last = resp.Header.Revision
	}
	_, err = kv.Compact(ctx(t), last)
	require.NoError(t, err)
	proxy.Refuse(false)

	for range wt.Responses() {
		t.Fatal("an event across the compacted gap was delivered")
	}
	var ce *etcdwatch.CompactedError
	require.ErrorAs(t, wt.Err(), &ce)
	require.Equal(t, first.Header.Revision+1, ce.Revision)
	require.Equal(t, last, ce.CompactRevision)
}

// TestManyWatchesResumeAfterCut times 5,000 live watches flowing again after
// every connection is cut.
func TestManyWatchesResumeAfterCut(t *testing.T) {
	leakCheck(t)
	kv := client(t)
	proxy := etcdwatchtest.NewProxy(t, etcd.Endpoint)
	s := openOn(t, []string{proxy.Addr()}, fastRetry)
	const n = 5000
	watches := make([]*etcdwatch.Watch, n)
	var wg sync.WaitGroup
	for g := range 50 {
		wg.Go(func() {
			for i := g; i < n; i += 50 {
				w, err := s.Watch(ctx(t), etcdwatch.Prefix("many5k/"))
				if err != nil {
					t.Error(err)
					return
				}
				watches[i] = w
			}
		})
	}
	wg.Wait()
	put := func(v string) int64 {
		resp, err := kv.Put(ctx(t), "many5k/k", v)
		require.NoError(t, err)
		return resp.Header.Revision
	}
	waitAll := func(rev int64) {
		for _, w := range watches {
			for {
				events := nextEvents(t, w)
				if events[len(events)-1].ModRevision >= rev {
					break
				}
			}
		}
	}
	waitAll(put("before"))
	cut := time.Now()
	require.Positive(t, proxy.Cut())
	rev := put("after")
	waitAll(rev)
	took := time.Since(cut)
	st := s.Stats()
	require.GreaterOrEqual(t, st.Moved, uint64(n))
	t.Logf("%d watches flowing again %v after a cut (reconnects %d, resumed %d)", n, took, st.Reconnects, st.Moved)
}

// TestMemberKillsInCluster kills and restarts each member of a 3-member
// cluster in turn, the leader first, under a multi-endpoint connection with
// require-leader; every watch must deliver its exact history.
func TestMemberKillsInCluster(t *testing.T) {
	leakCheck(t)
	members := etcdwatchtest.StartCluster(t, 3)
	var endpoints []string
	for _, m := range members {
		endpoints = append(endpoints, m.Endpoint)
	}
	kv := clientFor(t, endpoints...)
	s := openOn(t, endpoints, fastRetry, etcdwatch.WithRequireLeader())
	start := currentRevision(t, kv) + 1
	recs := watchSet(t, s, "cluster/", start)
	w := startWriter(t, kv, "cluster/", 10)
	order := []*etcdwatchtest.Server{}
	for _, m := range members {
		if m.IsLeader() {
			order = append([]*etcdwatchtest.Server{m}, order...)
		} else {
			order = append(order, m)
		}
	}
	for _, m := range order {
		progressed(t, recs[0], w.Last())
		m.Stop()
		progressed(t, recs[0], w.Last()) // the others serve on
		require.NoError(t, m.Restart())
	}
	progressed(t, recs[0], w.Last())
	events := finish(t, w, recs)
	st := s.Stats()
	t.Logf("3 member kills (leader first), %d transactions, %d events checked; reconnects %d, resumed %d; lost 0, duplicated 0",
		w.txns, events, st.Reconnects, st.Moved)
}

// TestClientV3ConnectionWithAuth: a Stream on the connection of an official
// client with auth enabled watches what the user may read, and is refused
// the rest.
func TestClientV3ConnectionWithAuth(t *testing.T) {
	leakCheck(t)
	member := etcdwatchtest.StartEtcd(t)
	root := clientFor(t, member.Endpoint)
	c := ctx(t)
	for _, step := range []func() error{
		func() error { _, err := root.UserAdd(c, "root", "rootpw"); return err },
		func() error { _, err := root.UserGrantRole(c, "root", "root"); return err },
		func() error { _, err := root.RoleAdd(c, "reader"); return err },
		func() error {
			_, err := root.RoleGrantPermission(c, "reader", "auth/", clientv3.GetPrefixRangeEnd("auth/"), clientv3.PermissionType(clientv3.PermRead))
			return err
		},
		func() error { _, err := root.UserAdd(c, "alice", "alicepw"); return err },
		func() error { _, err := root.UserGrantRole(c, "alice", "reader"); return err },
		func() error { _, err := root.AuthEnable(c); return err },
	} {
		require.NoError(t, step())
	}
	admin, err := clientv3.New(clientv3.Config{Endpoints: []string{member.Endpoint}, Username: "root", Password: "rootpw", DialTimeout: wait})
	require.NoError(t, err)
	t.Cleanup(func() { admin.Close() })
	alice, err := clientv3.New(clientv3.Config{Endpoints: []string{member.Endpoint}, Username: "alice", Password: "alicepw", DialTimeout: wait})
	require.NoError(t, err)
	t.Cleanup(func() { alice.Close() })

	s, err := etcdwatch.Open(alice.ActiveConnection())
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	w, err := s.Watch(c, etcdwatch.Prefix("auth/"))
	require.NoError(t, err)
	_, err = s.Watch(c, etcdwatch.Key("secret"))
	require.ErrorIs(t, err, etcdwatch.ErrPermissionDenied)
	var se *etcdwatch.ServerError
	require.True(t, errors.As(err, &se), "%v", err)
	_, err = admin.Put(c, "auth/k", "v")
	require.NoError(t, err)
	require.Equal(t, "auth/k", string(nextEvents(t, w)[0].Key))
}

package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdwatch/etcdwatch"
	"github.com/etcdwatch/etcdwatch/etcdwatchtest"
)

// committedAfter waits until the writer has committed a transaction that it
// began after the call, and returns a revision at or above that
// transaction's. Such a write was made after whatever the caller did just
// before, so a watch can only deliver it over a stream that outlived that.
func (w *writer) committedAfter(t *testing.T) int64 {
	t.Helper()
	w.mu.Lock()
	n := w.txns
	w.mu.Unlock()
	// Transaction n+1 may have been on its way already; n+2 began once n+1
	// was recorded, which is after the call.
	var rev int64
	require.Eventually(t, func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		rev = w.last
		return w.txns >= n+2
	}, wait, time.Millisecond, "the writer committed nothing new")
	return rev
}

// running asserts that none of the watches has ended.
func running(t *testing.T, recs []*recording) {
	t.Helper()
	for _, r := range recs {
		select {
		case <-r.done:
			t.Fatalf("watch %s ended: %v", r.w.Request(), r.w.Err())
		default:
		}
	}
}

// canceledOnly asserts that every watch ended by its Cancel, not earlier.
func canceledOnly(t *testing.T, recs []*recording) {
	t.Helper()
	for _, r := range recs {
		require.ErrorIs(t, r.w.Err(), etcdwatch.ErrCanceled, "watch %s", r.w.Request())
	}
}

// TestCutSeries cuts the stream's connection ten times in quick succession
// under continuous writes, with the default options: each cut as soon as the
// previous one's new stream has delivered a write made after that cut. The
// proxy adds 2 ms each way, so a cut catches bytes in flight.
//
// Each write made after a cut can only come over a new gRPC stream, so each
// cut adds at least one reconnect. Exactly one is not guaranteed: a new
// stream may be opened on the connection gRPC has not yet seen close and
// fail at once, which is one more replaced stream and no fault.
func TestCutSeries(t *testing.T) {
	leakCheck(t)
	kv := client(t)
	proxy := etcdwatchtest.NewProxy(t, etcd.Endpoint)
	proxy.SetDelay(2 * time.Millisecond)
	s := openOn(t, []string{proxy.Addr()})
	start := currentRevision(t, kv) + 1
	prefix := unique("cutseries")
	recs := watchSet(t, s, prefix, start)
	all := recs[0] // the whole prefix: every write is one of its events
	w := startWriter(t, kv, prefix, 10)
	waitDelivered(t, w.committedAfter(t), all)
	const cuts = 10
	began := time.Now()
	for i := range cuts {
		reconnects, events := s.Stats().Reconnects, all.events()
		require.Positive(t, proxy.Cut())
		waitDelivered(t, w.committedAfter(t), all)
		require.Greater(t, all.events(), events, "cut %d: no new event", i)
		require.Greater(t, s.Stats().Reconnects, reconnects, "cut %d: a write made after it came without a new stream", i)
	}
	took := time.Since(began)
	running(t, recs)
	events := finish(t, w, recs)
	canceledOnly(t, recs)
	st := s.Stats()
	require.GreaterOrEqual(t, st.Reconnects, uint64(cuts))
	t.Logf("%d cuts in %v (not asserted), %d transactions, %d events checked over %d watches; reconnects %d, resumed %d, duplicates dropped %d",
		cuts, took, w.txns, events, len(recs), st.Reconnects, st.Moved, st.DuplicatesDropped)
}

// TestQuorumLossUnderRequireLeader: a require-leader stream on one member of
// three, with the default options. The other two are killed: the member
// loses its leader, and etcd ends its require-leader streams (after three
// election timeouts without one) and refuses new ones. One member comes
// back; the watches, never ended, must deliver every committed write once.
func TestQuorumLossUnderRequireLeader(t *testing.T) {
	leakCheck(t)
	members := etcdwatchtest.StartCluster(t, 3)
	var served *etcdwatchtest.Server
	var others, endpoints []string
	var killed []*etcdwatchtest.Server
	for _, m := range members {
		endpoints = append(endpoints, m.Endpoint)
		if served == nil && !m.IsLeader() {
			served = m // a follower, so that the leader is among the killed
		} else {
			killed = append(killed, m)
			others = append(others, m.Endpoint)
		}
	}
	kv := clientFor(t, endpoints...)
	s := openOn(t, []string{served.Endpoint}, etcdwatch.WithRequireLeader())
	start := currentRevision(t, kv) + 1
	recs := watchSet(t, s, "quorum/", start)
	w := startWriter(t, kv, "quorum/", 10)
	waitDelivered(t, w.committedAfter(t), recs[0])

	reconnects := s.Stats().Reconnects
	for _, m := range killed {
		m.Stop()
	}
	require.Eventually(t, func() bool { return !served.HasLeader() }, wait, time.Millisecond,
		"member %s kept a leader without %v", served.Name, others)
	require.Eventually(t, func() bool { return s.Stats().Reconnects > reconnects }, wait, time.Millisecond,
		"the member without a leader did not end the require-leader stream")
	lastBefore := w.Last()
	running(t, recs)

	require.NoError(t, killed[0].Restart()) // returns once it has rejoined a quorum
	after := w.committedAfter(t)            // the writer retries until writes succeed
	require.Greater(t, after, lastBefore)
	waitDelivered(t, after, recs[0])
	running(t, recs)
	events := finish(t, w, recs)
	canceledOnly(t, recs)
	st := s.Stats()
	t.Logf("quorum lost and regained; %d transactions, %d events checked over %d watches; reconnects %d, resumed %d, duplicates dropped %d",
		w.txns, events, len(recs), st.Reconnects, st.Moved, st.DuplicatesDropped)
}

// TestStoppedNeighbour: two watches on one stream see the same events; one
// consumer reads nothing until every write is committed, the other reads at
// once. With default options, the reading one must receive all its events
// while the other has read nothing (counts, not time), and the stopped one
// then gets every event once, in order.
func TestStoppedNeighbour(t *testing.T) {
	const (
		txns      = 2000
		perTxn    = 10
		valueSize = 2 << 10
	)
	leakCheck(t)
	s, kv, c := open(t), client(t), ctx(t)
	prefix := unique("neighbour")
	start := currentRevision(t, kv) + 1
	req := etcdwatch.Prefix(prefix).FromRevision(start)
	reading, err := s.Watch(t.Context(), req)
	require.NoError(t, err)
	stopped, err := s.Watch(t.Context(), req)
	require.NoError(t, err)
	fast := record(reading, start)

	history := &writer{t: t, prefix: prefix, model: map[string]string{}} // records only; the test writes
	began := time.Now()
	for i := range txns {
		ops := make([]plannedOp, perTxn)
		txn := make([]clientv3.Op, perTxn)
		for j := range ops {
			head := fmt.Sprintf("%d.%d:", i, j)
			ops[j] = plannedOp{key: fmt.Sprintf("%sk%d", prefix, j), value: head + strings.Repeat("v", valueSize-len(head))}
			txn[j] = clientv3.OpPut(ops[j].key, ops[j].value)
		}
		resp, err := kv.Txn(c).Then(txn...).Commit()
		require.NoError(t, err)
		history.record(resp.Header.Revision, ops)
	}
	last := history.Last()
	wrote := time.Since(began)

	// Nothing has read the stopped watch yet: the reading one must have
	// received every event regardless.
	waitDelivered(t, last, fast)
	reading.Cancel()
	require.Equal(t, txns*perTxn, history.check(t, fast, last), "the reading neighbour")
	mid := s.Stats()

	slow := record(stopped, start)
	waitDelivered(t, last, slow)
	stopped.Cancel()
	require.Equal(t, txns*perTxn, history.check(t, slow, last), "the stopped consumer, once it read")
	canceledOnly(t, []*recording{fast, slow})
	st := s.Stats()
	t.Logf("%d events each, written in %v (not asserted); when the reader had all: stalls %d, pauses %d; at the end: resumes %d, duplicates dropped %d, reconnects %d",
		txns*perTxn, wrote, mid.Stalls, mid.Pauses, st.Resumes, st.DuplicatesDropped, st.Reconnects)
}

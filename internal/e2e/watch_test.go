package e2e

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding/gzip"

	"github.com/etcdwatch/etcdwatch"
	"github.com/etcdwatch/etcdwatch/dial"
	"github.com/etcdwatch/etcdwatch/etcdwatchtest"
)

// collect reads a watch's events in a goroutine until stop is closed and
// the events up to the revision sent on upTo have arrived.
type collector struct {
	mu     sync.Mutex
	events []etcdwatch.Event
	done   chan struct{}
}

func collect(t *testing.T, w *etcdwatch.Watch, upTo <-chan int64) *collector {
	c := &collector{done: make(chan struct{})}
	go func() {
		defer close(c.done)
		var last int64 = -1
		var seen int64
		for {
			select {
			case r, ok := <-w.Responses():
				if !assert.True(t, ok, "watch ended: %v", w.Err()) {
					return
				}
				c.mu.Lock()
				c.events = append(c.events, r.Events...)
				c.mu.Unlock()
				seen = r.Revision
			case last = <-upTo:
				upTo = nil
			case <-time.After(wait):
				t.Errorf("watch %d: no response within %v", w.ID(), wait)
				return
			}
			if last >= 0 && seen >= last {
				return
			}
		}
	}()
	return c
}

// TestBusyPrefixWhileCreating is the reported interleaving against a real
// server: while a writer keeps one watch busy, 250 more watches are created
// on the same stream, from goroutines calling Watch or by one WatchAll.
// Every watch must get exactly its own events, and the busy watch every
// write, in order.
func TestBusyPrefixWhileCreating(t *testing.T) {
	t.Run("Watch", func(t *testing.T) { busyPrefixWhileCreating(t, false) })
	t.Run("WatchAll", func(t *testing.T) { busyPrefixWhileCreating(t, true) })
}

func busyPrefixWhileCreating(t *testing.T, watchAll bool) {
	leakCheck(t)
	s, kv, ctx := open(t), client(t), ctx(t)
	prefix := unique("race")
	busy, err := s.Watch(ctx, etcdwatch.Prefix(prefix+"busy/"))
	require.NoError(t, err)
	lastRev := make(chan int64, 1)
	busyEvents := collect(t, busy, lastRev)

	stop := make(chan struct{})
	written := make(chan []int64, 1)
	go func() {
		var revs []int64
		defer func() { written <- revs }()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			resp, err := kv.Put(ctx, prefix+"busy/k", strconv.Itoa(i))
			if !assert.NoError(t, err) {
				return
			}
			revs = append(revs, resp.Header.Revision)
		}
	}()

	start := time.Now()
	own := func(n int) string { return fmt.Sprintf("%sown/%03d", prefix, n) }
	var watches []*etcdwatch.Watch
	if watchAll {
		watches = watchAllKeys(t, s, 250, own)
	} else {
		watches = watchKeys(t, s, 10, 25, own)
	}
	created := time.Since(start)
	for n := range watches {
		_, err := kv.Put(ctx, own(n), fmt.Sprint("own-", n))
		require.NoError(t, err)
	}
	close(stop)
	revs := <-written
	require.NotEmpty(t, revs)
	lastRev <- revs[len(revs)-1]
	<-busyEvents.done

	var got []int64
	for _, e := range busyEvents.events {
		require.Equal(t, prefix+"busy/k", string(e.Key))
		got = append(got, e.ModRevision)
	}
	require.Equal(t, revs, got, "the busy watch lost, repeated or reordered events")

	progress, err := s.RequestProgress(ctx)
	require.NoError(t, err)
	for n, w := range watches {
		r := next(t, w)
		for r.IsProgress() {
			r = next(t, w)
		}
		require.Len(t, r.Events, 1)
		require.Equal(t, own(n), string(r.Events[0].Key))
		require.Equal(t, fmt.Sprint("own-", n), string(r.Events[0].Value))
		for r.Revision < progress { // nothing else up to the progress revision, whose bookmark comes after
			r = next(t, w)
			require.True(t, r.IsProgress(), "watch %d got a stray event %v", n, r.Events)
		}
	}
	t.Logf("created %d watches beside a writer in %v; busy watch checked %d events up to revision %d (progress %d)",
		len(watches), created, len(got), revs[len(revs)-1], progress)
}

// TestManyWatchesFromManyGoroutines creates 5,000 watches from 50 goroutines
// on one stream and checks that each gets the write to its own key.
func TestManyWatchesFromManyGoroutines(t *testing.T) {
	leakCheck(t)
	s, kv, ctx := open(t), client(t), ctx(t)
	const goroutines, each = 50, 100
	key := func(n int) string { return fmt.Sprintf("many/%04d", n) }
	start := time.Now()
	watches := watchKeys(t, s, goroutines, each, key)
	created := time.Since(start)
	var wg sync.WaitGroup
	require.Equal(t, int64(len(watches)), s.Stats().Watches)
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				_, err := kv.Put(ctx, key(g*each+i), "v")
				assert.NoError(t, err)
			}
		})
	}
	wg.Wait()
	for n, w := range watches {
		events := nextEvents(t, w)
		require.Len(t, events, 1)
		require.Equal(t, key(n), string(events[0].Key))
	}
	t.Logf("created %d watches from %d goroutines in %v; %d events checked", len(watches), goroutines, created, len(watches))
}

// TestCompactedRevision: a watch from a compacted revision is refused with
// *CompactedError; one from the compaction point onwards works.
func TestCompactedRevision(t *testing.T) {
	leakCheck(t)
	s, kv, ctx := open(t), client(t), ctx(t)
	var revs []int64
	for i := range 5 {
		resp, err := kv.Put(ctx, "compact/k", strconv.Itoa(i))
		require.NoError(t, err)
		revs = append(revs, resp.Header.Revision)
	}
	_, err := kv.Compact(ctx, revs[3])
	require.NoError(t, err)

	w, err := s.Watch(ctx, etcdwatch.Key("compact/k").FromRevision(revs[0]))
	require.NoError(t, err, "etcd confirms the create before it cancels")
	err = func() error {
		for range w.Responses() {
		}
		return w.Err()
	}()
	var ce *etcdwatch.CompactedError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, revs[3], ce.CompactRevision)
	require.Equal(t, revs[0], ce.Revision)

	w, err = s.Watch(ctx, etcdwatch.Key("compact/k").FromRevision(revs[3]))
	require.NoError(t, err)
	events := nextEvents(t, w)
	require.Equal(t, revs[3], events[0].ModRevision)
}

// TestFiltersAndPrevKV checks event types, filters and previous values.
func TestFiltersAndPrevKV(t *testing.T) {
	leakCheck(t)
	s, kv, ctx := open(t), client(t), ctx(t)
	puts, err := s.Watch(ctx, etcdwatch.Prefix("filter/").WithoutDeletes().WithPrevKV())
	require.NoError(t, err)
	deletes, err := s.Watch(ctx, etcdwatch.Prefix("filter/").WithoutPuts().WithPrevKV())
	require.NoError(t, err)
	for _, op := range []clientv3.Op{
		clientv3.OpPut("filter/a", "1"), clientv3.OpPut("filter/a", "2"),
		clientv3.OpDelete("filter/a"), clientv3.OpPut("filter/b", "1"),
	} {
		_, err := kv.Do(ctx, op)
		require.NoError(t, err)
	}
	var got []etcdwatch.Event
	for len(got) < 3 {
		got = append(got, nextEvents(t, puts)...)
	}
	require.Len(t, got, 3)
	require.True(t, got[0].IsCreate())
	require.Nil(t, got[0].PrevKV)
	require.True(t, got[1].IsModify())
	require.Equal(t, "1", string(got[1].PrevKV.Value))
	require.Equal(t, "2", string(got[1].Value))
	require.Equal(t, "filter/b", string(got[2].Key))

	del := nextEvents(t, deletes)
	require.Len(t, del, 1)
	require.Equal(t, etcdwatch.Delete, del[0].Type)
	require.Equal(t, "filter/a", string(del[0].Key))
	require.Equal(t, "2", string(del[0].PrevKV.Value))
	require.Equal(t, got[1].ModRevision+1, del[0].ModRevision)
}

// TestFutureRevision: a watch from a revision the store has not reached yet
// delivers exactly from that revision.
func TestFutureRevision(t *testing.T) {
	leakCheck(t)
	s, kv, ctx := open(t), client(t), ctx(t)
	resp, err := kv.Put(ctx, "future/k", "0")
	require.NoError(t, err)
	from := resp.Header.Revision + 3
	w, err := s.Watch(ctx, etcdwatch.Key("future/k").FromRevision(from))
	require.NoError(t, err)
	require.Equal(t, from-1, w.Revision())
	for i := 1; i <= 5; i++ {
		_, err := kv.Put(ctx, "future/k", strconv.Itoa(i))
		require.NoError(t, err)
	}
	var revs []int64
	for len(revs) < 3 {
		for _, e := range nextEvents(t, w) {
			revs = append(revs, e.ModRevision)
		}
	}
	require.Equal(t, []int64{from, from + 1, from + 2}, revs)
}

// TestFragmentedTransaction: a transaction whose watch response exceeds the
// server's limit arrives in fragments; the watch delivers it whole.
func TestFragmentedTransaction(t *testing.T) {
	leakCheck(t)
	s, kv, ctx := open(t), client(t), ctx(t)
	w, err := s.Watch(ctx, etcdwatch.Prefix("frag/").WithPrevKV().WithFragment())
	require.NoError(t, err)
	value := func(b byte) string { return string(bytes.Repeat([]byte{b}, 1<<20)) }
	txn := func(b byte) int64 {
		var ops []clientv3.Op
		for i := range 3 {
			ops = append(ops, clientv3.OpPut(fmt.Sprint("frag/", i), value(b)))
		}
		resp, err := kv.Txn(ctx).Then(ops...).Commit()
		require.NoError(t, err)
		return resp.Header.Revision
	}
	txn('a')
	rev := txn('b') // with previous values: about 6 MiB, above the 4 MiB threshold
	var events []etcdwatch.Event
	for len(events) < 6 {
		r := next(t, w)
		require.True(t, len(r.Events) == 3, "a revision was split: %d events", len(r.Events))
		events = append(events, r.Events...)
	}
	for i, e := range events[3:] {
		require.Equal(t, rev, e.ModRevision)
		require.Equal(t, fmt.Sprint("frag/", i), string(e.Key))
		require.Equal(t, value('b'), string(e.Value))
		require.Equal(t, value('a'), string(e.PrevKV.Value))
	}
	require.Positive(t, s.Stats().Fragments, "the server did not fragment; the test proves nothing")
}

// TestLargeRevisionWithoutFragments: a revision above gRPC's default 4 MiB
// message limit, not fragmented, reaches a Stream on a connection dialed
// with no size option at all, and the stream is not replaced for it.
func TestLargeRevisionWithoutFragments(t *testing.T) {
	leakCheck(t)
	conn, err := dial.New([]string{etcd.Endpoint}, dial.WithInsecure())
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, conn.Close()) })
	s, err := etcdwatch.Open(conn)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	kv, ctx := client(t), ctx(t)
	w, err := s.Watch(ctx, etcdwatch.Prefix("large/").WithPrevKV())
	require.NoError(t, err)
	value := func(b byte) string { return string(bytes.Repeat([]byte{b}, 1<<20)) }
	var ops []clientv3.Op
	for i := range 3 {
		ops = append(ops, clientv3.OpPut(fmt.Sprint("large/", i), value('a')))
	}
	_, err = kv.Txn(ctx).Then(ops...).Commit()
	require.NoError(t, err)
	for i := range ops {
		ops[i] = clientv3.OpPut(fmt.Sprint("large/", i), value('b'))
	}
	resp, err := kv.Txn(ctx).Then(ops...).Commit() // with previous values: about 6 MiB
	require.NoError(t, err)
	var last etcdwatch.Response
	for last.Revision < resp.Header.Revision {
		last = next(t, w)
	}
	require.Len(t, last.Events, 3)
	require.Equal(t, value('a'), string(last.Events[2].PrevKV.Value))
	require.Zero(t, s.Stats().Reconnects, "the stream was replaced")
}

// TestOversizedCreateEndsItsWatchAlone: a create larger than the server
// accepts (its gRPC limit, maxRequestBytes + 512 KiB) or than the Stream
// may send (grpc.MaxCallSendMsgSize) ends the stream it was sent on. It
// ends that watch alone, refused with ErrInvalidRequest, as any refusal
// does; the other watches go on, from their next revision, on a new
// stream. Taken for the Stream's own receive limit, it ended every watch
// and refused every later one with ErrStreamFailed.
func TestOversizedCreateEndsItsWatchAlone(t *testing.T) {
	leakCheck(t)
	for _, tc := range []struct {
		name string
		size int
		opts []etcdwatch.Option
	}{
		{"server's limit", maxRequestBytes + 1<<20, nil},
		// Compressed, it passes the server's first check and breaks the
		// one after decompression, whose text gives no size.
		{"server's limit, compressed", maxRequestBytes + 1<<20, []etcdwatch.Option{etcdwatch.WithCallOptions(grpc.UseCompressor(gzip.Name))}},
		{"own send limit", 4 << 10, []etcdwatch.Option{etcdwatch.WithCallOptions(grpc.MaxCallSendMsgSize(2 << 10))}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, kv, c := open(t, tc.opts...), client(t), ctx(t)
			healthy, err := s.Watch(c, etcdwatch.Key("oversized/healthy"))
			require.NoError(t, err)
			big := etcdwatch.Key(string(bytes.Repeat([]byte("k"), tc.size)))

			_, err = s.Watch(c, big)
			var se *etcdwatch.ServerError
			require.ErrorAs(t, err, &se)
			require.ErrorIs(t, err, etcdwatch.ErrInvalidRequest)
			require.Contains(t, se.Reason, "larger than max")
			require.NotContains(t, se.Reason, "rpc error", "the status's message, as a refusal's reason is")
			require.NotErrorIs(t, err, etcdwatch.ErrStreamFailed)

			ws, err := s.WatchAll(c, etcdwatch.Key("oversized/a"), big)
			var re *etcdwatch.RequestError
			require.ErrorAs(t, err, &re)
			require.Equal(t, 1, re.Index)
			require.ErrorIs(t, err, etcdwatch.ErrInvalidRequest)
			require.Nil(t, ws)

			later, err := s.Watch(c, etcdwatch.Key("oversized/later"))
			require.NoError(t, err, "a later watch on the Stream")
			put, err := kv.Put(c, "oversized/healthy", "v")
			require.NoError(t, err)
			_, err = kv.Put(c, "oversized/later", "v")
			require.NoError(t, err)
			r := next(t, healthy)
			require.Len(t, r.Events, 1, "the watch opened before the refusals")
			require.Equal(t, put.Header.Revision, r.Events[0].ModRevision)
			require.Len(t, next(t, later).Events, 1)
			require.Equal(t, int64(2), s.Stats().Watches)
			require.Positive(t, s.Stats().Reconnects, "the refusals ended streams")
		})
	}
}

// TestOversizedCreateIsTheOneNotSent: with compression, a create's size
// on the wire is not its size, so the create that broke gRPC's send limit
// is the one gRPC would not send, whatever the others' sizes: here a
// compressible 8 KiB key goes out under a 2 KiB limit, and a random one of
// the same size, sent after it in the same call, does not. Catches: every
// create in flight above the limit in plain size refused with it.
func TestOversizedCreateIsTheOneNotSent(t *testing.T) {
	leakCheck(t)
	c := ctx(t)
	s := open(t, etcdwatch.WithCallOptions(grpc.UseCompressor(gzip.Name), grpc.MaxCallSendMsgSize(2<<10)))
	healthy, err := s.Watch(c, etcdwatch.Key("oversent/healthy"))
	require.NoError(t, err)
	compressible := etcdwatch.Key("oversent/" + strings.Repeat("k", 8<<10))
	random := make([]byte, 8<<10)
	for i := range random {
		random[i] = byte('a' + rand.IntN(26))
	}
	_, err = s.WatchAll(c, compressible, etcdwatch.Key("oversent/"+string(random)))
	var re *etcdwatch.RequestError
	require.ErrorAs(t, err, &re)
	require.Equal(t, 1, re.Index, "the random key, which gRPC would not send: %v", err)
	require.ErrorIs(t, err, etcdwatch.ErrInvalidRequest)
	w, err := s.Watch(c, compressible)
	require.NoError(t, err, "the compressible key goes out")
	w.Cancel()
	require.NoError(t, healthy.Err())
}

// TestOwnReceiveLimitIsFinalBesideABigCreate: a response above the
// Stream's own receive limit (grpc.MaxCallRecvMsgSize) ends its watches
// for good, as WithCallOptions says, even while a create above that limit
// (far below the server's) is in flight. Catches: that create taken for
// one the server refused, ended with ErrInvalidRequest, and the stream
// replaced, to meet the same response again.
func TestOwnReceiveLimitIsFinalBesideABigCreate(t *testing.T) {
	leakCheck(t)
	for name, opts := range map[string][]grpc.CallOption{
		"plain": nil,
		// Compressed, the response breaks the limit after decompression,
		// whose text gives no size.
		"compressed": {grpc.UseCompressor(gzip.Name)},
	} {
		t.Run(name, func(t *testing.T) {
			kv, c := client(t), ctx(t)
			proxy := etcdwatchtest.NewProxy(t, etcd.Endpoint)
			s := openOn(t, []string{proxy.Addr()}, etcdwatch.WithCallOptions(append(opts, grpc.MaxCallRecvMsgSize(64<<10))...))
			w, err := s.Watch(c, etcdwatch.Key("ownlimit/value"))
			require.NoError(t, err)
			proxy.SetDelay(300 * time.Millisecond) // the event comes while the create below is in flight
			_, err = kv.Put(c, "ownlimit/value", strings.Repeat("v", 100<<10))
			require.NoError(t, err)
			_, err = s.Watch(c, etcdwatch.Key("ownlimit/"+strings.Repeat("k", 80<<10)))
			proxy.SetDelay(0)
			var se *etcdwatch.ServerError
			require.False(t, errors.As(err, &se), "the server refused nothing: %v", err)
			require.ErrorIs(t, err, etcdwatch.ErrStreamFailed)
			<-w.Done()
			require.ErrorIs(t, w.Err(), etcdwatch.ErrStreamFailed)
			require.Zero(t, s.Stats().Reconnects, "the Stream's own receive limit is final")
		})
	}
}

// TestRequestProgress: the answer covers every write made before the call,
// and every watch gets it as a bookmark after its events.
func TestRequestProgress(t *testing.T) {
	leakCheck(t)
	s, kv, ctx := open(t), client(t), ctx(t)
	var watches []*etcdwatch.Watch
	for i := range 3 {
		w, err := s.Watch(ctx, etcdwatch.Key(fmt.Sprint("progress/", i)))
		require.NoError(t, err)
		watches = append(watches, w)
	}
	resp, err := kv.Put(ctx, "progress/0", "v")
	require.NoError(t, err)
	rev, err := s.RequestProgress(ctx)
	require.NoError(t, err)
	require.GreaterOrEqual(t, rev, resp.Header.Revision)
	for i, w := range watches {
		if i == 0 {
			require.Equal(t, resp.Header.Revision, next(t, w).Events[0].ModRevision)
		}
		r := next(t, w)
		require.True(t, r.IsProgress())
		require.Equal(t, rev, r.Revision)
	}
}

// TestStalledConsumerBesideBusyOne: a consumer that stops reading holds up a
// busy watch on the same stream only for the stall budget (one stall, then
// its watch is paused), and loses nothing once it reads.
func TestStalledConsumerBesideBusyOne(t *testing.T) {
	leakCheck(t)
	s, kv, ctx := open(t, etcdwatch.WithBufferLimit(16)), client(t), ctx(t)
	stalled, err := s.Watch(ctx, etcdwatch.Prefix("stall/s/"))
	require.NoError(t, err)
	busy, err := s.Watch(ctx, etcdwatch.Prefix("stall/b/"))
	require.NoError(t, err)
	const n = 200
	var stalledRevs []int64
	for i := range n {
		r1, err := kv.Put(ctx, "stall/s/k", strconv.Itoa(i))
		require.NoError(t, err)
		stalledRevs = append(stalledRevs, r1.Header.Revision)
		r2, err := kv.Put(ctx, "stall/b/k", strconv.Itoa(i))
		require.NoError(t, err)
		events := nextEvents(t, busy) // the busy consumer keeps up with every write
		require.Equal(t, r2.Header.Revision, events[len(events)-1].ModRevision)
	}
	require.Positive(t, s.Stats().Pauses, "the stalled watch was never paused")
	require.Equal(t, uint64(1), s.Stats().Stalls, "the stream waited more than once for a consumer that never read")
	var got []int64
	for len(got) < n {
		for _, e := range nextEvents(t, stalled) {
			got = append(got, e.ModRevision)
		}
	}
	require.Equal(t, stalledRevs, got)
	st := s.Stats()
	t.Logf("stalls %d, pauses %d, resumes %d", st.Stalls, st.Pauses, st.Resumes)
}

// watchKeys opens goroutines*each watches, watch n on key(n), from that many
// goroutines on one stream, and returns them in order of n.
func watchKeys(t *testing.T, s *etcdwatch.Stream, goroutines, each int, key func(n int) string) []*etcdwatch.Watch {
	t.Helper()
	watches := make([]*etcdwatch.Watch, goroutines*each)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				n := g*each + i
				w, err := s.Watch(t.Context(), etcdwatch.Key(key(n)))
				if !assert.NoError(t, err) {
					return
				}
				watches[n] = w
			}
		})
	}
	wg.Wait()
	require.NotContains(t, watches, (*etcdwatch.Watch)(nil), "some watches were not opened")
	return watches
}

// watchAllKeys opens n watches, on key(0) to key(n-1), with one WatchAll.
func watchAllKeys(t *testing.T, s *etcdwatch.Stream, n int, key func(n int) string) []*etcdwatch.Watch {
	t.Helper()
	rs := make([]etcdwatch.Request, n)
	for i := range rs {
		rs[i] = etcdwatch.Key(key(i))
	}
	watches, err := s.WatchAll(t.Context(), rs...)
	require.NoError(t, err)
	require.Len(t, watches, n)
	return watches
}

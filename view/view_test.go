package view_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/etcdwatch/etcdwatch"
	ws "github.com/etcdwatch/etcdwatch/internal/watchserver"
	"github.com/etcdwatch/etcdwatch/view"
)

// wait bounds every wait of these tests; nothing is timed.
const wait = ws.Timeout

// harness is a Stream on a scripted server, and the server's side of the
// gRPC stream of the Stream's isolated watches, which views use: the
// first view's watch opens it (the Stream's main stream, which views do
// not use, is main).
type harness struct {
	t      *testing.T
	s      *etcdwatch.Stream
	server *ws.Server
	main   *ws.Stream
	srv    *ws.Stream       // nil until a view's watch opened it: see isolated
	plain  *etcdwatch.Watch // from plainWatch
}

// isolated returns the server's side of the isolated watches' stream,
// taking it when it first opens.
func (h *harness) isolated() *ws.Stream {
	h.t.Helper()
	if h.srv == nil {
		h.srv = h.server.Accept(h.t)
	}
	return h.srv
}

func newHarness(t *testing.T, opts ...etcdwatch.Option) *harness {
	t.Helper()
	return harnessOn(t, ws.Start(t), opts...)
}

// harnessOn opens a Stream on server, closed when the test ends.
func harnessOn(t *testing.T, server *ws.Server, opts ...etcdwatch.Option) *harness {
	t.Helper()
	// A progress request is asked again only where a test says so: the
	// scripted server answers when the test does, and a request asked
	// again meanwhile (after 10ms) would stand among the ones it expects.
	s, err := etcdwatch.Open(server.Dial(t), append([]etcdwatch.Option{etcdwatch.WithProgressRetry(time.Hour, time.Hour)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	return &harness{t: t, s: s, server: server, main: server.Accept(t)}
}

// recv waits for the result of a call made in the background; call names
// the call in the failure.
func recv[T any](t *testing.T, ch <-chan T, call string) T {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(wait):
		t.Fatalf("%s did not return", call)
		var zero T
		return zero
	}
}

// ended waits for Done of v, failing the test after wait.
func ended[T any](t *testing.T, v *view.View[T]) {
	t.Helper()
	select {
	case <-v.Done():
	case <-time.After(wait):
		t.Fatal("the view did not end")
	}
}

// viewHarness is a view on a scripted server: the harness's Stream, the
// server's KV, and the id of the view's current server-side watch.
type viewHarness[T any] struct {
	*harness
	kv *ws.KV
	v  *view.View[T]
	id int64
}

type viewResult[T any] struct {
	v   *view.View[T]
	err error
}

func newViewAsync[T any](h *harness, r etcdwatch.Request, decode view.Decoder[T], opts ...view.Option) <-chan viewResult[T] {
	ch := make(chan viewResult[T], 1)
	go func() {
		v, err := view.New(context.Background(), h.s, r, decode, opts...)
		ch <- viewResult[T]{v, err}
	}()
	return ch
}

// openView opens a view of prefix "v/" and confirms its watch, which must
// start right after the revision the KV had when listed.
func openView[T any](h *harness, decode view.Decoder[T], opts ...view.Option) *viewHarness[T] {
	h.t.Helper()
	vh := &viewHarness[T]{harness: h, kv: h.server.KV()}
	res := newViewAsync(h, etcdwatch.Prefix("v/"), decode, opts...)
	vh.confirm()
	h.settle()
	r := recv(h.t, res, "view.New")
	require.NoError(h.t, r.err)
	vh.v = r.v
	h.t.Cleanup(func() { r.v.Close() })
	return vh
}

// settle answers the progress request view.New makes once its watch is
// confirmed (none on a release whose progress answers are unsafe).
func (h *harness) settle() {
	h.t.Helper()
	if h.server.Release() == "3.4.23" {
		return
	}
	require.NotNil(h.t, h.isolated().Recv(h.t).GetProgressRequest(), "view.New did not ask for progress on its watch")
	h.srv.Send(h.t, ws.Progress(-1, h.server.KV().Revision()))
}

// confirm answers the view's next create, checking it starts at the KV's
// revision, which the view listed at.
func (vh *viewHarness[T]) confirm() {
	vh.t.Helper()
	c := vh.isolated().RecvCreate(vh.t)
	rev := vh.kv.Revision()
	require.Equal(vh.t, rev, c.StartRevision, "watch from the listing's revision")
	require.True(vh.t, c.ProgressNotify)
	require.True(vh.t, c.Fragment)
	vh.id = c.WatchId // as etcd does: the id the client asked for
	vh.srv.Send(vh.t, ws.Created(vh.id, rev))
}

// compacted cancels the view's watch for a compaction, as etcd does, and
// takes the client's cancel of it: etcd keeps a compacted watcher on its
// stream until told.
func (vh *viewHarness[T]) compacted() {
	vh.t.Helper()
	vh.srv.Send(vh.t, ws.Compacted(vh.id, vh.kv.Revision()))
	require.Equal(vh.t, vh.id, vh.srv.RecvCancel(vh.t))
}

// send delivers events to the view's watch and waits until it applied them.
func (vh *viewHarness[T]) send(events ...*mvccpb.Event) {
	vh.t.Helper()
	rev := vh.kv.Revision()
	vh.srv.Send(vh.t, ws.Events(vh.id, rev, events...))
	vh.waitFor(events[len(events)-1].Kv.ModRevision)
}

func (vh *viewHarness[T]) waitFor(rev int64) {
	vh.t.Helper()
	waitFor(vh.t, vh.v, rev)
}

// waitFor waits until v has applied every change up to rev, which the
// test has sent: it asks the server nothing (WaitForRevision would).
func waitFor[T any](t *testing.T, v *view.View[T], rev int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	require.NoError(t, view.AwaitRevision(ctx, v, rev))
}

func nextBatch[T any](t *testing.T, sub *view.Subscription[T]) view.Batch[T] {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	b, err := sub.Next(ctx)
	require.NoError(t, err)
	return b
}

// summary is a batch's changes as "kind key" strings, in order.
func summary[T any](b view.Batch[T]) []string {
	var s []string
	for _, ch := range b.Changes {
		s = append(s, ch.Kind.String()+" "+ch.Key)
	}
	return s
}

func viewKeys[T any](v *view.View[T]) []string {
	var ks []string
	for k := range v.All() {
		ks = append(ks, k)
	}
	return ks
}

func putKeys(kv *ws.KV, n int) {
	for i := range n {
		kv.Put(fmt.Sprintf("v/%02d", i), strconv.Itoa(i))
	}
}

// TestViewListsPagesAtOneRevision: before etcd 3.7 (no RangeStream) the
// listing goes in pages, each after the first pinned to the first's
// revision and starting right after the previous page's last key.
func TestViewListsPagesAtOneRevision(t *testing.T) {
	h := newHarness(t)
	kv := h.server.KV()
	putKeys(kv, 7)
	kv.Put("w/outside", "x")
	vh := openView(h, view.DecodeBytes, view.WithPageSize(3), view.WithPageBytes(0))
	reqs := kv.Requests()
	require.Len(t, reqs, 3, "three pages, after a RangeStream refused")
	rev := kv.Revision()
	for i, r := range reqs {
		require.EqualValues(t, 3, r.Limit)
		if i == 0 {
			require.Zero(t, r.Revision, "the first page reads linearizably")
			require.Equal(t, "v/", string(r.Key))
			continue
		}
		require.Equal(t, rev, r.Revision, "page %d pinned to the first page's revision", i)
	}
	require.Equal(t, "v/02\x00", string(reqs[1].Key))
	require.Equal(t, "v/05\x00", string(reqs[2].Key))
	require.Equal(t, []string{"v/00", "v/01", "v/02", "v/03", "v/04", "v/05", "v/06"}, viewKeys(vh.v))
	require.Equal(t, rev, vh.v.Revision())
	e, ok := vh.v.Get("v/04")
	require.True(t, ok)
	require.Equal(t, "4", string(e.Value))
	_, ok = vh.v.Get("w/outside")
	require.False(t, ok)
}

// TestViewUsesRangeStream: where the server has RangeStream, one call reads
// the whole range, and the revision comes from its last message.
func TestViewUsesRangeStream(t *testing.T) {
	h := newHarness(t)
	kv := h.server.KV()
	kv.ServeStreams(2)
	putKeys(kv, 5)
	vh := openView(h, view.DecodeBytes, view.WithPageSize(1))
	require.Len(t, kv.Requests(), 1)
	require.Zero(t, kv.Requests()[0].Limit)
	require.Equal(t, 5, vh.v.Len())
	require.Equal(t, kv.Revision(), vh.v.Revision())
}

// TestViewRetriesAListingThatMayWork: a listing refused as unavailable, or
// its pinned revision compacted between two pages, is tried again from the
// start; a refused permission is final.
func TestViewRetriesAListingThatMayWork(t *testing.T) {
	h := newHarness(t, etcdwatch.WithReconnectBackoff(time.Millisecond, time.Millisecond))
	kv := h.server.KV()
	putKeys(kv, 4)
	kv.FailNext(status.Error(codes.Unavailable, "leader changed"), nil, status.Error(codes.OutOfRange, "etcdserver: mvcc: required revision has been compacted"))
	vh := openView(h, view.DecodeBytes, view.WithPageSize(2))
	require.Equal(t, 4, vh.v.Len())

	kv.FailNext(status.Error(codes.PermissionDenied, "etcdserver: permission denied"))
	res := newViewAsync(h, etcdwatch.Prefix("other/"), view.DecodeBytes)
	r := recv(t, res, "view.New")
	require.Equal(t, codes.PermissionDenied, status.Code(r.err), "%v", r.err)
	require.Nil(t, r.v)
}

// TestViewDoesNotRetryAListingTooLarge: a listing whose response is above
// the Stream's receive limit would be as large every time: New fails with
// gRPC's ResourceExhausted, as the Stream's watches do, having read once.
// Catches: the listing tried again until New's ctx ends, its reason lost.
func TestViewDoesNotRetryAListingTooLarge(t *testing.T) {
	h := newHarness(t, etcdwatch.WithCallOptions(grpc.MaxCallRecvMsgSize(4096)), etcdwatch.WithReconnectBackoff(time.Millisecond, time.Millisecond))
	kv := h.server.KV()
	kv.Put("v/big", strings.Repeat("x", 8192))
	res := newViewAsync(h, etcdwatch.Prefix("v/"), view.DecodeBytes)
	r := recv(t, res, "view.New")
	require.Equal(t, codes.ResourceExhausted, status.Code(r.err), "%v", r.err)
	require.Nil(t, r.v)
	require.Len(t, kv.Requests(), 1, "one listing")
}

// TestViewAppliesEventsAndReportsThem: events change the view a response at
// a time; a subscriber gets them with the entries before and after.
func TestViewAppliesEventsAndReportsThem(t *testing.T) {
	h := newHarness(t)
	kv := h.server.KV()
	putKeys(kv, 2)
	vh := openView(h, view.DecodeBytes)
	start := vh.v.Revision()
	sub := vh.v.Subscribe(context.Background(), start)
	vh.send(kv.PutEvent("v/00", "new"), kv.PutEvent("v/09", "nine"))
	vh.send(kv.DeleteEvent("v/01"))

	b := nextBatch(t, sub)
	require.Equal(t, view.Events, b.Kind)
	require.Equal(t, start, b.From)
	require.Equal(t, []string{"updated v/00", "created v/09"}, summary(b))
	require.Equal(t, "0", string(b.Changes[0].Prev.Value))
	require.Equal(t, "new", string(b.Changes[0].Entry.Value))
	require.EqualValues(t, 2, b.Changes[0].Entry.Version)
	b2 := nextBatch(t, sub)
	require.Equal(t, b.Revision, b2.From)
	require.Equal(t, []string{"deleted v/01"}, summary(b2))
	require.Equal(t, []string{"v/00", "v/09"}, viewKeys(vh.v))
	require.Equal(t, kv.Revision(), vh.v.Revision())
	require.EqualValues(t, len("v/00new")+len("v/09nine"), vh.v.Stats().Bytes)
}

// TestViewRelistsWithTheExactDifference: a watch ended by compaction makes
// the view list again and report only what changed in between, a key
// deleted and created again as both.
func TestViewRelistsWithTheExactDifference(t *testing.T) {
	h := newHarness(t)
	kv := h.server.KV()
	for _, k := range []string{"same", "upd", "del", "recreate"} {
		kv.Put("v/"+k, "1")
	}
	vh := openView(h, view.DecodeBytes)
	start := vh.v.Revision()
	sub := vh.v.Subscribe(context.Background(), start)

	kv.Put("v/upd", "2")
	kv.Delete("v/del")
	kv.Put("v/new", "1")
	kv.Delete("v/recreate")
	kv.Put("v/recreate", "2")
	vh.compacted()
	vh.confirm()

	b := nextBatch(t, sub)
	require.Equal(t, view.Relisted, b.Kind)
	require.Equal(t, start, b.From)
	require.Equal(t, kv.Revision(), b.Revision)
	require.Equal(t, []string{"deleted v/del", "created v/new", "deleted v/recreate", "created v/recreate", "updated v/upd"}, summary(b))
	for _, ch := range b.Changes {
		if ch.Kind == view.Deleted {
			require.Equal(t, b.Revision, ch.Revision, "%s: a delete's revision is not known: the listing's", ch.Key)
		} else {
			got, _ := vh.v.Get(ch.Key)
			require.Equal(t, got.ModRevision, ch.Revision, "%s: a put's revision is its key's", ch.Key)
		}
	}
	require.EqualValues(t, 1, vh.v.Stats().Relists)
	require.Equal(t, []string{"v/new", "v/recreate", "v/same", "v/upd"}, viewKeys(vh.v))

	vh.send(kv.PutEvent("v/same", "2")) // the new watch goes on
	require.Equal(t, []string{"updated v/same"}, summary(nextBatch(t, sub)))
}

// TestViewRepairsOnce: a key the watch never reported is found by the
// integrity check, which makes the view list again. While it lists, the
// checks go on against the state still published and find it wrong again.
// The repaired view must not take those for a mismatch of its own: it did,
// and listed once more at once (a second listing, an empty Relisted batch
// to every subscriber, and Relists counted twice).
func TestViewRepairsOnce(t *testing.T) {
	h := newHarness(t)
	kv := h.server.KV()
	putKeys(kv, 3)
	vh := openView(h, view.DecodeBytes, view.WithIntegrityCheck(5*time.Millisecond))
	sub := vh.v.Subscribe(context.Background(), vh.v.Revision())
	kv.Put("v/lost", "x") // no event: the view is now wrong
	require.Equal(t, vh.id, vh.srv.RecvCancel(t), "the mismatch ends the watch")
	require.Eventually(t, func() bool { return vh.v.Stats().IntegrityMismatches >= 2 }, wait, time.Millisecond,
		"no check found the old state wrong again while the new watch waited")
	vh.confirm()
	b := nextBatch(t, sub)
	require.Equal(t, view.Relisted, b.Kind)
	require.Equal(t, []string{"created v/lost"}, summary(b))
	// Not listed again: checks of the repaired state pass. (No write here:
	// the scripted KV keeps no history, so a check made between a write
	// and the view's applying it would find a true mismatch.)
	checks := vh.v.Stats().IntegrityChecks
	require.Eventually(t, func() bool { return vh.v.Stats().IntegrityChecks >= checks+5 }, wait, time.Millisecond)
	mismatches := vh.v.Stats().IntegrityMismatches
	checks = vh.v.Stats().IntegrityChecks
	require.Eventually(t, func() bool { return vh.v.Stats().IntegrityChecks >= checks+5 }, wait, time.Millisecond)
	require.Equal(t, mismatches, vh.v.Stats().IntegrityMismatches, "the repaired state found wrong")
	require.EqualValues(t, 1, vh.v.Stats().Relists)
	require.NoError(t, vh.v.Err())
}

// TestViewSyncWaitsForTheProgressAnswer: Sync asks for progress and returns
// once the view has the answer's revision, after the events before it.
func TestViewSyncWaitsForTheProgressAnswer(t *testing.T) {
	h := newHarness(t)
	kv := h.server.KV()
	vh := openView(h, view.DecodeBytes)
	ev := kv.PutEvent("v/a", "1")
	done := make(chan error, 1)
	go func() { done <- vh.v.Sync(context.Background()) }()
	require.NotNil(t, vh.srv.Recv(t).GetProgressRequest())
	vh.srv.Send(t, ws.Events(vh.id, kv.Revision(), ev))
	vh.srv.Send(t, ws.Progress(-1, kv.Revision()))
	require.NoError(t, recv(t, done, "Sync"))
	_, ok := vh.v.Get("v/a")
	require.True(t, ok, "Sync returned before the write")
}

// TestViewSyncWithoutProgress: on a release whose progress answers are
// unsafe, Sync reads the range's count and newest revision and waits for a
// state that matches them.
func TestViewSyncWithoutProgress(t *testing.T) {
	h := harnessOn(t, ws.StartRelease(t, "3.4.23"))
	kv := h.server.KV()
	putKeys(kv, 2)
	vh := openView(h, view.DecodeBytes)
	kv.Put("w/elsewhere", "x")
	require.NoError(t, vh.v.Sync(context.Background()), "nothing changed in the range")

	ev := kv.PutEvent("v/a", "1")
	done := make(chan error, 1)
	go func() { done <- vh.v.Sync(context.Background()) }()
	// The read Sync makes: the newest key by revision, without values.
	require.Eventually(t, func() bool {
		reqs := kv.Requests()
		r := reqs[len(reqs)-1]
		return r.SortTarget == pb.RangeRequest_MOD && r.SortOrder == pb.RangeRequest_DESCEND && r.KeysOnly && r.Limit == 1
	}, wait, time.Millisecond)
	vh.srv.Send(t, ws.Events(vh.id, kv.Revision(), ev))
	require.NoError(t, recv(t, done, "Sync"))
	_, ok := vh.v.Get("v/a")
	require.True(t, ok, "Sync returned before the write")
}

// TestSubscriberThatFallsBehindGetsAResync: the view does not wait for a
// subscriber; one beyond the history's bound gets the whole state instead,
// while one that keeps up gets every batch.
func TestSubscriberThatFallsBehindGetsAResync(t *testing.T) {
	h := newHarness(t)
	kv := h.server.KV()
	vh := openView(h, view.DecodeBytes, view.WithHistoryBytes(300))
	start := vh.v.Revision()
	slow, fast := vh.v.Subscribe(context.Background(), start), vh.v.Subscribe(context.Background(), start)
	from := start
	for i := range 20 {
		vh.send(kv.PutEvent(fmt.Sprintf("v/%02d", i), "value"))
		b := nextBatch(t, fast)
		require.Equal(t, view.Events, b.Kind)
		require.Equal(t, from, b.From)
		from = b.Revision
	}
	b := nextBatch(t, slow)
	require.Equal(t, view.Resync, b.Kind)
	require.Equal(t, vh.v.Revision(), b.Revision)
	require.Len(t, b.Changes, 20)
	require.EqualValues(t, 1, vh.v.Stats().Resyncs)
	vh.send(kv.PutEvent("v/next", "x"))
	require.Equal(t, []string{"created v/next"}, summary(nextBatch(t, slow)))
	require.Less(t, vh.v.Stats().HistoryBytes, int64(300+200))
}

// TestSubscribeReplaysFromARevision: a subscription from a revision still in
// the history starts there, inside a batch of several revisions if need be;
// from 0 it starts with the whole state.
func TestSubscribeReplaysFromARevision(t *testing.T) {
	h := newHarness(t)
	kv := h.server.KV()
	vh := openView(h, view.DecodeBytes)
	a, b, c := kv.PutEvent("v/a", "1"), kv.PutEvent("v/b", "1"), kv.PutEvent("v/c", "1")
	vh.send(a, b, c) // one response: revisions a, b and c in one batch
	sub := vh.v.Subscribe(context.Background(), b.Kv.ModRevision-1)
	got := nextBatch(t, sub)
	require.Equal(t, []string{"created v/b", "created v/c"}, summary(got))
	require.Equal(t, a.Kv.ModRevision, got.From)

	all := vh.v.Subscribe(context.Background(), 0)
	got = nextBatch(t, all)
	require.Equal(t, view.Resync, got.Kind)
	require.Equal(t, []string{"created v/a", "created v/b", "created v/c"}, summary(got))
	require.Zero(t, vh.v.Stats().Resyncs, "asked for, not fallen behind")
}

type config struct{ N int }

// TestViewKeepsKeysItCannotDecode: a value that does not decode is in the
// view with its error, counted, and cleared by a value that does.
func TestViewKeepsKeysItCannotDecode(t *testing.T) {
	h := newHarness(t)
	kv := h.server.KV()
	kv.Put("v/good", `{"N":1}`)
	kv.Put("v/bad", `{`)
	vh := openView(h, view.DecodeJSON[config])
	require.Equal(t, 2, vh.v.Len())
	e, _ := vh.v.Get("v/bad")
	require.Error(t, e.Err)
	require.Zero(t, e.Value)
	e, _ = vh.v.Get("v/good")
	require.NoError(t, e.Err)
	require.Equal(t, 1, e.Value.N)
	sub := vh.v.Subscribe(context.Background(), vh.v.Revision())
	vh.send(kv.PutEvent("v/good", "nope"))
	b := nextBatch(t, sub)
	require.Error(t, b.Changes[0].Entry.Err)
	require.NoError(t, b.Changes[0].Prev.Err)
	vh.send(kv.PutEvent("v/bad", `{"N":2}`))
	e, _ = vh.v.Get("v/bad")
	require.NoError(t, e.Err)
	require.Equal(t, 2, e.Value.N)
	require.EqualValues(t, 2, vh.v.Stats().DecodeErrors)
}

// TestViewEndsWithItsWatch: a refusal other than compaction ends the view,
// and its subscribers after what was published.
func TestViewEndsWithItsWatch(t *testing.T) {
	h := newHarness(t)
	kv := h.server.KV()
	vh := openView(h, view.DecodeBytes)
	sub := vh.v.Subscribe(context.Background(), vh.v.Revision())
	vh.send(kv.PutEvent("v/a", "1"))
	vh.refuse()
	ended(t, vh.v)
	require.ErrorIs(t, vh.v.Err(), etcdwatch.ErrPermissionDenied)
	require.Equal(t, []string{"created v/a"}, summary(nextBatch(t, sub)))
	_, err := sub.Next(context.Background())
	require.ErrorIs(t, err, etcdwatch.ErrPermissionDenied)
	require.ErrorIs(t, vh.v.WaitForRevision(context.Background(), 1<<40), etcdwatch.ErrPermissionDenied)
}

// refuse ends the view's watch as etcd does a revoked permission.
func (vh *viewHarness[T]) refuse() {
	vh.t.Helper()
	vh.srv.Send(vh.t, &pb.WatchResponse{Header: ws.Header(1), WatchId: vh.id, Canceled: true, CancelReason: "etcdserver: permission denied"})
}

// requestsBefore returns every request the Stream sent before a
// RequestProgress issued now, and answers that at the KV's revision: the
// dispatcher handles commands in order, so the requests it wrote before the
// progress request are all it had to write. The Stream must have a watch.
func (h *harness) requestsBefore() []*pb.WatchRequest {
	h.t.Helper()
	done := make(chan error, 1)
	go func() {
		_, err := h.plain.RequestProgress(context.Background())
		done <- err
	}()
	var before []*pb.WatchRequest
	for req := h.srv.Recv(h.t); req.GetProgressRequest() == nil; req = h.srv.Recv(h.t) {
		before = append(before, req)
	}
	h.srv.Send(h.t, ws.Progress(-1, h.server.KV().Revision()))
	require.NoError(h.t, recv(h.t, done, "RequestProgress"))
	return before
}

// plainWatch opens an isolated watch of key on the Stream, beside its
// views, so that their stream answers progress requests (requestsBefore)
// whatever the views do, and reads it until it ends.
func (h *harness) plainWatch(key string) {
	h.t.Helper()
	res := make(chan *etcdwatch.Watch, 1)
	go func() { // returns when the watch ends, at the Stream's Close at the latest
		r := etcdwatch.Key(key)
		r.Isolated = true
		w, err := h.s.Watch(context.Background(), r)
		assert.NoError(h.t, err)
		res <- w
		if err == nil {
			for range w.Responses() {
			}
		}
	}()
	c := h.isolated().RecvCreate(h.t)
	h.srv.Send(h.t, ws.Created(c.WatchId, h.server.KV().Revision()))
	h.plain = recv(h.t, res, "Watch")
}

// mainWatch opens a watch on the Stream's main lane and waits until the
// server has confirmed it: once its create went out, the lane's goroutines
// run, and a goleak snapshot taken after counts them. (The server sees the
// main stream a moment before its goroutines have all started.)
func (h *harness) mainWatch(key string) {
	h.t.Helper()
	res := make(chan error, 1)
	go func() { // returns once confirmed; the watch ends at the Stream's Close
		_, err := h.s.Watch(context.Background(), etcdwatch.Key(key))
		res <- err
	}()
	c := h.main.RecvCreate(h.t)
	h.main.Send(h.t, ws.Created(c.WatchId, h.server.KV().Revision()))
	require.NoError(h.t, recv(h.t, res, "Watch"))
}

// TestShareFollowsTheSameWatch: a View from Share takes the state as it is,
// without a listing or a watch of its own, and follows the one watch. Close
// of the first ends that View only, and sends the server nothing; Close of
// the last cancels the watch and returns once the state's goroutines have.
func TestShareFollowsTheSameWatch(t *testing.T) {
	h := newHarness(t)
	kv := h.server.KV()
	putKeys(kv, 2)
	h.plainWatch("elsewhere")
	h.mainWatch("main")
	before := goleak.IgnoreCurrent()
	first := openView(h, view.DecodeBytes)
	listed := len(kv.Requests())
	second := first.v.Share()
	t.Cleanup(func() { second.Close() })
	require.Equal(t, first.v.Snapshot(), second.Snapshot(), "the state as it is")
	first.send(kv.PutEvent("v/a", "1"))
	waitFor(t, second, kv.Revision())
	_, ok := second.Get("v/a")
	require.True(t, ok)
	require.Len(t, kv.Requests(), listed, "no listing of its own")

	require.NoError(t, first.v.Close())
	require.ErrorIs(t, first.v.Err(), view.ErrClosed, "closed, though its state lives on")
	select {
	case <-first.v.Done():
	default:
		t.Fatal("Close returned before Done was closed")
	}
	require.ErrorIs(t, first.v.WaitForRevision(context.Background(), 1<<40), view.ErrClosed)
	_, err := first.v.Subscribe(context.Background(), 0).Next(context.Background())
	require.ErrorIs(t, err, view.ErrClosed)
	require.NoError(t, second.Err())
	require.Empty(t, h.requestsBefore(), "a View's Close while another shares its state sends nothing")
	ev := kv.PutEvent("v/b", "1")
	h.srv.Send(t, ws.Events(first.id, kv.Revision(), ev))
	waitFor(t, second, ev.Kv.ModRevision)

	require.NoError(t, second.Close())
	select {
	case <-second.Done():
	default:
		t.Fatal("the last Close returned before Done was closed")
	}
	require.ErrorIs(t, second.Err(), view.ErrClosed)
	reqs := h.requestsBefore()
	require.Len(t, reqs, 1, "the last View takes the watch with it, before its Close returns")
	require.Equal(t, first.id, reqs[0].GetCancelRequest().GetWatchId())
	goleak.VerifyNone(t, before) // the state's goroutines returned with the last Close
}

// TestNewDoesNotShare: each New has a state and a watch of its own, so
// closing one leaves the other's watch alone.
func TestNewDoesNotShare(t *testing.T) {
	h := newHarness(t)
	first := openView(h, view.DecodeBytes)
	second := openView(h, view.DecodeBytes) // its own listing and create, confirmed
	require.NotEqual(t, first.id, second.id)
	require.NoError(t, first.v.Close())
	require.Equal(t, first.id, h.srv.RecvCancel(t))
	require.NoError(t, second.v.Err())
}

// TestShareOfAnEndedView: Share of a closed View, or of one whose state has
// ended, returns a View that has ended alike, not one of a state that goes
// on or of a new one.
func TestShareOfAnEndedView(t *testing.T) {
	h := newHarness(t)
	kv := h.server.KV()
	putKeys(kv, 1)
	first := openView(h, view.DecodeBytes)
	second := first.v.Share()
	t.Cleanup(func() { second.Close() })
	require.NoError(t, first.v.Close())

	closed := first.v.Share()
	select {
	case <-closed.Done():
	default:
		t.Fatal("Share of a closed View is running")
	}
	require.ErrorIs(t, closed.Err(), view.ErrClosed)
	_, err := closed.Subscribe(context.Background(), 0).Next(context.Background())
	require.ErrorIs(t, err, view.ErrClosed)
	require.NoError(t, closed.Close())
	require.NoError(t, second.Err(), "closing an ended Share ends nothing else")

	first.refuse()
	ended(t, second)
	late := second.Share()
	select {
	case <-late.Done():
	default:
		t.Fatal("Share of an ended View is running")
	}
	require.ErrorIs(t, late.Err(), etcdwatch.ErrPermissionDenied)
	require.ErrorIs(t, late.WaitForRevision(context.Background(), 1<<40), etcdwatch.ErrPermissionDenied)
	require.Equal(t, second.Snapshot(), late.Snapshot(), "the state as it ended")
	require.NoError(t, late.Close())
	require.ErrorIs(t, late.Err(), etcdwatch.ErrPermissionDenied, "Close of an ended View keeps why it ended")
}

// TestShareOfAnEndedCopy: a Share of an ended copy answers as the View
// first copied, and closing one copy moves no other. Catches a copy's Close
// keeping the state as it was then (it moves while another View holds
// it), and copies of copies linked one to the next, each kept alive by the
// last and walked at each read.
func TestShareOfAnEndedCopy(t *testing.T) {
	h := newHarness(t)
	kv := h.server.KV()
	putKeys(kv, 1)
	first := openView(h, view.DecodeBytes)
	second := first.v.Share()
	require.NoError(t, second.Close())
	closedAt := second.Revision()
	first.send(kv.PutEvent("v/later", "1"))
	waitFor(t, first.v, kv.Revision())
	require.Greater(t, first.v.Revision(), closedAt)

	copy1 := second.Share()
	copy2 := copy1.Share()
	require.Same(t, second, view.CopyOf(copy2), "a copy of a copy answers as the View first copied")
	require.NoError(t, copy1.Close())
	require.Equal(t, closedAt, copy1.Revision(), "copy1 moved at its own Close")
	require.Equal(t, closedAt, copy2.Revision(), "copy2 moved at copy1's Close")
	require.Equal(t, second.Stats(), copy2.Stats())
}

// TestNewRefusesWhatCannotWork: arguments and options are checked before
// anything is sent.
func TestNewRefusesWhatCannotWork(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	for name, c := range map[string]struct {
		src  view.Source
		r    etcdwatch.Request
		opts []view.Option
		is   error
	}{
		"nil source": {nil, etcdwatch.Prefix("v/"), nil, etcdwatch.ErrInvalidArgument},
		"nil stream": {(*etcdwatch.Stream)(nil), etcdwatch.Prefix("v/"), nil, etcdwatch.ErrInvalidArgument},
		"revision":   {h.s, etcdwatch.Prefix("v/").FromRevision(3), nil, etcdwatch.ErrInvalidRequest},
		"filter":     {h.s, etcdwatch.Prefix("v/").WithoutDeletes(), nil, etcdwatch.ErrInvalidRequest},
		"no key":     {h.s, etcdwatch.Request{}, nil, etcdwatch.ErrInvalidRequest},
		"history":    {h.s, etcdwatch.Prefix("v/"), []view.Option{view.WithHistoryBytes(0)}, etcdwatch.ErrInvalidArgument},
		"page":       {h.s, etcdwatch.Prefix("v/"), []view.Option{view.WithPageSize(0)}, etcdwatch.ErrInvalidArgument},
		"page bytes": {h.s, etcdwatch.Prefix("v/"), []view.Option{view.WithPageBytes(-1)}, etcdwatch.ErrInvalidArgument},
		"integrity":  {h.s, etcdwatch.Prefix("v/"), []view.Option{view.WithIntegrityCheck(-1)}, etcdwatch.ErrInvalidArgument},
		"bookmark":   {h.s, etcdwatch.Prefix("v/"), []view.Option{view.WithBookmarkInterval(-1)}, etcdwatch.ErrInvalidArgument},
	} {
		t.Run(name, func(t *testing.T) {
			v, err := view.New(ctx, c.src, c.r, view.DecodeBytes, c.opts...)
			require.ErrorIs(t, err, c.is)
			require.Nil(t, v)
		})
	}
	_, err := view.New[[]byte](ctx, h.s, etcdwatch.Prefix("v/"), nil)
	require.ErrorIs(t, err, etcdwatch.ErrInvalidArgument)
	require.Empty(t, h.server.KV().Requests(), "nothing listed")
}

// TestStreamCloseEndsItsViews: the Stream's Close ends every View of every
// state with etcdwatch.ErrClosed, Done closing once the state's goroutines
// have returned; subscribers get what was published first. New on a closed
// Stream fails.
func TestStreamCloseEndsItsViews(t *testing.T) {
	h := newHarness(t)
	kv := h.server.KV()
	before := goleak.IgnoreCurrent()
	vh := openView(h, view.DecodeBytes)
	shared := vh.v.Share()
	sub := shared.Subscribe(context.Background(), vh.v.Revision())
	vh.send(kv.PutEvent("v/a", "1"))
	require.NoError(t, h.s.Close())
	for _, v := range []*view.View[[]byte]{vh.v, shared} {
		ended(t, v)
		require.ErrorIs(t, v.Err(), etcdwatch.ErrClosed)
	}
	goleak.VerifyNone(t, before) // after Done, nothing of the view or the Stream runs
	require.Equal(t, []string{"created v/a"}, summary(nextBatch(t, sub)))
	_, err := sub.Next(context.Background())
	require.ErrorIs(t, err, etcdwatch.ErrClosed)
	_, err = view.New(context.Background(), h.s, etcdwatch.Prefix("v/"), view.DecodeBytes)
	require.ErrorIs(t, err, etcdwatch.ErrClosed)
}

// TestViewRetriesAWatchNotConfirmedInTime: on a Stream with a create
// timeout, a watch the server does not confirm in time is asked for again
// (with a new listing), not the end of the view.
func TestViewRetriesAWatchNotConfirmedInTime(t *testing.T) {
	// Long enough for a busy machine to answer the create asked again
	// within it, as the test does after letting the first one go.
	h := newHarness(t, etcdwatch.WithCreateTimeout(500*time.Millisecond), etcdwatch.WithReconnectBackoff(time.Millisecond, time.Millisecond))
	kv := h.server.KV()
	putKeys(kv, 2)
	res := newViewAsync(h, etcdwatch.Prefix("v/"), view.DecodeBytes)
	late := h.isolated().RecvCreate(t) // not answered in time: the call fails, the view lists again
	again := h.srv.RecvCreate(t)
	h.srv.Send(t, ws.Created(late.WatchId, kv.Revision()))
	require.Equal(t, late.WatchId, h.srv.RecvCancel(t), "the late watch is let go")
	h.srv.Send(t, ws.Created(again.WatchId, kv.Revision()))
	r := recv(t, res, "view.New")
	require.NoError(t, r.err)
	t.Cleanup(func() { r.v.Close() })
	require.Equal(t, 2, r.v.Len())
}

// holdChecks fails the next Ranges, so that the integrity checks (every 5
// ms) find nothing while the test writes the KV and the view applies the
// write: the scripted KV keeps no history, and a check in between finds a
// true mismatch, so that the view lists again before it has the write (1
// run in 200 under load). The checks after take up what is left; 40 cover
// the first 200 ms.
func holdChecks(kv *ws.KV) {
	errs := make([]error, 40)
	for i := range errs {
		errs[i] = status.Error(codes.Unavailable, "checks held (scripted)")
	}
	kv.FailNext(errs...)
}

// repairOf opens a view with an integrity check every 5 ms and applies a
// put of v/a whose record corrupt makes differ from the store's, then
// calls applied (if not nil). It returns the view once the check has
// found the mismatch and ended the watch, and the relist has published its
// Relisted batch, which it returns too.
func repairOf(t *testing.T, corrupt func(*mvccpb.KeyValue), applied func(*viewHarness[[]byte])) (*viewHarness[[]byte], view.Batch[[]byte]) {
	t.Helper()
	h := newHarness(t)
	kv := h.server.KV()
	putKeys(kv, 2)
	vh := openView(h, view.DecodeBytes, view.WithIntegrityCheck(5*time.Millisecond))
	sub := vh.v.Subscribe(context.Background(), vh.v.Revision())
	holdChecks(kv)
	ev := kv.PutEvent("v/a", "1")
	corrupt(ev.Kv)
	vh.send(ev)
	if applied != nil {
		applied(vh)
	}
	require.Equal(t, vh.id, vh.srv.RecvCancel(t), "the mismatch ends the watch")
	vh.confirm()
	var b view.Batch[[]byte]
	for b.Kind != view.Relisted {
		b = nextBatch(t, sub)
	}
	return vh, b
}

// TestRepairFixesWhatTheCheckFound: a key whose ModRevision is right
// but whose Version is not (a server or client fault, which is what the
// check is for) is found by the integrity check, which asks for a relist;
// the relist must repair it. The differ kept every entry whose ModRevision
// did not move, so the wrong entry stayed, and every check after found it
// again and listed again.
func TestRepairFixesWhatTheCheckFound(t *testing.T) {
	vh, _ := repairOf(t, func(kv *mvccpb.KeyValue) { kv.Version = 7 }, nil) // the store says 1
	e, ok := vh.v.Get("v/a")
	require.True(t, ok)
	require.EqualValues(t, 1, e.Version, "the relist kept the entry the check found wrong")
}

// TestDecodeErrorsCountedOncePerValue: a listing that fails after
// its first page and is tried again decodes that page again; a value the
// decoder refused was counted each time.
func TestDecodeErrorsCountedOncePerValue(t *testing.T) {
	h := newHarness(t, etcdwatch.WithReconnectBackoff(time.Millisecond, time.Millisecond))
	kv := h.server.KV()
	kv.Put("v/a", "{")
	kv.Put("v/b", `{"N":1}`)
	kv.FailNext(nil, status.Error(codes.Unavailable, "leader changed"))
	vh := openView(h, view.DecodeJSON[config], view.WithPageSize(1), view.WithPageBytes(0))
	require.Equal(t, 2, vh.v.Len())
	require.EqualValues(t, 1, vh.v.Stats().DecodeErrors, "one value refused")
}

// TestFallingBehindAfterAnAskedResyncIsCounted: a subscriber from 0 asks
// for its first Resync, which is not counted; once it has taken it, falling
// beyond the history's bound is a Resync it did not ask for, and Resyncs
// counts it. (The subscription kept the asked flag of its first Resync, so
// that every later one went uncounted.)
func TestFallingBehindAfterAnAskedResyncIsCounted(t *testing.T) {
	h := newHarness(t)
	kv := h.server.KV()
	putKeys(kv, 2)
	vh := openView(h, view.DecodeBytes, view.WithHistoryBytes(300))
	sub := vh.v.Subscribe(context.Background(), 0)
	b := nextBatch(t, sub)
	require.Equal(t, view.Resync, b.Kind)
	require.Len(t, b.Changes, 2)
	require.Zero(t, vh.v.Stats().Resyncs, "asked for, not fallen behind")
	for i := range 20 {
		vh.send(kv.PutEvent(fmt.Sprintf("v/%02d", 10+i), "value"))
	}
	b = nextBatch(t, sub)
	require.Equal(t, view.Resync, b.Kind, "fell behind the history")
	require.Equal(t, vh.v.Revision(), b.Revision)
	require.Len(t, b.Changes, 22)
	require.EqualValues(t, 1, vh.v.Stats().Resyncs, "fallen behind after a Resync it asked for: counted")
}

// TestRepairFixesALeaseTheCheckFound: as TestRepairFixesWhatTheCheckFound,
// for a key held with the wrong lease at the right ModRevision: the
// integrity check compares leases too, and the relist repairs it, reported
// as an update of the key.
func TestRepairFixesALeaseTheCheckFound(t *testing.T) {
	vh, b := repairOf(t, func(kv *mvccpb.KeyValue) { kv.Lease = 7 }, func(vh *viewHarness[[]byte]) { // the store says none
		e, _ := vh.v.Get("v/a")
		require.EqualValues(t, 7, e.Lease)
	})
	require.Equal(t, []string{"updated v/a"}, summary(b))
	require.EqualValues(t, 7, b.Changes[0].Prev.Lease)
	require.Zero(t, b.Changes[0].Entry.Lease)
	e, ok := vh.v.Get("v/a")
	require.True(t, ok)
	require.Zero(t, e.Lease, "the relist kept the lease the check found wrong")
	require.NotZero(t, vh.v.Stats().IntegrityMismatches)
}

// TestRelistedRevisionIsNotReplayed: the watch after a relist starts at
// the listing's revision, whose events the server sends again; the view
// skips them, so that a subscriber gets after the Relisted batch only what
// came next, not the listing's last write again as an update.
func TestRelistedRevisionIsNotReplayed(t *testing.T) {
	h := newHarness(t)
	kv := h.server.KV()
	putKeys(kv, 1)
	vh := openView(h, view.DecodeBytes)
	sub := vh.v.Subscribe(context.Background(), vh.v.Revision())
	last := kv.PutEvent("v/a", "1") // never sent: the watch is compacted
	vh.compacted()
	vh.confirm()
	b := nextBatch(t, sub)
	require.Equal(t, view.Relisted, b.Kind)
	require.Equal(t, last.Kv.ModRevision, b.Revision)
	require.Equal(t, []string{"created v/a"}, summary(b))

	vh.send(last) // the listing's revision, again on the new watch
	vh.send(kv.PutEvent("v/b", "1"))
	next := nextBatch(t, sub)
	require.Equal(t, b.Revision, next.From)
	require.Equal(t, []string{"created v/b"}, summary(next), "the listing's revision reported again")
	e, _ := vh.v.Get("v/a")
	require.EqualValues(t, 1, e.Version)
}

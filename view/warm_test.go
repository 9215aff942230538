package view_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/etcdwatch/etcdwatch"
	ws "github.com/etcdwatch/etcdwatch/internal/watchserver"
	"github.com/etcdwatch/etcdwatch/view"
)

// logs keeps the records of a Stream's logger (etcdwatch.WithLogger) for
// tests that wait for one.
type logs struct {
	mu      sync.Mutex
	recs    []slog.Record
	changed chan struct{} // closed and replaced at each record
}

func newLogs() *logs { return &logs{changed: make(chan struct{})} }

func (l *logs) Enabled(context.Context, slog.Level) bool { return true }
func (l *logs) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logs) WithGroup(string) slog.Handler            { return l }

func (l *logs) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recs = append(l.recs, r.Clone())
	close(l.changed)
	l.changed = make(chan struct{})
	return nil
}

// wait returns the first record with msg for which match holds, waiting
// for it.
func (l *logs) wait(t *testing.T, msg string, match func(attrs map[string]slog.Value) bool) slog.Record {
	t.Helper()
	deadline := time.After(wait)
	for i := 0; ; {
		l.mu.Lock()
		recs, changed := l.recs, l.changed
		l.mu.Unlock()
		for ; i < len(recs); i++ {
			if r := recs[i]; r.Message == msg && match(attrsOf(r)) {
				return r
			}
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("no log %q", msg)
		}
	}
}

func attrsOf(r slog.Record) map[string]slog.Value {
	m := map[string]slog.Value{}
	r.Attrs(func(a slog.Attr) bool {
		m[a.Key] = a.Value
		return true
	})
	return m
}

// loggedHarness is a harness whose Stream logs to l.
func loggedHarness(t *testing.T, server *ws.Server) (*harness, *logs) {
	l := newLogs()
	return harnessOn(t, server, etcdwatch.WithLogger(slog.New(l))), l
}

// errCompacted is etcd's refusal of a revision its history no longer
// holds.
var errCompacted = status.Error(codes.OutOfRange, "etcdserver: mvcc: required revision has been compacted")

// restoreCompacted opens a view of bytes restored from saved, a state at
// revision at whose history since is compacted, so that the view lists
// against it; it checks that the view restored at.
func restoreCompacted(t *testing.T, h *harness, saved []byte, at int64, opts ...view.Option) *viewHarness[[]byte] {
	t.Helper()
	h.server.KV().FailNext(nil, errCompacted) // the cluster's header, then the changes since the save
	vh := openView(h, view.DecodeBytes, append([]view.Option{view.WithRestore(bytes.NewReader(saved))}, opts...)...)
	rev, err := vh.v.Restored()
	require.NoError(t, err)
	require.Equal(t, at, rev)
	return vh
}

// savedState opens a view of r on h that keeps its values, saves it,
// closes it, and returns what it saved and the revision.
func savedState(t *testing.T, h *harness, r etcdwatch.Request) ([]byte, int64) {
	t.Helper()
	res := newViewAsync(h, r, view.DecodeBytes, view.WithSave())
	c := h.isolated().RecvCreate(t)
	h.srv.Send(t, ws.Created(c.WatchId, h.server.KV().Revision()))
	h.settle()
	got := recv(t, res, "view.New")
	require.NoError(t, got.err)
	var b bytes.Buffer
	require.NoError(t, got.v.Save(&b))
	rev := got.v.Revision()
	require.NoError(t, got.v.Close())
	require.Equal(t, c.WatchId, h.srv.RecvCancel(t))
	return b.Bytes(), rev
}

// restoring starts a view of "v/" with opts on h, and confirms its watch,
// which must start at from; it returns New's result to come and the
// watch's id.
func (h *harness) restoring(from int64, decode view.Decoder[[]byte], opts ...view.Option) (<-chan viewResult[[]byte], int64) {
	h.t.Helper()
	res := newViewAsync(h, etcdwatch.Prefix("v/"), decode, opts...)
	c := h.isolated().RecvCreate(h.t)
	require.Equal(h.t, from, c.StartRevision, "the watch starts after the saved revision")
	h.srv.Send(h.t, ws.Created(c.WatchId, h.server.KV().Revision()))
	return res, c.WatchId
}

// started returns the view New made, closed when the test ends.
func started(t *testing.T, res <-chan viewResult[[]byte]) *view.View[[]byte] {
	t.Helper()
	r := recv(t, res, "view.New")
	require.NoError(t, r.err)
	t.Cleanup(func() { r.v.Close() })
	return r.v
}

// TestRestoreCatchesUpInOneBatch: a view started from a saved state asks
// for no listing, watches from the revision after the saved one, and
// returns from New once it has applied what the server says changed since:
// a subscriber from the saved revision gets all of it in one Events batch,
// with the saved entries (decoded again) as Prev, then the view goes on.
// Catches: a listing made anyway, a watch from the wrong revision, New
// returning before the view caught up, the changes split over batches or
// lost, the saved values not the ones restored.
func TestRestoreCatchesUpInOneBatch(t *testing.T) {
	h := newHarness(t)
	kv := h.server.KV()
	for _, k := range []string{"same", "upd", "del", "re"} {
		kv.Put("v/"+k, "1")
	}
	saved, at := savedState(t, h, etcdwatch.Prefix("v/"))
	upd, del := kv.PutEvent("v/upd", "2"), kv.DeleteEvent("v/del")
	reDel, reNew := kv.DeleteEvent("v/re"), kv.PutEvent("v/re", "2")
	created := kv.PutEvent("v/new", "1")
	kv.Put("w/elsewhere", "x")
	before := len(kv.Requests())

	res, id := h.restoring(at+1, view.DecodeBytes, view.WithRestore(bytes.NewReader(saved)))
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest(), "it asks the server how far to catch up")
	h.srv.Send(t, ws.Events(id, kv.Revision(), upd, del))
	h.srv.Send(t, ws.Events(id, kv.Revision(), reDel, reNew, created))
	h.srv.Send(t, ws.Progress(-1, kv.Revision()))
	v := started(t, res)
	require.Equal(t, kv.Revision(), v.Revision(), "New returns caught up")
	rev, err := v.Restored()
	require.NoError(t, err)
	require.Equal(t, at, rev)
	reqs := kv.Requests()[before:]
	require.Len(t, reqs, 2, "one Range for the cluster's ID and revision, one to see the changes since are there; no listing")
	require.True(t, reqs[0].CountOnly && reqs[1].CountOnly)
	require.Equal(t, at, reqs[1].Revision, "the saved revision is not compacted (a compaction just past it counts: etcd #18089)")
	require.Equal(t, []string{"v/new", "v/re", "v/same", "v/upd"}, viewKeys(v))
	e, _ := v.Get("v/upd")
	require.Equal(t, "2", string(e.Value))
	e, _ = v.Get("v/same")
	require.Equal(t, "1", string(e.Value))
	require.EqualValues(t, 1, e.Version)

	sub := v.Subscribe(context.Background(), at)
	b := nextBatch(t, sub)
	require.Equal(t, view.Events, b.Kind)
	require.Equal(t, at, b.From)
	require.Equal(t, kv.Revision(), b.Revision)
	require.Equal(t, []string{"updated v/upd", "deleted v/del", "deleted v/re", "created v/re", "created v/new"}, summary(b))
	require.Equal(t, "1", string(b.Changes[0].Prev.Value), "the saved value")
	require.Equal(t, upd.Kv.ModRevision, b.Changes[0].Revision)

	ev := kv.PutEvent("v/same", "2")
	h.srv.Send(t, ws.Events(id, kv.Revision(), ev))
	b2 := nextBatch(t, sub)
	require.Equal(t, b.Revision, b2.From)
	require.Equal(t, []string{"updated v/same"}, summary(b2))
	st := v.Stats()
	require.Zero(t, st.Relists)
	require.Zero(t, st.RestoreRefusals)
	require.Equal(t, 4, st.Keys)
}

// TestRestoreWhenNothingChanged: when the range did not change since the
// save, the first batch says so: Events from the saved revision to the one
// the server vouched for, without changes. When the cluster wrote nothing
// at all, the watch starts at the saved revision itself (not a future
// one) and there is nothing to say: the first batch is the next change.
func TestRestoreWhenNothingChanged(t *testing.T) {
	h := newHarness(t)
	kv := h.server.KV()
	putKeys(kv, 3)
	saved, at := savedState(t, h, etcdwatch.Prefix("v/"))

	// The cluster did not move: the store is at the saved revision.
	res, id := h.restoring(at, view.DecodeBytes, view.WithRestore(bytes.NewReader(saved)))
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest())
	h.srv.Send(t, ws.Progress(-1, at))
	v := started(t, res)
	require.Equal(t, at, v.Revision())
	sub := v.Subscribe(context.Background(), at)
	ev := kv.PutEvent("v/00", "new")
	h.srv.Send(t, ws.Events(id, kv.Revision(), ev))
	b := nextBatch(t, sub)
	require.Equal(t, at, b.From)
	require.Equal(t, []string{"updated v/00"}, summary(b))
	require.NoError(t, v.Close())
	require.Equal(t, id, h.srv.RecvCancel(t))

	// Writes elsewhere since: an empty batch up to the revision vouched for.
	kv.Put("w/elsewhere", "x")
	res, _ = h.restoring(at+1, view.DecodeBytes, view.WithRestore(bytes.NewReader(saved)))
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest())
	h.srv.Send(t, ws.Progress(-1, kv.Revision()))
	v = started(t, res)
	b = nextBatch(t, v.Subscribe(context.Background(), at))
	require.Equal(t, view.Events, b.Kind)
	require.Equal(t, at, b.From)
	require.Equal(t, kv.Revision(), b.Revision)
	require.Empty(t, b.Changes)
	require.Equal(t, []string{"v/00", "v/01", "v/02"}, viewKeys(v))
	e, _ := v.Get("v/00")
	require.Equal(t, "0", string(e.Value), "the saved state: that update came after")
}

// TestRestoreFindsItCompacted: when the changes since the saved revision
// are compacted (a Range at the saved revision is out of range), the
// view lists its range against the saved state, read beside the listing,
// and its first batch is a Relisted one holding exactly the difference;
// then it watches from the listing. A saved state found corrupt on the
// way is refused, and the listing stands as a first one.
func TestRestoreFindsItCompacted(t *testing.T) {
	h := newHarness(t)
	kv := h.server.KV()
	for _, k := range []string{"same", "upd", "del", "recreate", "zz"} {
		kv.Put("v/"+k, "1")
	}
	saved, at := savedState(t, h, etcdwatch.Prefix("v/"))
	kv.Put("v/upd", "2")
	kv.Delete("v/del")
	kv.Put("v/new", "1")
	kv.Delete("v/recreate")
	kv.Put("v/recreate", "2")
	kv.Delete("v/zz")

	vh := restoreCompacted(t, h, saved, at)
	b := nextBatch(t, vh.v.Subscribe(context.Background(), at))
	require.Equal(t, view.Relisted, b.Kind)
	require.Equal(t, at, b.From)
	require.Equal(t, kv.Revision(), b.Revision)
	require.Equal(t, []string{"deleted v/del", "created v/new", "deleted v/recreate", "created v/recreate", "updated v/upd", "deleted v/zz"}, summary(b))
	for _, ch := range b.Changes {
		if ch.Entry != nil {
			require.Equal(t, ch.Entry.ModRevision, ch.Revision, "a relisted put at its own revision: %s %s", ch.Kind, ch.Key)
		} else {
			require.Equal(t, b.Revision, ch.Revision, "a relisted delete at the listing's: %s", ch.Key)
		}
		if ch.Prev != nil {
			require.Equal(t, "1", string(ch.Prev.Value), "the saved value, decoded")
		}
	}
	require.EqualValues(t, 1, vh.v.Stats().Relists)
	require.Equal(t, []string{"v/new", "v/recreate", "v/same", "v/upd"}, viewKeys(vh.v))
	vh.send(kv.PutEvent("v/same", "2"))
	require.Equal(t, []string{"updated v/same"}, summary(nextBatch(t, vh.v.Subscribe(context.Background(), vh.v.Revision()-1))))
	require.NoError(t, vh.v.Close())
	require.Equal(t, vh.id, h.srv.RecvCancel(t))

	// Corrupt in its last entry: found once the listing is read.
	bad := bytes.Clone(saved)
	bad[bytes.LastIndex(bad, []byte("v/zz"))+len("v/zz")] ^= 1
	kv.FailNext(nil, errCompacted)
	vh = openView(h, view.DecodeBytes, view.WithRestore(bytes.NewReader(bad)))
	rev, err := vh.v.Restored()
	require.Zero(t, rev)
	require.ErrorIs(t, err, view.ErrSavedCorrupt)
	require.EqualValues(t, 1, vh.v.Stats().RestoreRefusals)
	require.Zero(t, vh.v.Stats().Relists)
	require.Equal(t, []string{"v/new", "v/recreate", "v/same", "v/upd"}, viewKeys(vh.v))
	b = nextBatch(t, vh.v.Subscribe(context.Background(), at))
	require.Equal(t, view.Resync, b.Kind, "no difference from a state refused")
}

// TestRestoreAfterCompaction: when the changes since the saved revision are
// compacted after the view found them there, its watch from the saved
// revision ends compacted; the view lists its range and its first batch is
// a Relisted one holding exactly the difference from the saved state.
func TestRestoreAfterCompaction(t *testing.T) {
	h := newHarness(t)
	kv := h.server.KV()
	for _, k := range []string{"same", "upd", "del", "recreate"} {
		kv.Put("v/"+k, "1")
	}
	saved, at := savedState(t, h, etcdwatch.Prefix("v/"))
	kv.Put("v/upd", "2")
	kv.Delete("v/del")
	kv.Put("v/new", "1")
	kv.Delete("v/recreate")
	kv.Put("v/recreate", "2")

	res, id := h.restoring(at+1, view.DecodeBytes, view.WithRestore(bytes.NewReader(saved)))
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest())
	h.srv.Send(t, ws.Compacted(id, kv.Revision()))
	require.Equal(t, id, h.srv.RecvCancel(t))
	c := h.srv.RecvCreate(t)
	require.Equal(t, kv.Revision(), c.StartRevision, "a watch from the listing's revision")
	h.srv.Send(t, ws.Created(c.WatchId, kv.Revision()))
	h.srv.Send(t, ws.Progress(-1, kv.Revision())) // the request asked before the compaction, still waiting
	// That answer does not cover the watch created since: asked again.
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest())
	h.srv.Send(t, ws.Progress(-1, kv.Revision()))
	v := started(t, res)
	rev, err := v.Restored()
	require.NoError(t, err)
	require.Equal(t, at, rev)
	b := nextBatch(t, v.Subscribe(context.Background(), at))
	require.Equal(t, view.Relisted, b.Kind)
	require.Equal(t, at, b.From)
	require.Equal(t, kv.Revision(), b.Revision)
	require.Equal(t, []string{"deleted v/del", "created v/new", "deleted v/recreate", "created v/recreate", "updated v/upd"}, summary(b))
	require.Equal(t, "1", string(b.Changes[4].Prev.Value))
	require.EqualValues(t, 1, v.Stats().Relists)
	require.Equal(t, []string{"v/new", "v/recreate", "v/same", "v/upd"}, viewKeys(v))
}

// TestRestoreWithoutSafeProgress: on a release whose progress answers are
// unsafe, the view reads the range's count and newest revision instead,
// and is caught up once it holds as many keys, none newer: at once when
// the range did not change, after the events otherwise.
func TestRestoreWithoutSafeProgress(t *testing.T) {
	h := harnessOn(t, ws.StartRelease(t, "3.4.23"))
	kv := h.server.KV()
	putKeys(kv, 3)
	saved, at := savedState(t, h, etcdwatch.Prefix("v/"))
	kv.Put("w/elsewhere", "x")

	res, id := h.restoring(at+1, view.DecodeBytes, view.WithRestore(bytes.NewReader(saved)))
	v := started(t, res)
	b := nextBatch(t, v.Subscribe(context.Background(), at))
	require.Equal(t, at, b.From)
	require.Equal(t, kv.Revision(), b.Revision, "the revision the read vouched for")
	require.Empty(t, b.Changes)
	require.NoError(t, v.Close())
	require.Equal(t, id, h.srv.RecvCancel(t))

	ev := kv.PutEvent("v/01", "new")
	res, id = h.restoring(at+1, view.DecodeBytes, view.WithRestore(bytes.NewReader(saved)))
	h.srv.Send(t, ws.Events(id, kv.Revision(), ev))
	v = started(t, res)
	b = nextBatch(t, v.Subscribe(context.Background(), at))
	require.Equal(t, at, b.From)
	require.Equal(t, []string{"updated v/01"}, summary(b))
	e, _ := v.Get("v/01")
	require.Equal(t, "new", string(e.Value))
	reqs := kv.Requests()
	last := reqs[len(reqs)-1]
	require.True(t, last.SortTarget == pb.RangeRequest_MOD && last.KeysOnly && last.Limit == 1, "the read: the newest key, without values")
}

// TestRestoreFailsOnARefusedRead: where progress is unsafe, a restored
// view learns how far to catch up from a read of the range; when the
// server refuses that read, New fails with the refusal, as for a refused
// listing, having asked once and ended its watch. Catches: the read tried
// again until New's context ends (New then returns the view the second
// read vouched for), the refusal lost or the watch left running.
func TestRestoreFailsOnARefusedRead(t *testing.T) {
	h := harnessOn(t, ws.StartRelease(t, "3.4.23"))
	kv := h.server.KV()
	putKeys(kv, 3)
	saved, at := savedState(t, h, etcdwatch.Prefix("v/"))
	before := len(kv.Requests())
	// The header's read goes through; the freshness read, the only other one
	// when nothing was written since the save, is refused.
	kv.FailNext(nil, status.Error(codes.PermissionDenied, "etcdserver: permission denied"))

	res, id := h.restoring(at, view.DecodeBytes, view.WithRestore(bytes.NewReader(saved)))
	got := recv(t, res, "view.New")
	require.ErrorIs(t, got.err, etcdwatch.ErrPermissionDenied)
	require.Nil(t, got.v)
	require.Equal(t, id, h.srv.RecvCancel(t), "the watch from the saved revision ends")
	reqs := kv.Requests()[before:]
	require.Len(t, reqs, 2, "the header and one freshness read, not tried again")
	require.True(t, reqs[1].SortTarget == pb.RangeRequest_MOD && reqs[1].KeysOnly && reqs[1].Limit == 1, "the read: the newest key, without values")
}

// TestRestoreFailsWhenItsWatchEnds: a restored view publishes the loaded
// state before it catches up; when the server then ends its watch for
// good, New fails with why, although a state was published. Catches: New
// waiting for its context (the loaded state taken for a ready view), or
// returning a view whose state has ended.
func TestRestoreFailsWhenItsWatchEnds(t *testing.T) {
	h := newHarness(t)
	putKeys(h.server.KV(), 3)
	saved, at := savedState(t, h, etcdwatch.Prefix("v/"))

	res, id := h.restoring(at, view.DecodeBytes, view.WithRestore(bytes.NewReader(saved)))
	h.srv.Send(t, &pb.WatchResponse{Header: ws.Header(at), WatchId: id, Canceled: true, CancelReason: "etcdserver: permission denied"})
	got := recv(t, res, "view.New")
	require.ErrorIs(t, got.err, etcdwatch.ErrPermissionDenied)
	require.Nil(t, got.v)
}

// TestRestoreFailsWhenItsWatchEndsBeforeItsGoal: the server refuses the
// restore's watch while the saved entries are still read, and the read of
// how far to catch up (made instead of the progress answer the refusal
// cut short) sets a goal the loaded state already meets. The watch's end
// and the goal both wait for catchUp; it took the goal at even odds and
// New returned a view that ended at once. The entries are held until the
// read is made, and are many (3,000), so that the goal has come when
// catchUp starts.
func TestRestoreFailsWhenItsWatchEndsBeforeItsGoal(t *testing.T) {
	for range 3 {
		h := newHarness(t) // a Stream each: the progress request the refusal cut short is never answered
		kv := h.server.KV()
		putKeys(kv, 3000)
		saved, at := savedState(t, h, etcdwatch.Prefix("v/"))
		hdr, err := view.ReadHeaderLength(saved)
		require.NoError(t, err)
		pr, pw := io.Pipe()
		go func() { _, _ = pw.Write(saved[:hdr]) }()
		before := len(kv.Requests())
		res, id := h.restoring(at, view.DecodeBytes, view.WithRestore(pr))
		require.NotNil(t, h.srv.Recv(t).GetProgressRequest(), "asked how far to catch up")
		h.srv.Send(t, &pb.WatchResponse{Header: ws.Header(at), WatchId: id, Canceled: true, CancelReason: "etcdserver: permission denied"})
		kv.AwaitRequests(t, func(reqs []*pb.RangeRequest) bool {
			return slices.ContainsFunc(reqs[before:], func(r *pb.RangeRequest) bool { return r.SortTarget == pb.RangeRequest_MOD })
		})
		go func() { _, _ = pw.Write(saved[hdr:]); _ = pw.Close() }()
		got := recv(t, res, "view.New")
		if got.v != nil {
			ended(t, got.v)
			t.Fatalf("New returned a view whose watch the server had refused; it ended with %v", got.v.Err())
		}
		require.ErrorIs(t, got.err, etcdwatch.ErrPermissionDenied)
	}
}

// TestRestoreRefusedSettlesItsNewWatch: New returns once a progress
// request for its watch is answered. A restore's catching up asks for one
// on the restore's watch; when the loaded entries are then refused, the
// view lists and watches anew, and that watch is asked about too.
// Catches: the answer for the watch let go taken for the new one's (New
// returned, and the first Sync could wait for etcd's next sync of new
// watches).
func TestRestoreRefusedSettlesItsNewWatch(t *testing.T) {
	h := newHarness(t)
	kv := h.server.KV()
	putKeys(kv, 3)
	saved, at := savedState(t, h, etcdwatch.Prefix("v/"))
	bad := bytes.Clone(saved)
	bad[len(bad)-6] ^= 1 // an entry's byte: its checksum fails once all are read
	hdr, err := view.ReadHeaderLength(saved)
	require.NoError(t, err)
	pr, pw := io.Pipe()
	go func() { _, _ = pw.Write(bad[:hdr]) }()
	res, id := h.restoring(at, view.DecodeBytes, view.WithRestore(pr))
	require.NotNil(t, h.isolated().Recv(t).GetProgressRequest(), "asked how far to catch up while the entries are read")
	responses := h.s.Stats().Responses
	h.srv.Send(t, ws.Progress(-1, kv.Revision())) // answered for the restore's watch...
	require.Eventually(t, func() bool { return h.s.Stats().Responses > responses }, ws.Timeout, time.Millisecond,
		"...and the answer taken, before the entries end")
	go func() { _, _ = pw.Write(bad[hdr:]); _ = pw.Close() }()
	require.Equal(t, id, h.srv.RecvCancel(t), "the restore's watch let go")
	vh := &viewHarness[[]byte]{harness: h, kv: kv}
	vh.confirm()
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest(), "asked about the new watch")
	select {
	case r := <-res:
		if r.v != nil {
			r.v.Close()
		}
		t.Fatal("New returned before its new watch's progress request was answered")
	default: // it waits for the answer
	}
	h.srv.Send(t, ws.Progress(-1, kv.Revision()))
	v := started(t, res)
	_, err = v.Restored()
	require.ErrorIs(t, err, view.ErrSavedCorrupt)
}

// TestRestoreLetGoIsReported: a valid saved state whose history is
// compacted is listed against; when that listing fails for a reason that
// may pass, the retry lists as without it. Restored then says why it was
// not used (a *RestoreError with the server's error), and Stats counts it.
// Catches: Restored saying there was none to restore.
func TestRestoreLetGoIsReported(t *testing.T) {
	h := newHarness(t, etcdwatch.WithReconnectBackoff(time.Millisecond, time.Millisecond))
	kv := h.server.KV()
	putKeys(kv, 3)
	saved, _ := savedState(t, h, etcdwatch.Prefix("v/"))
	kv.Put("v/new", "1")
	// The header's read goes through, the history since is compacted, and
	// the listing against the saved state fails once.
	kv.FailNext(nil, errCompacted, status.Error(codes.Unavailable, "leader changed"))
	vh := openView(h, view.DecodeBytes, view.WithRestore(bytes.NewReader(saved)))
	rev, err := vh.v.Restored()
	require.Zero(t, rev)
	var re *view.RestoreError
	require.ErrorAs(t, err, &re)
	require.Equal(t, codes.Unavailable, status.Code(re.Err), "%v", err)
	require.Equal(t, uint64(1), vh.v.Stats().RestoreRefusals)
	require.Equal(t, 4, vh.v.Len())
}

// TestSaveNamesTheClusterOfItsState: when the Source comes to reach
// another cluster, the view relists there; a save while that listing's
// watch is still being created saves the state published, the first
// cluster's, and says so. Catches: the file naming the cluster of the
// listing under way, which a restart against that cluster would accept.
func TestSaveNamesTheClusterOfItsState(t *testing.T) {
	h := newHarness(t)
	kv := h.server.KV()
	kv.SetClusterID(1)
	kv.Put("v/a", "1")
	path := filepath.Join(t.TempDir(), "state")
	vh := openView(h, view.DecodeBytes, view.WithStateFile(path, 0))
	first := vh.v.Revision()

	kv.SetClusterID(2)
	kv.Put("v/b", "2")
	vh.compacted()                                            // a relist: a listing of cluster 2...
	vh.isolated().RecvCreate(t)                               // ...and its watch, left unanswered
	closed := callAsync(func() error { return vh.v.Close() }) // saves the state published
	require.NoError(t, recv(t, closed, "Close"))
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	rev, err := view.SavedRevision(b)
	require.NoError(t, err)
	require.Equal(t, first, rev, "the state published: the first listing's")
	cluster, err := view.SavedCluster(b)
	require.NoError(t, err)
	require.EqualValues(t, 1, cluster, "the cluster that state came from")
}

// decoded returns a Decoder of plain values that records the keys it was
// given.
func decoded(keys *[]string) view.Decoder[[]byte] {
	var mu sync.Mutex
	return func(key, value []byte) ([]byte, error) {
		mu.Lock()
		defer mu.Unlock()
		*keys = append(*keys, string(key))
		return value, nil
	}
}

// TestRestoreRefusals: a saved state that is truncated, corrupted, of
// another format version, range or cluster, or ahead of the cluster's
// revision, each in a file of its own, is refused with its sentinel: the
// view lists its range instead and holds exactly the server's keys, none
// of the file's (no key of it was even decoded); the refusal is in
// Restored, counted, and logged at Warn. Catches: a loader that skips any
// one of its checks, or that keeps part of a state it refused.
func TestRestoreRefusals(t *testing.T) {
	for name, c := range map[string]struct {
		is error
		// file makes the saved state on h, whose KV holds v/a and
		// v/stale; restore on the harness it returns.
		file func(t *testing.T, h *harness) (restoreOn *harness, saved []byte)
		// the entries are refused, not the header: the view has watched
		// from the saved state meanwhile
		entries bool
	}{
		"truncated": {is: view.ErrSavedCorrupt, entries: true, file: func(t *testing.T, h *harness) (*harness, []byte) {
			b, _ := savedState(t, h, etcdwatch.Prefix("v/"))
			return h, b[:len(b)-10] // in the last entry
		}},
		"corrupted": {is: view.ErrSavedCorrupt, entries: true, file: func(t *testing.T, h *harness) (*harness, []byte) {
			b, _ := savedState(t, h, etcdwatch.Prefix("v/"))
			b[bytes.LastIndex(b, []byte("old"))] ^= 1 // "nld": a value the server never had
			return h, b
		}},
		"another version": {is: view.ErrSavedVersion, file: func(t *testing.T, h *harness) (*harness, []byte) {
			b, _ := savedState(t, h, etcdwatch.Prefix("v/"))
			return h, view.StateOfVersion(b, 2)
		}},
		"another range": {is: view.ErrSavedRange, file: func(t *testing.T, h *harness) (*harness, []byte) {
			b, _ := savedState(t, h, etcdwatch.Prefix("v/s"))
			return h, b
		}},
		"another range end": {is: view.ErrSavedRange, file: func(t *testing.T, h *harness) (*harness, []byte) {
			h.server.KV().Put("w/out", "x") // outside the view's range, inside the state's
			b, _ := savedState(t, h, etcdwatch.FromKey("v/"))
			return h, b
		}},
		"another cluster": {is: view.ErrSavedCluster, file: func(t *testing.T, h *harness) (*harness, []byte) {
			h.server.KV().SetClusterID(2)
			b, _ := savedState(t, h, etcdwatch.Prefix("v/"))
			h.server.KV().SetClusterID(0)
			return h, b
		}},
		"ahead of the cluster": {is: view.ErrSavedAhead, file: func(t *testing.T, h *harness) (*harness, []byte) {
			for range 5 {
				h.server.KV().Put("w/elsewhere", "x")
			}
			b, at := savedState(t, h, etcdwatch.Prefix("v/"))
			require.Greater(t, at, int64(4), "ahead of the backup's revision once the test wrote there")
			// The cluster restored from a backup older than the save: the
			// same cluster, at a lower revision, without v/stale.
			back, _ := loggedHarness(t, ws.Start(t))
			back.server.KV().Put("v/a", "1")
			return back, b
		}},
	} {
		t.Run(name, func(t *testing.T) {
			h, _ := loggedHarness(t, ws.Start(t))
			kv := h.server.KV()
			kv.Put("v/a", "1")
			kv.Put("v/stale", "old")
			restoreOn, b := c.file(t, h)
			path := filepath.Join(t.TempDir(), "state")
			require.NoError(t, os.WriteFile(path, b, 0o600))
			rkv := restoreOn.server.KV()
			rkv.Delete("v/stale")
			rkv.Put("v/b", "2")

			var keys []string
			res := newViewAsync(restoreOn, etcdwatch.Prefix("v/"), decoded(&keys), view.WithStateFile(path, 0))
			asked := false // a progress request waits for its answer
			if c.entries { // its watch from the saved state, let go
				cr := restoreOn.isolated().RecvCreate(t)
				restoreOn.srv.Send(t, ws.Created(cr.WatchId, rkv.Revision()))
				req := restoreOn.srv.Recv(t)
				for req.GetProgressRequest() != nil { // asked how far to catch up meanwhile
					asked = true
					req = restoreOn.srv.Recv(t)
				}
				require.Equal(t, cr.WatchId, req.GetCancelRequest().GetWatchId(), "%v", req)
			}
			vh := &viewHarness[[]byte]{harness: restoreOn, kv: rkv}
			vh.confirm()
			if asked { // the view's watch joins the request still waiting
				restoreOn.srv.Send(t, ws.Progress(-1, rkv.Revision()))
			} else {
				restoreOn.settle()
			}
			r := recv(t, res, "view.New")
			require.NoError(t, r.err)
			vh.v = r.v
			t.Cleanup(func() { r.v.Close() })
			require.Equal(t, []string{"v/a", "v/b"}, viewKeys(vh.v), "the server's keys")
			require.Equal(t, []string{"v/a", "v/b"}, keys, "no key of the refused state decoded")
			require.Equal(t, rkv.Revision(), vh.v.Revision())
			rev, err := vh.v.Restored()
			require.Zero(t, rev)
			require.ErrorIs(t, err, c.is)
			var re *view.RestoreError
			require.ErrorAs(t, err, &re)
			require.Equal(t, path, re.Path)
			require.EqualValues(t, 1, vh.v.Stats().RestoreRefusals)
			require.Zero(t, vh.v.Stats().Relists)
			b0 := nextBatch(t, vh.v.Subscribe(context.Background(), rev))
			require.Equal(t, view.Resync, b0.Kind, "after a listing, the whole state")
		})
	}
}

// TestRestoreRefusalIsLogged: a refusal is logged at Warn with the
// *RestoreError.
func TestRestoreRefusalIsLogged(t *testing.T) {
	h, l := loggedHarness(t, ws.Start(t))
	putKeys(h.server.KV(), 1)
	vh := openView(h, view.DecodeBytes, view.WithRestore(strings.NewReader("not a state")))
	r := l.wait(t, "etcdwatch: view did not use its saved state; listing instead", func(map[string]slog.Value) bool { return true })
	require.Equal(t, slog.LevelWarn, r.Level)
	err, _ := attrsOf(r)["err"].Any().(error)
	require.ErrorIs(t, err, view.ErrSavedCorrupt)
	_, got := vh.v.Restored()
	require.Equal(t, err, got)
}

// TestRestoreRoundTrip: a view restored from another's save holds the same
// entries, its values decoded again by its own Decoder: a value that does
// not decode has its error again, and is counted.
func TestRestoreRoundTrip(t *testing.T) {
	h := newHarness(t)
	kv := h.server.KV()
	kv.Put("v/good", `{"N":1}`)
	kv.Put("v/bad", `{`)
	kv.Put("v/good", `{"N":2}`)
	kv.Put("v/empty", ``)
	first := openView(h, view.DecodeJSON[config], view.WithSave())
	var b bytes.Buffer
	require.NoError(t, first.v.Save(&b))
	at := first.v.Revision()

	res := newViewAsync(h, etcdwatch.Prefix("v/"), view.DecodeJSON[config], view.WithRestore(&b), view.WithSave())
	c := h.srv.RecvCreate(t)
	require.Equal(t, at, c.StartRevision)
	h.srv.Send(t, ws.Created(c.WatchId, at))
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest())
	h.srv.Send(t, ws.Progress(-1, at))
	r := recv(t, res, "view.New")
	require.NoError(t, r.err)
	second := r.v
	t.Cleanup(func() { second.Close() })
	require.Equal(t, at, second.Revision())
	var want, got []view.Entry[config]
	for _, e := range first.v.All() {
		want = append(want, e)
	}
	for _, e := range second.All() {
		got = append(got, e)
	}
	require.Len(t, got, len(want))
	for i := range want {
		w, g := want[i], got[i]
		require.Equal(t, w.Key, g.Key)
		require.Equal(t, w.Value, g.Value, w.Key)
		require.Equal(t, w.Err == nil, g.Err == nil, w.Key)
		require.Equal(t, []int64{w.CreateRevision, w.ModRevision, w.Version, w.Lease}, []int64{g.CreateRevision, g.ModRevision, g.Version, g.Lease}, w.Key)
	}
	require.Equal(t, first.v.Stats().Bytes, second.Stats().Bytes)
	require.EqualValues(t, 2, second.Stats().DecodeErrors, "v/bad and v/empty, decoded again")

	var again bytes.Buffer
	require.NoError(t, second.Save(&again))
	var once bytes.Buffer
	require.NoError(t, first.v.Save(&once))
	require.Equal(t, once.Bytes(), again.Bytes(), "saved again as it was")
}

// TestStateFile: WithStateFile lists when there is no file yet (no
// refusal), saves every interval and when the view ends, each time the
// state changed, and the next New restores the last save.
func TestStateFile(t *testing.T) {
	h, l := loggedHarness(t, ws.Start(t))
	kv := h.server.KV()
	putKeys(kv, 2)
	path := filepath.Join(t.TempDir(), "v.state")
	vh := openView(h, view.DecodeBytes, view.WithStateFile(path, time.Millisecond))
	rev, err := vh.v.Restored()
	require.Zero(t, rev)
	require.NoError(t, err, "no file yet is no refusal")
	require.Zero(t, vh.v.Stats().RestoreRefusals)

	vh.send(kv.PutEvent("v/a", "1"))
	at := kv.Revision()
	l.wait(t, "etcdwatch: view saved its state", func(a map[string]slog.Value) bool { return a["revision"].Int64() == at })
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	saved, err := view.SavedRevision(b)
	require.NoError(t, err)
	require.Equal(t, at, saved)

	vh.send(kv.PutEvent("v/b", "2"))
	require.NoError(t, vh.v.Close()) // saves once more, before it returns
	require.Equal(t, vh.id, h.srv.RecvCancel(t))
	b, err = os.ReadFile(path)
	require.NoError(t, err)
	saved, err = view.SavedRevision(b)
	require.NoError(t, err)
	require.Equal(t, kv.Revision(), saved, "saved at Close")
	tmps, err := filepath.Glob(path + ".*.tmp")
	require.NoError(t, err)
	require.Empty(t, tmps, "the temporary file is renamed")

	res, _ := h.restoring(kv.Revision(), view.DecodeBytes, view.WithStateFile(path, 0))
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest())
	h.srv.Send(t, ws.Progress(-1, kv.Revision()))
	v := started(t, res)
	rev, err = v.Restored()
	require.NoError(t, err)
	require.Equal(t, kv.Revision(), rev)
	require.Equal(t, []string{"v/00", "v/01", "v/a", "v/b"}, viewKeys(v))
}

// TestStateFileFailure: a save that fails is logged and counted, and the
// view goes on.
func TestStateFileFailure(t *testing.T) {
	h, l := loggedHarness(t, ws.Start(t))
	putKeys(h.server.KV(), 1)
	path := filepath.Join(t.TempDir(), "no such directory", "v.state")
	vh := openView(h, view.DecodeBytes, view.WithStateFile(path, time.Millisecond))
	r := l.wait(t, "etcdwatch: view could not save its state", func(map[string]slog.Value) bool { return true })
	require.Equal(t, slog.LevelWarn, r.Level)
	require.ErrorIs(t, attrsOf(r)["err"].Any().(error), os.ErrNotExist)
	require.NotZero(t, vh.v.Stats().SaveFailures)
	require.NoError(t, vh.v.Err())
}

// TestWarmOptions: Save needs a view that keeps its values; the options'
// arguments are checked in New, before anything is sent.
func TestWarmOptions(t *testing.T) {
	h := newHarness(t)
	vh := openView(h, view.DecodeBytes)
	require.ErrorIs(t, vh.v.Save(&bytes.Buffer{}), etcdwatch.ErrInvalidArgument)
	before := len(h.server.KV().Requests())
	path := filepath.Join(t.TempDir(), "state")
	for name, opts := range map[string][]view.Option{
		"nil reader":    {view.WithRestore(nil)},
		"no path":       {view.WithStateFile("", time.Second)},
		"negative time": {view.WithStateFile(path, -time.Second)},
		"both":          {view.WithRestore(strings.NewReader("")), view.WithStateFile(path, 0)},
	} {
		ctx, cancel := context.WithTimeout(t.Context(), ws.Timeout) // an option let through starts a view: it fails here, not at the package's timeout
		v, err := view.New(ctx, h.s, etcdwatch.Prefix("v/"), view.DecodeBytes, opts...)
		cancel()
		require.ErrorIs(t, err, etcdwatch.ErrInvalidArgument, name)
		require.Nil(t, v)
	}
	require.Len(t, h.server.KV().Requests(), before, "nothing sent")
}

// TestRestoreReadsItsReaderToTheEnd: WithRestore reads its reader to the
// end, as its doc says, also when the state is refused at its header.
// Catches a refusal that left a reader (a pipe, a response body) read only
// as far as the first buffer.
func TestRestoreReadsItsReaderToTheEnd(t *testing.T) {
	h, _ := loggedHarness(t, ws.Start(t))
	kv := h.server.KV()
	value := strings.Repeat("x", 1<<10)
	for i := range 600 {
		kv.Put(fmt.Sprintf("v/s%03d", i), value)
	}
	saved, _ := savedState(t, h, etcdwatch.Prefix("v/s"))
	require.Greater(t, len(saved), 256<<10, "more than the first buffer holds")
	r := &countingReader{r: bytes.NewReader(saved)}
	res := newViewAsync(h, etcdwatch.Prefix("v/"), view.DecodeBytes, view.WithRestore(r))
	vh := &viewHarness[[]byte]{harness: h, kv: kv}
	vh.confirm()
	h.settle()
	got := recv(t, res, "view.New")
	require.NoError(t, got.err)
	t.Cleanup(func() { got.v.Close() })
	_, err := got.v.Restored()
	require.ErrorIs(t, err, view.ErrSavedRange)
	require.Equal(t, len(saved), r.n, "read to its end")
}

// countingReader counts the bytes read from r.
type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// TestCompactedRefusedStateIsNotDecoded: a saved state whose history is
// compacted is merged with a listing as it is read; a value of it that
// then proves corrupt (its checksum fails at the end) never reaches the
// Decoder, which may not expect bytes the server never had.
func TestCompactedRefusedStateIsNotDecoded(t *testing.T) {
	h := newHarness(t)
	kv := h.server.KV()
	kv.Put("v/same", "1")
	kv.Put("v/upd", "1")
	saved, _ := savedState(t, h, etcdwatch.Prefix("v/"))
	kv.Put("v/upd", "2")
	bad := bytes.Clone(saved)
	bad[bytes.Index(bad, []byte("v/upd"))+len("v/upd")] ^= 1 // the saved value "1" becomes "0", which the server never had

	var mu sync.Mutex
	var decoded []string
	decode := func(key, value []byte) ([]byte, error) {
		mu.Lock()
		defer mu.Unlock()
		decoded = append(decoded, string(key)+"="+string(value))
		return value, nil
	}
	kv.FailNext(nil, errCompacted) // the cluster's header, then the check of the saved revision
	vh := openView(h, decode, view.WithRestore(bytes.NewReader(bad)))
	_, err := vh.v.Restored()
	require.ErrorIs(t, err, view.ErrSavedCorrupt)
	mu.Lock()
	defer mu.Unlock()
	require.ElementsMatch(t, []string{"v/same=1", "v/upd=2"}, decoded, "only the listing's values decoded")
}

// TestCloseSavesTheStateTheViewEndsWith: the last save is made once the
// view's goroutine has stopped publishing, so that the file holds the
// state Close leaves the view with, even when a response was being applied
// as Close began, which the view publishes as it ends.
func TestCloseSavesTheStateTheViewEndsWith(t *testing.T) {
	h := newHarness(t)
	kv := h.server.KV()
	putKeys(kv, 2)
	path := filepath.Join(t.TempDir(), "v.state")
	entered, release := make(chan struct{}), make(chan struct{})
	decode := func(key, value []byte) ([]byte, error) {
		if string(value) == "block" {
			close(entered)
			<-release
		}
		return value, nil
	}
	vh := openView(h, decode, view.WithStateFile(path, 0))
	vh.srv.Send(t, ws.Events(vh.id, kv.Revision()+1, kv.PutEvent("v/a", "v")))
	vh.srv.Send(t, ws.Events(vh.id, kv.Revision()+1, kv.PutEvent("v/b", "block")))
	recv(t, entered, "decode") // the view's goroutine is applying the last response
	closed := callAsync(func() error { return vh.v.Close() })
	vh.srv.RecvCancel(t) // the state's context has ended: its watch is canceled
	close(release)
	require.NoError(t, recv(t, closed, "Close"))
	require.Equal(t, kv.Revision(), vh.v.Revision(), "the view ends with what it applied")
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	saved, err := view.SavedRevision(b)
	require.NoError(t, err)
	require.Equal(t, vh.v.Revision(), saved, "the file holds the state the view ended with")
}

// TestRestoreReaderReadWhenNewFailsFirst: WithRestore's reader is read to
// its end also when New fails before it gets to the saved state: here the
// server refuses the first read it makes, of the cluster's revision.
func TestRestoreReaderReadWhenNewFailsFirst(t *testing.T) {
	h := newHarness(t)
	kv := h.server.KV()
	putKeys(kv, 3)
	saved, _ := savedState(t, h, etcdwatch.Prefix("v/"))
	r := &countingReader{r: bytes.NewReader(saved)}
	kv.FailNext(status.Error(codes.PermissionDenied, "etcdserver: permission denied"))
	v, err := view.New(context.Background(), h.s, etcdwatch.Prefix("v/"), view.DecodeBytes, view.WithRestore(r))
	require.ErrorIs(t, err, etcdwatch.ErrPermissionDenied)
	require.Nil(t, v)
	require.Equal(t, len(saved), r.n, "read to its end")
}

// TestRestoredStateNotMovedIsNotSavedAgain: WithStateFile saves "each time
// it moved since the last save" (README: "a state whose revision has not
// moved since the last save is not written again"). A view restored from
// its file, on a cluster that wrote nothing since, has not moved: its Close
// must leave the file as it is. Catches the restored state taken as never
// saved (lastSaved unset), so the whole state is written again, once per
// interval's first tick and at Close, by every process of a fleet restart.
func TestRestoredStateNotMovedIsNotSavedAgain(t *testing.T) {
	h := newHarness(t)
	kv := h.server.KV()
	putKeys(kv, 3)
	path := filepath.Join(t.TempDir(), "v.state")
	vh := openView(h, view.DecodeBytes, view.WithStateFile(path, 0))
	require.NoError(t, vh.v.Close()) // saves
	require.Equal(t, vh.id, h.srv.RecvCancel(t))
	before, err := os.Stat(path)
	require.NoError(t, err)

	res, id := h.restoring(kv.Revision(), view.DecodeBytes, view.WithStateFile(path, 0))
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest())
	h.srv.Send(t, ws.Progress(-1, kv.Revision()))
	v := started(t, res)
	rev, err := v.Restored()
	require.NoError(t, err)
	require.Equal(t, kv.Revision(), rev)
	require.Equal(t, rev, v.Revision(), "nothing moved")
	require.NoError(t, v.Close())
	require.Equal(t, id, h.srv.RecvCancel(t))
	after, err := os.Stat(path)
	require.NoError(t, err)
	require.True(t, os.SameFile(before, after), "the file was written again, though the state did not move since it was saved")
}

// TestHeldProgressBatchIsNotSavedAgain: a view moved by a bookmark within
// progressGap of its last progress batch publishes the new revision at
// once and its progress batch later. That later publication changes
// nothing (same revision, same listing), so the state file, saved at that
// revision in between, is not written again. Catches: the progress batch
// published with a new Snapshot, which saveFile (identity) takes for a
// state never saved: a whole-file write on an idle view. (On a machine
// slow enough that the second Sync comes after progressGap, there is no
// later publication and the test shows nothing.)
func TestHeldProgressBatchIsNotSavedAgain(t *testing.T) {
	h := newHarness(t)
	kv := h.server.KV()
	putKeys(kv, 2)
	path := filepath.Join(t.TempDir(), "v.state")
	vh := openView(h, view.DecodeBytes, view.WithStateFile(path, 0))
	kv.Put("w/a", "1")
	syncAnswered(t, vh) // a progress batch
	sub := vh.v.Subscribe(context.Background(), vh.v.Revision())
	kv.Put("w/b", "1")
	syncAnswered(t, vh) // within progressGap: published now, its progress batch later
	x := vh.v.Revision()
	before := vh.v.Snapshot()
	view.SaveStateFileNow(vh.v)
	saved, err := os.Stat(path)
	require.NoError(t, err)
	p := nextBatch(t, sub) // the held progress batch to x
	require.Equal(t, x, p.Revision)
	require.Empty(t, p.Changes)
	require.Equal(t, x, vh.v.Revision(), "nothing moved")
	view.SaveStateFileNow(vh.v)
	after, err := os.Stat(path)
	require.NoError(t, err)
	require.True(t, os.SameFile(saved, after), "the file was written again at unchanged revision %d (a new Snapshot: %v)", x, before != vh.v.Snapshot())
}

// TestStateFileRemovesLeftoversOfCrashedSaves: a save removes the
// temporary files that saves a crash interrupted left beside its file
// (unmodified for a minute), so that a process crashing as it saves, again
// and again, does not fill its disk; a young one, which may be another
// process's save in progress, and files that only look alike stay.
func TestStateFileRemovesLeftoversOfCrashedSaves(t *testing.T) {
	h := newHarness(t)
	putKeys(h.server.KV(), 1)
	dir := t.TempDir()
	path := filepath.Join(dir, "v.state")
	old := time.Now().Add(-time.Hour)
	file := func(name string, mod time.Time) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte("x"), 0o600))
		require.NoError(t, os.Chtimes(p, mod, mod))
		return p
	}
	left := []string{file("v.state.123.tmp", old), file("v.state.9.tmp", old)}
	kept := []string{
		file("v.state.456.tmp", time.Now()), // young: perhaps a save in progress
		file("v.state.x1.tmp", old),         // not os.CreateTemp's
		file("v.state.tmp", old),
		file("w.state.123.tmp", old), // another file's
		file("123.tmp", old),
	}
	vh := openView(h, view.DecodeBytes, view.WithStateFile(path, 0))
	require.NoError(t, vh.v.Close()) // saves
	require.Equal(t, vh.id, h.srv.RecvCancel(t))
	for _, p := range left {
		require.NoFileExists(t, p)
	}
	for _, p := range kept {
		require.FileExists(t, p)
	}
	require.FileExists(t, path)
}

// TestRestoredRelistIsNoStepFromBeforeTheSave: a view restored from a
// saved state found compacted starts its history at the saved revision,
// with the Relisted batch from there. A subscriber holding a state older
// than the saved one gets a Resync, not counted (the view never had those
// changes), rather than that batch, which is not the difference from its
// state.
func TestRestoredRelistIsNoStepFromBeforeTheSave(t *testing.T) {
	h := newHarness(t)
	kv := h.server.KV()
	kv.Put("v/early", "1")
	before := kv.Revision()
	kv.Put("v/a", "1")
	saved, at := savedState(t, h, etcdwatch.Prefix("v/"))
	require.Less(t, before, at)
	kv.Put("v/a", "2")
	kv.Put("v/b", "1")

	vh := restoreCompacted(t, h, saved, at)
	b := nextBatch(t, vh.v.Subscribe(context.Background(), before))
	require.Equal(t, view.Resync, b.Kind, "from before the saved state: the whole state")
	require.Equal(t, kv.Revision(), b.Revision)
	require.Len(t, b.Changes, 3)
	require.Zero(t, vh.v.Stats().Resyncs, "the view never had those changes: not fallen behind")
	b = nextBatch(t, vh.v.Subscribe(context.Background(), at))
	require.Equal(t, view.Relisted, b.Kind, "from the saved state: the difference")
	require.Equal(t, []string{"updated v/a", "created v/b"}, summary(b))
}

// TestCompactedRestoreSavesAsAColdView: a view that keeps its
// values, restored from a saved state whose history is compacted (listed
// against it), holds what a cold view of the range holds: it saves the
// same bytes (every key's value as sent, the listing's revision, the
// cluster it listed) and counts the same bytes. Catches: the listing's
// values as sent not kept (every save then fails, its two maps out of
// step), the state's cluster lost (the next restart refuses the file),
// its size not counted.
func TestCompactedRestoreSavesAsAColdView(t *testing.T) {
	h := newHarness(t)
	kv := h.server.KV()
	kv.SetClusterID(7)
	for _, k := range []string{"same", "upd", "del"} {
		kv.Put("v/"+k, "1")
	}
	saved, at := savedState(t, h, etcdwatch.Prefix("v/"))
	kv.Put("v/upd", "2")
	kv.Delete("v/del")
	kv.Put("v/new", "1")

	warm := restoreCompacted(t, h, saved, at, view.WithSave())
	require.EqualValues(t, 1, warm.v.Stats().Relists, "listed against the saved state")
	var got bytes.Buffer
	require.NoError(t, warm.v.Save(&got), "a restored view saves")
	cluster, err := view.SavedCluster(got.Bytes())
	require.NoError(t, err)
	require.EqualValues(t, 7, cluster, "the cluster the state came from")

	cold := openView(h, view.DecodeBytes, view.WithSave())
	require.Equal(t, cold.v.Revision(), warm.v.Revision())
	var want bytes.Buffer
	require.NoError(t, cold.v.Save(&want))
	require.Equal(t, want.Bytes(), got.Bytes(), "saved as a cold view of the same state saves")
	require.Equal(t, cold.v.Stats().Bytes, warm.v.Stats().Bytes)
	require.Equal(t, cold.v.Stats().Keys, warm.v.Stats().Keys)
}

// TestCompactedRestoreOfALargeState: a saved state larger than the
// reader's buffer, whose history is compacted, is merged with the listing
// as it is read, the reader lending each entry's bytes; the Relisted
// batch's Prevs, decoded once the whole state is read, are the saved
// values of their keys, also of the first keys, whose bytes the reader has
// long since overwritten. Catches: a Prev kept as the lent bytes, not a
// copy (it is then whatever the buffer holds at the end).
func TestCompactedRestoreOfALargeState(t *testing.T) {
	h := newHarness(t)
	kv := h.server.KV()
	key := func(i int) string { return fmt.Sprintf("v/s%03d", i) }
	value := func(i int, gen string) string { return fmt.Sprintf("%s %03d ", gen, i) + strings.Repeat("x", 1<<10) }
	for i := range 600 {
		kv.Put(key(i), value(i, "saved"))
	}
	saved, at := savedState(t, h, etcdwatch.Prefix("v/"))
	require.Greater(t, len(saved), 2*256<<10, "more than twice what the reader's buffer holds")
	updated := []int{0, 1, 2, 300, 599}
	for _, i := range updated {
		kv.Put(key(i), value(i, "new"))
	}
	kv.Delete(key(3))
	kv.Delete(key(598))

	vh := restoreCompacted(t, h, saved, at)
	b := nextBatch(t, vh.v.Subscribe(context.Background(), at))
	require.Equal(t, view.Relisted, b.Kind)
	require.Equal(t, []string{"updated v/s000", "updated v/s001", "updated v/s002", "deleted v/s003",
		"updated v/s300", "deleted v/s598", "updated v/s599"}, summary(b))
	for _, ch := range b.Changes {
		var i int
		_, err := fmt.Sscanf(ch.Key, "v/s%03d", &i)
		require.NoError(t, err)
		require.NotNil(t, ch.Prev, ch.Key)
		require.Equal(t, value(i, "saved"), string(ch.Prev.Value), "the saved value of %s", ch.Key)
		require.Equal(t, ch.Key, ch.Prev.Key)
		if ch.Entry != nil {
			require.Equal(t, value(i, "new"), string(ch.Entry.Value), ch.Key)
		}
	}
}

// TestSaveKeepsEveryRevisionOfAKey: a view restored from another's
// save holds each key's revisions and lease as the saving view held them,
// a lease too (which a listing of the scripted server never sets: here it
// comes with an event). Catches: Save writing a revision in another's
// place, or leaving the lease out.
func TestSaveKeepsEveryRevisionOfAKey(t *testing.T) {
	h := newHarness(t)
	kv := h.server.KV()
	kv.Put("v/a", "1")
	kv.Put("v/a", "2")
	first := openView(h, view.DecodeBytes, view.WithSave())
	ev := kv.PutEvent("v/a", "3")
	ev.Kv.Lease = 0x1234
	first.send(ev)
	ev = kv.PutEvent("v/b", "1")
	ev.Kv.Lease = 0x5678
	first.send(ev)
	want, ok := first.v.Get("v/a")
	require.True(t, ok)
	require.Equal(t, []int64{2, 4, 3, 0x1234}, []int64{want.CreateRevision, want.ModRevision, want.Version, want.Lease}, "the saving view's entry")
	wants := map[string]view.Entry[[]byte]{}
	for k, e := range first.v.All() {
		wants[k] = e
	}
	var saved bytes.Buffer
	require.NoError(t, first.v.Save(&saved))
	require.NoError(t, first.v.Close())
	require.Equal(t, first.id, h.srv.RecvCancel(t))

	res, _ := h.restoring(kv.Revision(), view.DecodeBytes, view.WithRestore(&saved))
	require.NotNil(t, h.srv.Recv(t).GetProgressRequest())
	h.srv.Send(t, ws.Progress(-1, kv.Revision()))
	v := started(t, res)
	rev, err := v.Restored()
	require.NoError(t, err)
	require.Equal(t, kv.Revision(), rev)
	for _, k := range []string{"v/a", "v/b"} {
		w := wants[k]
		g, ok := v.Get(k)
		require.True(t, ok, k)
		require.Equal(t, []int64{w.CreateRevision, w.ModRevision, w.Version, w.Lease}, []int64{g.CreateRevision, g.ModRevision, g.Version, g.Lease}, k)
	}
}

// TestRestoreWatchNotConfirmedIsReported: when the watch from the
// saved revision is not confirmed in time (a reason that may pass), the
// saved state is let go and the view lists; Restored says why (a
// *RestoreError wrapping ErrCreateTimeout) and Stats counts it, as
// WithRestore says. Catches: the failure returned as the listing's, which
// lists the same but leaves Restored saying there was nothing to restore.
func TestRestoreWatchNotConfirmedIsReported(t *testing.T) {
	h := newHarness(t, etcdwatch.WithCreateTimeout(500*time.Millisecond), etcdwatch.WithReconnectBackoff(time.Millisecond, time.Millisecond))
	kv := h.server.KV()
	putKeys(kv, 2)
	saved, at := savedState(t, h, etcdwatch.Prefix("v/"))
	kv.Put("v/new", "1")

	res := newViewAsync(h, etcdwatch.Prefix("v/"), view.DecodeBytes, view.WithRestore(bytes.NewReader(saved)))
	late := h.isolated().RecvCreate(t) // not answered in time
	require.Equal(t, at+1, late.StartRevision, "the watch from the saved revision")
	again := h.srv.RecvCreate(t) // the listing's
	require.Equal(t, kv.Revision(), again.StartRevision, "the watch from the listing")
	h.srv.Send(t, ws.Created(late.WatchId, kv.Revision()))
	require.Equal(t, late.WatchId, h.srv.RecvCancel(t), "the late watch is let go")
	h.srv.Send(t, ws.Created(again.WatchId, kv.Revision()))
	h.settle()
	v := started(t, res)
	require.Equal(t, []string{"v/00", "v/01", "v/new"}, viewKeys(v))
	rev, err := v.Restored()
	require.Zero(t, rev)
	var re *view.RestoreError
	require.ErrorAs(t, err, &re)
	require.ErrorIs(t, err, etcdwatch.ErrCreateTimeout)
	require.EqualValues(t, 1, v.Stats().RestoreRefusals)
}

// TestStateFileIntervalNotNegative: WithStateFile's interval is at
// least 0; the least negative one is refused too, in New, before anything
// is sent. Catches: a bound below 0.
func TestStateFileIntervalNotNegative(t *testing.T) {
	h := newHarness(t)
	before := len(h.server.KV().Requests())
	ctx, cancel := context.WithTimeout(context.Background(), wait) // accepted, New would wait for a watch the server never confirms
	defer cancel()
	v, err := view.New(ctx, h.s, etcdwatch.Prefix("v/"), view.DecodeBytes,
		view.WithStateFile(filepath.Join(t.TempDir(), "state"), -time.Nanosecond))
	require.ErrorIs(t, err, etcdwatch.ErrInvalidArgument)
	require.Nil(t, v)
	require.Len(t, h.server.KV().Requests(), before, "nothing sent")
}

// TestDecodeErrorsOfAFailedListingAgainstASavedStateNotCounted: a listing
// against a saved state whose history is compacted that fails after its
// first page is let go, and the retry lists as without it; a value of that
// first page that the Decoder refuses is then counted once, as
// TestDecodeErrorsCountedOncePerValue has it for a first listing (core.go:
// a listing counts the decode errors of the state it installs only, not
// those of tries that failed).
func TestDecodeErrorsOfAFailedListingAgainstASavedStateNotCounted(t *testing.T) {
	h := newHarness(t, etcdwatch.WithReconnectBackoff(time.Millisecond, time.Millisecond))
	kv := h.server.KV()
	kv.Put("v/a", "{")
	kv.Put("v/b", `{"N":1}`)
	saved, _ := savedState(t, h, etcdwatch.Prefix("v/"))
	kv.Put("v/b", `{"N":2}`)
	// The cluster's header; the history since the save, compacted; the
	// first page of the listing against it; its second page fails.
	kv.FailNext(nil, errCompacted,
		nil, status.Error(codes.Unavailable, "leader changed"))
	vh := openView(h, view.DecodeJSON[config], view.WithRestore(bytes.NewReader(saved)), view.WithPageSize(1), view.WithPageBytes(0))
	rev, err := vh.v.Restored()
	require.Zero(t, rev)
	var re *view.RestoreError
	require.ErrorAs(t, err, &re)
	require.Equal(t, codes.Unavailable, status.Code(re.Err), "let go: %v", err)
	require.Equal(t, 2, vh.v.Len())
	require.EqualValues(t, 1, vh.v.Stats().DecodeErrors, "one value refused: v/a")
}

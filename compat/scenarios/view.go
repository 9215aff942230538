package scenarios

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/etcdwatch/etcdwatch"
	"github.com/etcdwatch/etcdwatch/view"
)

// viewList lists 1,500 keys while a writer keeps changing them. Before
// etcd 3.7 the view reads 100-key pages pinned to the first page's
// revision R, and between every two pages the writer creates the very key
// the next page starts at (so a page read at a newer revision would hold
// it); etcd 3.7 streams the range from one snapshot (RangeStream). Either
// way the view's state at R, and at every revision after, must be a Range
// at that revision: key, value and revisions.
func viewList(t *testing.T, e *Env) {
	const keys, page = 1500, 100
	prefix := unique("view-list")
	key := func(i int) string { return fmt.Sprintf("%sk%04d", prefix, i) }
	for i := 0; i < keys; i += 100 { // etcd's default --max-txn-ops is 128
		var kvs [][2]string
		for j := i; j < i+100; j++ {
			kvs = append(kvs, [2]string{key(j), fmt.Sprint("v", j)})
		}
		e.txn(t, kvs...)
	}

	ctx := t.Context()
	asks := make(chan string)   // a key to create between two pages
	made := make(chan int64, 1) // the revision it was created at
	stop := make(chan struct{}) // ends the writer
	quit := make(chan struct{}) // closed when the writer has returned
	var writes, between int     // the writer's, read after quit
	var betweenKeys []string    // likewise
	var writeErr error          // likewise
	// The writer: exits when stop is closed, or at its first error.
	go func() {
		defer close(quit)
		for i := 0; ; i++ {
			var err error
			select {
			case <-stop:
				return
			case k := <-asks:
				var rev int64
				if rev, err = e.tryPut(ctx, k, "between pages"); err == nil {
					between++
					betweenKeys = append(betweenKeys, k)
					select {
					case made <- rev:
					case <-stop:
						return
					}
				}
			default: // update a key, delete it, create it again; striding over every page
				switch j := (i / 3 * 97) % keys; i % 3 {
				case 0:
					_, err = e.tryPut(ctx, key(j), fmt.Sprint("w", i))
				case 1:
					_, err = e.tryDelete(ctx, key(j))
				case 2:
					_, err = e.tryPut(ctx, key(j), fmt.Sprint("again", i))
				}
			}
			if err != nil {
				writeErr = err
				return
			}
			writes++
		}
	}()
	sp := newSpy(prefix, page)
	sp.between = func(ctx context.Context, start []byte, after int64) error {
		select {
		case asks <- string(start):
		case <-quit:
			return errors.New("the writer has stopped")
		case <-ctx.Done():
			return ctx.Err()
		}
		select {
		case rev := <-made:
			if rev <= after {
				return fmt.Errorf("the write between pages is at %d, not after the previous page's %d", rev, after)
			}
			return nil
		case <-quit:
			return errors.New("the writer has stopped")
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	s := openConn(t, e.Endpoint, sp.options())
	nctx, cancel := context.WithTimeout(ctx, Wait)
	defer cancel()
	v, err := view.New(nctx, s, etcdwatch.Prefix(prefix), view.DecodeBytes, view.WithPageSize(page), view.WithPageBytes(0))
	close(stop)
	<-quit
	if err != nil {
		t.Fatalf("view.New: %v (spy: %v, writer: %v)", err, sp.failure(), writeErr)
	}
	defer v.Close()
	must(t, writeErr)

	lists, pages, streams, refused := sp.listings()
	check(t, len(lists) == 1, "%d listings, want 1: %v", len(lists), lists)
	listed := lists[0]
	atListing := e.rows(t, prefix, listed)
	path := "RangeStream"
	if e.Version.Major == 3 && e.Version.Minor < 7 {
		want := (len(atListing) + page - 1) / page
		check(t, streams == 0 && refused == 1, "etcd %s: %d RangeStream listings, %d refused; want 0 and 1", e.Version, streams, refused)
		check(t, pages == want && pages >= keys/page, "etcd %s: %d pages for %d keys, want %d", e.Version, pages, len(atListing), want)
		check(t, between == pages-1, "%d writes between %d pages", between, pages)
		path = fmt.Sprintf("%d Range pages of %d pinned to %d", pages, page, listed)
	} else {
		check(t, streams == 1 && refused == 0 && pages == 0, "etcd %s: %d RangeStream listings, %d refused, %d pages; want one RangeStream",
			e.Version, streams, refused, pages)
		check(t, between == 0, "%d writes between pages of a RangeStream", between)
	}

	// The state at the listing: the current one with every change since
	// undone, each Change's Prev put back.
	sub := v.Subscribe(context.Background(), listed)
	defer sub.Close()
	snap := v.Snapshot()
	var batches []view.Batch[[]byte]
	for last := listed; last < snap.Revision(); {
		b := nextBatch(t, sub)
		check(t, b.Kind == view.Events && b.From == last && b.Revision <= snap.Revision(),
			"batch %s from %d to %d after %d (state at %d)", b.Kind, b.From, b.Revision, last, snap.Revision())
		batches = append(batches, b)
		last = b.Revision
	}
	state := map[string]row{}
	for _, r := range snapRows(t, snap) {
		state[r.key] = r
	}
	changes := 0
	for i := len(batches) - 1; i >= 0; i-- {
		chs := batches[i].Changes
		changes += len(chs)
		for j := len(chs) - 1; j >= 0; j-- {
			switch ch := chs[j]; ch.Kind {
			case view.Created:
				delete(state, ch.Key)
			default:
				check(t, ch.Prev != nil, "%s change of %s without Prev", ch.Kind, ch.Key)
				state[ch.Key] = entryRow(ch.Prev)
			}
		}
	}
	equal(t, atListing, sortedRows(state), fmt.Sprintf("the view as listed at %d", listed))
	equal(t, e.rows(t, prefix, snap.Revision()), snapRows(t, snap), fmt.Sprintf("the view at %d", snap.Revision()))
	for _, k := range betweenKeys {
		_, ok := state[k]
		check(t, !ok, "%q, created between two pages, is in the listing at %d", k, listed)
	}

	lastRev := e.put(t, key(0), "last") // the writer has stopped: the view ends at this write
	syncView(t, v)
	got, _ := v.Get(key(0))
	check(t, got.ModRevision == lastRev, "after Sync, %s at %d, want the last write at %d", key(0), got.ModRevision, lastRev)
	final := v.Snapshot()
	equal(t, e.rows(t, prefix, final.Revision()), snapRows(t, final), fmt.Sprintf("the view after Sync, at %d", final.Revision()))
	t.Logf("etcd %s: listed %d keys at %d with %s; %d writes while view.New ran (%d between pages); "+
		"%d changes in %d batches up to %d; %d keys at %d after Sync",
		e.Version, len(atListing), listed, path, writes, between, changes, len(batches), snap.Revision(), final.Len(), final.Revision())
}

// viewRelist takes the view's connection down (through a dialer that holds
// every dial until told), and while it is down updates, deletes, creates,
// and deletes then creates again keys of the range, and compacts. On
// resume etcd cancels the watch as compacted; the view lists again and its
// subscriber's next batch is Relisted with exactly the difference, every
// entry as a Range at each end has it. Proxy.Cut would not do: gRPC dials
// again at once, and the stream resumes before the compaction.
func viewRelist(t *testing.T, e *Env) {
	prefix := unique("view-relist")
	key := func(i int) string { return fmt.Sprintf("%sk%02d", prefix, i) }
	var kvs [][2]string
	for i := range 10 {
		kvs = append(kvs, [2]string{key(i), "v0"})
	}
	e.txn(t, kvs...)
	out := newOutage(e.Endpoint)
	sp := newSpy(prefix, 1000)
	s := openConn(t, e.Endpoint, append(sp.options(), grpc.WithContextDialer(out.dial)),
		etcdwatch.WithReconnectBackoff(10*time.Millisecond, 200*time.Millisecond))
	t.Cleanup(out.restore) // before the Stream's Close: a dial still held returns
	ctx, cancel := context.WithTimeout(t.Context(), Wait)
	defer cancel()
	// No bookmark requests of the view's own: nothing but the outage moves it.
	v, err := view.New(ctx, s, etcdwatch.Prefix(prefix), view.DecodeBytes, view.WithBookmarkInterval(0))
	must(t, err)
	defer v.Close()
	e.put(t, key(9), "v1")
	syncView(t, v)
	from := v.Revision()
	before := e.rows(t, prefix, from)
	equal(t, before, snapRows(t, v.Snapshot()), fmt.Sprintf("the view at %d", from))
	sub := v.Subscribe(context.Background(), from)
	defer sub.Close()

	check(t, out.down() >= 1, "no connection to take down")
	out.awaitHeld(t) // the Stream is trying to reconnect, and cannot
	e.put(t, key(1), "v1")
	e.put(t, key(1), "v2") // updated twice
	e.del(t, key(2))
	e.put(t, key(10), "new")
	e.del(t, key(3))
	e.put(t, key(3), "again") // deleted, then created again
	e.put(t, key(4), "v0")    // the same value: a new ModRevision and Version
	e.put(t, key(11), "brief")
	e.del(t, key(11)) // created and deleted: no change
	compacted := e.put(t, unique("view-relist-elsewhere")+"k", "x")
	e.compact(t, compacted)
	out.restore()

	b := nextBatch(t, sub)
	check(t, b.Kind == view.Relisted, "first batch after the outage is %s from %d to %d, want relisted", b.Kind, b.From, b.Revision)
	check(t, b.From == from && b.Revision >= compacted, "relisted from %d to %d; want from %d to at least %d", b.From, b.Revision, from, compacted)
	after := e.rows(t, prefix, b.Revision)
	var got []change
	var shape []string
	for _, ch := range b.Changes {
		got = append(got, changeOf(ch))
		shape = append(shape, fmt.Sprint(ch.Kind, " ", ch.Key[len(prefix):]))
	}
	equal(t, diffRows(before, after, b.Revision), got, "relisted changes")
	equal(t, []string{"updated k01", "deleted k02", "deleted k03", "created k03", "updated k04", "created k10"}, shape, "relisted changes")
	st := v.Stats()
	check(t, st.Relists == 1, "Stats.Relists %d, want 1", st.Relists)
	lists, _, _, _ := sp.listings()
	check(t, len(lists) == 2 && lists[1] == b.Revision, "listings at %v, want a second at %d", lists, b.Revision)
	check(t, s.Stats().Reconnects >= 1, "the Stream did not reconnect")

	// The new watch follows the range.
	rev := e.put(t, key(0), "after")
	n := nextBatch(t, sub)
	check(t, n.Kind == view.Events && n.From == b.Revision && n.Revision == rev && len(n.Changes) == 1,
		"after the relist: %s from %d to %d with %d changes; want the put at %d", n.Kind, n.From, n.Revision, len(n.Changes), rev)
	ch := n.Changes[0]
	check(t, ch.Kind == view.Updated && ch.Key == key(0) && string(ch.Entry.Value) == "after" && string(ch.Prev.Value) == "v0",
		"after the relist: %+v", changeOf(ch))
	equal(t, e.rows(t, prefix, rev), snapRows(t, v.Snapshot()), fmt.Sprintf("the view at %d", rev))
	t.Logf("etcd %s: relisted from %d to %d (compacted at %d) with %d changes; %d reconnects",
		e.Version, b.From, b.Revision, compacted, len(b.Changes), s.Stats().Reconnects)
}

// viewRestoreAtCompaction: a view saved at S restarts from its state after
// a key was deleted at S+1 and the store compacted at S+1, so that a watch
// from S+1 is still allowed. It must not hold the deleted key. etcd before
// the fix of #18089 (3.4.23 among them) drops a tombstone at the compaction
// revision from what a watch from that revision replays.
func viewRestoreAtCompaction(t *testing.T, e *Env) {
	prefix := unique("view-restore")
	e.txn(t, [2]string{prefix + "a", "v"}, [2]string{prefix + "b", "v"})
	var saved bytes.Buffer
	var savedRev int64
	func() {
		s := open(t, e.Endpoint)
		v, err := view.New(t.Context(), s, etcdwatch.Prefix(prefix), view.DecodeBytes, view.WithSave())
		must(t, err)
		defer v.Close()
		syncView(t, v)
		savedRev = v.Revision()
		must(t, v.Save(&saved))
	}()
	deleted := e.del(t, prefix+"a")
	e.compact(t, deleted)

	s := open(t, e.Endpoint)
	ctx, cancel := context.WithTimeout(t.Context(), Wait) // it waited for ever, for a delete the server never sent
	defer cancel()
	v, err := view.New(ctx, s, etcdwatch.Prefix(prefix), view.DecodeBytes, view.WithRestore(&saved))
	must(t, err)
	defer v.Close()
	syncView(t, v)
	rev := v.Revision()
	equal(t, e.rows(t, prefix, rev), snapRows(t, v.Snapshot()), fmt.Sprintf("the restored view at %d", rev))
	from, refused := v.Restored()
	t.Logf("etcd %s: restored from %d (refused: %v), deleted and compacted at %d, view at %d", e.Version, from, refused, deleted, rev)
	check(t, refused == nil && from == savedRev, "the view started from its saved state at %d, not a listing (restored from %d, refused: %v)", savedRev, from, refused)
}

// viewSync: after each of 100 writes (puts, and deletes of keys there or
// not), Sync makes the view hold it. Where the Stream refuses progress
// requests (etcd #15220: 3.4.0-3.4.24, 3.5.0-3.5.7) every Sync must make
// exactly one linearizable read instead, and none elsewhere. Then Sync
// returns on views nobody writes while keys elsewhere change.
func viewSync(t *testing.T, e *Env) {
	const writes = 100
	prefix := unique("view-sync")
	key := func(i int) string { return fmt.Sprintf("%sk%d", prefix, i%10) }
	sp := newSpy(prefix, 1000)
	s := openConn(t, e.Endpoint, sp.options())
	ctx, cancel := context.WithTimeout(t.Context(), Wait)
	defer cancel()
	v, err := view.New(ctx, s, etcdwatch.Prefix(prefix), view.DecodeBytes)
	must(t, err)
	defer v.Close()
	byRead := e.Version.ProgressRunsAhead()
	t.Run("RightAfterNew", func(t *testing.T) { viewSyncRightAway(t, e, s) })

	held := map[string]int64{} // key -> ModRevision
	for i := range writes {
		k := key(i)
		if i%4 == 3 {
			e.del(t, k)
			delete(held, k)
		} else {
			held[k] = e.put(t, k, fmt.Sprint(i))
		}
		syncView(t, v)
		got, ok := v.Get(k)
		mod, want := held[k]
		check(t, ok == want, "write %d: %s in the view: %v, want %v", i, k, ok, want)
		if want {
			check(t, string(got.Value) == fmt.Sprint(i) && got.ModRevision == mod,
				"write %d: %s is %q at %d, want %q at %d", i, k, got.Value, got.ModRevision, fmt.Sprint(i), mod)
		}
		check(t, v.Len() == len(held), "write %d: %d keys in the view, want %d", i, v.Len(), len(held))
	}
	pctx, pcancel := context.WithTimeout(t.Context(), Wait)
	defer pcancel()
	_, err = s.RequestProgress(pctx)
	if byRead {
		check(t, errors.Is(err, etcdwatch.ErrProgressUnsupported), "RequestProgress on etcd %s: %v", e.Version, err)
	} else {
		must(t, err)
	}
	reads := sp.reads()
	if byRead {
		check(t, reads == writes, "etcd %s: %d reads for %d Syncs without progress", e.Version, reads, writes)
	} else {
		check(t, reads == 0, "etcd %s: %d Syncs read the range instead of asking for progress", e.Version, reads)
	}

	// Idle: nothing changes in the view's range, keys elsewhere do.
	empty, err := view.New(pctx, s, etcdwatch.Prefix(unique("view-sync-empty")), view.DecodeBytes)
	must(t, err)
	defer empty.Close()
	idleFrom := v.Revision()
	elsewhere := unique("view-sync-elsewhere")
	var last int64
	for i := range 3 {
		last = e.put(t, fmt.Sprint(elsewhere, i), "x")
	}
	syncView(t, v)
	syncView(t, empty)
	check(t, v.Len() == len(held) && empty.Len() == 0, "idle views changed: %d and %d keys", v.Len(), empty.Len())
	if byRead {
		check(t, sp.reads() == writes+1, "etcd %s: the idle Sync made %d reads, want 1", e.Version, sp.reads()-writes)
	}
	// On every path, Sync moves an idle view to the revision it read.
	check(t, v.Revision() >= last && empty.Revision() >= last, "after Sync, idle views at %d and %d, below the write elsewhere at %d",
		v.Revision(), empty.Revision(), last)

	// WaitForRevision of a revision written elsewhere asks, as Sync does:
	// by progress, or where that is unsafe, by a read.
	last = e.put(t, elsewhere+"w", "x")
	must(t, v.WaitForRevision(pctx, last))
	check(t, v.Revision() >= last, "WaitForRevision(%d) returned with the view at %d", last, v.Revision())
	if byRead {
		check(t, sp.reads() == writes+2, "etcd %s: WaitForRevision made %d reads, want 1", e.Version, sp.reads()-writes-1)
	}
	how := "RequestProgress"
	if byRead {
		how = "a linearizable read (RequestProgress: ErrProgressUnsupported)"
	}
	t.Logf("etcd %s: %d Syncs by %s; idle Sync with writes elsewhere up to %d: view from %d to %d, empty view at %d",
		e.Version, writes+2, how, last, idleFrom, v.Revision(), empty.Revision())
}

// viewSyncRightAway: Sync on a new view, with nothing written anywhere
// since its listing, returns at once: the view is as fresh as a read.
func viewSyncRightAway(t *testing.T, e *Env, s *etcdwatch.Stream) {
	// etcd 3.5.13+, 3.6 and 3.7 answer no progress request while a watch on
	// the stream starts after the store's revision (progressIfSync: rev <
	// w.startRev). A view watches from its listing's revision, so this
	// Sync, with nothing written anywhere, is answered.
	ctx, cancel := context.WithTimeout(t.Context(), Wait)
	defer cancel()
	v, err := view.New(ctx, s, etcdwatch.Prefix(unique("view-sync-new")), view.DecodeBytes)
	must(t, err)
	defer v.Close()
	syncView(t, v)
	check(t, v.Len() == 0, "%d keys in a new view of an empty range", v.Len())
}

// row is a key of a range as a Range or a view holds it.
type row struct {
	key, value                  string
	create, mod, version, lease int64
}

// rows is the range of prefix at rev (0: the newest), in key order.
func (e *Env) rows(t *testing.T, prefix string, rev int64) []row {
	t.Helper()
	resp, err := e.kv.Range(t.Context(), &pb.RangeRequest{Key: []byte(prefix), RangeEnd: prefixEnd(prefix), Revision: rev})
	must(t, err)
	var rows []row
	for _, kv := range resp.Kvs {
		rows = append(rows, row{string(kv.Key), string(kv.Value), kv.CreateRevision, kv.ModRevision, kv.Version, kv.Lease})
	}
	return rows
}

func entryRow(en *view.Entry[[]byte]) row {
	if en == nil {
		return row{}
	}
	return row{en.Key, string(en.Value), en.CreateRevision, en.ModRevision, en.Version, en.Lease}
}

// snapRows is a snapshot's state, in key order.
func snapRows(t *testing.T, s *view.Snapshot[[]byte]) []row {
	t.Helper()
	var rows []row
	for k, en := range s.All() {
		check(t, en.Err == nil && en.Key == k, "entry of %q: key %q, error %v", k, en.Key, en.Err)
		rows = append(rows, entryRow(&en))
	}
	return rows
}

func sortedRows(m map[string]row) []row {
	rows := make([]row, 0, len(m))
	for _, r := range m {
		rows = append(rows, r)
	}
	slices.SortFunc(rows, func(a, b row) int { return strings.Compare(a.key, b.key) })
	return rows
}

// change is a Change as the comparisons see it.
type change struct {
	kind        view.ChangeKind
	key         string
	rev         int64
	entry, prev row
}

func changeOf(ch view.Change[[]byte]) change {
	return change{ch.Kind, ch.Key, ch.Revision, entryRow(ch.Entry), entryRow(ch.Prev)}
}

// diffRows is the difference a relist from before to after (both in key
// order) must report at rev: a key whose CreateRevision moved was deleted
// and created again; one whose ModRevision moved, updated. A put's
// revision is its key's ModRevision; a delete's, rev.
func diffRows(before, after []row, rev int64) []change {
	var d []change
	i, j := 0, 0
	for i < len(before) || j < len(after) {
		switch {
		case j == len(after) || (i < len(before) && before[i].key < after[j].key):
			d = append(d, change{view.Deleted, before[i].key, rev, row{}, before[i]})
			i++
		case i == len(before) || after[j].key < before[i].key:
			d = append(d, change{view.Created, after[j].key, after[j].mod, after[j], row{}})
			j++
		default:
			b, a := before[i], after[j]
			switch {
			case b.create != a.create:
				d = append(d, change{view.Deleted, b.key, rev, row{}, b}, change{view.Created, a.key, a.mod, a, row{}})
			case b.mod != a.mod:
				d = append(d, change{view.Updated, a.key, a.mod, a, b})
			}
			i++
			j++
		}
	}
	return d
}

// del deletes key and returns the revision.
func (e *Env) del(t *testing.T, key string) int64 {
	t.Helper()
	rev, err := e.tryDelete(t.Context(), key)
	must(t, err)
	return rev
}

// tryDelete is del for goroutines other than the test's.
func (e *Env) tryDelete(ctx context.Context, key string) (int64, error) {
	resp, err := e.kv.DeleteRange(ctx, &pb.DeleteRangeRequest{Key: []byte(key)})
	if err != nil {
		return 0, err
	}
	return resp.Header.Revision, nil
}

func syncView[T any](t *testing.T, v *view.View[T]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), Wait)
	defer cancel()
	must(t, v.Sync(ctx))
}

func nextBatch[T any](t *testing.T, sub *view.Subscription[T]) view.Batch[T] {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), Wait)
	defer cancel()
	b, err := sub.Next(ctx)
	must(t, err)
	return b
}

// spy sees the Range and RangeStream calls a Stream's connection makes for
// one prefix: how its view lists the range, and how Sync reads it.
type spy struct {
	key, end []byte
	page     int64
	// between, if set, runs before each page of a paged listing but the
	// first, with the key the page starts at and the store's revision the
	// page before saw. An error fails the page.
	between func(ctx context.Context, start []byte, after int64) error

	mu      sync.Mutex
	lists   []int64 // the revision of each listing: its first page's, or its RangeStream's
	pages   int     // Range pages of listings
	prev    int64   // the store's revision at the last page
	streams int     // listings by RangeStream
	refused int     // RangeStream calls the server does not have
	fresh   int     // Sync's reads without progress: one key, keys only, newest ModRevision first
	err     error   // the first page between failed
}

func newSpy(prefix string, page int) *spy {
	return &spy{key: []byte(prefix), end: prefixEnd(prefix), page: int64(page)}
}

func (s *spy) options() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithChainUnaryInterceptor(s.unary), grpc.WithChainStreamInterceptor(s.stream)}
}

func (s *spy) mine(r *pb.RangeRequest) bool {
	return bytes.HasPrefix(r.Key, s.key) && bytes.Equal(r.RangeEnd, s.end)
}

func (s *spy) listings() (lists []int64, pages, streams, refused int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]int64(nil), s.lists...), s.pages, s.streams, s.refused
}

func (s *spy) reads() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fresh
}

func (s *spy) failure() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

func (s *spy) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoke grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	r, ok := req.(*pb.RangeRequest)
	if method != pb.KV_Range_FullMethodName || !ok || !s.mine(r) {
		return invoke(ctx, method, req, reply, cc, opts...)
	}
	if r.Limit == 1 && r.KeysOnly && r.SortTarget == pb.RangeRequest_MOD && r.SortOrder == pb.RangeRequest_DESCEND {
		s.mu.Lock()
		s.fresh++
		s.mu.Unlock()
		return invoke(ctx, method, req, reply, cc, opts...)
	}
	if r.Limit != s.page {
		return invoke(ctx, method, req, reply, cc, opts...)
	}
	first := bytes.Equal(r.Key, s.key) // a listing's first page; the others start after a key
	if !first && s.between != nil {
		s.mu.Lock()
		after := s.prev
		s.mu.Unlock()
		if err := s.between(ctx, r.Key, after); err != nil {
			s.mu.Lock()
			if s.err == nil {
				s.err = err
			}
			s.mu.Unlock()
			return err
		}
	}
	if err := invoke(ctx, method, req, reply, cc, opts...); err != nil {
		return err
	}
	rev := reply.(*pb.RangeResponse).GetHeader().GetRevision()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pages++
	s.prev = rev
	if first {
		s.lists = append(s.lists, rev)
	}
	return nil
}

func (s *spy) stream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	cs, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil || method != pb.KV_RangeStream_FullMethodName {
		return cs, err
	}
	return &spiedRange{ClientStream: cs, spy: s}, nil
}

// spiedRange is a RangeStream call the spy sees.
type spiedRange struct {
	grpc.ClientStream
	spy  *spy
	mine bool
	rev  int64
}

func (r *spiedRange) SendMsg(m any) error {
	if req, ok := m.(*pb.RangeRequest); ok {
		r.mine = r.spy.mine(req)
	}
	return r.ClientStream.SendMsg(m)
}

func (r *spiedRange) RecvMsg(m any) error {
	err := r.ClientStream.RecvMsg(m)
	if !r.mine {
		return err
	}
	switch {
	case err == nil:
		if resp, ok := m.(*pb.RangeStreamResponse); ok {
			if h := resp.GetRangeResponse().GetHeader(); h != nil {
				r.rev = h.Revision
			}
		}
	case err == io.EOF:
		r.spy.mu.Lock()
		r.spy.streams++
		r.spy.lists = append(r.spy.lists, r.rev)
		r.spy.mu.Unlock()
	case status.Code(err) == codes.Unimplemented:
		r.spy.mu.Lock()
		r.spy.refused++
		r.spy.mu.Unlock()
	}
	return err
}

// outage is a connection's way to its server (grpc.WithContextDialer) that
// can be taken down and kept down: down closes every connection it made and
// holds every dial until restore. A proxy's cut is not enough here: gRPC
// dials again at once.
type outage struct {
	target string
	held   chan struct{} // buffered 1: a dial is waiting for restore

	mu    sync.Mutex
	up    chan struct{} // closed while dials go through
	conns []net.Conn
}

func newOutage(target string) *outage {
	o := &outage{target: target, held: make(chan struct{}, 1), up: make(chan struct{})}
	close(o.up)
	return o
}

func (o *outage) dial(ctx context.Context, _ string) (net.Conn, error) {
	for {
		o.mu.Lock()
		up := o.up
		o.mu.Unlock()
		select {
		case <-up:
		default:
			select {
			case o.held <- struct{}{}:
			default:
			}
			select {
			case <-up:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", o.target)
		if err != nil {
			return nil, err
		}
		o.mu.Lock()
		if o.up == up {
			o.conns = append(o.conns, c)
			o.mu.Unlock()
			return c, nil
		}
		o.mu.Unlock()
		c.Close() // taken down while it dialed
	}
}

// down closes every connection, holds every dial from now on, and returns
// how many connections it closed: those gRPC had closed already do not
// count, so that down() >= 1 proves an open connection was cut.
func (o *outage) down() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	select {
	case <-o.up:
		o.up = make(chan struct{})
	default:
	}
	select { // a dial held by an earlier outage
	case <-o.held:
	default:
	}
	n := 0
	for _, c := range o.conns {
		if c.Close() == nil { // an error: it was closed already
			n++
		}
	}
	o.conns = nil
	return n
}

// restore lets dials through again. It is idempotent.
func (o *outage) restore() {
	o.mu.Lock()
	defer o.mu.Unlock()
	select {
	case <-o.up:
	default:
		close(o.up)
	}
}

// awaitHeld waits for a dial the outage holds.
func (o *outage) awaitHeld(t *testing.T) {
	t.Helper()
	select {
	case <-o.held:
	case <-time.After(Wait):
		t.Fatalf("no dial within %v of taking the connection down", Wait)
	}
}

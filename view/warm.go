package view

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"sync/atomic"
	"time"
	"weak"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/etcdwatch/etcdwatch"
	"github.com/etcdwatch/etcdwatch/internal/clock"
)

// warmOptions are the options of warm restarts.
type warmOptions struct {
	keep    bool          // keep values as sent, for Save: WithSave, WithStateFile
	from    io.Reader     // WithRestore's
	fromSet bool          // WithRestore was given
	path    string        // WithStateFile's
	pathSet bool          // WithStateFile was given
	every   time.Duration // WithStateFile's interval
}

// WithSave makes the view keep each value as the server sent it, beside its
// decoded Entry, so that Save can write the state. It costs a second
// copy-on-write map of the keys, about 45 bytes a key, and, unless the
// Decoder keeps the value it is given (DecodeBytes does), the value's bytes
// (BenchmarkSaveMemory). The Decoder of such a view must not modify the
// value it is given.
func WithSave() Option { return func(o *options) { o.warm.keep = true } }

// WithRestore starts the view from a state Save wrote, read from r in New,
// instead of listing its range: the view watches from the saved revision
// on, and New returns once it has applied every change the server made
// since (as fresh as a listing would be). Subscribe(ctx, rev), rev from
// Restored, gets first one Events batch from the saved revision with those
// changes, or with none when the range did not change (and no batch when
// the cluster wrote nothing at all since: there is no revision to report).
// When the server no longer has the changes since the saved revision
// (compacted), the view lists the range, reading the saved state beside
// the listing, and that first batch is a Relisted one: exactly the
// difference from the saved state. Entries are decoded once all are read
// and the checksums hold.
//
// A saved state is refused, and the view lists its range as without the
// option, when it is truncated or corrupted, of another format version,
// another range, or another cluster, or ahead of the cluster's revision (a
// cluster restored from a backup). It is also let go when a call to the
// server that starting from it needs fails for a reason that may pass; the
// view lists as it retries. Either is logged at Warn on the Source's
// logger, counted in Stats.RestoreRefusals, and returned by Restored (a
// *RestoreError); New does not fail for it. Values are decoded again as
// they are loaded. r is read to its end and not closed; ctx does not
// interrupt a Read that blocks.
func WithRestore(r io.Reader) Option {
	return func(o *options) { o.warm.from, o.warm.fromSet = r, true }
}

// WithStateFile is the common case of WithSave and WithRestore: New
// restores the state from the file at path if there is one (none is no
// refusal: the view lists its range), and the view saves its state there
// every interval (0: only at the end) and when it ends (its last Close, or
// its Source's end), each time it moved since the last save. A save writes
// a temporary file of its own beside path (path.*.tmp), syncs it and renames
// it over path, so that a crash leaves the old state or the new one, whole
// (and perhaps that temporary file, which a later save removes once it
// has gone unmodified for a minute); the file keeps the mode of the one it
// replaces, and a new one is 0600. A failed save is logged at
// Warn and counted in Stats.SaveFailures. Each save writes the whole state:
// choose the interval by its size. One file per view state: two views
// saving to one file would overwrite each other.
func WithStateFile(path string, every time.Duration) Option {
	return func(o *options) {
		o.warm.keep, o.warm.path, o.warm.pathSet, o.warm.every = true, path, true, every
	}
}

func (w warmOptions) validate() error {
	switch {
	case w.fromSet && w.from == nil:
		return fmt.Errorf("%w: WithRestore(nil)", etcdwatch.ErrInvalidArgument)
	case w.pathSet && w.path == "":
		return fmt.Errorf("%w: WithStateFile: no path", etcdwatch.ErrInvalidArgument)
	case w.pathSet && w.every < 0:
		return fmt.Errorf("%w: WithStateFile(%q, %v): at least 0", etcdwatch.ErrInvalidArgument, w.path, w.every)
	case w.fromSet && w.pathSet:
		return fmt.Errorf("%w: WithRestore and WithStateFile both give a saved state", etcdwatch.ErrInvalidArgument)
	}
	return nil
}

// warm is a state's part in warm restarts: what it was restored from, and
// what saving needs. Its zero value is ready.
type warm[T any] struct {
	// Counters, for Stats. (The cluster a state came from is its
	// Snapshot's, for saves.)
	refusals     atomic.Uint64
	saveFailures atomic.Uint64

	// Written by the runner before core.ready is closed, read after.
	restored int64 // the saved revision the state started from; 0 if listed
	refused  error // why a saved state given was not used: a *RestoreError

	tried bool // the runner's: the saved state given was looked at
	// saveLoop's: the state it last wrote, weakly, so that it does not
	// keep a state since replaced (its entries and values) alive until
	// the next save; once collected, it cannot be the state published.
	lastSaved weak.Pointer[Snapshot[T]]
}

// Restored returns the revision of the saved state the view started from
// (WithRestore, WithStateFile), or 0 when it listed its range instead; then
// err says why the saved state was refused (a *RestoreError), or is nil
// when there was none to restore. Subscribe(ctx, rev) gets what changed
// since the save first (see WithRestore); after a listing, rev is 0: a Resync.
func (v *View[T]) Restored() (rev int64, err error) {
	return v.core.warm.restored, v.core.warm.refused
}

// restore starts the state from the saved one given, instead of the first
// listing. It reports done when it did (the state is published, watched and
// caught up), or when the check it needs of the server failed (err: a
// listError, to try again later as a listing). It reports false, nil when
// there is nothing to restore, when the saved state was refused, and when
// its history was compacted (the loaded state is then published, and the
// listing that follows reports the difference from it).
//
// Once the header is checked, and the changes since the saved revision
// found still there (else relistSaved), the view watches and asks how far
// to catch up while it reads the entries: etcd answers that only once the
// new watch is synced, which its next 100 ms pass does.
func (r *runner[T]) restore() (bool, error) {
	w := &r.warm
	if w.tried || (!r.opts.warm.fromSet && !r.opts.warm.pathSet) {
		return false, nil
	}
	if path := r.opts.warm.path; path != "" {
		if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
			w.tried = true
			r.log.Info("etcdwatch: view has no saved state yet; listing", "path", path)
			return false, nil
		}
	}
	cluster, current, err := r.list.header(r.ctx)
	if err != nil {
		return true, &readError{"reading the cluster's revision", err}
	}
	w.tried = true
	in, done, err := r.openSaved()
	if err != nil {
		r.refuse(err)
		return false, nil
	}
	defer done()
	sr, h, err := readHeader(in)
	if err == nil {
		err = r.check(h, cluster, current)
	}
	if err != nil {
		r.refuse(err)
		return false, nil
	}
	if h.revision < current {
		// Compacted at the revision after the saved one counts too,
		// though a watch from there is allowed: etcd before the fix of
		// #18089 (3.4.23 among them) leaves a delete at the compaction
		// revision out of what such a watch replays, and the catch-up
		// would wait for ever for the state the server vouches for.
		compacted, err := r.list.compacted(r.ctx, h.revision)
		if err != nil {
			r.refuse(fmt.Errorf("reading whether its history since is compacted: %w", err))
			return false, nil
		}
		if compacted {
			return r.relistSaved(sr, h)
		}
	}
	// From the revision after the saved one; from the saved one itself when
	// the store is still there, not to watch a future revision (see
	// listAndWatch). Its events are skipped.
	watch, err := r.src.Watch(r.ctx, r.req.FromRevision(min(h.revision+1, current)))
	if err != nil {
		if relistRetryable(err) {
			r.refuse(fmt.Errorf("watching from its revision: %w", err))
			return false, nil
		}
		return true, err
	}
	r.watch.Store(watch) // for vouch's progress requests
	ctx, cancel := context.WithCancel(r.ctx)
	defer cancel()
	vouched := make(chan vouching, 1)
	ask := func() {
		r.tasks.Go(func() { // returns with the answer, or once restore has returned; start waits
			g, err := r.vouch(ctx)
			select {
			case vouched <- vouching{g, err}:
			case <-ctx.Done():
			}
		})
	}
	ask()
	ld, err := r.load(sr, h)
	if err != nil {
		cancel()
		watch.Cancel()
		r.refuse(err)
		return false, nil
	}
	w.restored = h.revision
	r.install(ld.ed, ld.raw, h.revision, ld.bytes, cluster, watch)
	r.publishFirst()
	return r.catchUp(h.revision, vouched, ask)
}

// endWarm does what warm restarts need once the state has ended and its
// tasks (saveLoop among them) have returned: WithStateFile's last save, of
// the state the runner published last; and for WithRestore's reader, if
// the runner never got to it (New failed first), a read to its end, as
// WithRestore says.
func (r *runner[T]) endWarm() {
	if r.listed && r.opts.warm.path != "" {
		r.saveFile()
	}
	if r.opts.warm.fromSet && !r.warm.tried {
		io.Copy(io.Discard, r.opts.warm.from)
	}
}

// openSaved opens the saved state given, and returns what closes it (for
// WithRestore's reader, what reads the rest of it).
func (r *runner[T]) openSaved() (io.Reader, func(), error) {
	path := r.opts.warm.path
	if path == "" {
		from := r.opts.warm.from
		return from, func() { io.Copy(io.Discard, from) }, nil // read to its end, as WithRestore says, also when refused early
	}
	f, err := os.Open(path) // gone since restore looked: refused as any other failure to read it
	if err != nil {
		return nil, nil, err
	}
	return f, func() { f.Close() }, nil
}

// check compares a saved state's header with the view's range and the
// server's cluster and revision.
func (r *runner[T]) check(h stateHeader, cluster uint64, current int64) error {
	switch {
	case !bytes.Equal(h.key, r.req.Key) || !bytes.Equal(h.end, r.req.End):
		return fmt.Errorf("%w: saved %s, the view's %s", ErrSavedRange,
			etcdwatch.Request{Key: h.key, End: h.end}, etcdwatch.Request{Key: r.req.Key, End: r.req.End})
	case h.cluster != cluster:
		return fmt.Errorf("%w: saved from cluster %x, the Source reaches cluster %x", ErrSavedCluster, h.cluster, cluster)
	case h.revision > current:
		return fmt.Errorf("%w: saved at revision %d, the cluster is at %d (restored from a backup?)", ErrSavedAhead, h.revision, current)
	}
	return nil
}

// loaded is a saved state read, checked and decoded, not yet published.
type loaded[T any] struct {
	ed    *tableEditor[T]
	raw   raws
	bytes int64
}

// load reads the entries after h and decodes them, once they are all read
// and the checksum holds. The slice grows with the entries read, not
// with h.count: a file that claims more than it holds is refused having
// allocated about what it held.
func (r *runner[T]) load(sr *stateReader, h stateHeader) (*loaded[T], error) {
	entries := make([]savedEntry, 0, min(h.count, 1<<10))
	if err := sr.readEntries(h, false, func(e savedEntry) bool {
		entries = append(entries, e)
		return true
	}); err != nil {
		return nil, err
	}
	ld := &loaded[T]{ed: table[T]{}.Edit(), raw: editRaws(r.opts, &Snapshot[T]{})}
	for i := range entries {
		e := &entries[i]
		en := r.entry(e.key, e.kv[:len(e.key):len(e.key)], e.value, e.create, e.mod, e.version, e.lease)
		ld.ed.Append(&en)
		ld.raw.add(en.Key, e.value)
		ld.bytes += int64(en.size)
		entries[i] = savedEntry{} // let the records go as the entries are made
	}
	return ld, nil
}

// refuse records, logs and counts why the saved state was not used: it
// was refused, or the server failed the view as it started from it.
func (r *runner[T]) refuse(err error) {
	re := &RestoreError{Path: r.opts.warm.path, Err: err}
	r.warm.refused = re
	r.warm.refusals.Add(1)
	r.log.Warn("etcdwatch: view did not use its saved state; listing instead", "err", re)
}

// catchUp applies the watch's responses to the restored state until it has
// every change up to a revision the server vouches for (vouch, whose
// answer comes on vouched), and publishes them as one batch from the saved
// revision (sinceSave). It reports false, nil when the watch was
// compacted: the state at the saved revision stays published, and a
// listing follows. When vouch gave up (a refused read), it ends the watch
// and returns the read's error, as a refused listing would. A goal not
// reached within progressWait is asked for again (ask), as Sync's reach
// does: the watch, unread while the state loaded, may have been paused
// meanwhile, and a paused watch is not covered by the answer, whose
// bookmark then never comes. Every goal vouched for stays one: the first
// reached ends the catch-up, so that asking again never moves the end
// further off under steady writes.
func (r *runner[T]) catchUp(saved int64, vouched <-chan vouching, ask func()) (bool, error) {
	var changes []Change[T]
	var goals []goal
	var again clock.Stoppable // runs while no goal is reached: a goal's bookmark can be lost (a paused watch is not covered)
	defer again.Stop()
	var g *goal // the first goal reached
	for g == nil {
		select {
		case <-again.C:
			again.Stop()
			ask() // the answer is for the watch as it is now
		case resp, ok := <-r.w.Responses():
			if !ok {
				return r.catchUpEnded(saved)
			}
			changes = append(changes, r.apply(resp)...)
		case v := <-vouched:
			if v.err != nil {
				r.w.Cancel()
				return true, &readError{"reading how far to catch up", v.err}
			}
			goals = append(goals, v.goal)
			again.Reset(clock.Real, progressWait)
		case <-r.ctx.Done():
			r.w.Cancel()
			return true, context.Cause(r.ctx)
		}
		g = reachedOf(goals, r.rev, r.ed.Len())
	}
	if r.w.Err() != nil { // its end and the goal both came; select took the goal
		return r.catchUpEnded(saved)
	}
	// The state now equals the range's at g.rev: move there, so that the
	// batch says so (only a key created and deleted again in between,
	// still to come from the watch, is then skipped).
	r.rev = max(r.rev, g.rev)
	r.log.Info("etcdwatch: view restored its saved state", "path", r.opts.warm.path, "saved", saved, "revision", r.rev, "changes", len(changes), "keys", r.ed.Len())
	if r.rev == saved { // the cluster has written nothing since: no revision to speak of
		if r.opts.warm.path != "" {
			r.warm.lastSaved = weak.Make(r.snap.Load()) // the state published is the file's: not saved again until it moves (saveLoop starts after this)
		}
		return true, nil
	}
	r.publish(sinceSave(saved, r.rev, changes))
	r.from = r.rev
	return true, nil
}

// sinceSave is the first batch of a restored view: the changes since the
// saved revision, or none. Issue 18 makes views send such change-less
// Events batches as progress; this is the one place that decides their
// form for restores.
func sinceSave[T any](saved, rev int64, changes []Change[T]) Batch[T] {
	return Batch[T]{Kind: Events, From: saved, Revision: rev, Changes: changes}
}

// catchUpEnded decides what the end of the watch during catchUp means, as
// watchEnded does: compacted, the loaded state stays published and a
// listing reports the difference from it; the changes applied since are
// dropped (the listing starts from the published state).
func (r *runner[T]) catchUpEnded(saved int64) (bool, error) {
	err := r.w.Err()
	if !errors.Is(err, etcdwatch.ErrCompacted) {
		return true, err
	}
	r.from = saved
	r.log.Info("etcdwatch: view's saved state is compacted; listing again", "saved", saved, "err", err)
	return false, nil
}

// goal is a revision the server vouches for: the state has caught up when
// it has applied everything up to rev, or, after a read of the range
// (fresh set), when it holds the read's count of keys with none newer than
// its revision.
type goal struct {
	rev   int64
	fresh *freshness
}

// reachedOf returns the first of goals that a state at rev, with keys
// keys, has reached; nil for none.
func reachedOf(goals []goal, rev int64, keys int) *goal {
	for i := range goals {
		if goals[i].reached(rev, keys) {
			return &goals[i]
		}
	}
	return nil
}

func (g *goal) reached(rev int64, keys int) bool {
	if rev >= g.rev {
		return true
	}
	return g.fresh != nil && g.fresh.seenBy(rev, keys)
}

// vouching is what vouch found: a goal, or why it gave up.
type vouching struct {
	goal
	err error
}

// vouch asks the server what revision the view must reach, as Sync does:
// a progress answer, or where there is none safe or in time, a read of the
// range's freshness. It tries again as Sync does (retrying): while the read
// fails for a reason that may pass, until ctx ends.
func (c *core[T]) vouch(ctx context.Context) (goal, error) {
	var g goal
	err := c.retrying(ctx, func(ctx context.Context) error {
		pctx, cancel := context.WithTimeout(ctx, progressWait)
		rev, err := c.progress(pctx)
		cancel()
		if err == nil {
			g = goal{rev: rev}
			return nil
		}
		f, err := c.reads.fresh(ctx)
		if err == nil {
			g = goal{rev: f.rev, fresh: &f}
		}
		return err
	})
	return g, err
}

// header reads the cluster ID and current revision of the server, with one
// linearizable Range of the range's first key, counted, not read.
func (l *lister) header(ctx context.Context) (cluster uint64, rev int64, err error) {
	r, err := l.kv.Range(ctx, &pb.RangeRequest{Key: l.key, CountOnly: true}, l.call...)
	if err != nil {
		return 0, 0, err
	}
	return r.GetHeader().GetClusterId(), r.GetHeader().GetRevision(), nil
}

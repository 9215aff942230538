package view

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/etcdwatch/etcdwatch"
	"github.com/etcdwatch/etcdwatch/internal/clock"
	"github.com/etcdwatch/etcdwatch/internal/rpcerr"
)

// runner is the state's goroutine, started by New (core.start), and what
// it alone owns: the listing, the editor of the next state, where the view
// stands, and the watch it follows. It reads the core it embeds, and writes
// there only by publishing (publish), counting, and closing ready.
type runner[T any] struct {
	*core[T]
	list    *lister          // the range's listings
	ed      *tableEditor[T]  // the state being applied to, published as a Snapshot
	rev     int64            // the revision ed holds
	from    int64            // Revision of the last batch kept, or of the first listing: the next batch's From
	bytes   int64            // of ed's keys and values as stored
	w       *etcdwatch.Watch // the watch since the last listing
	raw     raws             // the values of ed as sent, for Save (WithSave; save.go)
	cluster uint64           // the ID of the cluster ed came from, for Save
	listed  bool             // the first listing is published and watched: core.ready is closed
	listing uint64           // counts installs (listings, loads): the published Snapshots' listing
}

// start runs the state until it ends, then ends its tasks and tells every
// View, reader, waiter and subscriber why.
func (c *core[T]) start() {
	r := newRunner(c)
	err := r.run()
	c.cancel(err)
	c.tasks.Wait()
	r.endWarm()
	c.finish(err, r.listed)
}

func newRunner[T any](c *core[T]) *runner[T] {
	return &runner[T]{core: c, list: newLister(c.src, c.req.Key, c.req.End, c.opts.pageSize, c.opts.pageBytes)}
}

// run lists and follows the range until the state ends, and returns why.
func (r *runner[T]) run() error {
	for {
		if err := r.relist(); err != nil {
			return err
		}
		if !r.listed {
			r.listed = true
			close(r.ready)
			if r.opts.integrity > 0 {
				r.tasks.Go(r.checkLoop) // returns when ctx ends, which start does before it waits
			}
			r.startSaving() // WithStateFile (save.go)
		}
		if err := r.follow(); err != nil {
			return err
		}
	}
}

// relist lists the range and watches it from the revision listed, trying
// again after the Source's RetryDelay while the listing fails for a reason
// that may pass.
func (r *runner[T]) relist() error {
	authRetried := false
	for failures := 1; ; failures++ {
		err := r.listAndWatch()
		if err == nil {
			return nil
		}
		if cause := context.Cause(r.ctx); cause != nil {
			return cause
		}
		if retryAuth(err, &authRetried) {
			continue
		}
		if !relistRetryable(err) {
			return err
		}
		delay := r.src.RetryDelay(failures)
		r.log.Info("etcdwatch: view listing failed; trying again", "err", err, "in", delay)
		if err := clock.Sleep(r.ctx, clock.Real, delay); err != nil {
			return err
		}
	}
}

// retryAuth reports whether to try a refused call once more at once: the
// server refused its token (expired, say), which package dial then drops,
// so that the next call authenticates afresh, as a Stream's watches do.
// Once per series of tries; a second refusal is final.
func retryAuth(err error, retried *bool) bool {
	if *retried || status.Code(err) != codes.Unauthenticated {
		return false
	}
	*retried = true
	return true
}

// relistRetryable reports whether listAndWatch may succeed if tried again:
// after a listing that failed for a reason that may pass, or a watch that
// the Source could not confirm in time (etcdwatch.ErrCreateTimeout: its
// stream down meanwhile). The watch's other errors are final: a refusal,
// the Source closed or failed for good.
func relistRetryable(err error) bool {
	var re *readError
	if errors.As(err, &re) {
		return listRetryable(re.err)
	}
	return errors.Is(err, etcdwatch.ErrCreateTimeout)
}

// readError is a failed read of the range (a listing, which relist may try
// again, or Sync's). A refusal (a permission, credentials) also matches
// the sentinel a Watch refused for the same cause would: it unwraps to the
// gRPC error and to an *etcdwatch.ServerError with the server's reason.
type readError struct {
	what string
	err  error
}

func (e *readError) Error() string { return "etcdwatch/view: " + e.what + ": " + e.err.Error() }

func (e *readError) Unwrap() []error {
	if s, ok := status.FromError(e.err); ok && rpcerr.Final(e.err) {
		return []error{e.err, &etcdwatch.ServerError{Reason: s.Message()}}
	}
	return []error{e.err}
}

// listAndWatch lists the range at a new revision R, comparing it with the
// published state as it goes, watches from R, and publishes the new state
// with the difference (none for the first listing).
func (r *runner[T]) listAndWatch() error {
	if done, err := r.restore(); done || err != nil { // the saved state instead of a listing (WithRestore; warm.go)
		return err
	}
	base := r.snap.Load()
	first := base == nil
	if first {
		base = &Snapshot[T]{}
	}
	d := newDiffer(r.core, base, !first)
	defer d.stop()
	rev, err := r.list.list(r.ctx, listing{}, d.take)
	if err != nil {
		return &readError{"listing the range", err}
	}
	d.finish(rev)
	// From rev, not rev+1: a watch from the revision after the store's
	// is one the server deems waiting for a future revision, and etcd 3.5+
	// then answers no progress request on the stream until the next write
	// anywhere. Revision rev's events come again, and are skipped.
	w, err := r.src.Watch(r.ctx, r.req.FromRevision(rev))
	if err != nil {
		return err
	}
	r.install(d.ed, d.raw, rev, d.bytes, r.list.cluster, w)
	r.stats.decodeErrors.Add(d.refused)
	if first {
		r.publishFirst()
		return nil
	}
	r.stats.relists.Add(1)
	r.log.Info("etcdwatch: view listed again", "from", base.rev, "revision", rev, "changes", len(d.changes), "keys", d.ed.Len())
	r.publish(Batch[T]{Kind: Relisted, From: r.from, Revision: rev, Changes: d.changes, same: base.rev})
	r.from = rev
	return nil
}

// follow applies the watch's responses until the watch cannot go on
// (nil: list again) or the state ends (the reason). Applied steps are
// published when the pacer says.
func (r *runner[T]) follow() error {
	tick, stopTick := ticker(r.opts.bookmark)
	defer stopTick()
	held := newUnpublished[T]()
	defer held.stop()
	flush := func() { r.publish(held.take(time.Now())...) }
	heard := false // a response since the last tick
	for {
		select {
		case resp, ok := <-r.w.Responses():
			if !ok {
				flush()
				return r.watchEnded()
			}
			heard = true
			if r.hold(held, r.apply(resp)) {
				flush()
			}
		case <-held.due.C:
			flush()
		case <-held.later.C:
			if r.rev > r.from && held.moved(r.from, r.rev, time.Now()) {
				r.from = r.rev
				flush()
			}
		case <-tick:
			if !heard {
				r.askProgress()
			}
			heard = false
		case f := <-r.moves:
			if r.move(f) {
				r.hold(held, nil)
				flush() // at once: a Sync waits for it, whatever the pacer says
			}
		case listing := <-r.repair:
			if listing != r.listing {
				break // a check of a state listed before this one: already repaired
			}
			flush() // the listing compares with the published state
			r.w.Cancel()
			return nil
		case <-r.ctx.Done():
			flush() // what was applied is the state the view ends with, and saves (endWarm)
			r.w.Cancel()
			return context.Cause(r.ctx)
		}
	}
}

// ticker returns the channel of a ticker every d, and its stop; for d 0, a
// channel that never fires.
func ticker(d time.Duration) (<-chan time.Time, func()) {
	if d <= 0 {
		return nil, func() {}
	}
	t := time.NewTicker(d)
	return t.C, t.Stop
}

// watchEnded decides what the end of the watch means: a compacted history
// is listed again; anything else ends the state.
func (r *runner[T]) watchEnded() error {
	err := r.w.Err()
	if errors.Is(err, etcdwatch.ErrCompacted) {
		r.log.Info("etcdwatch: view's history compacted; listing again", "revision", r.rev, "err", err)
		return nil
	}
	return err
}

// move moves the view to the revision of the read f, if the view is
// behind it and its state is the one f saw (see seen): nothing of the
// range changed in between. It reports whether it moved.
func (r *runner[T]) move(f freshness) bool {
	if r.rev >= f.rev || !f.seenBy(r.rev, r.ed.Len()) {
		return false
	}
	r.rev = f.rev
	return true
}

// hold holds the changes the view has just applied, up to its revision,
// for publication, as a step from the last held or published one; or, for
// a view that moved on without changes, a progress batch, at most every
// progressGap. It reports whether to publish now: when the pacer says, or
// at once for a view that moved without changes (a bookmark, which a Sync
// or WaitForRevision may be waiting for, and which comes at the rate
// progress is asked for, not at the rate of writes).
func (r *runner[T]) hold(held *unpublished[T], changes []Change[T]) bool {
	now := time.Now()
	if len(changes) == 0 {
		if r.rev > r.from && held.moved(r.from, r.rev, now) {
			r.from = r.rev
		}
		return true
	}
	held.add(Batch[T]{Kind: Events, From: r.from, Revision: r.rev, Changes: changes})
	r.from = r.rev
	return held.paced(now)
}

// apply applies one response's events to the editor, skipping revisions
// already applied, so that a replay is harmless, and returns the changes.
func (r *runner[T]) apply(resp etcdwatch.Response) []Change[T] {
	var changes []Change[T]
	var slab entrySlab[T]
	for i := range resp.Events {
		ev := &resp.Events[i]
		if ev.ModRevision <= r.rev {
			continue
		}
		if changes == nil {
			changes = make([]Change[T], 0, len(resp.Events)-i)
		}
		slab.left = len(resp.Events) - i
		switch ev.Type {
		case etcdwatch.Put:
			changes = r.put(ev, changes, &slab)
		case etcdwatch.Delete:
			changes = r.del(ev, changes, &slab)
		}
	}
	r.rev = max(r.rev, resp.Revision)
	return changes
}

func (r *runner[T]) put(ev *etcdwatch.Event, changes []Change[T], slab *entrySlab[T]) []Change[T] {
	kv := &ev.KeyValue
	e := slab.keep(r.entry("", kv.Key, kv.Value, kv.CreateRevision, kv.ModRevision, kv.Version, kv.Lease))
	old, replaced := r.ed.Put(kv.Key, e) // sets e.Key: the state's own string when it has the key
	r.raw.set(e.Key, kv.Value)
	ch := Change[T]{Kind: Created, Key: e.Key, Revision: kv.ModRevision, Entry: e}
	if replaced {
		ch.Kind, ch.Prev = Updated, slab.keep(old)
		r.bytes -= int64(old.size)
	}
	r.bytes += int64(e.size)
	return append(changes, ch)
}

func (r *runner[T]) del(ev *etcdwatch.Event, changes []Change[T], slab *entrySlab[T]) []Change[T] {
	old, ok := r.ed.Delete(string(ev.Key))
	if !ok {
		return changes
	}
	r.raw.delete(old.Key)
	r.bytes -= int64(old.size)
	prev := slab.keep(old)
	return append(changes, Change[T]{Kind: Deleted, Key: prev.Key, Revision: ev.ModRevision, Prev: prev})
}

// entrySlab hands out the Entries of a response's changes from blocks, so
// that they take an allocation or two a response rather than one each.
// A block is sized for left more events, each with an Entry and a Prev.
// Owned by apply.
type entrySlab[T any] struct {
	free []Entry[T]
	left int // events of the response not yet applied, the current one included
}

// keep returns a pointer to a copy of e, which nobody modifies after.
func (s *entrySlab[T]) keep(e Entry[T]) *Entry[T] {
	if len(s.free) == 0 {
		s.free = make([]Entry[T], 2*max(s.left, 1))
	}
	p := &s.free[0]
	*p = e
	s.free = s.free[1:]
	return p
}

// install makes a state listed or loaded at rev, from cluster, the
// runner's, followed from there by w. The runner publishes it next:
// publishFirst, or publish with the difference from the state before.
func (r *runner[T]) install(ed *tableEditor[T], raw raws, rev, bytes int64, cluster uint64, w *etcdwatch.Watch) {
	r.ed, r.raw, r.rev, r.bytes, r.cluster, r.w = ed, raw, rev, bytes, cluster, w
	r.listing++
	r.watch.Store(w)
}

// publishFirst publishes the installed state as the first one of its
// history: no batch leads to it, and subscribers start from its revision.
func (r *runner[T]) publishFirst() {
	r.hist.floor, r.from = r.rev, r.rev
	r.publish()
}

// publish makes the editor's state the view's, with bs as the steps to it.
func (r *runner[T]) publish(bs ...Batch[T]) {
	if cur := r.snap.Load(); cur != nil && cur.rev == r.rev {
		if len(bs) == 0 {
			return // nothing moved
		}
		if cur.listing == r.listing {
			// The steps alone (a held progress batch): the state is the one
			// published, which a listing changes only with its revision.
			// Keeping the Snapshot keeps saveFile from writing it again.
			r.hist.publish(&r.snap, cur, bs)
			return
		}
	}
	r.hist.publish(&r.snap, &Snapshot[T]{m: r.ed.Map(), rev: r.rev, bytes: r.bytes, raw: r.raw.freeze(), cluster: r.cluster, listing: r.listing}, bs)
}

package view

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/etcdwatch/etcdwatch"
	"github.com/etcdwatch/etcdwatch/internal/clock"
	"github.com/etcdwatch/etcdwatch/internal/cow"
)

// core is the state that Views of one range share, and the goroutine
// that keeps it: run lists the range, watches it, applies the watch's
// responses and lists again when the watch cannot go on. Readers take the
// published Snapshot, which never changes; subscribers read the history.
type core[T any] struct {
	src    Source
	req    etcdwatch.Request // the range, watched with bookmarks and fragments
	decode Decoder[T]
	opts   options
	log    *slog.Logger
	list   *lister // run's
	reads  *lister // the integrity check's and Sync's

	snap  atomic.Pointer[Snapshot[T]] // the published state; stored under hist.mu
	hist  history[T]
	stats counters

	ctx    context.Context // ends the state: the last View closed, the Source's Context ended, or refused
	cancel context.CancelCauseFunc
	ready  chan struct{} // closed once the first state is published and watched, or when the state ended first
	done   chan struct{} // closed once every goroutine of the state has returned
	err    error         // why the state ended; written before done is closed
	repair chan struct{} // buffered 1: the integrity check asks run to list again
	tasks  sync.WaitGroup
	asking atomic.Bool // a bookmark request is in flight
	noAsk  atomic.Bool // the server's progress answers are unsafe: never ask

	mu    sync.Mutex
	views map[*View[T]]struct{} // the Views of this state; nil once it has ended. Guarded by mu

	// Owned by run.
	ed      *cow.Editor[*Entry[T]]
	rev     int64
	from    int64 // Revision of the last batch kept, or of the first listing: the next batch's From
	bytes   int64
	w       *etcdwatch.Watch
	isReady bool
}

func newCore[T any](src Source, r etcdwatch.Request, decode Decoder[T], o options) *core[T] {
	// The state's context ends with the Source's, or when the last View
	// goes (ErrClosed).
	ctx, cancel := context.WithCancelCause(src.Context())
	c := &core[T]{
		src:    src,
		req:    etcdwatch.Request{Key: r.Key, End: r.End, ProgressNotify: true, Fragment: true},
		decode: decode,
		opts:   o,
		log:    src.Logger().With("view", r.String()),
		list:   newLister(src, r.Key, r.End, o.pageSize),
		reads:  newLister(src, r.Key, r.End, o.pageSize),
		ctx:    ctx,
		cancel: cancel,
		ready:  make(chan struct{}),
		done:   make(chan struct{}),
		repair: make(chan struct{}, 1),
		views:  make(map[*View[T]]struct{}),
	}
	c.hist.init(int64(o.historyBytes))
	return c
}

// join returns a new View of the state, or nil if from (nil for the first
// View) is no View of it any more: closed, or the state has ended.
func (c *core[T]) join(from *View[T]) *View[T] {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.views[from]; (from != nil && !ok) || c.views == nil {
		return nil
	}
	v := &View[T]{core: c, done: make(chan struct{})}
	v.ctx, v.cancel = context.WithCancelCause(c.ctx)
	c.views[v] = struct{}{}
	return v
}

// leave forgets v, whose ctx has ended, and closes v.done. The last View to
// leave ends the state and first waits for its goroutines. A View the
// state's end has already taken is left to finish, which closes its done.
func (c *core[T]) leave(v *View[T]) {
	c.mu.Lock()
	_, held := c.views[v]
	delete(c.views, v)
	last := held && len(c.views) == 0
	c.mu.Unlock()
	if !held {
		return
	}
	if last {
		c.cancel(ErrClosed)
		<-c.done
	}
	close(v.done)
}

// start runs the state until it ends, then ends its tasks and tells every
// View, reader, waiter and subscriber why.
func (c *core[T]) start() {
	err := c.run()
	c.cancel(err)
	c.tasks.Wait()
	c.finish(err)
}

// finish records why the state ended, wakes its waiters and subscribers,
// and ends every View still of it: their ctx ended with the state's.
func (c *core[T]) finish(err error) {
	c.err = err
	c.hist.end()
	close(c.done)
	if !c.isReady {
		close(c.ready)
	}
	c.mu.Lock()
	views := c.views
	c.views = nil
	c.mu.Unlock()
	for v := range views {
		close(v.done)
	}
}

// failed returns why the state ended before it was first published; nil
// once it was. Call after ready is closed.
func (c *core[T]) failed() error {
	if c.snap.Load() != nil {
		return nil
	}
	<-c.done
	return c.err
}

// run lists and follows the range until the state ends, and returns why.
func (c *core[T]) run() error {
	for {
		if err := c.relist(); err != nil {
			return err
		}
		if !c.isReady {
			c.isReady = true
			close(c.ready)
			if c.opts.integrity > 0 {
				c.tasks.Go(c.checkLoop) // returns when ctx ends, which start does before it waits
			}
		}
		if err := c.follow(); err != nil {
			return err
		}
	}
}

// relist lists the range and watches it from the revision listed, trying
// again after the Source's RetryDelay while the listing fails for a reason
// that may pass.
func (c *core[T]) relist() error {
	for failures := 1; ; failures++ {
		err := c.listAndWatch()
		if err == nil {
			return nil
		}
		if cause := context.Cause(c.ctx); cause != nil {
			return cause
		}
		if !relistRetryable(err) {
			return err
		}
		delay := c.src.RetryDelay(failures)
		c.log.Info("etcdwatch: view listing failed; trying again", "err", err, "in", delay)
		if err := clock.Sleep(c.ctx, clock.Real, delay); err != nil {
			return err
		}
	}
}

// relistRetryable reports whether listAndWatch may succeed if tried again:
// after a listing that failed for a reason that may pass, or a watch that
// the Source could not confirm in time (etcdwatch.ErrCreateTimeout: its
// stream down meanwhile). The watch's other errors are final: a refusal,
// the Source closed or failed for good.
func relistRetryable(err error) bool {
	var le *listError
	if errors.As(err, &le) {
		return listRetryable(le.err)
	}
	return errors.Is(err, etcdwatch.ErrCreateTimeout)
}

// listError is a failed listing, which relist may try again.
type listError struct{ err error }

func (e *listError) Error() string { return "etcdwatch/view: listing the range: " + e.err.Error() }
func (e *listError) Unwrap() error { return e.err }

// listAndWatch lists the range at a new revision R, comparing it with the
// published state as it goes, watches from R, and publishes the new state
// with the difference (none for the first listing).
func (c *core[T]) listAndWatch() error {
	base := c.snap.Load()
	first := base == nil
	if first {
		base = &Snapshot[T]{}
	}
	d := newDiffer(c, base, !first)
	defer d.stop()
	rev, err := c.list.list(c.ctx, listing{}, d.take)
	if err != nil {
		return &listError{err}
	}
	d.finish(rev)
	// From rev, not rev+1: a watch from the revision after the store's
	// is one the server deems waiting for a future revision, and etcd 3.5+
	// then answers no progress request on the stream until the next write
	// anywhere. Revision rev's events come again, and are skipped.
	w, err := c.src.Watch(c.ctx, c.req.FromRevision(rev))
	if err != nil {
		return err
	}
	c.ed, c.rev, c.bytes, c.w = d.ed, rev, d.bytes, w
	if first {
		c.hist.floor, c.from = rev, rev
		c.publish()
		return nil
	}
	c.stats.relists.Add(1)
	c.log.Info("etcdwatch: view listed again", "from", base.rev, "revision", rev, "changes", len(d.changes), "keys", d.ed.Len())
	c.publish(Batch[T]{Kind: Relisted, From: c.from, Revision: rev, Changes: d.changes})
	c.from = rev
	return nil
}

// follow applies the watch's responses until the watch cannot go on
// (nil: list again) or the state ends (the reason). Applied steps are
// published when the pacer says.
func (c *core[T]) follow() error {
	var tick <-chan time.Time
	if c.opts.bookmark > 0 {
		t := time.NewTicker(c.opts.bookmark)
		defer t.Stop()
		tick = t.C
	}
	held := newUnpublished[T]()
	defer held.stop()
	flush := func() { c.publish(held.take(time.Now())...) }
	heard := false
	for {
		select {
		case r, ok := <-c.w.Responses():
			if !ok {
				flush()
				return c.watchEnded()
			}
			heard = true
			if held.add(c.apply(r), time.Now()) {
				flush()
			}
		case <-held.due:
			flush()
		case <-tick:
			if !heard {
				c.askProgress()
			}
			heard = false
		case <-c.repair:
			flush() // the listing compares with the published state
			c.w.Cancel()
			return nil
		case <-c.ctx.Done():
			c.w.Cancel()
			return context.Cause(c.ctx)
		}
	}
}

// unpublished is what follow has applied and not yet published: the steps,
// and the timer that says when the pacer wants them out. Owned by follow.
type unpublished[T any] struct {
	pace  pacer
	steps []Batch[T]
	timer *time.Timer
	due   <-chan time.Time // the timer's channel while steps are held; nil otherwise
}

func newUnpublished[T any]() *unpublished[T] {
	u := &unpublished[T]{pace: pacer{gap: publishGap}, timer: time.NewTimer(time.Hour)}
	u.timer.Stop()
	return u
}

// add holds the step b applied at now, and reports whether to publish now;
// if not, the timer is set for when.
func (u *unpublished[T]) add(b Batch[T], now time.Time) bool {
	u.steps = holdStep(u.steps, b)
	wait := u.pace.applied(now)
	if wait > 0 && u.due == nil {
		u.timer.Reset(wait)
		u.due = u.timer.C
	}
	return wait == 0
}

// take returns the steps held, to be published at now, and forgets them.
func (u *unpublished[T]) take(now time.Time) []Batch[T] {
	steps := u.steps
	u.steps = nil // the history keeps the published ones
	u.pace.published(now)
	u.stop()
	return steps
}

func (u *unpublished[T]) stop() {
	u.timer.Stop()
	u.due = nil
}

// watchEnded decides what the end of the watch means: a compacted history
// is listed again; anything else ends the state.
func (c *core[T]) watchEnded() error {
	err := c.w.Err()
	if errors.Is(err, etcdwatch.ErrCompacted) {
		c.log.Info("etcdwatch: view's history compacted; listing again", "revision", c.rev, "err", err)
		return nil
	}
	return err
}

// holdStep adds b to the batches held for publication, joined to the last one
// when both are small, as a Watch joins small responses: a subscriber then
// takes a burst of single events in a few handovers rather than one each.
func holdStep[T any](held []Batch[T], b Batch[T]) []Batch[T] {
	switch n := len(held); {
	case len(b.Changes) == 0:
		return held
	case n > 0 && len(held[n-1].Changes)+len(b.Changes) <= etcdwatch.JoinLimit:
		last := &held[n-1]
		last.Changes = append(last.Changes, b.Changes...)
		last.Revision = b.Revision
		return held
	}
	return append(held, b)
}

// publishGap and maxHeld bound how long, and how many responses, the
// pacer holds applied responses before they are published.
const (
	publishGap = time.Millisecond
	maxHeld    = 64
)

// pacer decides when a view publishes what it applied. Each publication
// freezes the state's tree, so the next writes copy the nodes they touch: a
// publication per response would copy most of the tree under a steady flow.
// So a response after a quiet spell (gap since the last publication) is
// published at once, and while responses keep coming they are held until
// gap has passed since the last publication or maxHeld are waiting. Readers
// then see a state at most gap old; WaitForRevision, Sync and subscribers
// see it when it is published. Owned by follow.
type pacer struct {
	gap  time.Duration
	last time.Time // of the last publication
	held int       // responses applied since
}

// applied counts a response applied at now and returns how long it may
// wait to be published: 0 for at once.
func (p *pacer) applied(now time.Time) time.Duration {
	p.held++
	since := now.Sub(p.last)
	if p.held >= maxHeld || since >= p.gap {
		return 0
	}
	return p.gap - since
}

// published records a publication at now.
func (p *pacer) published(now time.Time) { p.last, p.held = now, 0 }

// apply applies one response's events to the editor, skipping revisions
// already applied, so that a replay is harmless, and returns the step.
func (c *core[T]) apply(r etcdwatch.Response) Batch[T] {
	b := Batch[T]{Kind: Events, From: c.from}
	for i := range r.Events {
		ev := &r.Events[i]
		if ev.ModRevision <= c.rev {
			continue
		}
		if b.Changes == nil {
			b.Changes = make([]Change[T], 0, len(r.Events)-i)
		}
		switch ev.Type {
		case etcdwatch.Put:
			c.put(ev, &b)
		case etcdwatch.Delete:
			c.del(ev, &b)
		}
	}
	c.rev = max(c.rev, r.Revision)
	b.Revision = c.rev
	if len(b.Changes) > 0 {
		c.from = b.Revision
	}
	return b
}

func (c *core[T]) put(ev *etcdwatch.Event, b *Batch[T]) {
	kv := &ev.KeyValue
	key := string(kv.Key)
	e := c.entry(key, kv.Key, kv.Value, kv.CreateRevision, kv.ModRevision, kv.Version, kv.Lease)
	old, replaced := c.ed.Set(e.Key, e)
	ch := Change[T]{Kind: Created, Key: e.Key, Revision: kv.ModRevision, Entry: e}
	if replaced {
		ch.Kind, ch.Prev = Updated, old
		c.bytes -= int64(old.size)
	}
	c.bytes += int64(e.size)
	b.Changes = append(b.Changes, ch)
}

func (c *core[T]) del(ev *etcdwatch.Event, b *Batch[T]) {
	old, ok := c.ed.Delete(string(ev.Key))
	if !ok {
		return
	}
	c.bytes -= int64(old.size)
	b.Changes = append(b.Changes, Change[T]{Kind: Deleted, Key: old.Key, Revision: ev.ModRevision, Prev: old})
}

// entry decodes a value into a new Entry; a decode error is kept in it.
func (c *core[T]) entry(key string, k, v []byte, create, mod, version, lease int64) *Entry[T] {
	val, err := c.decode(k, v)
	if err != nil {
		c.stats.decodeErrors.Add(1)
		c.log.Debug("etcdwatch: view cannot decode a value", "key", key, "revision", mod, "err", err)
		var zero T
		val = zero
	}
	return &Entry[T]{
		Key: key, Value: val, Err: err,
		CreateRevision: create, ModRevision: mod, Version: version, Lease: lease,
		size: len(k) + len(v),
	}
}

// publish makes the editor's state the view's, with bs as the steps to it.
func (c *core[T]) publish(bs ...Batch[T]) {
	if cur := c.snap.Load(); cur != nil && cur.rev == c.rev && len(bs) == 0 {
		return // nothing moved
	}
	c.hist.publish(&c.snap, &Snapshot[T]{m: c.ed.Map(), rev: c.rev, bytes: c.bytes}, bs)
}

// askProgress asks the Source for a bookmark in the background, one request
// at a time, so that an idle range's revision keeps up with the store.
func (c *core[T]) askProgress() {
	if c.noAsk.Load() || !c.asking.CompareAndSwap(false, true) {
		return
	}
	c.tasks.Go(func() { // returns when answered, refused, or after one interval; start waits
		defer c.asking.Store(false)
		ctx, cancel := context.WithTimeout(c.ctx, max(c.opts.bookmark, time.Second))
		defer cancel()
		if _, err := c.src.RequestProgress(ctx); errors.Is(err, etcdwatch.ErrProgressUnsupported) {
			c.noAsk.Store(true) // the server's own notifications will do
		}
	})
}

package view

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"sync"
	"sync/atomic"

	"github.com/etcdwatch/etcdwatch"
)

// View is a local copy of a range of keys, kept current by a watch on a
// Source: a consistent list of the range at a revision R, then the range's
// changes from R+1, applied a whole revision at a time. Readers always see
// the state at one revision. The view survives compaction: when its watch
// cannot go on, it lists the range again and reports the difference
// (Relisted batches). Its methods are safe for concurrent use. The zero
// View is not usable: New and Share make them.
//
// Once a View has ended (Close, its Source's end, a refusal), Get, All,
// Len, Revision and Snapshot go on answering from the last state it
// published, which no longer changes; check Err (or Done) to tell.
//
// Share returns another View of the same state and server-side watch; the
// state lives until every View of it is closed, its Source's Context ends,
// or the server refuses it for good.
type View[T any] struct {
	core *core[T] // set by New or Share, then read only
	// ctx ends when this View ends: at its Close (cause ErrClosed), or with
	// its state (cause why the state ended). It bounds the View's waits.
	ctx    context.Context
	cancel context.CancelCauseFunc
	// done is closed once ctx has ended and no goroutine works for this
	// View any more: by core.leave at Close, or by core.finish when the
	// state ends. It is this View's hold on the state (core.join).
	done chan struct{}
	once sync.Once // Close's

	mu      sync.Mutex
	subs    map[*Subscription[T]]struct{} // open subscriptions, ended by Close; nil after; guarded by mu
	closed  bool                          // Close has begun; guarded by mu
	resyncs atomic.Uint64                 // Resyncs its subscriptions were given for falling behind

	// last is the state and its counters as Close left them (for the last
	// View of a state, as the state ended), which the View answers from
	// then on, though another View of the state goes on; nil before.
	// Stored by Close, then read only.
	last atomic.Pointer[closedState[T]]
	// of is, for a View endedCopy made, the View it copies (never itself
	// a copy), whose closed state it answers from once there is one (see
	// kept); set by endedCopy, then read only.
	of *View[T]
}

// closedState is what a closed View goes on answering from.
type closedState[T any] struct {
	snap  *Snapshot[T]
	stats Stats // the state's counters, without the View's own
}

// New lists r's range on src's connection and watches it on src, and returns
// once the list is applied and the watch confirmed. ctx bounds that wait
// only: the view lives until Close, or until src's Context ends (Err then
// returns its cause: etcdwatch.ErrClosed for a Stream closed) or the server
// refuses it for good (a permission, say). Each New has a state and a watch
// of its own; Share shares them.
//
// r names the keys (Key, Prefix, Range or FromKey); the view sets the rest as
// it needs (every event, with bookmarks and fragments), so a Request with a
// Revision or a filter is refused with an error wrapping
// etcdwatch.ErrInvalidRequest. decode makes each value's T: DecodeBytes for
// plain values. A nil src or decode is refused with an error wrapping
// etcdwatch.ErrInvalidArgument.
//
// The listing reads linearizably at a revision R: with etcd 3.7's RangeStream
// (one snapshot, streamed) where the server has it, else with a first page
// of WithPageSize keys and pages of about WithPageBytes after it, each
// pinned to R. It retries, after src's RetryDelay
// (a Stream's WithReconnectBackoff), what may succeed when tried again.
func New[T any](ctx context.Context, src Source, r etcdwatch.Request, decode Decoder[T], opts ...Option) (*View[T], error) {
	o := defaultOptions()
	for _, opt := range opts {
		opt(&o)
	}
	if err := checkArgs(src, r, decode == nil, o); err != nil {
		return nil, err
	}
	c := newCore(src, r, decode, o)
	v := newView(c, c.join(nil))
	go c.start() // returns when the state ends: its last View closed, src's Context ended, or refused for good; that Close waits for it, and every View's Done closes after it
	select {
	case <-c.ready:
		if err := c.failed(); err != nil {
			v.Close()
			return nil, err
		}
		c.settle(ctx)
		return v, nil
	case <-ctx.Done():
		v.Close()
		return nil, src.State().Explain(context.Cause(ctx))
	}
}

// newView returns a View of c that holds it by done, from c.join.
func newView[T any](c *core[T], done chan struct{}) *View[T] {
	v := &View[T]{core: c, done: done}
	v.ctx, v.cancel = context.WithCancelCause(c.ctx)
	return v
}

func checkArgs(src Source, r etcdwatch.Request, noDecode bool, o options) error {
	switch {
	case isNil(src):
		return fmt.Errorf("%w: view.New: source is nil", etcdwatch.ErrInvalidArgument)
	case noDecode:
		return fmt.Errorf("%w: view.New: decode is nil (use DecodeBytes for plain values)", etcdwatch.ErrInvalidArgument)
	case r.Revision != 0:
		return fmt.Errorf("%w: a view lists its range at the newest revision; Revision must be 0", etcdwatch.ErrInvalidRequest)
	case r.NoPut || r.NoDelete:
		return fmt.Errorf("%w: a view needs every event; NoPut and NoDelete must be false", etcdwatch.ErrInvalidRequest)
	}
	if err := r.Validate(); err != nil {
		return err
	}
	return o.validate()
}

// Snapshot returns the view's current state.
func (v *View[T]) Snapshot() *Snapshot[T] {
	if last := v.kept(); last != nil {
		return last.snap
	}
	return v.core.snap.Load()
}

// kept is what the View answers from once closed (last), or that of
// the View it copies; nil while there is none: the state as it is.
func (v *View[T]) kept() *closedState[T] {
	if v.of != nil {
		return v.of.last.Load()
	}
	return v.last.Load()
}

// Get returns the key's entry in the current state, and whether it exists.
func (v *View[T]) Get(key string) (Entry[T], bool) { return v.Snapshot().Get(key) }

// All iterates the current state in key order: every key at one revision,
// however the view changes meanwhile.
func (v *View[T]) All() iter.Seq2[string, Entry[T]] { return v.Snapshot().All() }

// Revision is the revision of the current state: every change of the range
// up to it has been applied.
func (v *View[T]) Revision() int64 { return v.Snapshot().Revision() }

// Len is the number of keys in the current state.
func (v *View[T]) Len() int { return v.Snapshot().Len() }

// Done is closed once the view has ended and no goroutine works for it any
// more: at its Close (for the last View of a state, once the state's
// goroutines have returned), or, after its Source's Context ended or the
// server refused it for good, once the state's goroutines have returned.
func (v *View[T]) Done() <-chan struct{} { return v.done }

// Err returns nil until Done is closed, then why the view ended: ErrClosed
// after Close, the cause of its Source's Context (etcdwatch.ErrClosed after
// a Stream's Close), or the server's refusal.
func (v *View[T]) Err() error {
	select {
	case <-v.done:
		return context.Cause(v.ctx)
	default:
		return nil
	}
}

// bound returns ctx, ended also when the view ends, with the view's cause.
func (v *View[T]) bound(ctx context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	if v.ctx.Err() != nil { // ended already: now, not in AfterFunc's goroutine
		cancel(context.Cause(v.ctx))
		return ctx, func() {}
	}
	stop := context.AfterFunc(v.ctx, func() { cancel(context.Cause(v.ctx)) })
	return ctx, func() {
		stop()
		cancel(nil)
	}
}

// outcome is err, unless the view or ctx (bound) has ended, in which case
// it is why: view.ErrClosed, the Source's cause, or the caller's, rather
// than whatever an RPC cut short by it said.
func (v *View[T]) outcome(ctx context.Context, err error) error {
	switch {
	case err == nil:
		return nil
	case v.ctx.Err() != nil:
		return context.Cause(v.ctx)
	case ctx.Err() != nil && !errors.Is(err, context.Cause(ctx)):
		return context.Cause(ctx)
	}
	return err // ctx's cause with more said, as a read's last failure
}

// Stats returns the view's counters.
func (v *View[T]) Stats() Stats {
	var st Stats
	if last := v.kept(); last != nil {
		st = last.stats
	} else {
		st = v.core.statsNow()
	}
	v.mu.Lock()
	st.Subscribers = len(v.subs)
	v.mu.Unlock()
	st.Resyncs = v.resyncs.Load()
	return st
}

// WaitForRevision waits until the view has applied every change up to rev,
// or ctx ends, or the view ends: a revision written anywhere in the store,
// in the view's range or not. While the view is behind rev it asks how far
// the store has gone, as Sync does, and moves there; while the store has
// not reached rev it asks again every 100ms, and once it has, again every
// second while the view has not (as Sync does). Calls of all the views of
// a Source share their requests.
func (v *View[T]) WaitForRevision(ctx context.Context, rev int64) error {
	ctx, stop := v.bound(ctx)
	defer stop()
	return v.outcome(ctx, v.core.waitFor(ctx, rev))
}

// Sync waits until the view is at least as fresh as a linearizable read of
// its range made when Sync was called: every change made before the call
// is then in the view, and Revision is at least that read's revision.
//
// It reads the store's revision with one linearizable Range of a single
// key (counted, not sent), then waits as WaitForRevision does, asking for
// progress on the view's watch, which is isolated
// (etcdwatch.Request.Isolated), so that no other watch of the Source can
// hold the answer up. Where progress requests are unsafe (etcd 3.4.0-3.4.24
// and 3.5.0-3.5.7, see etcdwatch.ErrProgressUnsupported), or go unanswered
// for a second (etcd's gRPC proxy drops them), it makes one linearizable
// Range of the range instead, sorted by revision and without values,
// waits until the view holds as many keys, none changed since (the state
// that read saw), and moves the view to the read's revision. That Range
// makes the server read the whole range, without sending it. It cannot
// see a key created and deleted again after the view's revision: if the
// watch had not yet delivered that pair, the view moves past it (its
// state is right, the pair having left nothing) and subscribers never get
// that creation and deletion.
//
// A read that fails for a reason that may pass (Unavailable, as through a
// member's outage) is made again after the Source's RetryDelay, until ctx
// ends; the error is then ctx's cause, wrapping the last failure. A
// refusal (PermissionDenied, say) is returned at once. An answer lost on
// its way to the view (a bookmark for a watch a relist has just replaced,
// a read's state changed and changed back before the view could move) is
// asked for again once a second has passed without the view reaching it.
func (v *View[T]) Sync(ctx context.Context) error {
	ctx, stop := v.bound(ctx)
	defer stop()
	return v.outcome(ctx, v.core.sync(ctx))
}

// Subscribe returns a subscription to the view's batches for a subscriber
// that holds the state at rev: a Snapshot's Revision, or the Revision of
// the last batch it applied, saved across a restart of its own if need
// be. It gets every change after rev, in batches that start at rev (but
// for a key created and deleted again that a Sync by read moved the view
// past; see Sync). For
// rev <= 0 (it holds nothing), or a rev the view's history no longer
// reaches back to, the first batch is a Resync of the current state. A
// rev the view has not reached (taken from another View of the range)
// is the subscriber's state too: batches that end before it are skipped,
// and a relist whose difference starts before it, which is not the
// subscriber's difference, is a Resync instead. The view never waits for
// a subscriber: one that falls more than
// WithHistoryBytes behind gets a Resync instead of what it missed. The
// subscription ends with ctx, at its Close, or with the View.
//
// Batches without changes come when the view has moved on without changes
// to its range (bookmarks, and every Sync or WaitForRevision that moved
// it), at most ten a second, each with the latest revision: a subscriber
// can save it and subscribe again from there.
func (v *View[T]) Subscribe(ctx context.Context, rev int64) *Subscription[T] {
	sub := v.core.subscribe(ctx, rev, &v.resyncs, v.forget)
	v.mu.Lock()
	if v.closed {
		v.mu.Unlock()
		sub.end(ErrClosed) // a View's subscriptions end with it
		return sub
	}
	if v.subs == nil {
		v.subs = make(map[*Subscription[T]]struct{})
	}
	v.subs[sub] = struct{}{}
	if sub.ending.Load() { // ended (its ctx) before it was counted: its forget may have come first
		delete(v.subs, sub)
	} // else its forget, if any, comes after this, under v.mu
	v.mu.Unlock()
	return sub
}

func (v *View[T]) forget(sub *Subscription[T]) {
	v.mu.Lock()
	defer v.mu.Unlock()
	delete(v.subs, sub)
}

// Share returns another View of v's state: the same keys, history, counters
// and server-side watch, with a Close, Done, Err and subscriptions of its
// own. The state lives until every View of it is closed. Share of a View
// that has ended (or is closing) returns a View ended with the same error,
// which answers as v does: while v's Close is under way (it waits for the
// state's goroutines when v is the last View), from the state as it is,
// though its Done is closed already.
func (v *View[T]) Share() *View[T] {
	if v.ctx.Err() == nil { // else v has ended, or is closing
		if done := v.core.join(v.done); done != nil {
			return newView(v.core, done)
		}
	}
	return v.endedCopy()
}

// endedCopy returns a View of v's state that has ended as v has, with v's
// cause: closed when that is ErrClosed, so that its subscriptions end at
// once; else the state has ended or is ending, and they end with it. v's
// ctx has ended: a View that no longer holds its state has always ended it
// first.
func (v *View[T]) endedCopy() *View[T] {
	cause := context.Cause(v.ctx)
	// It answers as v does: from v's closed state once v's Close under way
	// has kept it, not waiting for that here (Share may be called on the
	// state's own goroutines, a Decoder's, for which that Close waits). Its
	// Done is closed at once, though, before that Close returns. A copy of
	// a copy answers as the View first copied: of is never a copy.
	src := v
	if v.of != nil {
		src = v.of
	}
	u := &View[T]{core: v.core, done: make(chan struct{}), closed: cause == ErrClosed, of: src}
	u.ctx, u.cancel = context.WithCancelCause(context.Background())
	u.cancel(cause)
	close(u.done)
	return u
}

// Close ends the view and its subscriptions. The state, its watch and its
// goroutines go with the last View of it, and Close then waits for them. It
// is idempotent and always returns nil; once it returns, Done is closed.
// So the state's own goroutine must not close its last View: a Decoder (or
// a Source's method) that does waits for itself and never returns; it may
// start a goroutine to do it.
func (v *View[T]) Close() error {
	v.once.Do(func() {
		v.cancel(ErrClosed)
		v.mu.Lock()
		subs := v.subs
		v.subs, v.closed = nil, true
		v.mu.Unlock()
		for sub := range subs {
			sub.end(ErrClosed)
		}
		if v.of != nil {
			return // a copy (endedCopy) holds no state and keeps none: it answers as of does
		}
		held := v.core.leave(v.done) // the last View waits for the state's end, and its last publication
		v.last.Store(&closedState[T]{snap: v.core.snap.Load(), stats: v.core.statsNow()})
		if held {
			close(v.done) // after last: whoever sees Done sees the closed state
		}
	})
	<-v.done
	return nil
}

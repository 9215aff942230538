package view

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/etcdwatch/etcdwatch"
)

// This file is how a view learns how far the store has gone, for Sync and
// WaitForRevision, and moves there.
//
// The view's watch is isolated (etcdwatch.Request.Isolated): it shares a
// gRPC stream with the Stream's other isolated watches only, so a progress
// request for it is answered once the view's own watch (and its fellow
// views') has caught up, whatever the Stream's other watches do. The
// answer R comes as a bookmark after every event <= R, which moves the
// view to R. Where the server's progress answers are unsafe (etcd
// 3.4.0-3.4.24, 3.5.0-3.5.7), or none comes within progressWait (etcd's
// gRPC proxy drops the requests), one linearizable read of the range
// stands in, and the runner is asked to move the view to the read's
// revision once its state is the one the read saw.

// await waits until cond holds for the published state, ctx ends or the
// state ends.
func (c *core[T]) await(ctx context.Context, cond func(*Snapshot[T]) bool) error {
	for {
		select {
		case <-c.done:
			return c.err
		default:
		}
		wait := c.hist.waiter() // before the state: a publication in between closes it
		if cond(c.snap.Load()) {
			return nil
		}
		select {
		case <-wait:
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-c.done:
			return c.err
		}
	}
}

// atLeast is await's condition of a state at rev or later.
func atLeast[T any](rev int64) func(*Snapshot[T]) bool {
	return func(s *Snapshot[T]) bool { return s.rev >= rev }
}

// progressWait is how long the view waits for a progress answer, or for
// the view to reach it, before it reads the range instead.
const progressWait = time.Second

// waitCadence is how often WaitForRevision asks again while the store has
// not reached the revision it waits for.
const waitCadence = 100 * time.Millisecond

// sync reads the store's revision now, linearizably, and waits until the
// view has reached it. A progress answer alone would not do: it is not
// known which request it answers, and one asked before Sync was called
// (a request is asked again when no answer comes soon) may come late,
// with a revision below a write made before the call. Where progress is
// unsafe, the read that stands in for it is all it takes.
func (c *core[T]) sync(ctx context.Context) error {
	if c.noAsk.Load() {
		rev, err := c.freshenByRead(ctx)
		if err != nil {
			return err
		}
		return c.reach(ctx, rev)
	}
	var rev int64
	err := c.retrying(ctx, func(ctx context.Context) (err error) {
		rev, err = c.reads.revision(ctx)
		return err
	})
	if err != nil {
		return &readError{"reading the store's revision for Sync", err}
	}
	return c.waitFor(ctx, rev)
}

// retrying calls read until it succeeds or fails for a reason that will
// not pass (listRetryable: a refusal, say), waiting the Source's RetryDelay
// between tries, as a listing does: a Sync or WaitForRevision through a
// member's outage waits for the Stream's connection to come back rather
// than failing with Unavailable. It gives up when ctx ends, with ctx's
// cause and the last failure (gaveUp), or when the state ends.
func (c *core[T]) retrying(ctx context.Context, read func(context.Context) error) error {
	var last error
	authRetried := false
	for failures := 1; ; failures++ {
		err := read(ctx)
		switch {
		case err == nil:
			return nil
		case ctx.Err() != nil: // cut short
			return gaveUp(ctx, last)
		case retryAuth(err, &authRetried):
			continue
		case !listRetryable(err):
			return err
		}
		last = err
		c.log.Debug("etcdwatch: view's read failed; trying again", "err", err)
		t := time.NewTimer(c.src.RetryDelay(failures))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return gaveUp(ctx, last)
		case <-c.done:
			t.Stop()
			return c.err
		}
	}
}

// gaveUp is ctx's cause, with the last failure of the reads it cut short
// if there was one.
func gaveUp(ctx context.Context, last error) error {
	if last == nil {
		return context.Cause(ctx)
	}
	return fmt.Errorf("%w (the last read failed: %w)", context.Cause(ctx), last)
}

// waitFor waits until the view has applied every change up to rev, asking
// how far the store has gone, at waitCadence, until it has gone that far.
func (c *core[T]) waitFor(ctx context.Context, rev int64) error {
	for c.snap.Load().rev < rev {
		at, err := c.freshen(ctx)
		if err != nil {
			return err
		}
		if at >= rev {
			break
		}
		if err := c.pause(ctx, rev); err != nil {
			return err
		}
	}
	return c.reach(ctx, rev)
}

// reach waits until the view is at rev or later, which the store has
// reached. What moves the view there can be lost: a bookmark answered to
// a watch a relist has just replaced; a read's move, which the runner
// drops when its state, changed since the read matched, is no longer the
// one the read saw (a key created and deleted again). So while the view is
// short of rev for progressWait, it asks again (freshen), which answers
// for the view's watch and state as they are now.
func (c *core[T]) reach(ctx context.Context, rev int64) error {
	for {
		wctx, cancel := context.WithTimeout(ctx, progressWait)
		err := c.await(wctx, atLeast[T](rev))
		waited := wctx.Err() != nil // before cancel, which ends it too
		cancel()
		if err == nil || ctx.Err() != nil || !waited {
			return err // reached, or ctx or the state ended
		}
		if _, err := c.freshen(ctx); err != nil {
			return err
		}
	}
}

// pause waits waitCadence, or less if the view reaches rev meanwhile
// (events and bookmarks still come); it returns an error only if ctx or
// the state has ended.
func (c *core[T]) pause(ctx context.Context, rev int64) error {
	wctx, cancel := context.WithTimeout(ctx, waitCadence)
	defer cancel()
	err := c.await(wctx, atLeast[T](rev))
	if err != nil && ctx.Err() == nil && wctx.Err() != nil {
		return nil // the cadence passed
	}
	return err
}

// freshen returns a revision which the view will reach having applied
// every change of its range up to it: by progress on the view's watch (the
// member's revision when it answered, at least the highest the Stream had
// seen; callers compare it with what they need), or by a read (that of a
// linearizable read made now). Progress that
// fails in any way (no answer within progressWait; ErrNoWatches, while a
// relist has no watch yet; the release refusing it, from then on) leaves
// it to the read, whose own errors are the call's.
func (c *core[T]) freshen(ctx context.Context) (int64, error) {
	if !c.noAsk.Load() {
		pctx, cancel := context.WithTimeout(ctx, progressWait)
		rev, err := c.progress(pctx)
		cancel()
		switch {
		case err == nil:
			return rev, nil
		case ctx.Err() != nil:
			return 0, context.Cause(ctx)
		case errors.Is(err, etcdwatch.ErrProgressUnsupported):
			c.noAsk.Store(true)
		}
	}
	return c.freshenByRead(ctx)
}

// settle waits, for at most progressWait, until the server answers a
// progress request for the view's new watch. etcd holds a watch created at
// its current revision apart until its next sync of new watches (every
// 100ms), and answers no progress request on its stream meanwhile: a view
// that returns from New once it is answered answers its first Sync in a
// round trip, not after that sync.
func (c *core[T]) settle(ctx context.Context) {
	if c.noAsk.Load() || c.answered.Load() == c.watch.Load() { // a restore's catching up asked already, for this watch
		return
	}
	ctx, cancel := context.WithTimeout(ctx, progressWait)
	defer cancel()
	if _, err := c.progress(ctx); errors.Is(err, etcdwatch.ErrProgressUnsupported) {
		c.noAsk.Store(true)
	}
}

// progress asks for progress on the view's current watch; a watch that
// ends meanwhile (a relist) is replaced by the next.
func (c *core[T]) progress(ctx context.Context) (int64, error) {
	for {
		w := c.watch.Load()
		rev, err := w.RequestProgress(ctx)
		if err == nil {
			c.answered.Store(w)
		}
		if err == nil || ctx.Err() != nil || c.watch.Load() == w {
			return rev, err
		}
	}
}

// freshenByRead reads the range's freshness with one linearizable read,
// waits for a state that matches it, and has the runner move the view to
// the read's revision: nothing of the range changed in between.
func (c *core[T]) freshenByRead(ctx context.Context) (int64, error) {
	var f freshness
	err := c.retrying(ctx, func(ctx context.Context) (err error) {
		f, err = c.reads.fresh(ctx)
		return err
	})
	if err != nil {
		return 0, &readError{"reading the range for Sync", err}
	}
	if err := c.await(ctx, seen[T](f)); err != nil {
		return 0, err
	}
	select {
	case c.moves <- f:
	case <-ctx.Done():
		return 0, context.Cause(ctx)
	case <-c.done:
		return 0, c.err
	}
	return f.rev, nil
}

// seen is await's condition of the state the read f saw, or a later one
// (freshness.seenBy).
func seen[T any](f freshness) func(*Snapshot[T]) bool {
	return func(s *Snapshot[T]) bool { return f.seenBy(s.rev, s.Len()) }
}

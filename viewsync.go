package etcdwatch

import (
	"context"
	"errors"
	"time"
)

// await waits until cond holds for the published state, ctx ends or the
// state ends.
func (c *viewCore[T]) await(ctx context.Context, cond func(*Snapshot[T]) bool) error {
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

// progressRecheck is how long Sync waits for the bookmark of a progress
// answer before it asks again: the answer covers only the watches active
// when the server gave it, and the view's may have been between two.
const progressRecheck = time.Second

func (c *viewCore[T]) sync(ctx context.Context) error {
	for {
		rev, err := c.stream.RequestProgress(ctx)
		if errors.Is(err, ErrProgressUnsupported) || errors.Is(err, ErrNoWatches) {
			return c.syncByRead(ctx)
		}
		if err != nil {
			return err
		}
		wctx, cancel := context.WithTimeout(ctx, progressRecheck)
		err = c.await(wctx, func(s *Snapshot[T]) bool { return s.rev >= rev })
		cancel()
		if err == nil || ctx.Err() != nil || wctx.Err() == nil {
			return err
		}
	}
}

// syncByRead is Sync without progress requests: one linearizable read of
// the range's freshness, then a wait for a state that matches it.
func (c *viewCore[T]) syncByRead(ctx context.Context) error {
	f, err := c.reads.fresh(ctx)
	if err != nil {
		return err
	}
	return c.await(ctx, func(s *Snapshot[T]) bool {
		return s.rev >= f.rev || (int64(s.Len()) == f.count && f.newest <= s.rev)
	})
}

package view

import (
	"context"
	"errors"
	"time"

	"github.com/etcdwatch/etcdwatch"
)

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

// progressWait is how long Sync waits for a progress answer, or for the
// view to reach it, before it reads the range instead. etcd answers a
// progress request only once every watch on the stream is synced and none
// waits for a future revision, which a resumed watch of a range nobody
// writes can do until the next write anywhere; and an answer covers only
// the watches active when it was given.
const progressWait = time.Second

func (c *core[T]) sync(ctx context.Context) error {
	pctx, cancel := context.WithTimeout(ctx, progressWait)
	defer cancel()
	rev, err := c.src.RequestProgress(pctx)
	if err == nil {
		err = c.await(pctx, func(s *Snapshot[T]) bool { return s.rev >= rev })
	}
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return context.Cause(ctx)
	case pctx.Err() != nil, errors.Is(err, etcdwatch.ErrProgressUnsupported), errors.Is(err, etcdwatch.ErrNoWatches):
		return c.syncByRead(ctx)
	}
	return err
}

// syncByRead is Sync without progress requests: one linearizable read of
// the range's freshness, then a wait for a state that matches it.
func (c *core[T]) syncByRead(ctx context.Context) error {
	f, err := c.reads.fresh(ctx)
	if err != nil {
		return &readError{"reading the range for Sync", err}
	}
	return c.await(ctx, func(s *Snapshot[T]) bool {
		return s.rev >= f.rev || (int64(s.Len()) == f.count && f.newest <= s.rev)
	})
}

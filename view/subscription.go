package view

import (
	"context"
	"sort"
	"sync"
)

// Subscription is one subscriber's cursor into a view's batches, from
// View.Subscribe (the zero Subscription is not usable). Its batches come
// in revision order. Next is for one goroutine at a time; Close may be
// called from any.
type Subscription[T any] struct {
	c       *core[T]
	closed  chan struct{}
	once    sync.Once
	onClose func() // tells the View; set by View.Subscribe

	// Owned by the caller of Next.
	next   uint64 // sequence number of the next batch
	from   int64  // the first revision asked for; trims the first batch
	resync bool   // the next batch is a Resync
	asked  bool   // that Resync was asked for, not caused by falling behind
}

func (c *core[T]) subscribe(fromRev int64) *Subscription[T] {
	h := &c.hist
	h.mu.Lock()
	defer h.mu.Unlock()
	h.subs++
	sub := &Subscription[T]{c: c, closed: make(chan struct{}), from: fromRev}
	if fromRev <= h.floor {
		sub.resync, sub.asked = true, fromRev <= 0
		return sub
	}
	i := sort.Search(len(h.items), func(i int) bool { return h.items[i].b.Revision >= fromRev })
	sub.next = h.first + uint64(i)
	return sub
}

// Next returns the next batch, waiting for one until ctx ends. Once the view
// has ended, it returns what the view published before, then the view's Err;
// after Close, ErrClosed.
func (s *Subscription[T]) Next(ctx context.Context) (Batch[T], error) {
	for {
		b, wait, err := s.poll()
		if wait == nil || err != nil {
			return b, err
		}
		select {
		case <-wait:
		case <-ctx.Done():
			return Batch[T]{}, context.Cause(ctx)
		case <-s.closed:
			return Batch[T]{}, ErrClosed
		}
	}
}

// poll returns the next batch, or the channel to wait on for one.
func (s *Subscription[T]) poll() (Batch[T], <-chan struct{}, error) {
	select {
	case <-s.closed:
		return Batch[T]{}, nil, ErrClosed
	default:
	}
	h := &s.c.hist
	h.mu.Lock()
	end := h.first + uint64(len(h.items))
	switch {
	case s.resync || s.next < h.first:
		snap, asked := s.c.snap.Load(), s.resync && s.asked
		s.next, s.resync, s.from = end, false, 0
		h.mu.Unlock()
		return s.resyncTo(snap, asked)
	case s.next < end:
		b := h.items[s.next-h.first].b
		s.next++
		h.mu.Unlock()
		return s.trimFirst(b), nil, nil
	case h.over:
		h.mu.Unlock()
		return Batch[T]{}, nil, s.c.err
	}
	wait := h.changed
	h.mu.Unlock()
	return Batch[T]{}, wait, nil
}

// resyncTo is the Resync of snap, counted unless it was asked for; or the
// view's end if it ended before its first state. Built outside the
// history's lock: it copies the whole state.
func (s *Subscription[T]) resyncTo(snap *Snapshot[T], asked bool) (Batch[T], <-chan struct{}, error) {
	if snap == nil {
		return Batch[T]{}, nil, s.c.err
	}
	if !asked {
		s.c.stats.resyncs.Add(1)
	}
	return resyncOf(snap), nil, nil
}

// trimFirst trims the subscription's first batch to the revision it asked
// for; later ones go as they are.
func (s *Subscription[T]) trimFirst(b Batch[T]) Batch[T] {
	if s.from > 0 {
		b = trim(b, s.from)
		s.from = 0
	}
	return b
}

// resyncOf is the whole state of snap as one batch.
func resyncOf[T any](snap *Snapshot[T]) Batch[T] {
	b := Batch[T]{Kind: Resync, Revision: snap.rev, Changes: make([]Change[T], 0, snap.Len())}
	for k, e := range snap.m.All() {
		b.Changes = append(b.Changes, Change[T]{Kind: Created, Key: k, Revision: e.ModRevision, Entry: e})
	}
	return b
}

// trim leaves out of an Events batch the revisions before from. A Relisted
// batch is one step, kept whole.
func trim[T any](b Batch[T], from int64) Batch[T] {
	if b.Kind != Events || b.From >= from-1 {
		return b
	}
	i := sort.Search(len(b.Changes), func(i int) bool { return b.Changes[i].Revision >= from })
	b.Changes, b.From = b.Changes[i:], from-1
	return b
}

// Close ends the subscription: Next returns ErrClosed. It is idempotent.
func (s *Subscription[T]) Close() {
	s.end()
	if s.onClose != nil {
		s.onClose()
	}
}

func (s *Subscription[T]) end() {
	s.once.Do(func() {
		close(s.closed)
		h := &s.c.hist
		h.mu.Lock()
		h.subs--
		h.mu.Unlock()
	})
}

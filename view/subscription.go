package view

import (
	"context"
	"iter"
	"sort"
	"sync"
	"sync/atomic"
)

// Subscription is one subscriber's cursor into a view's batches, from
// View.Subscribe (the zero Subscription is not usable). Its batches come
// in revision order, each starting where the one before ended (From is the
// previous Revision), but a Resync, which replaces the whole state (From
// 0). Next and Batches are for one goroutine at a time;
// Close and Err may be called from any.
type Subscription[T any] struct {
	c       *core[T]
	ctx     context.Context // the subscription's: its end ends the subscription
	resyncs *atomic.Uint64  // its View's count of Resyncs caused by falling behind
	closed  chan struct{}   // closed by end
	cause   error           // why it ended; written before closed is closed
	once    sync.Once
	ending  atomic.Bool            // end has begun: set before onEnd is told
	onEnd   func(*Subscription[T]) // tells its View, at the end; may be nil

	mu      sync.Mutex
	stopCtx func() bool // releases the AfterFunc on the subscription's context; guarded by mu

	// Owned by the caller of Next.
	next   uint64 // sequence number of the next batch
	from   int64  // the first revision wanted; trims the first batch
	resync bool   // the next batch is a Resync
	asked  bool   // that Resync was asked for, not caused by falling behind
}

// subscribe returns a subscription, whose end is told to onEnd (if not
// nil), for a subscriber that holds the state at
// rev (none for rev <= 0), ended with ctx.
func (c *core[T]) subscribe(ctx context.Context, rev int64, resyncs *atomic.Uint64, onEnd func(*Subscription[T])) *Subscription[T] {
	sub := &Subscription[T]{c: c, resyncs: resyncs, closed: make(chan struct{}), ctx: ctx, from: rev + 1, onEnd: onEnd}
	h := &c.hist
	h.mu.Lock()
	if rev <= 0 || rev < h.floor {
		sub.resync, sub.asked = true, rev <= 0 || rev < h.origin // from before the view's first state: it never had those changes, so not fallen behind
	} else {
		i := sort.Search(len(h.items), func(i int) bool { return h.items[i].b.Revision > rev })
		sub.next = h.first + uint64(i) // its first batch, checked by poll (held, unknownStart)
	}
	h.mu.Unlock()
	sub.mu.Lock()
	defer sub.mu.Unlock()
	sub.stopCtx = context.AfterFunc(ctx, func() { sub.end(context.Cause(ctx)) })
	return sub
}

// Next returns the next batch, waiting for one until ctx ends. Once the
// view has ended, it returns what the view published before, then the
// view's Err; once the subscription has ended, why: ErrClosed after its
// Close or its View's, or the cause of the context it was made with.
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
			return Batch[T]{}, s.cause
		}
	}
}

// Batches iterates the subscription's batches, as Next gives them, until
// it ends: then Err says why.
//
//	for b := range sub.Batches() { ... }
//	err := sub.Err()
func (s *Subscription[T]) Batches() iter.Seq[Batch[T]] {
	return func(yield func(Batch[T]) bool) {
		for {
			b, err := s.Next(context.Background())
			if err != nil {
				s.end(err) // the view's end ends the subscription too
				return
			}
			if !yield(b) {
				return
			}
		}
	}
}

// Err returns nil while the subscription runs, then why it ended (see
// Next).
func (s *Subscription[T]) Err() error {
	s.endedWithCtx()
	select {
	case <-s.closed:
		return s.cause
	default:
		return nil
	}
}

// poll returns the next batch, or the channel to wait on for one. The
// batches the subscriber holds already are skipped in a loop: with a large
// history, a subscriber may be many batches ahead of its start.
func (s *Subscription[T]) poll() (Batch[T], <-chan struct{}, error) {
	for {
		s.endedWithCtx()
		select {
		case <-s.closed:
			return Batch[T]{}, nil, s.cause
		default:
		}
		h := &s.c.hist
		h.mu.Lock()
		end := h.first + uint64(len(h.items))
		switch {
		case s.resync || s.next < h.first:
			snap, asked := s.c.snap.Load(), s.resync && s.asked
			s.next, s.resync, s.from = end, false, 0
			if snap != nil { // the next batch starts at the Resync's revision, though it may have been published from before it
				s.from = snap.rev + 1
			}
			h.mu.Unlock()
			return s.resyncTo(snap, asked)
		case s.next < end:
			b := h.items[s.next-h.first].b
			s.next++
			h.mu.Unlock()
			if s.held(b) {
				continue
			}
			if s.unknownStart(b) {
				s.resync, s.asked = true, true
				continue
			}
			return s.trimFirst(b), nil, nil
		case h.over:
			h.mu.Unlock()
			s.end(s.c.err) // Err says so too
			return Batch[T]{}, nil, s.c.err
		}
		wait := h.changed
		h.mu.Unlock()
		return Batch[T]{}, wait, nil
	}
}

// endedWithCtx ends the subscription now if its context has ended, rather
// than when context.AfterFunc's goroutine gets to it.
func (s *Subscription[T]) endedWithCtx() {
	if s.ctx.Err() != nil {
		s.end(context.Cause(s.ctx))
	}
}

// resyncTo is the Resync of snap, counted unless it was asked for; or the
// view's end if it ended before its first state. Built outside the
// history's lock: it copies the whole state.
func (s *Subscription[T]) resyncTo(snap *Snapshot[T], asked bool) (Batch[T], <-chan struct{}, error) {
	if snap == nil {
		s.end(s.c.err)
		return Batch[T]{}, nil, s.c.err
	}
	if !asked {
		s.resyncs.Add(1)
	}
	return resyncOf(snap), nil, nil
}

// held reports whether the subscriber holds all of b already: a step that
// ends at or before the state its first batch starts from, such as a
// progress batch published late (progressGap) after the view moved there
// and a Resync or Subscribe gave it that state, or a relist of a view
// behind the subscriber that ends before its revision. Such a step is
// skipped; the first batch is still to come. (A relist that ends at the
// subscriber's revision is given, or is a Resync: see unknownStart.)
func (s *Subscription[T]) held(b Batch[T]) bool {
	switch {
	case s.from <= 0:
		return false
	case b.Kind == Events:
		return b.Revision < s.from
	case b.Kind == Relisted: // one to the subscriber's revision is given, so that it sees the relist
		return b.Revision < s.from-1
	}
	return false
}

// unknownStart reports whether b, the subscription's first batch, is a
// Relisted step from a state before the subscriber's that the view knows
// less of than the subscriber holds: the subscriber's revision is past
// b.same, the last revision the view knows the step's start at (a
// revision it saved past a saved state the view restored from, or one
// taken from another View of the range that was ahead). What changed up
// to that revision is not known, so b's changes are not the subscriber's:
// it gets a Resync instead, not counted, since it did not fall behind.
func (s *Subscription[T]) unknownStart(b Batch[T]) bool {
	return s.from > 0 && b.Kind == Relisted && s.from-1 > b.same
}

// trimFirst trims the subscription's first batch to the revisions after
// the state it holds; later ones go as they are.
func (s *Subscription[T]) trimFirst(b Batch[T]) Batch[T] {
	if s.from > 0 {
		b = trim(b, s.from)
		s.from = 0
	}
	return b
}

// resyncOf is the whole state of snap as one batch. The state keeps
// records, not Entries (record.go), so the batch's Entries are made for it,
// in one block.
func resyncOf[T any](snap *Snapshot[T]) Batch[T] {
	b := Batch[T]{Kind: Resync, Revision: snap.rev, Changes: make([]Change[T], 0, snap.Len())}
	es := make([]Entry[T], 0, snap.Len())
	for k, e := range snap.m.All() {
		es = append(es, e)
		b.Changes = append(b.Changes, Change[T]{Kind: Created, Key: k, Revision: e.ModRevision, Entry: &es[len(es)-1]})
	}
	return b
}

// trim leaves out of an Events batch the revisions before from. A Relisted
// batch is one step, kept whole; one that starts before from-1 starts there
// instead: no change was published between its From and from-1 (the view
// moved without changes, progress within progressGap of the last progress
// batch), so the state it starts from is the one at from-1.
func trim[T any](b Batch[T], from int64) Batch[T] {
	switch {
	case b.From >= from-1:
		return b
	case b.Kind == Relisted:
		b.From = from - 1
		return b
	case b.Kind != Events:
		return b
	}
	i := sort.Search(len(b.Changes), func(i int) bool { return b.Changes[i].Revision >= from })
	b.Changes, b.From = b.Changes[i:], from-1
	return b
}

// Close ends the subscription: Next returns ErrClosed. It is idempotent.
func (s *Subscription[T]) Close() { s.end(ErrClosed) }

// end ends the subscription with cause, once: its Close, its context's
// end, its View's Close, or the view's end met by Next. onEnd is told
// before Err says so, so that once Err is set its View no longer counts it.
func (s *Subscription[T]) end(cause error) {
	s.once.Do(func() {
		s.cause = cause
		s.ending.Store(true)
		if s.onEnd != nil {
			s.onEnd(s)
		}
		close(s.closed)
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.stopCtx != nil {
			s.stopCtx()
		}
	})
}

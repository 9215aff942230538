package view

import (
	"context"
	"sort"
	"sync"
	"sync/atomic"
)

// history is the batches a view keeps for its subscribers, oldest first,
// bounded in bytes. Subscribers read it at their own pace through a cursor
// of their own; the view only appends, so it never waits for one.
type history[T any] struct {
	mu      sync.Mutex
	limit   int64
	items   []histItem[T]
	first   uint64        // sequence number of items[0]
	bytes   int64         // of items
	floor   int64         // items hold every change after this revision
	changed chan struct{} // closed, and replaced, at each publication; closed for good at the end
	over    bool          // the view has ended
	subs    int           // open subscriptions
}

type histItem[T any] struct {
	b    Batch[T]
	size int64
}

func (h *history[T]) init(limit int64) {
	h.limit = limit
	h.changed = make(chan struct{})
}

// changeWeight is what a change costs the history beyond its bytes.
const changeWeight = 64

func batchWeight[T any](b *Batch[T]) int64 {
	n := int64(0)
	for _, ch := range b.Changes {
		n += changeWeight
		if ch.Entry != nil {
			n += int64(ch.Entry.size)
		}
		if ch.Prev != nil {
			n += int64(ch.Prev.size)
		}
	}
	return n
}

// publish stores s as the view's state and keeps bs, the steps to it, then
// wakes everyone waiting. The state and the history change together, so a
// subscriber starting from a state continues from the batch after it.
func (h *history[T]) publish(snap *atomic.Pointer[Snapshot[T]], s *Snapshot[T], bs []Batch[T]) {
	h.mu.Lock()
	defer h.mu.Unlock()
	snap.Store(s)
	for _, b := range bs {
		h.push(b)
	}
	close(h.changed)
	h.changed = make(chan struct{})
}

// push appends b and drops the oldest batches beyond the limit; the newest
// is kept whatever its size.
func (h *history[T]) push(b Batch[T]) {
	it := histItem[T]{b: b, size: batchWeight(&b)}
	h.items = append(h.items, it)
	h.bytes += it.size
	for h.bytes > h.limit && len(h.items) > 1 {
		h.floor = h.items[0].b.Revision
		h.bytes -= h.items[0].size
		h.items[0] = histItem[T]{}
		h.items = h.items[1:]
		h.first++
	}
}

// end wakes everyone for the last time.
func (h *history[T]) end() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.over = true
	close(h.changed)
}

// waiter returns the channel closed at the next publication.
func (h *history[T]) waiter() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.changed
}

func (h *history[T]) size() (subs int, bytes int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.subs, h.bytes
}

// Subscription is one subscriber's cursor into a view's batches, from
// View.Subscribe. Next is for one goroutine at a time; Close may be called
// from any.
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
		snap := s.c.snap.Load()
		s.next = end
		asked := s.resync && s.asked
		s.resync, s.from = false, 0
		h.mu.Unlock()
		if snap == nil { // the view ended before its first state
			return Batch[T]{}, nil, s.c.err
		}
		if !asked {
			s.c.stats.resyncs.Add(1)
		}
		return resyncOf(snap), nil, nil
	case s.next < end:
		b := h.items[s.next-h.first].b
		s.next++
		h.mu.Unlock()
		if s.from > 0 {
			b = trim(b, s.from)
			s.from = 0
		}
		return b, nil, nil
	case h.over:
		h.mu.Unlock()
		return Batch[T]{}, nil, s.c.err
	}
	wait := h.changed
	h.mu.Unlock()
	return Batch[T]{}, wait, nil
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

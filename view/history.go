package view

import (
	"sync"
	"sync/atomic"
)

// history is the batches a view keeps for its subscribers, oldest first,
// bounded in bytes. Subscribers read it at their own pace through a cursor
// of their own; the runner only appends, so it never waits for one. Every
// field is guarded by mu, but limit, set by init, and floor's first value,
// set by the runner before its first publication (which core.ready orders
// before any subscription).
type history[T any] struct {
	mu      sync.Mutex
	limit   int64
	items   []histItem[T]
	first   uint64        // sequence number of items[0]
	bytes   int64         // of items
	floor   int64         // items hold every change after this revision
	changed chan struct{} // closed, and replaced, at each publication; closed for good at the end
	over    bool          // the view has ended
	origin  int64         // floor's first value, a store revision (>= 1), set at the first publication: the history never held changes up to it; 0 before
}

type histItem[T any] struct {
	b    Batch[T]
	size int64
}

func (h *history[T]) init(limit int64) {
	h.limit = limit
	h.changed = make(chan struct{})
}

// changeWeight is what a change costs the history beyond its bytes; a
// batch costs as much again, so that batches without changes (progress)
// count too.
const changeWeight = 64

func batchWeight[T any](b *Batch[T]) int64 {
	n := int64(changeWeight)
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
	if h.origin == 0 {
		h.origin = h.floor
	}
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

func (h *history[T]) size() (bytes int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.bytes
}

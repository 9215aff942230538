// Package ring provides a growable FIFO queue backed by a ring buffer.
package ring

import "iter"

// Ring is a FIFO queue that grows on demand. Its zero value is an empty queue
// that holds no memory. It is not safe for concurrent use.
type Ring[T any] struct {
	buf  []T
	head int // index of the first element in buf
	n    int // number of elements
}

// Cap returns how many elements the buffer holds before it grows.
func (r *Ring[T]) Cap() int { return len(r.buf) }

// Len returns the number of queued elements.
func (r *Ring[T]) Len() int { return r.n }

// Push appends v at the tail, doubling the buffer when it is full.
func (r *Ring[T]) Push(v T) {
	if r.n == len(r.buf) {
		r.grow()
	}
	r.buf[(r.head+r.n)%len(r.buf)] = v
	r.n++
}

// Pop removes and returns the head. It reports false when the queue is empty.
func (r *Ring[T]) Pop() (T, bool) {
	var zero T
	if r.n == 0 {
		return zero, false
	}
	v := r.buf[r.head]
	r.buf[r.head] = zero // let the garbage collector have it
	r.head = (r.head + 1) % len(r.buf)
	r.n--
	if r.n == 0 {
		r.head = 0
		if len(r.buf) > keptBuffer {
			r.buf = nil // a burst's buffer goes once drained: a queue of a million is not kept for the next
		}
	}
	return v, true
}

// keptBuffer is the largest buffer a queue keeps once Pop has emptied it.
const keptBuffer = 1024

// Peek returns the head without removing it. It reports false when the
// queue is empty.
func (r *Ring[T]) Peek() (T, bool) {
	if r.n == 0 {
		var zero T
		return zero, false
	}
	return r.buf[r.head], true
}

// Last returns a pointer to the tail element, or nil when the queue is empty.
// The pointer is valid until the next Push or Pop.
func (r *Ring[T]) Last() *T {
	if r.n == 0 {
		return nil
	}
	return &r.buf[(r.head+r.n-1)%len(r.buf)]
}

// All yields the queued elements, head first. The queue must not change
// meanwhile.
func (r *Ring[T]) All() iter.Seq[T] {
	return func(yield func(T) bool) {
		for i := range r.n {
			if !yield(r.buf[(r.head+i)%len(r.buf)]) {
				return
			}
		}
	}
}

// DeleteFunc removes every element for which del returns true, keeping the
// others in order. del sees each element once, head first.
func (r *Ring[T]) DeleteFunc(del func(T) bool) {
	var zero T
	kept := 0
	for i := range r.n {
		v := r.buf[(r.head+i)%len(r.buf)]
		if del(v) {
			continue
		}
		r.buf[(r.head+kept)%len(r.buf)] = v
		kept++
	}
	for i := kept; i < r.n; i++ {
		r.buf[(r.head+i)%len(r.buf)] = zero // let the garbage collector have them
	}
	r.n = kept
	if r.n == 0 {
		r.head = 0
	}
}

// Reset empties the queue and releases its buffer.
func (r *Ring[T]) Reset() { *r = Ring[T]{} }

func (r *Ring[T]) grow() {
	size := 2 * len(r.buf)
	if size == 0 {
		size = 4
	}
	buf := make([]T, size)
	for i := range r.n {
		buf[i] = r.buf[(r.head+i)%len(r.buf)]
	}
	r.buf, r.head = buf, 0
}

package view

import (
	"iter"

	"github.com/etcdwatch/etcdwatch/internal/cow"
)

// Snapshot is a view's state at one revision. It never changes, and reading
// it never holds the view up; its methods are safe for concurrent use. The
// zero Snapshot is empty, at revision 0.
type Snapshot[T any] struct {
	m     cow.Map[*Entry[T]]
	rev   int64
	bytes int64
	raw   cow.Map[[]byte] // the values as the server sent them, for Save (WithSave); empty for other views
}

// Revision is the revision whose state the snapshot holds.
func (s *Snapshot[T]) Revision() int64 { return s.rev }

// Len is the number of keys.
func (s *Snapshot[T]) Len() int { return s.m.Len() }

// Get returns the key's entry, and whether the key exists.
func (s *Snapshot[T]) Get(key string) (Entry[T], bool) {
	e, ok := s.m.Get(key)
	if !ok {
		return Entry[T]{}, false
	}
	return *e, true
}

// All iterates every key in key order.
func (s *Snapshot[T]) All() iter.Seq2[string, Entry[T]] {
	return func(yield func(string, Entry[T]) bool) {
		for k, e := range s.m.All() {
			if !yield(k, *e) {
				return
			}
		}
	}
}

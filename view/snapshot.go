package view

import (
	"iter"

	"github.com/etcdwatch/etcdwatch/internal/cow"
)

// Snapshot is a view's state at one revision. It never changes, and reading
// it never holds the view up; its methods are safe for concurrent use. The
// zero Snapshot is empty, at revision 0.
type Snapshot[T any] struct {
	m     table[T] // the keys, as records (record.go)
	rev   int64
	bytes int64
	raw   cow.Map[[]byte] // the values as the server sent them, for Save (WithSave); empty for other views
	// cluster is the ID of the cluster the state was listed from or
	// restored against, for Save: of this state, not of a listing under way.
	cluster uint64
	listing uint64 // the runner's listing (or load) the state follows from, for the integrity check
}

// Revision is the revision whose state the snapshot holds.
func (s *Snapshot[T]) Revision() int64 { return s.rev }

// Len is the number of keys.
func (s *Snapshot[T]) Len() int { return s.m.Len() }

// Get returns the key's entry, and whether the key exists.
func (s *Snapshot[T]) Get(key string) (Entry[T], bool) { return s.m.Get(key) }

// All iterates every key in key order.
func (s *Snapshot[T]) All() iter.Seq2[string, Entry[T]] { return s.m.All() }

package view

import (
	"iter"
	"math"

	"github.com/etcdwatch/etcdwatch/internal/cow"
)

// record is how a state keeps a key's Entry: the decoded value and the
// revisions, without the key (the tree has it) and without Err. It is
// stored in the tree's nodes, not behind a pointer of its own: 56 bytes
// for a []byte value, where an Entry of its own and the pointer to it took
// 104 (viewsync: 86 bytes a key beyond key and value, from 131). The price
// is paid by writes: Get, All and each Change (Entry and Prev) make their
// Entry from the record, and the nodes a write copies after a publication
// are three times the size. A record whose Version or size does not fit
// in 32 bits, or whose value did not decode, is wide: its Entry's Err,
// Version and size are in the state's wides instead.
type record[T any] struct {
	val     T
	create  int64
	mod     int64
	lease   int64
	version uint32 // Version; unset when wide
	size    uint32 // bytes of the key and of the value as stored, below wideFlag; wideFlag when wide
}

// wideFlag in record.size marks a wide record.
const wideFlag = 1 << 31

// wide is what a wide record's Entry has beyond the record.
type wide struct {
	err     error
	version int64
	size    int
}

func (r *record[T]) isWide() bool { return r.size&wideFlag != 0 }

// entry is the Entry of key, whose record r is; for a wide record, but
// for what its wide has.
func (r *record[T]) entry(key string) Entry[T] {
	return Entry[T]{
		Key: key, Value: r.val,
		CreateRevision: r.create, ModRevision: r.mod, Version: int64(r.version), Lease: r.lease,
		size: int(r.size),
	}
}

// onto completes the Entry of a wide record.
func onto[T any](w wide, e *Entry[T]) { e.Err, e.Version, e.size = w.err, w.version, w.size }

// recordOf returns the record of e, and whether it is wide.
func recordOf[T any](e *Entry[T]) (record[T], bool) {
	r := record[T]{val: e.Value, create: e.CreateRevision, mod: e.ModRevision, lease: e.Lease}
	if e.Err != nil || e.Version < 0 || e.Version > math.MaxUint32 || e.size < 0 || int64(e.size) >= wideFlag {
		r.size = wideFlag
		return r, true
	}
	r.version, r.size = uint32(e.Version), uint32(e.size)
	return r, false
}

// table is the keys of a state, in key order: one record each, and the
// wide ones' rest. It never changes; copying it shares everything. The
// zero table is empty.
type table[T any] struct {
	recs  cow.Map[record[T]]
	wides cow.Map[wide] // empty unless some record is wide
}

func (s table[T]) Len() int { return s.recs.Len() }

// entry is the Entry of key, whose record is r.
func (s table[T]) entry(key string, r *record[T]) Entry[T] {
	e := r.entry(key)
	if r.isWide() {
		w, _ := s.wides.Get(key)
		onto(w, &e)
	}
	return e
}

// Get returns the key's Entry, and whether the key exists.
func (s table[T]) Get(key string) (Entry[T], bool) {
	r, ok := s.recs.Get(key)
	if !ok {
		return Entry[T]{}, false
	}
	return s.entry(key, &r), true
}

// All yields every key and its Entry in key order.
func (s table[T]) All() iter.Seq2[string, Entry[T]] {
	return func(yield func(string, Entry[T]) bool) {
		for k, r := range s.recs.All() {
			if !yield(k, s.entry(k, &r)) {
				return
			}
		}
	}
}

// Edit returns an editor whose contents start as s's.
func (s table[T]) Edit() *tableEditor[T] {
	return &tableEditor[T]{recs: s.recs.Edit(), wides: s.wides.Edit()}
}

// tableEditor changes a copy of a table, as cow.Editor does a Map:
// owned by one goroutine, which publishes with Map.
type tableEditor[T any] struct {
	recs  *cow.Editor[record[T]]
	wides *cow.Editor[wide]
}

func (ed *tableEditor[T]) Len() int { return ed.recs.Len() }

// Map returns a snapshot of the editor's contents; later edits do not
// change it.
func (ed *tableEditor[T]) Map() table[T] {
	return table[T]{recs: ed.recs.Map(), wides: ed.wides.Map()}
}

// entry is the Entry of key, whose record is r.
func (ed *tableEditor[T]) entry(key string, r *record[T]) Entry[T] {
	e := r.entry(key)
	if r.isWide() {
		w, _ := ed.wides.Get(key)
		onto(w, &e)
	}
	return e
}

// Set stores e under its key and returns the Entry it replaced and true,
// or false when the key was new.
func (ed *tableEditor[T]) Set(e *Entry[T]) (old Entry[T], replaced bool) { return set(ed, e.Key, e) }

// Put is Set for an Entry whose key is given as bytes: it sets e.Key to the
// string the table holds, so that an update makes no string of its key.
func (ed *tableEditor[T]) Put(key []byte, e *Entry[T]) (old Entry[T], replaced bool) {
	return set(ed, key, e)
}

func set[T any, K cow.Key](ed *tableEditor[T], key K, e *Entry[T]) (old Entry[T], replaced bool) {
	r, isWide := recordOf(e)
	held, prev, replaced := cow.Put(ed.recs, key, r)
	e.Key = held
	if replaced {
		old = ed.entry(e.Key, &prev)
		if prev.isWide() && !isWide {
			ed.wides.Delete(e.Key)
		}
	}
	if isWide {
		ed.wides.Set(e.Key, wide{err: e.Err, version: e.Version, size: e.size})
	}
	return old, replaced
}

// Append stores e under its key, which must sort after every key held.
func (ed *tableEditor[T]) Append(e *Entry[T]) {
	r, isWide := recordOf(e)
	ed.recs.Append(e.Key, r)
	if isWide {
		ed.wides.Append(e.Key, wide{err: e.Err, version: e.Version, size: e.size}) // in key order too
	}
}

// Delete removes key and returns its Entry and true, or false when it was
// missing.
func (ed *tableEditor[T]) Delete(key string) (old Entry[T], deleted bool) {
	prev, deleted := ed.recs.Delete(key)
	if !deleted {
		return old, false
	}
	old = prev.entry(key)
	if prev.isWide() {
		w, _ := ed.wides.Delete(key)
		onto(w, &old)
	}
	return old, true
}

// Package cow provides a persistent ordered map from string keys: a
// copy-on-write B-tree with transient editing.
//
// A Map is an immutable snapshot. An Editor, owned by one goroutine, changes
// a copy of a Map a batch at a time and publishes a new Map in O(1) with
// Editor.Map. Readers may iterate any published Map without a lock while the
// editor goes on.
//
// Ownership: every node carries the generation token of the editor that
// created it. An editor writes in place only the nodes of its current
// generation; any other node (one reachable from a published Map, or from
// the Map the editor started from) is copied on first write, together with
// the path above it. Editor.Map retires the current generation, so the nodes
// of a published Map are never written again.
package cow

import "iter"

// Map is an immutable ordered map from string keys to V. The zero Map is
// empty and ready to use. A Map never changes, so all its methods are safe
// for concurrent use by any number of goroutines, alongside an Editor that
// goes on from it; hand a Map over through a channel, mutex or atomic as for
// any value. Copying a Map is cheap and shares everything.
type Map[V any] struct {
	root *node[V] // nil when empty; its generation is retired
	n    int
}

// Len returns the number of keys in m, in O(1); 0 for the zero Map. Safe
// for concurrent use.
func (m Map[V]) Len() int { return m.n }

// Get returns the value stored under key and whether there is one; the zero
// V and false when there is none. Safe for concurrent use.
func (m Map[V]) Get(key string) (V, bool) { return m.root.get(key) }

// All yields every key and value of m in ascending key order; nothing for
// the zero Map. Safe for concurrent use, with no lock: m never changes, so
// the sequence may be ranged over at any time, as often as wanted.
func (m Map[V]) All() iter.Seq2[string, V] { return all(m.root) }

// From yields the keys of m that are >= key, with their values, in
// ascending key order; key need not be present. Safe for concurrent use,
// like All.
func (m Map[V]) From(key string) iter.Seq2[string, V] {
	return func(yield func(string, V) bool) {
		if m.root != nil {
			m.root.from(key, yield)
		}
	}
}

// Edit returns a new editor whose contents start as m's, in O(1). m itself
// never changes: the editor copies the nodes it shares with m before writing
// them. Safe for concurrent use: any number of editors may start from one
// Map, each owned by its goroutine. Edit of the zero Map is an empty editor.
func (m Map[V]) Edit() *Editor[V] { return &Editor[V]{root: m.root, n: m.n} }

func all[V any](root *node[V]) iter.Seq2[string, V] {
	return func(yield func(string, V) bool) {
		if root != nil {
			root.walk(yield)
		}
	}
}

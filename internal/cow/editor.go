package cow

import (
	"fmt"
	"iter"
)

// Editor changes a copy of a Map. It is not safe for concurrent use: one
// goroutine owns it and makes every call on it, while any goroutine may read
// the Maps it has published. The zero Editor is ready to use and holds an
// empty map. An Editor must not be copied; pass the pointer.
type Editor[V any] struct {
	_    noCopy
	root *node[V]
	n    int
	// gen is the current generation: the nodes carrying it were created by
	// this editor since its last Map and are reachable from no Map, so they
	// are written in place. nil until the first write after Edit or Map.
	gen *gen
	// tail is the rightmost leaf while Append alone has changed the tree in
	// this generation, for Append's fast path; otherwise nil.
	tail *node[V]
}

// noCopy makes go vet's copylocks check report a copied Editor: two copies
// would write the same nodes of one generation.
type noCopy struct{}

func (*noCopy) Lock()   {}
func (*noCopy) Unlock() {}

// Len returns the number of keys in the editor, in O(1). Owner goroutine
// only, like every Editor method.
func (e *Editor[V]) Len() int { return e.n }

// Get returns the value stored under key and whether there is one; the zero
// V and false when there is none. Owner goroutine only.
func (e *Editor[V]) Get(key string) (V, bool) { return e.root.get(key) }

// All yields the editor's current contents in ascending key order. Owner
// goroutine only, and the sequence must not be used across a Set, Delete or
// Append (nor ranged over while one runs); take a Map to iterate while
// editing or from another goroutine.
func (e *Editor[V]) All() iter.Seq2[string, V] { return all(e.root) }

// Map returns a snapshot of the editor's current contents in O(1). Later
// edits do not change it: the editor starts a new generation, so nodes
// reachable from the snapshot are copied before they are written again.
// Owner goroutine only; the Map it returns is safe for concurrent use by
// any goroutine. The zero Editor's Map is the zero Map.
func (e *Editor[V]) Map() Map[V] {
	e.gen, e.tail = nil, nil
	return Map[V]{root: e.root, n: e.n}
}

// Set stores v under key and returns the value it replaced and true, or the
// zero V and false when key was new. Owner goroutine only. It copies the
// nodes on the path to key that a published Map shares. A key after every
// other one is added as Append adds it, so that keys created in ascending
// order (sequence numbers, timestamps) leave full nodes behind rather than
// the half-full ones of a split.
func (e *Editor[V]) Set(key string, v V) (old V, replaced bool) {
	_, old, replaced = Put(e, key, v)
	return old, replaced
}

// Key is a key as a string or as bytes.
type Key interface{ ~string | ~[]byte }

// Put is e.Set for a key given as a string or as bytes. It also returns the
// key as the editor holds it: the string it already held when it replaced a
// value, else a copy of key made then. A caller with bytes thus makes no
// string of its own, and an update none at all.
func Put[V any, K Key](e *Editor[V], key K, v V) (held string, old V, replaced bool) {
	if e.root == nil || string(key) > e.lastKey() {
		held = string(key)
		e.append(item[V]{held, v})
		return held, old, false
	}
	e.tail = nil
	n := e.mut(e.root)
	if n.full() {
		n = e.grow(n, item[V]{}, nil)
		e.splitChild(n, 0)
	}
	e.root = n
	// Top down: split each full node before entering it, so that the leaf
	// has room and a split never has to climb back up.
	for {
		i, found := search(n, key)
		if found {
			old, n.items[i].val = n.items[i].val, v
			return n.items[i].key, old, true
		}
		if n.leaf() {
			held = string(key)
			n.insertAt(i, item[V]{held, v})
			e.n++
			return held, old, false
		}
		if c := e.child(n, i); !c.full() {
			n = c
			continue
		}
		e.splitChild(n, i) // then search n again: the median moved up into it
	}
}

// Delete removes key and returns the value it held and true, or the zero V
// and false when key was missing (which copies nothing). Owner goroutine
// only. The tree keeps no reference to the deleted value; a published Map
// that holds key keeps it, as it must.
func (e *Editor[V]) Delete(key string) (old V, deleted bool) {
	if e.root == nil {
		return old, false
	}
	root, it, ok := e.remove(e.root, key)
	if !ok {
		return old, false
	}
	e.tail = nil
	switch {
	case len(root.items) > 0:
		e.root = root
	case root.leaf():
		e.root = nil // emptied
	default:
		e.root = root.children[0] // the root's last two children merged
	}
	e.n--
	return it.val, true
}

// Append stores v under key, which must sort after every key in the editor;
// it panics otherwise, changing nothing. Owner goroutine only. It is the
// fast path for building from sorted input: it fills the rightmost leaf in
// place, and when a rightmost node is full it leaves that node with all but
// one of its items and starts a new one to its right, so that a tree built
// by Append has its nodes nearly full.
func (e *Editor[V]) Append(key string, v V) {
	if e.root != nil {
		mustFollow(key, e.lastKey())
	}
	e.append(item[V]{key, v})
}

// append adds it, whose key sorts after every key in the editor.
func (e *Editor[V]) append(it item[V]) {
	if t := e.tail; t != nil && !t.full() {
		t.items = append(t.items, it)
		e.n++
		return
	}
	if e.root == nil {
		e.root = e.newNode(true)
	}
	root := e.mut(e.root)
	if sep, right := e.appendTo(root, it); right != nil {
		root = e.grow(root, sep, right)
	}
	e.root = root
	e.n++
}

func mustFollow(key, last string) {
	if key <= last {
		panic(fmt.Sprintf("cow: Append(%q): key does not sort after the last key %q", key, last))
	}
}

// lastKey returns the greatest key of the non-empty editor: the tail's
// last while Append's fast path holds one, else the rightmost leaf's.
func (e *Editor[V]) lastKey() string {
	n := e.tail
	if n == nil {
		n = e.root
		for !n.leaf() {
			n = n.children[len(n.children)-1]
		}
	}
	return n.items[len(n.items)-1].key
}

// own returns the current generation, starting one if there is none.
func (e *Editor[V]) own() *gen {
	if e.gen == nil {
		e.gen = new(gen)
	}
	return e.gen
}

// mut returns n if this generation may write it, else a copy that it may.
// The caller must store the result where n was.
func (e *Editor[V]) mut(n *node[V]) *node[V] {
	g := e.own()
	if n.owner == g {
		return n
	}
	return n.clone(g)
}

// child makes children[i] of the writable node n writable and returns it.
func (e *Editor[V]) child(n *node[V], i int) *node[V] {
	c := e.mut(n.children[i])
	n.children[i] = c
	return c
}

func (e *Editor[V]) newNode(leaf bool) *node[V] {
	if leaf {
		return newLeaf[V](e.own())
	}
	return newInternal[V](e.own())
}

// grow returns a new root above the old one. With right set, sep and right
// follow the old root in it; else the caller splits the old root.
func (e *Editor[V]) grow(root *node[V], sep item[V], right *node[V]) *node[V] {
	r := e.newNode(false)
	r.children = append(r.children, root)
	if right != nil {
		r.items = append(r.items, sep)
		r.children = append(r.children, right)
	}
	return r
}

// splitChild splits the full writable children[i] of the writable, non-full
// node n around its median, which moves up into n.
func (e *Editor[V]) splitChild(n *node[V], i int) {
	const mid = maxItems / 2
	c := n.children[i]
	right := e.newNode(c.leaf())
	right.items = append(right.items, c.items[mid+1:]...)
	if !c.leaf() {
		right.children = append(right.children, c.children[mid+1:]...)
	}
	med := c.items[mid]
	c.truncate(mid)
	n.insertAt(i, med)
	n.insertChildAt(i+1, right)
}

// appendTo adds it after every item of the subtree under the writable node
// n. If n was full it returns a separator and a new right sibling for the
// caller to hang after n; n then keeps all but one of its items.
func (e *Editor[V]) appendTo(n *node[V], it item[V]) (sep item[V], right *node[V]) {
	if n.leaf() {
		if !n.full() {
			n.items = append(n.items, it)
			e.tail = n
			return sep, nil
		}
		right = e.newNode(true)
		right.items = append(right.items, it)
		e.tail = right
		return n.removeAt(len(n.items) - 1), right
	}
	last := len(n.children) - 1
	sep, r := e.appendTo(e.child(n, last), it)
	if r == nil {
		return sep, nil
	}
	if !n.full() {
		n.items = append(n.items, sep)
		n.children = append(n.children, r)
		return item[V]{}, nil
	}
	right = e.newNode(false)
	right.items = append(right.items, sep)
	right.children = append(right.children, n.removeChildAt(last), r)
	return n.removeAt(len(n.items) - 1), right
}

// remove deletes key from the subtree under n and returns the subtree's new
// root (n itself or its writable copy) and the removed item. It copies
// nothing when key is missing. The new root may be left short of items; its
// parent rebalances it.
func (e *Editor[V]) remove(n *node[V], key string) (*node[V], item[V], bool) {
	i, found := n.search(key)
	switch {
	case n.leaf() && !found:
		return n, item[V]{}, false
	case n.leaf():
		n = e.mut(n)
		return n, n.removeAt(i), true
	case !found:
		c, it, ok := e.remove(n.children[i], key)
		if !ok {
			return n, it, false
		}
		n = e.mut(n)
		n.children[i] = c
		e.fixChild(n, i)
		return n, it, true
	}
	// An internal item: its predecessor, the last item of the subtree to
	// its left, takes its place.
	n = e.mut(n)
	it := n.items[i]
	n.children[i], n.items[i] = e.removeMax(n.children[i])
	e.fixChild(n, i)
	return n, it, true
}

// removeMax deletes the last item of the non-empty subtree under n and
// returns the subtree's new root and that item.
func (e *Editor[V]) removeMax(n *node[V]) (*node[V], item[V]) {
	n = e.mut(n)
	if n.leaf() {
		return n, n.removeAt(len(n.items) - 1)
	}
	last := len(n.children) - 1
	var it item[V]
	n.children[last], it = e.removeMax(n.children[last])
	e.fixChild(n, last)
	return n, it
}

// fixChild brings children[i] of the writable node n back to minItems when
// a removal left it short: it borrows from a sibling that can spare an item,
// or else merges with one, which takes an item from n.
func (e *Editor[V]) fixChild(n *node[V], i int) {
	if len(n.children[i].items) >= minItems {
		return
	}
	switch {
	case i > 0 && len(n.children[i-1].items) > minItems:
		e.rotateRight(n, i-1)
	case i+1 < len(n.children) && len(n.children[i+1].items) > minItems:
		e.rotateLeft(n, i)
	case i > 0:
		e.merge(n, i-1)
	default:
		e.merge(n, i)
	}
}

// rotateRight moves the last item of children[i] up into n and n's
// items[i] down to the front of children[i+1].
func (e *Editor[V]) rotateRight(n *node[V], i int) {
	left, right := e.child(n, i), e.child(n, i+1)
	right.insertAt(0, n.items[i])
	n.items[i] = left.removeAt(len(left.items) - 1)
	if !left.leaf() {
		right.insertChildAt(0, left.removeChildAt(len(left.children)-1))
	}
}

// rotateLeft moves the first item of children[i+1] up into n and n's
// items[i] down to the end of children[i].
func (e *Editor[V]) rotateLeft(n *node[V], i int) {
	left, right := e.child(n, i), e.child(n, i+1)
	left.items = append(left.items, n.items[i])
	n.items[i] = right.removeAt(0)
	if !right.leaf() {
		left.children = append(left.children, right.removeChildAt(0))
	}
}

// merge joins children[i], n's items[i] and children[i+1] into one node.
// The two children hold at most 2*minItems-1 items together, so it fits.
// children[i+1] is only read: it stays as it was for any Map sharing it.
func (e *Editor[V]) merge(n *node[V], i int) {
	left, right := e.child(n, i), n.children[i+1]
	left.items = append(left.items, n.removeAt(i))
	left.items = append(left.items, right.items...)
	if !left.leaf() {
		left.children = append(left.children, right.children...)
	}
	n.removeChildAt(i + 1)
}

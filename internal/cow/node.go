package cow

// The tree is a B-tree with items in every node: a node with k items has
// k+1 children unless it is a leaf. Every leaf lies at the same depth.
//
// Sizes: a node holds at most maxItems items. A node off the rightmost spine
// (the path from the root through each last child) holds at least minItems.
// A node on the spine holds at least one: Append leaves the spine short so
// that the nodes it leaves behind stay full. That still bounds the height by
// about log_(minItems+1)(n) + 2.
//
// The degree is 16 (maxItems 31), chosen by the benchmarks in bench_test.go
// against 24, 32 and 48: publishing after a Set copies one node per level,
// and the bytes so copied (the GC's cost) halve from degree 32 to 16 with
// Get about the same; All slows by a quarter and the tree's memory grows by
// about 2 bytes per item, both cheap beside that.
const (
	maxItems = 31 // 2*degree - 1
	minItems = maxItems / 2
)

// gen is an edit generation. A node is mutable by the editor whose current
// generation it carries, and by nobody else. The type has a size so that each
// new(gen) is a distinct pointer (zero-size allocations may share one).
type gen struct{ _ byte }

type item[V any] struct {
	key string
	val V
}

// node is one B-tree node. Once its generation is retired (the editor
// published a snapshot, see Editor.Map) the node never changes again.
type node[V any] struct {
	owner    *gen
	items    []item[V]  // ascending keys; capacity maxItems
	children []*node[V] // nil for a leaf; else len(items)+1, capacity maxItems+1
}

func newLeaf[V any](owner *gen) *node[V] {
	return &node[V]{owner: owner, items: make([]item[V], 0, maxItems)}
}

func newInternal[V any](owner *gen) *node[V] {
	n := newLeaf[V](owner)
	n.children = make([]*node[V], 0, maxItems+1)
	return n
}

// clone copies n into a new node of generation owner. The children are
// shared: they are copied in turn when that generation writes them.
func (n *node[V]) clone(owner *gen) *node[V] {
	c := newLeaf[V](owner)
	c.items = append(c.items, n.items...)
	if !n.leaf() {
		c.children = make([]*node[V], len(n.children), maxItems+1)
		copy(c.children, n.children)
	}
	return c
}

func (n *node[V]) leaf() bool { return n.children == nil }

func (n *node[V]) full() bool { return len(n.items) == maxItems }

// search returns the index of the first item whose key is >= key, and
// whether that item's key is key.
func (n *node[V]) search(key string) (int, bool) { return search(n, key) }

// search is n.search for a key given as a string or as bytes; the
// comparisons of string(key) copy nothing.
func search[V any, K Key](n *node[V], key K) (int, bool) {
	lo, hi := 0, len(n.items)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if n.items[m].key < string(key) {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo, lo < len(n.items) && n.items[lo].key == string(key)
}

// get looks key up in the subtree under n, which may be nil.
func (n *node[V]) get(key string) (V, bool) {
	for n != nil {
		i, found := n.search(key)
		if found {
			return n.items[i].val, true
		}
		if n.leaf() {
			break
		}
		n = n.children[i]
	}
	var zero V
	return zero, false
}

// walk yields the subtree under n in key order; false means yield stopped.
func (n *node[V]) walk(yield func(string, V) bool) bool {
	if n.leaf() {
		for _, it := range n.items {
			if !yield(it.key, it.val) {
				return false
			}
		}
		return true
	}
	return n.children[0].walk(yield) && n.walkFrom(0, yield)
}

// walkFrom yields items[i:] of the internal node n, each followed by the
// subtree to its right.
func (n *node[V]) walkFrom(i int, yield func(string, V) bool) bool {
	for ; i < len(n.items); i++ {
		it := n.items[i]
		if !yield(it.key, it.val) || !n.children[i+1].walk(yield) {
			return false
		}
	}
	return true
}

// from yields the items of the subtree under n whose keys are >= key.
func (n *node[V]) from(key string, yield func(string, V) bool) bool {
	i, found := n.search(key)
	if n.leaf() {
		for _, it := range n.items[i:] {
			if !yield(it.key, it.val) {
				return false
			}
		}
		return true
	}
	if !found && !n.children[i].from(key, yield) {
		return false
	}
	return n.walkFrom(i, yield)
}

// The structural edits below work on nodes the caller has made writable; a
// sibling or child they must change is made writable through e.child.

// insertAt puts it at items[i] of the writable, non-full node n.
func (n *node[V]) insertAt(i int, it item[V]) {
	n.items = append(n.items, item[V]{})
	copy(n.items[i+1:], n.items[i:])
	n.items[i] = it
}

// removeAt deletes items[i] of the writable node n and returns it. The slot
// it vacates is zeroed so that the collector can have the value.
func (n *node[V]) removeAt(i int) item[V] {
	it := n.items[i]
	last := len(n.items) - 1
	copy(n.items[i:], n.items[i+1:])
	n.items[last] = item[V]{}
	n.items = n.items[:last]
	return it
}

// removeChildAt deletes children[i] of the writable node n, zeroing the slot.
func (n *node[V]) removeChildAt(i int) *node[V] {
	c := n.children[i]
	last := len(n.children) - 1
	copy(n.children[i:], n.children[i+1:])
	n.children[last] = nil
	n.children = n.children[:last]
	return c
}

// insertChildAt puts c at children[i] of the writable node n.
func (n *node[V]) insertChildAt(i int, c *node[V]) {
	n.children = append(n.children, nil)
	copy(n.children[i+1:], n.children[i:])
	n.children[i] = c
}

// truncate cuts the writable node n to its first k items (and k+1 children),
// zeroing what it drops.
func (n *node[V]) truncate(k int) {
	clear(n.items[k:])
	n.items = n.items[:k]
	if !n.leaf() {
		clear(n.children[k+1:])
		n.children = n.children[:k+1]
	}
}

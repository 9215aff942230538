package cow

import (
	"errors"
	"fmt"
)

// checkTree verifies the B-tree invariants of the tree under root, which
// must hold wantLen keys: every leaf at one depth, child counts, node sizes
// (at most maxItems; at least minItems off the rightmost spine; at least one
// on it, root included), keys strictly ascending across the whole tree (in
// order of an in-order walk, which makes it a search tree), and an owner on
// every node.
func checkTree[V any](root *node[V], wantLen int) error {
	if root == nil {
		if wantLen != 0 {
			return fmt.Errorf("nil root, want %d keys", wantLen)
		}
		return nil
	}
	c := checker[V]{leafDepth: -1}
	if err := c.node(root, 0, true); err != nil {
		return err
	}
	if c.count != wantLen {
		return fmt.Errorf("tree holds %d keys, Len says %d", c.count, wantLen)
	}
	return nil
}

type checker[V any] struct {
	leafDepth int
	count     int
	last      string // the last key seen in order, once count > 0
}

// node checks the subtree under n at depth; spine says whether n is on the
// rightmost spine.
func (c *checker[V]) node(n *node[V], depth int, spine bool) error {
	if err := checkSize(n, spine); err != nil {
		return fmt.Errorf("depth %d: %w", depth, err)
	}
	if n.leaf() {
		if c.leafDepth >= 0 && c.leafDepth != depth {
			return fmt.Errorf("leaves at depths %d and %d", c.leafDepth, depth)
		}
		c.leafDepth = depth
		for _, it := range n.items {
			if err := c.next(it.key); err != nil {
				return err
			}
		}
		return nil
	}
	if len(n.children) != len(n.items)+1 {
		return fmt.Errorf("depth %d: %d items but %d children", depth, len(n.items), len(n.children))
	}
	for i, ch := range n.children {
		if err := c.node(ch, depth+1, spine && i == len(n.items)); err != nil {
			return err
		}
		if i < len(n.items) {
			if err := c.next(n.items[i].key); err != nil {
				return err
			}
		}
	}
	return nil
}

// next takes the next key of the in-order walk.
func (c *checker[V]) next(key string) error {
	if c.count > 0 && key <= c.last {
		return fmt.Errorf("key %q follows %q", key, c.last)
	}
	c.last = key
	c.count++
	return nil
}

func checkSize[V any](n *node[V], spine bool) error {
	switch {
	case n == nil:
		return errors.New("nil node")
	case n.owner == nil:
		return errors.New("node without an owner")
	case len(n.items) > maxItems:
		return fmt.Errorf("%d items, more than %d", len(n.items), maxItems)
	case len(n.items) == 0:
		return errors.New("empty node")
	case !spine && len(n.items) < minItems:
		return fmt.Errorf("%d items off the spine, fewer than %d", len(n.items), minItems)
	}
	return nil
}

// nodes adds every node of the tree under n to set.
func nodes[V any](n *node[V], set map[*node[V]]bool) {
	if n == nil || set[n] {
		return
	}
	set[n] = true
	for _, c := range n.children {
		nodes(c, set)
	}
}

// checkOwnership verifies copy-on-write: no node that the editor may write
// in place (one of its current generation) is reachable from a published
// Map.
func checkOwnership[V any](e *Editor[V], published map[*node[V]]bool) error {
	if e.gen == nil {
		return nil
	}
	mine := map[*node[V]]bool{}
	nodes(e.root, mine)
	for n := range mine {
		if n.owner == e.gen && published[n] {
			return errors.New("a node of the current generation is reachable from a published Map")
		}
	}
	return nil
}

// height counts the levels of the tree under n.
func height[V any](n *node[V]) int {
	h := 0
	for ; n != nil; h++ {
		if n.leaf() {
			return h + 1
		}
		n = n.children[0]
	}
	return h
}

package cow

import (
	"fmt"
	"iter"
	"maps"
	"slices"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// key formats i so that string order is numeric order.
func key(i int) string { return fmt.Sprintf("%08d", i) }

// oracle is the reference model: a plain map, with its keys in a slice for
// picking one at random.
type oracle struct {
	vals map[string]int
	keys []string
	pos  map[string]int // index in keys
}

func newOracle() *oracle {
	return &oracle{vals: map[string]int{}, pos: map[string]int{}}
}

func (o *oracle) set(k string, v int) (int, bool) {
	old, ok := o.vals[k]
	o.vals[k] = v
	if !ok {
		o.pos[k] = len(o.keys)
		o.keys = append(o.keys, k)
	}
	return old, ok
}

func (o *oracle) del(k string) (int, bool) {
	old, ok := o.vals[k]
	if !ok {
		return 0, false
	}
	delete(o.vals, k)
	i, last := o.pos[k], len(o.keys)-1
	o.keys[i] = o.keys[last]
	o.pos[o.keys[i]] = i
	o.keys = o.keys[:last]
	delete(o.pos, k)
	return old, true
}

// next returns the index of the key after the largest one, or 0.
func (o *oracle) next() int {
	if len(o.keys) == 0 {
		return 0
	}
	n, err := strconv.Atoi(slices.Max(o.keys))
	if err != nil {
		panic(err)
	}
	return n + 1
}

// snap is a published Map with the oracle's copy taken at that moment.
type snap struct {
	m    Map[int]
	want map[string]int
	keys []string // of want, ascending
}

// harness runs edits on an Editor and the oracle side by side and checks
// that they agree; it keeps every Map published on the way.
type harness struct {
	t         testing.TB
	e         *Editor[int]
	o         *oracle
	snaps     []snap
	published map[*node[int]]bool // every node reachable from a snap
	clock     int                 // the next value stored
	maxLen    int                 // the largest Len seen by checkOp
	maxHeight int                 // the greatest tree height seen by checkOp
}

func newHarness(t testing.TB) *harness {
	return &harness{t: t, e: new(Editor[int]), o: newOracle(), published: map[*node[int]]bool{}}
}

func (h *harness) set(k string) {
	h.clock++
	old, ok := h.e.Set(k, h.clock)
	if wold, wok := h.o.set(k, h.clock); old != wold || ok != wok {
		h.t.Fatalf("Set(%q) = %d, %v; want %d, %v", k, old, ok, wold, wok)
	}
}

func (h *harness) del(k string) {
	old, ok := h.e.Delete(k)
	if wold, wok := h.o.del(k); old != wold || ok != wok {
		h.t.Fatalf("Delete(%q) = %d, %v; want %d, %v", k, old, ok, wold, wok)
	}
}

// appendRun appends n keys after the largest, the first gap keys past it;
// each checks the tree after itself.
func (h *harness) appendRun(n, gap int, each bool) {
	next := h.o.next() + gap
	for i := range n {
		h.clock++
		h.e.Append(key(next+i), h.clock)
		h.o.set(key(next+i), h.clock)
		if each {
			h.checkOp()
		}
	}
}

// snapshot publishes a Map, to be checked by checkAll.
func (h *harness) snapshot() {
	m := h.e.Map()
	s := snap{m: m, want: maps.Clone(h.o.vals), keys: slices.Sorted(maps.Keys(h.o.vals))}
	h.snaps = append(h.snaps, s)
	nodes(m.root, h.published)
}

// branch goes on editing from snapshot i, dropping the editor's changes
// since; the Maps published since stay checked.
func (h *harness) branch(i int) {
	s := h.snaps[i%len(h.snaps)]
	h.e = s.m.Edit()
	h.o = newOracle()
	for _, k := range s.keys { // in order, so that runs repeat
		h.o.set(k, s.want[k])
	}
}

// checkOp checks the editor's tree invariants and length.
func (h *harness) checkOp() {
	require.NoError(h.t, checkTree(h.e.root, h.e.Len()))
	require.Equal(h.t, len(h.o.vals), h.e.Len())
	h.maxLen = max(h.maxLen, h.e.Len())
	h.maxHeight = max(h.maxHeight, height(h.e.root))
}

// checkEditor checks the editor against the oracle, and that no node it
// writes in place is shared with a published Map.
func (h *harness) checkEditor() {
	h.checkOp()
	require.NoError(h.t, sameContents(h.e, h.o.vals, slices.Sorted(maps.Keys(h.o.vals))))
	require.NoError(h.t, checkOwnership(h.e, h.published))
}

// checkAll checks the editor and every snapshot against its copy.
func (h *harness) checkAll() {
	h.checkEditor()
	for _, s := range h.snaps {
		h.checkSnap(s)
	}
}

func (h *harness) checkSnap(s snap) {
	require.NoError(h.t, checkTree(s.m.root, s.m.Len()))
	require.NoError(h.t, sameContents(s.m, s.want, s.keys))
	require.NoError(h.t, sameFrom(s.m, s.want, s.keys))
}

type view interface {
	Len() int
	Get(string) (int, bool)
	All() iter.Seq2[string, int]
}

// sameContents compares v's Len, All and Get with want, whose keys in
// ascending order are keys.
func sameContents(v view, want map[string]int, keys []string) error {
	if v.Len() != len(want) {
		return fmt.Errorf("Len %d, want %d", v.Len(), len(want))
	}
	i := 0
	for k, val := range v.All() {
		if i >= len(keys) || k != keys[i] || val != want[k] {
			return fmt.Errorf("All: #%d is %q=%d, not as wanted", i, k, val)
		}
		i++
	}
	if i != len(keys) {
		return fmt.Errorf("All yielded %d keys, want %d", i, len(keys))
	}
	for k, w := range want {
		if got, ok := v.Get(k); !ok || got != w {
			return fmt.Errorf("Get(%q) = %d, %v; want %d", k, got, ok, w)
		}
	}
	if _, ok := v.Get("missing"); ok {
		return fmt.Errorf("Get of a missing key found it")
	}
	return nil
}

// sameFrom checks From on keys before, at, between and after the keys.
// Past the start the walk is All's, so it compares only the first
// fromPrefix keys, enough to cross several nodes, and then stops early.
func sameFrom(m Map[int], want map[string]int, keys []string) error {
	const fromPrefix = 3 * maxItems
	probes := []string{"", "~"}
	for i := 0; i < len(keys); i += 1 + len(keys)/4 {
		probes = append(probes, keys[i], keys[i]+"0")
	}
	for _, p := range probes {
		wantKeys := keys[sortSearch(keys, p):]
		wantKeys = wantKeys[:min(len(wantKeys), fromPrefix)]
		var got []string
		for k, v := range m.From(p) {
			if v != want[k] {
				return fmt.Errorf("From(%q) yields %q=%d, want %d", p, k, v, want[k])
			}
			if got = append(got, k); len(got) == fromPrefix {
				break
			}
		}
		if !slices.Equal(got, wantKeys) {
			return fmt.Errorf("From(%q) yields %d keys, want %d", p, len(got), len(wantKeys))
		}
	}
	return nil
}

func sortSearch(keys []string, k string) int {
	i, _ := slices.BinarySearch(keys, k)
	return i
}

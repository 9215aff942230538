package cow

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"testing"
	"unsafe"
	"weak"

	"github.com/stretchr/testify/require"
)

type kv struct {
	k string
	v int
}

func collect(seq func(func(string, int) bool)) []kv {
	var out []kv
	for k, v := range seq {
		out = append(out, kv{k, v})
	}
	return out
}

func TestSmallCases(t *testing.T) {
	tests := []struct {
		name     string
		edit     func(t *testing.T, e *Editor[int])
		want     []kv
		from     string
		wantFrom []kv
	}{
		{
			name: "empty",
			edit: func(*testing.T, *Editor[int]) {},
			from: "a",
		},
		{
			name:     "one key",
			edit:     func(t *testing.T, e *Editor[int]) { requireSet(t, e, "a", 1, 0, false) },
			want:     []kv{{"a", 1}},
			from:     "a",
			wantFrom: []kv{{"a", 1}},
		},
		{
			name: "replace",
			edit: func(t *testing.T, e *Editor[int]) {
				requireSet(t, e, "a", 1, 0, false)
				requireSet(t, e, "a", 2, 1, true)
			},
			want:     []kv{{"a", 2}},
			from:     "",
			wantFrom: []kv{{"a", 2}},
		},
		{
			name: "delete missing",
			edit: func(t *testing.T, e *Editor[int]) {
				requireDelete(t, e, "a", 0, false)
				requireSet(t, e, "a", 1, 0, false)
				requireDelete(t, e, "b", 0, false)
			},
			want:     []kv{{"a", 1}},
			from:     "b",
			wantFrom: nil,
		},
		{
			name: "delete to empty",
			edit: func(t *testing.T, e *Editor[int]) {
				requireSet(t, e, "a", 1, 0, false)
				requireSet(t, e, "b", 2, 0, false)
				requireDelete(t, e, "a", 1, true)
				requireDelete(t, e, "b", 2, true)
				requireDelete(t, e, "b", 0, false)
				require.Nil(t, e.root, "an emptied editor has an empty root")
			},
			from: "",
		},
		{
			name:     "From a missing key between keys",
			edit:     setAll("a", "c", "e"),
			want:     []kv{{"a", 0}, {"c", 1}, {"e", 2}},
			from:     "b",
			wantFrom: []kv{{"c", 1}, {"e", 2}},
		},
		{
			name:     "From a present key",
			edit:     setAll("a", "c", "e"),
			want:     []kv{{"a", 0}, {"c", 1}, {"e", 2}},
			from:     "c",
			wantFrom: []kv{{"c", 1}, {"e", 2}},
		},
		{
			name:     "From before the first key",
			edit:     setAll("b", "a"),
			want:     []kv{{"a", 1}, {"b", 0}},
			from:     "",
			wantFrom: []kv{{"a", 1}, {"b", 0}},
		},
		{
			name: "From past the end",
			edit: setAll("a", "c", "e"),
			want: []kv{{"a", 0}, {"c", 1}, {"e", 2}},
			from: "f",
		},
		{
			name: "Append after Set",
			edit: func(t *testing.T, e *Editor[int]) {
				requireSet(t, e, "b", 1, 0, false)
				e.Append("c", 2)
				e.Append("d", 3)
			},
			want:     []kv{{"b", 1}, {"c", 2}, {"d", 3}},
			from:     "bb",
			wantFrom: []kv{{"c", 2}, {"d", 3}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := Map[int]{}.Edit()
			tc.edit(t, e)
			m := e.Map()
			for _, v := range []view{e, m} {
				require.Equal(t, tc.want, collect(v.All()))
				require.Equal(t, len(tc.want), v.Len())
				for _, w := range tc.want {
					got, ok := v.Get(w.k)
					require.True(t, ok)
					require.Equal(t, w.v, got)
				}
				_, ok := v.Get("zz")
				require.False(t, ok)
			}
			require.Equal(t, tc.wantFrom, collect(m.From(tc.from)))
			require.NoError(t, checkTree(m.root, m.Len()))
		})
	}
}

func setAll(keys ...string) func(*testing.T, *Editor[int]) {
	return func(t *testing.T, e *Editor[int]) {
		for i, k := range keys {
			requireSet(t, e, k, i, 0, false)
		}
	}
}

func requireSet(t *testing.T, e *Editor[int], k string, v, wantOld int, wantReplaced bool) {
	t.Helper()
	old, replaced := e.Set(k, v)
	require.Equal(t, wantOld, old)
	require.Equal(t, wantReplaced, replaced)
}

func requireDelete(t *testing.T, e *Editor[int], k string, wantOld int, wantDeleted bool) {
	t.Helper()
	old, deleted := e.Delete(k)
	require.Equal(t, wantOld, old)
	require.Equal(t, wantDeleted, deleted)
}

// TestPutByBytes checks that Put with a key as bytes stores it as Set
// would, returns the key the editor holds, and makes no string for a key
// it already holds.
func TestPutByBytes(t *testing.T) {
	var e Editor[int]
	for i := range 100 {
		held, _, replaced := Put(&e, []byte(key(i*2)), i) // ascending: the append path
		require.False(t, replaced)
		require.Equal(t, key(i*2), held)
	}
	held, _, replaced := Put(&e, []byte(key(1)), -1) // between two keys: the descent
	require.False(t, replaced)
	require.Equal(t, key(1), held)
	held, old, replaced := Put(&e, []byte(key(42)), 421)
	require.True(t, replaced)
	require.Equal(t, 21, old)
	require.Equal(t, key(42), held)
	require.NoError(t, checkTree(e.root, 101))
	v, _ := e.Get(key(42))
	require.Equal(t, 421, v)

	k := []byte(key(42))
	allocs := testing.AllocsPerRun(100, func() { Put(&e, k, 7) })
	require.Zero(t, allocs, "an update made a string of its key")
}

func TestZeroValues(t *testing.T) {
	var m Map[int]
	require.Equal(t, 0, m.Len())
	_, ok := m.Get("a")
	require.False(t, ok)
	require.Empty(t, collect(m.All()))
	require.Empty(t, collect(m.From("")))

	var e Editor[int]
	require.Equal(t, 0, e.Len())
	require.Equal(t, Map[int]{}, e.Map())
	e.Append("a", 1)
	require.Equal(t, []kv{{"a", 1}}, collect(e.Map().All()))
}

func TestAppendOutOfOrderPanics(t *testing.T) {
	var e Editor[int]
	e.Append("b", 1)
	msg := `cow: Append("a"): key does not sort after the last key "b"`
	require.PanicsWithValue(t, msg, func() { e.Append("a", 2) }) // fast path
	e.Map()
	require.PanicsWithValue(t, msg, func() { e.Append("a", 2) }) // slow path
	require.Panics(t, func() { e.Append("b", 2) })               // equal
	require.Equal(t, []kv{{"b", 1}}, collect(e.All()))
}

// TestAppendFillsNodes checks that a tree built by Append, or by Set in
// ascending order (published now and then, as a view does), keeps its nodes
// nearly full: all but the rightmost spine hold maxItems-1 items.
func TestAppendFillsNodes(t *testing.T) {
	for _, how := range []string{"Append", "Set"} {
		t.Run(how, func(t *testing.T) {
			var e Editor[int]
			const n = 100_000
			for i := range n {
				if how == "Append" {
					e.Append(key(i), i)
				} else if _, replaced := e.Set(key(i), i); replaced {
					t.Fatalf("Set(%q) replaced a value", key(i))
				}
				if i%1000 == 0 {
					e.Map()
				}
			}
			checkFull(t, &e, n)
		})
	}
}

func checkFull(t *testing.T, e *Editor[int], n int) {
	require.NoError(t, checkTree(e.root, n))
	var walk func(nd *node[int], spine bool)
	walk = func(nd *node[int], spine bool) {
		if !spine {
			require.Equal(t, maxItems-1, len(nd.items))
		}
		for i, c := range nd.children {
			walk(c, spine && i == len(nd.children)-1)
		}
	}
	walk(e.root, true)
}

// TestRandomAgainstOracle runs random Set, Delete and Append over several
// generations of growth and shrinkage, publishing at random points and
// sometimes going on from an old snapshot. It checks the tree invariants
// after every op, and that every snapshot still equals the oracle's copy
// taken when it was published.
func TestRandomAgainstOracle(t *testing.T) {
	for seed := range uint64(3) {
		t.Run("", func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 99))
			h := newHarness(t)
			for range 3 { // generations of growth and shrinkage
				randomPhase(h, rng, 2000, 0.55)
				randomPhase(h, rng, 2000, 0.30)
				for h.e.Len() > 0 { // shrink to empty
					h.del(h.o.keys[rng.IntN(len(h.o.keys))])
					h.checkOp()
				}
				require.Nil(t, h.e.root, "emptied map has an empty root")
				h.snapshot()
				h.checkAll()
			}
			t.Logf("%d snapshots checked; up to %d keys, %d levels", len(h.snaps), h.maxLen, h.maxHeight)
		})
	}
}

// randomPhase runs ops random ops; grow is the share of Sets of new keys.
func randomPhase(h *harness, rng *rand.Rand, ops int, grow float64) {
	space := 3 * (h.e.Len() + 1000)
	for i := range ops {
		switch r := rng.Float64(); {
		case r < grow:
			h.set(key(rng.IntN(space)))
		case r < grow+0.05 && len(h.o.keys) > 0: // replace
			h.set(h.o.keys[rng.IntN(len(h.o.keys))])
		case r < 0.90 && len(h.o.keys) > 0:
			h.del(h.o.keys[rng.IntN(len(h.o.keys))])
		case r < 0.92:
			h.del(key(rng.IntN(space))) // mostly missing
		case r < 0.975:
			h.appendRun(1+rng.IntN(100), rng.IntN(3), true)
		case r < 0.985:
			h.snapshot()
		default:
			if len(h.snaps) > 0 && rng.IntN(3) == 0 {
				h.branch(rng.IntN(len(h.snaps)))
			}
		}
		h.checkOp()
		if i%500 == 0 {
			h.checkEditor()
		}
	}
	h.checkEditor()
}

// TestLargeTree deletes most of a four-level tree built by Append, in
// random order, with Sets between, and checks it against a snapshot taken
// first, which must not change.
func TestLargeTree(t *testing.T) {
	const n = 300_000
	var e Editor[int]
	for i := range n {
		e.Append(key(i), i)
	}
	require.Equal(t, 4, height(e.root))
	full := e.Map()
	rng := rand.New(rand.NewPCG(4, 4))
	want := map[string]int{}
	for i := range n {
		want[key(i)] = i
	}
	for j, i := range rng.Perm(n)[:n-1000] {
		_, ok := e.Delete(key(i))
		require.True(t, ok)
		delete(want, key(i))
		if j%7 == 0 {
			k := key(rng.IntN(n))
			e.Set(k, -j)
			want[k] = -j
		}
		if j%20_000 == 0 {
			require.NoError(t, checkTree(e.root, e.Len()))
			e.Map() // a new generation now and then
		}
	}
	require.NoError(t, checkTree(e.root, e.Len()))
	require.NoError(t, sameContents(&e, want, slices.Sorted(maps.Keys(want))))
	require.NoError(t, readAll(full))
	for k, v := range full.All() {
		require.Equal(t, key(v), k)
	}
}

// TestEditDoesNotChangeItsMap edits two editors from one Map and checks
// that neither sees the other's changes and the Map sees neither.
func TestEditDoesNotChangeItsMap(t *testing.T) {
	var e Editor[int]
	for i := range 5000 {
		e.Append(key(i), i)
	}
	m := e.Map()
	a, b := m.Edit(), m.Edit()
	for i := range 5000 {
		if i%2 == 0 {
			a.Delete(key(i))
		} else {
			b.Set(key(i), -i)
		}
	}
	a.Append(key(9999), 1)
	require.Equal(t, 5000, m.Len())
	for k, v := range m.All() {
		require.Equal(t, key(v), k)
	}
	require.Equal(t, 2501, a.Len())
	require.Equal(t, 5000, b.Len())
	v, ok := b.Get(key(2))
	require.True(t, ok)
	require.Equal(t, 2, v)
}

func TestIterationStops(t *testing.T) {
	var e Editor[int]
	for i := range 10_000 {
		e.Set(key(i*7%10_000), i)
	}
	m := e.Map()
	for _, stop := range []int{1, 63, 64, 500, 9999} {
		n := 0
		for range m.All() {
			n++
			if n == stop {
				break
			}
		}
		require.Equal(t, stop, n)
		n = 0
		for k := range m.From(key(100)) {
			if n == 0 {
				require.Equal(t, key(100), k)
			}
			n++
			if n == stop {
				break
			}
		}
		require.Equal(t, min(stop, 9900), n)
	}
}

// TestConcurrentReaders reads published Maps from other goroutines while
// the editor goes on; run with -race.
func TestConcurrentReaders(t *testing.T) {
	var e Editor[int]
	pub := make(chan Map[int], 8)
	errs := make(chan error, 4)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for m := range pub {
				if err := readAll(m); err != nil {
					errs <- err
					for range pub { // drain
					}
				}
			}
		})
	}
	rng := rand.New(rand.NewPCG(1, 1))
	for batch := range 300 {
		for range 50 {
			if k := key(rng.IntN(3000)); rng.IntN(3) == 0 {
				e.Delete(k)
			} else {
				e.Set(k, batch)
			}
		}
		m := e.Map()
		pub <- m
		pub <- m
	}
	close(pub)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

// readAll checks m's tree and that All yields Len ascending keys.
func readAll(m Map[int]) error {
	if err := checkTree(m.root, m.Len()); err != nil {
		return err
	}
	n, prev := 0, ""
	for k := range m.All() {
		if k <= prev {
			return fmt.Errorf("All yields %q after %q", k, prev)
		}
		prev = k
		n++
	}
	if n != m.Len() {
		return fmt.Errorf("All yields %d keys, Len is %d", n, m.Len())
	}
	return nil
}

type payload struct{ _ [64]byte } // big enough to stay out of the tiny allocator

// TestDeletedValueNotRetained checks that the tree drops its references to
// deleted and replaced values (no stale slot keeps one), and that a snapshot
// holds them until it goes.
func TestDeletedValueNotRetained(t *testing.T) {
	for _, withSnapshot := range []bool{false, true} {
		t.Run(fmt.Sprint("snapshot=", withSnapshot), func(t *testing.T) {
			testDeletedValueNotRetained(t, withSnapshot)
		})
	}
}

func testDeletedValueNotRetained(t *testing.T, withSnapshot bool) {
	const n = 20_000
	rng := rand.New(rand.NewPCG(7, 7))
	var e Editor[*payload]
	weaks := make([]weak.Pointer[payload], n)
	for _, i := range rng.Perm(n / 2) { // random Sets: splits in place
		p := new(payload)
		weaks[i] = weak.Make(p)
		e.Set(key(i), p)
	}
	for i := n / 2; i < n; i++ { // Appends: splits of the rightmost nodes
		p := new(payload)
		weaks[i] = weak.Make(p)
		e.Append(key(i), p)
	}
	var snapshot Map[*payload]
	if withSnapshot {
		snapshot = e.Map()
	}
	order := rng.Perm(n) // deletes of leaf and internal items, merges, rotations
	for _, i := range order {
		if i%3 != 0 {
			e.Delete(key(i))
		}
	}
	replaced := map[int]bool{}
	for _, i := range order[:300] {
		if i%3 == 0 {
			e.Set(key(i), new(payload))
			replaced[i] = true
		}
	}
	gc()
	if withSnapshot {
		for i := range weaks {
			require.NotNil(t, weaks[i].Value(), "#%d is held by the snapshot", i)
		}
		runtime.KeepAlive(snapshot)
		snapshot = Map[*payload]{}
		gc()
	}
	for i := range weaks {
		kept := i%3 == 0 && !replaced[i]
		require.Equal(t, kept, weaks[i].Value() != nil, "#%d kept", i)
	}
	runtime.KeepAlive(&e)
}

func gc() {
	for range 3 {
		runtime.GC()
	}
}

// TestMemoryPerItem measures the tree's own bytes per item for 100k
// pointer values, beyond each item's string header and pointer.
func TestMemoryPerItem(t *testing.T) {
	const n = 100_000
	keys := make([]string, n)
	vals := make([]*payload, n)
	for i := range n {
		keys[i], vals[i] = key(i), new(payload)
	}
	perm := rand.New(rand.NewPCG(3, 3)).Perm(n)
	build := map[string]func() Map[*payload]{
		"Append": func() Map[*payload] {
			var e Editor[*payload]
			for i := range n {
				e.Append(keys[i], vals[i])
			}
			return e.Map()
		},
		"Set random": func() Map[*payload] {
			var e Editor[*payload]
			for _, i := range perm {
				e.Set(keys[i], vals[i])
			}
			return e.Map()
		},
	}
	for _, name := range slices.Sorted(maps.Keys(build)) {
		var before, after runtime.MemStats
		gc()
		runtime.ReadMemStats(&before)
		m := build[name]()
		gc()
		runtime.ReadMemStats(&after)
		perItem := float64(after.HeapAlloc-before.HeapAlloc) / n
		overhead := perItem - float64(unsafe.Sizeof(item[*payload]{}))
		t.Logf("%s: %.1f bytes per item, %.1f of them tree overhead", name, perItem, overhead)
		require.Less(t, overhead, 40.0)
		runtime.KeepAlive(m)
	}
	runtime.KeepAlive(keys)
	runtime.KeepAlive(vals)
}

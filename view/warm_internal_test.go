package view

import (
	"bytes"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestReachedOf: a restore's catch-up ends at the first goal vouched for
// that its state reaches, by revision or by the freshness read's state,
// not only at the latest: asking again must not move the end further off.
func TestReachedOf(t *testing.T) {
	fresh := &freshness{rev: 20, count: 3, newest: 12}
	goals := []goal{{rev: 10}, {rev: 20, fresh: fresh}, {rev: 30}}
	for _, c := range []struct {
		rev, keys int
		want      int // index in goals; -1 for none
	}{
		{9, 3, -1},
		{10, 3, 0},
		{12, 3, 0},
		{12, 4, 0},
		{35, 3, 0},
	} {
		got := reachedOf(goals, int64(c.rev), c.keys)
		if c.want < 0 {
			require.Nil(t, got, "at %d with %d keys", c.rev, c.keys)
			continue
		}
		require.Same(t, &goals[c.want], got, "at %d with %d keys", c.rev, c.keys)
	}
	later := goals[1:] // the first lost its bookmark: the fresh state, then the later answer
	require.Same(t, &later[0], reachedOf(later, 12, 3), "the state the read saw")
	require.Nil(t, reachedOf(later, 12, 4))
	require.Same(t, &later[0], reachedOf(later, 25, 4))
	require.Nil(t, reachedOf(nil, 100, 3))
}

// TestLoadAllocatesWhatTheFileHolds: a saved state whose header, its
// checksum right, claims 2^30 entries and holds none is refused having
// allocated about what it held, as the reader does for an entry's
// lengths. Catches: load sizing its entries from the header's count (up
// to 2^20 entries of 96 bytes: about 100 MB for a 54-byte file).
func TestLoadAllocatesWhatTheFileHolds(t *testing.T) {
	var b bytes.Buffer
	h := stateHeader{cluster: 1, revision: 5, key: []byte("k"), count: 1 << 30}
	// writeState writes the header, then refuses the entries that are not
	// what it says: b holds a whole header with its checksum.
	_ = writeState(&b, h, func(func(*savedEntry) bool) {})
	sr, read, err := readHeader(bytes.NewReader(b.Bytes()))
	require.NoError(t, err)
	require.EqualValues(t, 1<<30, read.count)
	r := &runner[[]byte]{core: &core[[]byte]{opts: defaultOptions(), decode: DecodeBytes}}

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err = r.load(sr, read)
	runtime.ReadMemStats(&after)
	require.ErrorIs(t, err, ErrSavedCorrupt)
	alloc := after.TotalAlloc - before.TotalAlloc
	require.Less(t, alloc, uint64(4<<20), "load allocated %d bytes for a file of %d", alloc, b.Len())
}

// TestMoveOnlyToTheStateTheReadSaw: the runner moves the view to a read's
// revision (Sync without progress) only while its state is the one the
// read saw. A view that has since applied a key created after the read's
// newest key, whose delete (at or before the read's revision) is still to
// come, is not moved: moved, it would skip that delete, and hold the key
// for ever.
func TestMoveOnlyToTheStateTheReadSaw(t *testing.T) {
	f := freshness{rev: 8, count: 1, newest: 3} // the read: one key, v/a at 3
	r := &runner[[]byte]{rev: 6, ed: table[[]byte]{}.Edit()}
	a := Entry[[]byte]{Key: "v/a", CreateRevision: 3, ModRevision: 3, Version: 1}
	r.ed.Set(&a)
	x := Entry[[]byte]{Key: "v/x", CreateRevision: 6, ModRevision: 6, Version: 1} // deleted at 7
	r.ed.Set(&x)
	require.False(t, r.move(f), "a state the read did not see")
	require.EqualValues(t, 6, r.rev)

	r.ed.Delete("v/x") // the delete at 7 applied
	r.rev = 7
	require.True(t, r.move(f), "the state the read saw")
	require.EqualValues(t, 8, r.rev)
	require.False(t, r.move(f), "already there")
}

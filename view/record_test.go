package view

import (
	"errors"
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestTableKeepsEveryEntryField: a table gives back each Entry as it was
// stored, narrow or wide (a decode error, a Version beyond 32 bits), across
// Set, Append and Delete, and a published table never changes.
func TestTableKeepsEveryEntryField(t *testing.T) {
	bad := errors.New("bad value")
	narrow := Entry[[]byte]{Key: "a", Value: []byte("1"), CreateRevision: 2, ModRevision: 3, Version: 2, Lease: 7, size: 2}
	failed := Entry[[]byte]{Key: "b", Err: bad, CreateRevision: 4, ModRevision: 4, Version: 1, size: 9}
	old := Entry[[]byte]{Key: "c", Value: []byte("3"), CreateRevision: 1, ModRevision: 9, Version: math.MaxUint32 + 5, size: 2}
	long := Entry[[]byte]{Key: "d", Value: []byte("4"), CreateRevision: 1, ModRevision: 9, Version: 1, size: math.MaxInt} // wide where int has 64 bits

	ed := table[[]byte]{}.Edit()
	for _, e := range []Entry[[]byte]{narrow, failed, old, long} {
		ed.Append(&e)
	}
	first := ed.Map()
	requireEntries(t, first, narrow, failed, old, long)

	// a wide key made narrow, a narrow one made wide, one deleted
	fixed := Entry[[]byte]{Key: "b", Value: []byte("2"), CreateRevision: 4, ModRevision: 10, Version: 2, size: 2}
	prev, replaced := ed.Set(&fixed)
	require.True(t, replaced)
	require.Equal(t, failed, prev)
	broken := Entry[[]byte]{Key: "a", Err: bad, CreateRevision: 2, ModRevision: 11, Version: 3, Lease: 7, size: 5}
	prev, replaced = ed.Set(&broken)
	require.True(t, replaced)
	require.Equal(t, narrow, prev)
	gone, ok := ed.Delete("c")
	require.True(t, ok)
	require.Equal(t, old, gone)
	_, ok = ed.Delete("c")
	require.False(t, ok)

	second := ed.Map()
	requireEntries(t, second, broken, fixed, long)
	require.Equal(t, 2, second.wides.Len(), "only wide records have a wide")
	requireEntries(t, first, narrow, failed, old, long) // as it was
}

func requireEntries(t *testing.T, s table[[]byte], want ...Entry[[]byte]) {
	t.Helper()
	var got []Entry[[]byte]
	for k, e := range s.All() {
		require.Equal(t, k, e.Key)
		got = append(got, e)
		one, ok := s.Get(k)
		require.True(t, ok)
		require.Equal(t, e, one)
	}
	require.Equal(t, want, got)
	require.Equal(t, len(want), s.Len())
}

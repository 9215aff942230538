package view

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestHistoryBound: the history keeps the newest batches within its bound,
// the newest whatever its size, and its floor says what it still covers.
func TestHistoryBound(t *testing.T) {
	var h history[[]byte]
	h.init(3 * (2*changeWeight + 2)) // three batches of one change: a batch and its change weigh changeWeight each
	batch := func(rev int64, n int) Batch[[]byte] {
		b := Batch[[]byte]{Kind: Events, From: rev - 1, Revision: rev}
		for i := range n {
			k := fmt.Sprint(i)
			b.Changes = append(b.Changes, Change[[]byte]{Kind: Created, Key: k, Revision: rev, Entry: &Entry[[]byte]{Key: k, size: 2}})
		}
		return b
	}
	h.floor = 1
	for rev := int64(2); rev <= 4; rev++ {
		h.push(batch(rev, 1))
	}
	require.Len(t, h.items, 3)
	require.EqualValues(t, 1, h.floor)
	h.push(batch(5, 1))
	require.Len(t, h.items, 3)
	require.EqualValues(t, 2, h.floor, "the change of revision 2 is gone")
	require.EqualValues(t, 1, h.first)
	h.push(batch(6, 10))
	require.Len(t, h.items, 1, "the newest is kept whatever its size")
	require.EqualValues(t, 5, h.floor)
	for rev := int64(7); rev < 100; rev++ {
		h.push(batch(rev, 0))
	}
	require.Len(t, h.items, 3*(2*changeWeight+2)/changeWeight, "batches without changes are bounded too")
}

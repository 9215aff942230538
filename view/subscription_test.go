package view

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestTrim: a batch of several revisions, asked for from one inside it,
// starts there; a Relisted one is one step and keeps its changes, but
// starts there too (nothing changed between: see trim).
func TestTrim(t *testing.T) {
	b := Batch[[]byte]{Kind: Events, From: 1, Revision: 4, Changes: []Change[[]byte]{{Key: "a", Revision: 2}, {Key: "b", Revision: 3}, {Key: "c", Revision: 3}, {Key: "d", Revision: 4}}}
	got := trim(b, 3)
	require.EqualValues(t, 2, got.From)
	require.Len(t, got.Changes, 3)
	require.Equal(t, b, trim(b, 2))
	b.Kind = Relisted
	want := b
	want.From = 2
	require.Equal(t, want, trim(b, 3))
}

package view

import (
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

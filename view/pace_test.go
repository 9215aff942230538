package view

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/etcdwatch/etcdwatch"
)

// TestPacer: a response after a quiet spell is published at once; while
// responses keep coming they wait for the gap since the last publication,
// or until maxHeld of them wait.
func TestPacer(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ms := time.Millisecond
	for _, tc := range []struct {
		name  string
		after []time.Duration // arrival of each response after the last publication, at t0
		want  []time.Duration // how long each may wait
	}{
		{"quiet", []time.Duration{5 * ms}, []time.Duration{0}},
		{"at the gap", []time.Duration{ms}, []time.Duration{0}},
		{"a burst", []time.Duration{0, ms / 4, ms / 2}, []time.Duration{ms, 3 * ms / 4, ms / 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := pacer{gap: ms}
			p.published(t0)
			for i, d := range tc.after {
				require.Equal(t, tc.want[i], p.applied(t0.Add(d)), "response %d", i)
			}
		})
	}
	p := pacer{gap: ms}
	p.published(t0)
	for i := range maxHeld - 1 {
		require.NotZero(t, p.applied(t0), "response %d", i)
	}
	require.Zero(t, p.applied(t0), "maxHeld responses are published at once")
	p.published(t0)
	require.NotZero(t, p.applied(t0), "published resets the count")
}

// TestHoldStep: small steps held for publication are joined, up to etcdwatch.JoinLimit
// changes, into one step from the first's From to the last's Revision.
func TestHoldStep(t *testing.T) {
	step := func(from, n int) Batch[[]byte] {
		return Batch[[]byte]{Kind: Events, From: int64(from), Revision: int64(from + 1), Changes: make([]Change[[]byte], n)}
	}
	var held []Batch[[]byte]
	held = holdStep(held, step(1, 1))
	held = holdStep(held, step(2, 0))
	held = holdStep(held, step(2, 1))
	require.Len(t, held, 1)
	require.EqualValues(t, 1, held[0].From)
	require.EqualValues(t, 3, held[0].Revision)
	require.Len(t, held[0].Changes, 2)
	held = holdStep(held, step(3, etcdwatch.JoinLimit-1))
	require.Len(t, held, 2, "past etcdwatch.JoinLimit changes a step is kept apart")
	require.EqualValues(t, 3, held[1].From)
}

// TestProgressBatchesAreRationed: a view that moves on without changes
// holds a batch without changes for its subscribers, at most one every
// progressGap; one in between is not held but waits (later is set), and
// a step already held reaches the new revision instead.
func TestProgressBatchesAreRationed(t *testing.T) {
	u := newUnpublished[[]byte]()
	defer u.stop()
	t0 := time.Unix(1000, 0)
	require.True(t, u.moved(5, 6, t0), "the first progress batch goes")
	require.Equal(t, []Batch[[]byte]{{Kind: Events, From: 5, Revision: 6}}, u.take(t0))
	require.False(t, u.moved(6, 7, t0.Add(progressGap/2)), "a second within progressGap waits")
	require.NotNil(t, u.later.C, "and is due later")
	require.Empty(t, u.take(t0.Add(progressGap/2)))
	require.True(t, u.moved(6, 8, t0.Add(progressGap)), "once progressGap has passed, the latest goes")
	require.Nil(t, u.later.C)
	require.Equal(t, []Batch[[]byte]{{Kind: Events, From: 6, Revision: 8}}, u.take(t0.Add(progressGap)))

	u.add(Batch[[]byte]{Kind: Events, From: 8, Revision: 9, Changes: make([]Change[[]byte], 1)})
	require.True(t, u.moved(9, 12, t0.Add(progressGap+time.Millisecond)), "a held step reaches the new revision")
	steps := u.take(t0)
	require.Len(t, steps, 1)
	require.EqualValues(t, 12, steps[0].Revision)
}

// TestHoldStepJoinsUpToTheLimit: steps whose changes add up to exactly
// etcdwatch.JoinLimit are joined; one more change keeps the next apart.
func TestHoldStepJoinsUpToTheLimit(t *testing.T) {
	step := func(from, n int) Batch[[]byte] {
		return Batch[[]byte]{Kind: Events, From: int64(from), Revision: int64(from + 1), Changes: make([]Change[[]byte], n)}
	}
	held := holdStep(nil, step(1, 1))
	held = holdStep(held, step(2, etcdwatch.JoinLimit-1))
	require.Equal(t, 1, len(held), "etcdwatch.JoinLimit changes in all: joined")
	require.Len(t, held[0].Changes, etcdwatch.JoinLimit)
	require.EqualValues(t, 1, held[0].From)
	require.EqualValues(t, 3, held[0].Revision)
	held = holdStep(held, step(3, 1))
	require.Equal(t, 2, len(held), "past etcdwatch.JoinLimit a step is kept apart")
	require.EqualValues(t, 3, held[1].From)
}

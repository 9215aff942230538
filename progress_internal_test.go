package etcdwatch

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCreatesSpareTheCallsScan: sending creates lowers the needs of calls
// that wait for every watch, or for the creates up to a queued one; while
// none does, it leaves the calls alone and costs nothing (flushCreates
// runs after every created response).
func TestCreatesSpareTheCallsScan(t *testing.T) {
	var p progressState
	for range 10 {
		p.waiting = append(p.waiting, &progressWaiter{ctx: context.Background(), needs: 5})
	}
	w := &Watch{}
	p.waiting[0].upTo = w // left over: forAll says no call waits for queued creates
	require.Zero(t, testing.AllocsPerRun(100, func() {
		p.sentUpTo(w, 7)
		p.allSent(7)
	}))
	require.Same(t, w, p.waiting[0].upTo, "no scan while forAll is false")
	require.EqualValues(t, 5, p.waiting[0].needs)
	p.waiting[0].upTo = nil

	p.waiting[0].needs, p.waiting[1].upTo, p.forAll = int64(allCreates), w, true
	p.sentUpTo(w, 9)
	require.EqualValues(t, 5, p.waiting[1].needs, "min of its needs and the last create sent")
	require.Nil(t, p.waiting[1].upTo)
	require.Equal(t, int64(allCreates), p.waiting[0].needs, "its watches are not all sent yet")
	p.allSent(11)
	require.EqualValues(t, 11, p.waiting[0].needs)
	require.False(t, p.forAll)
}

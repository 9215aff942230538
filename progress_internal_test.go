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

// TestCaughtUp: which active watches an answer at revision 10 need not
// cover, whichever request it is to.
func TestCaughtUp(t *testing.T) {
	for _, c := range []struct {
		name  string
		flags entryFlags
		rev   int64
		want  bool
	}{
		{"created from now on this stream, nothing since", nowHere | unanchored, 3, true},
		{"created from now on this stream, an event since", nowHere, 4, true},
		{"from an old revision, behind the answer", 0, 9, false},
		{"from an old revision, up to it", 0, 10, true},
		{"from a revision past it", 0, 12, true},
		{"unanchored and not from now here: its start is not known", unanchored, 12, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := entry{flags: c.flags, rev: c.rev}
			require.Equal(t, c.want, e.caughtUp(10))
		})
	}
}

// TestActivateRecordsACreateFromNow: nowHere says what the create just
// confirmed asked for, and a watch created again from its revision loses it.
func TestActivateRecordsACreateFromNow(t *testing.T) {
	d := &dispatcher{watches: make(map[int64]*Watch), s: &Stream{}}
	w := &Watch{}
	w.entry.init(Request{Key: []byte("k")}, 0)
	d.activate(w, 1, 10)
	require.True(t, w.entry.is(nowHere))
	w.entry.set(fromNow, false) // as requeued: the next create asks from its revision
	d.activate(w, 2, 12)
	require.False(t, w.entry.is(nowHere))
}

// TestProgressCoversStayBounded: requests sent after ever newer creates
// and never answered keep at most maxCovers runs: the ones past the
// limit join the newest, which covers no more than its first request did,
// and every request is still counted, oldest answered first. Catches: a
// run kept for every request, growing for as long as the server answers
// nothing.
func TestProgressCoversStayBounded(t *testing.T) {
	var p progressState
	const sent = 20
	for last := int64(1); last <= sent; last++ {
		p.sent(last)
	}
	require.Len(t, p.covers, maxCovers)
	n := 0
	for _, c := range p.covers {
		n += c.n
	}
	require.Equal(t, sent, n, "every request counted")
	for last := int64(1); last < maxCovers; last++ {
		require.Equal(t, last, p.coverage())
	}
	for range sent - maxCovers + 1 {
		require.EqualValues(t, maxCovers, p.coverage(), "the newest run covers what its first request did")
	}
	require.Empty(t, p.covers)
}

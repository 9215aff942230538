package etcdwatch

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// TestNothingIsTakenAfterAPumpGaveUp: at Close a pump whose consumer is
// not reading gives up its backlog, while the dispatcher may still hand
// out a few responses it had already read before it ends the watch. What
// comes then follows what was dropped and must not be taken. Catches a
// later response handed straight to a consumer that had started reading,
// after a gap (a review found 5 gaps in 400 tries: revision 2149, then
// 2185), or queued for a new pump.
func TestNothingIsTakenAfterAPumpGaveUp(t *testing.T) {
	var o delivery
	o.init(1, nil)
	limit := bufferLimit{events: 100, bytes: 1 << 20}
	start, _ := o.push(nil, Response{Revision: 2, Events: []Event{{KeyValue: KeyValue{ModRevision: 2}}}}, limit)
	require.True(t, start, "no reader: queued for a pump")
	r, ok, _ := o.next(load{}, limit) // the pump takes the head, and gives up at Close
	require.True(t, ok)
	require.Equal(t, int64(2), r.Revision)
	o.giveUp()

	taken := make(chan Response, 1)
	go func() {
		r, ok := <-o.ch
		if ok {
			taken <- r
		}
		close(taken)
	}()
	for range 100 { // whether or not the reader is waiting yet
		start, behind := o.push(nil, Response{Revision: 4, Events: []Event{{KeyValue: KeyValue{ModRevision: 4}}}}, limit)
		require.False(t, start, "queued for a new pump after the backlog was dropped")
		require.False(t, behind)
	}
	require.Equal(t, int64(1), o.delivered.Load(), "a response after the dropped one was taken")
	o.abort(ErrClosed)
	_, got := <-taken
	require.False(t, got, "the consumer got a response after a gap")
}

// TestWatchKeepsItsSizeClass: every idle watch is a Watch, so a field that
// pushes it into the next allocation size class costs every watch that
// much (144 to 160 bytes: a bool added to delivery did, measured as 16 B
// more a watch in make bench). A field a watch needs only once it is
// behind or ended goes in more.
func TestWatchKeepsItsSizeClass(t *testing.T) {
	require.LessOrEqual(t, unsafe.Sizeof(Watch{}), uintptr(144), "Watch outgrew its 144-byte size class")
}

// TestQueuedBookmarkIsSuperseded: a bookmark pushed behind a bookmark still
// queued for a consumer that is behind replaces it: the consumer gets the
// newer one alone, and the backlog counts one. Catches: bookmarks piling
// up in the backlog of a consumer that is not reading, each counted
// against its buffer limit.
func TestQueuedBookmarkIsSuperseded(t *testing.T) {
	var o delivery
	o.init(1, nil)
	limit := bufferLimit{events: 100, bytes: 1 << 20}
	start, _ := o.push(nil, Response{Revision: 2, Events: []Event{{KeyValue: KeyValue{ModRevision: 2}}}}, limit)
	require.True(t, start, "no reader: queued for a pump")
	for rev := int64(3); rev <= 5; rev++ {
		o.push(nil, Response{Revision: rev}, limit)
	}
	require.Equal(t, 2, o.more.queue.Len())
	require.Equal(t, load{events: 2, bytes: eventOverhead}, o.more.queued)
	var got []int64
	for r, ok, _ := o.next(load{}, limit); ok; r, ok, _ = o.next(weigh(r), limit) {
		got = append(got, r.Revision)
	}
	require.Equal(t, []int64{2, 5}, got)
	o.abort(ErrClosed)
}

// wide returns a response at revision rev with n events: with n > 32, too
// many to be joined with another such response in a backlog.
func wide(rev int64, n int) Response {
	r := Response{Revision: rev}
	for range n {
		r.Events = append(r.Events, Event{KeyValue: KeyValue{Key: []byte("k"), ModRevision: rev}})
	}
	return r
}

// TestDrainedBacklogKeepsASmallBuffer: a backlog that grew large for a
// burst lets its buffer go once it is through, for a channel's pump and a
// Handler's goroutine alike: a watch keeps at most keptQueue slots for the
// next burst. Catches: every watch that once fell behind keeping the
// largest buffer it ever needed (a thousand watches behind once, a
// thousand large buffers for good).
func TestDrainedBacklogKeepsASmallBuffer(t *testing.T) {
	const n = 64 // responses queued at once
	limit := bufferLimit{events: 1 << 20, bytes: 1 << 30}
	t.Run("pump", func(t *testing.T) {
		var o delivery
		o.init(1, nil)
		for rev := int64(2); rev < 2+n; rev++ {
			o.push(nil, wide(rev, 40), limit)
		}
		require.Greater(t, o.more.queue.Cap(), keptQueue)
		var got []int64
		for r, ok, _ := o.next(load{}, limit); ok; r, ok, _ = o.next(weigh(r), limit) {
			got = append(got, r.Revision)
		}
		require.Len(t, got, n)
		require.Zero(t, o.more.queued, "the drained backlog still counts")
		require.LessOrEqual(t, o.more.queue.Cap(), keptQueue, "a drained backlog kept its large buffer")
		o.abort(ErrClosed)
	})
	t.Run("handler", func(t *testing.T) {
		var o delivery
		o.init(1, &Handler{max: 1})
		o.pumping = true // being served: push queues, and schedules nothing
		for rev := int64(2); rev < 2+n; rev++ {
			o.push(nil, wide(rev, 40), limit)
		}
		require.Greater(t, o.more.queue.Cap(), keptQueue)
		var got []int64
		var took load
		for {
			r, step, _ := o.handled(took, limit)
			if step != stepHandle {
				require.Equal(t, stepIdle, step)
				break
			}
			got = append(got, r.Revision)
			took = weigh(r)
		}
		require.Len(t, got, n)
		require.Zero(t, o.more.queued, "the drained backlog still counts")
		require.LessOrEqual(t, o.more.queue.Cap(), keptQueue, "a drained backlog kept its large buffer")
	})
}

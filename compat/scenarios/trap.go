package scenarios

import (
	"context"
	"errors"
	"testing"

	"github.com/etcdwatch/etcdwatch"
)

// progressAfterCut: a watch that has delivered the store's newest revision
// is re-created on a new stream after a cut, and nothing is written after.
// Re-created from the revision after its own, it would start ahead of the
// store, and etcd 3.5.13+, 3.6 and 3.7 would then answer no progress
// request on that stream until the next write anywhere (the future-
// revision trap). It asks for its own revision again instead: progress is
// answered (a hang here is the trap), the watch gets the bookmark, and the
// event sent a second time is dropped without counting as a duplicate.
func progressAfterCut(t *testing.T, e *Env) {
	prefix := unique("progress-after-cut")
	proxy := NewProxy(t, e.Endpoint)
	s := open(t, proxy.Addr())
	ctx, cancel := context.WithTimeout(t.Context(), Wait)
	defer cancel()
	w, err := s.Watch(ctx, etcdwatch.Prefix(prefix))
	must(t, err)
	rev := e.put(t, prefix+"k", "v") // the newest revision: nothing is written after it
	events := nextEvents(t, w)
	check(t, events[0].ModRevision == rev, "event at %d, want %d", events[0].ModRevision, rev)

	check(t, proxy.Cut() > 0, "no connection to cut")
	// Until an answer comes on the new stream: one asked once the watch
	// has moved there (an answer from the old stream before the cut
	// showed says nothing).
	var got int64
	for {
		moved := s.Stats().Moved > 0
		got, err = s.RequestProgress(ctx)
		if err != nil || moved {
			break
		}
	}
	if e.Version.ProgressRunsAhead() {
		check(t, errors.Is(err, etcdwatch.ErrProgressUnsupported), "RequestProgress on etcd %s: %v", e.Version, err)
	} else {
		must(t, err) // within Wait: the trap would hold it until the next write
		check(t, got >= rev, "progress at %d, below the write at %d", got, rev)
		untilBookmark(t, w, got)
	}
	after := e.put(t, prefix+"k", "after") // the next write comes once, on the new stream
	for r := next(t, w); r.Revision < after; r = next(t, w) {
		for _, ev := range r.Events {
			check(t, ev.ModRevision == after, "event at %d after the cut, want only the write at %d", ev.ModRevision, after)
		}
	}
	st := s.Stats()
	check(t, st.Reconnects >= 1 && st.DuplicatesDropped == 0, "after the cut: %d reconnects, %d duplicates dropped; want 1+ and 0",
		st.Reconnects, st.DuplicatesDropped)
	t.Logf("etcd %s: progress at %d right after a cut, the watch at the store's newest revision %d", e.Version, got, rev)
}

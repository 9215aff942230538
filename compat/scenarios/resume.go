package scenarios

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/etcdwatch/etcdwatch"
)

// write is one put the resume scenario made.
type write struct {
	key, value string
	rev        int64
}

// recording is a watch and what it is expected to see.
type recording struct {
	w      *etcdwatch.Watch
	match  func(key string) bool
	from   int64 // the first revision it may see
	events []etcdwatch.Event
}

// expected returns the writes the recording should have seen.
func (r *recording) expected(writes []write) []write {
	var want []write
	for _, w := range writes {
		if w.rev >= r.from && r.match(w.key) {
			want = append(want, w)
		}
	}
	return want
}

// resumeAfterCut cuts the connection five times between rounds of writes
// (through a loopback proxy) and checks that every watch, from a revision
// or from now, with and without PrevKV, delivers exactly its history: each
// write once, in order, none missing, previous values right.
func resumeAfterCut(t *testing.T, e *Env) {
	const cuts, perRound = 5, 20
	proxy := NewProxy(t, e.Endpoint)
	s := open(t, proxy.Addr(), etcdwatch.WithReconnectBackoff(10*time.Millisecond, 200*time.Millisecond))
	ctx, prefix := t.Context(), unique("cuts")
	key := func(i int) string { return fmt.Sprintf("%sk%02d", prefix, i%5) }
	startRev := e.put(t, key(0), "start")
	writes := []write{{key(0), "start", startRev}}
	isPrefix := func(k string) bool { return strings.HasPrefix(k, prefix) }
	var recs []*recording
	for _, c := range []struct {
		req   etcdwatch.Request
		match func(string) bool
		from  int64
	}{
		{etcdwatch.Prefix(prefix).FromRevision(startRev), isPrefix, startRev},
		{etcdwatch.Prefix(prefix).WithPrevKV().FromRevision(startRev), isPrefix, startRev},
		{etcdwatch.Key(key(1)).FromRevision(startRev), func(k string) bool { return k == key(1) }, startRev},
		{etcdwatch.Prefix(prefix), isPrefix, startRev + 1}, // from now: after the start write
	} {
		w, err := s.Watch(ctx, c.req)
		must(t, err)
		recs = append(recs, &recording{w: w, match: c.match, from: c.from})
	}
	for round := 0; round <= cuts; round++ {
		for i := range perRound {
			v := fmt.Sprint(round, "-", i)
			writes = append(writes, write{key(i), v, e.put(t, key(i), v)})
		}
		for _, r := range recs { // each reads up to its last expected write, so the stream is up
			for want := len(r.expected(writes)); len(r.events) < want; {
				r.events = append(r.events, nextEvents(t, r.w)...)
			}
		}
		if round < cuts {
			check(t, proxy.Cut() >= 1, "round %d: no connection to cut", round)
		}
	}
	for i, r := range recs {
		want := r.expected(writes)
		var got []write
		for _, ev := range r.events {
			got = append(got, write{string(ev.Key), string(ev.Value), ev.ModRevision})
		}
		equal(t, want, got, fmt.Sprintf("watch %d on %s", i, r.w.Request()))
	}
	last := map[string]string{}
	for i, w := range writes { // the PrevKV watch saw each key's value before
		prev := recs[1].events[i].PrevKV
		want, had := last[w.key]
		check(t, had == (prev != nil), "write %d: PrevKV %v, want one: %v", i, prev, had)
		if prev != nil {
			check(t, string(prev.Value) == want, "write %d: PrevKV %q, want %q", i, prev.Value, want)
		}
		last[w.key] = w.value
	}
	st := s.Stats()
	check(t, st.Reconnects >= cuts, "%d reconnects after %d cuts", st.Reconnects, cuts)
	t.Logf("%d cuts: %d reconnects, %d watches resumed, %d duplicates dropped; %d writes checked on %d watches",
		cuts, st.Reconnects, st.Moved, st.DuplicatesDropped, len(writes), len(recs))
}

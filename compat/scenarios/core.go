package scenarios

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"

	"github.com/etcdwatch/etcdwatch"
)

// seedRace is the reported interleaving: while a writer keeps one watch
// busy, 250 more are created on the same stream, by one WatchAll and by 10
// goroutines calling Watch. The busy watch must get every write in order,
// and each new watch exactly its own event.
func seedRace(t *testing.T, e *Env) {
	t.Run("WatchAll", func(t *testing.T) { seedRaceWith(t, e, true) })
	t.Run("Watch", func(t *testing.T) { seedRaceWith(t, e, false) })
}

func seedRaceWith(t *testing.T, e *Env, watchAll bool) {
	const n = 250
	s, ctx, prefix := open(t, e.Endpoint), t.Context(), unique("race")
	busy, err := s.Watch(ctx, etcdwatch.Prefix(prefix+"busy/"))
	must(t, err)
	upTo := make(chan int64, 1)
	got := make(chan []int64, 1)
	go func() { // exits once it has read up to the revision sent on upTo, or the watch ends
		var revs []int64
		defer func() { got <- revs }()
		last, seen := int64(-1), int64(0)
		for last < 0 || seen < last {
			select {
			case r, ok := <-busy.Responses():
				if !ok {
					return
				}
				for _, ev := range r.Events {
					revs = append(revs, ev.ModRevision)
				}
				seen = r.Revision
			case last = <-upTo:
				upTo = nil
			}
		}
	}()

	stop := make(chan struct{})
	written := make(chan []int64, 1)
	var writeErr error
	go func() { // the writer: exits when stop is closed, or at its first error
		var revs []int64
		defer func() { written <- revs }()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			rev, err := e.tryPut(ctx, prefix+"busy/k", strconv.Itoa(i))
			if err != nil {
				writeErr = err
				return
			}
			revs = append(revs, rev)
		}
	}()

	own := func(i int) string { return fmt.Sprintf("%sown/%03d", prefix, i) }
	var watches []*etcdwatch.Watch
	if watchAll {
		reqs := make([]etcdwatch.Request, n)
		for i := range reqs {
			reqs[i] = etcdwatch.Key(own(i))
		}
		watches, err = s.WatchAll(ctx, reqs...)
		must(t, err)
	} else {
		watches = watchFrom(t, s, 10, n/10, own)
	}
	for i := 0; i < n; i += 50 {
		var kvs [][2]string
		for j := i; j < i+50; j++ {
			kvs = append(kvs, [2]string{own(j), fmt.Sprint("own-", j)})
		}
		e.txn(t, kvs...)
	}
	close(stop)
	revs := <-written
	must(t, writeErr)
	check(t, len(revs) > 0, "the writer wrote nothing")
	upTo <- revs[len(revs)-1]
	equal(t, revs, <-got, "busy watch: revisions of its events")

	ownEvent := func(i int) {
		events := nextEvents(t, watches[i])
		check(t, len(events) == 1 && string(events[0].Key) == own(i) && string(events[0].Value) == fmt.Sprint("own-", i),
			"watch %d on %s got %v", i, own(i), events)
	}
	// Then nothing else up to a bookmark. A server with etcd #15220 answers
	// progress at once, ahead of events it holds back (a watcher whose
	// channel was full waits as a victim), so there the Stream refuses
	// RequestProgress, and each watch's own event is all there is to see.
	if e.Version.ProgressRunsAhead() {
		for i := range watches {
			ownEvent(i)
		}
		_, err := s.RequestProgress(ctx)
		check(t, errors.Is(err, etcdwatch.ErrProgressUnsupported), "RequestProgress on etcd %s: %v", e.Version, err)
		t.Logf("%d watches created beside %d writes; progress refused on %s", n, len(revs), e.Version)
		return
	}
	rev, err := s.RequestProgress(ctx)
	must(t, err)
	for i, w := range watches {
		ownEvent(i)
		untilBookmark(t, w, rev)
	}
	t.Logf("%d watches created beside %d writes; progress at %d", n, len(revs), rev)
}

// watchFrom opens goroutines*each watches, watch i on key(i), from that
// many goroutines calling Watch on one stream, in order of i.
func watchFrom(t *testing.T, s *etcdwatch.Stream, goroutines, each int, key func(int) string) []*etcdwatch.Watch {
	t.Helper()
	watches := make([]*etcdwatch.Watch, goroutines*each)
	errs := make([]error, goroutines)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				w, err := s.Watch(t.Context(), etcdwatch.Key(key(g*each+i)))
				if err != nil {
					errs[g] = err
					return
				}
				watches[g*each+i] = w
			}
		})
	}
	wg.Wait()
	must(t, errors.Join(errs...))
	return watches
}

// manyCreates opens 5,000 watches from 50 goroutines on one stream; each
// gets exactly the write to its own key.
func manyCreates(t *testing.T, e *Env) {
	const goroutines, each = 50, 100
	s, prefix := open(t, e.Endpoint), unique("many")
	key := func(i int) string { return fmt.Sprintf("%s%04d", prefix, i) }
	watches := watchFrom(t, s, goroutines, each, key)
	check(t, s.Stats().Watches == goroutines*each, "Stats.Watches %d", s.Stats().Watches)
	for i := 0; i < len(watches); i += 100 { // etcd's default --max-txn-ops is 128
		var kvs [][2]string
		for j := i; j < i+100; j++ {
			kvs = append(kvs, [2]string{key(j), strconv.Itoa(j)})
		}
		e.txn(t, kvs...)
	}
	for i, w := range watches {
		events := nextEvents(t, w)
		check(t, len(events) == 1 && string(events[0].Key) == key(i) && string(events[0].Value) == strconv.Itoa(i),
			"watch %d got %v", i, events)
	}
	t.Logf("%d watches, each got its own event", len(watches))
}

// compaction: a watch from a compacted revision ends with *CompactedError
// naming both revisions; one from the compaction point works.
func compaction(t *testing.T, e *Env) {
	s, ctx, key := open(t, e.Endpoint), t.Context(), unique("compact")+"k"
	var revs []int64
	for i := range 5 {
		revs = append(revs, e.put(t, key, strconv.Itoa(i)))
	}
	e.compact(t, revs[3])
	w, err := s.Watch(ctx, etcdwatch.Key(key).FromRevision(revs[0]))
	must(t, err) // etcd confirms the create, then cancels it
	for r := range w.Responses() {
		t.Fatalf("a compacted watch delivered %v", r)
	}
	var ce *etcdwatch.CompactedError
	check(t, errors.As(w.Err(), &ce), "watch ended with %v, not a *CompactedError", w.Err())
	check(t, ce.CompactRevision == revs[3] && ce.Revision == revs[0], "CompactedError %+v, want compact %d, revision %d", *ce, revs[3], revs[0])
	check(t, errors.Is(w.Err(), etcdwatch.ErrCompacted), "not ErrCompacted: %v", w.Err())

	w, err = s.Watch(ctx, etcdwatch.Key(key).FromRevision(revs[3]))
	must(t, err)
	var got []int64
	for len(got) < 2 {
		for _, ev := range nextEvents(t, w) {
			got = append(got, ev.ModRevision)
		}
	}
	equal(t, revs[3:], got, "watch from the compaction point")
}

// fragments: a transaction whose watch response exceeds the server's limit
// arrives in fragments, and the watch delivers each revision whole.
func fragments(t *testing.T, e *Env) {
	s, ctx, prefix := open(t, e.Endpoint), t.Context(), unique("frag")
	w, err := s.Watch(ctx, etcdwatch.Prefix(prefix).WithPrevKV().WithFragment())
	must(t, err)
	value := func(b byte) string { return string(bytes.Repeat([]byte{b}, 1<<20)) }
	txn := func(b byte) int64 {
		var kvs [][2]string
		for i := range 3 {
			kvs = append(kvs, [2]string{fmt.Sprint(prefix, i), value(b)})
		}
		return e.txn(t, kvs...)
	}
	first := txn('a')
	second := txn('b') // with previous values about 6 MiB, above the 4 MiB threshold
	var revs []int64
	for len(revs) < 2 {
		r := next(t, w)
		if r.IsProgress() {
			continue
		}
		check(t, len(r.Events) == 3, "a revision was split or joined: %d events", len(r.Events))
		for i, ev := range r.Events {
			check(t, string(ev.Key) == fmt.Sprint(prefix, i), "event %d has key %q", i, ev.Key)
			check(t, ev.ModRevision == r.Events[0].ModRevision, "events of several revisions in one response")
		}
		revs = append(revs, r.Events[0].ModRevision)
		if len(revs) == 2 {
			for _, ev := range r.Events {
				check(t, string(ev.Value) == value('b') && ev.PrevKV != nil && string(ev.PrevKV.Value) == value('a'),
					"event at %d: wrong value or previous value", ev.ModRevision)
			}
		}
	}
	equal(t, []int64{first, second}, revs, "revisions")
	st := s.Stats()
	check(t, st.Fragments > 0, "the server sent no fragments; the scenario proves nothing")
	t.Logf("%d fragments joined", st.Fragments)
}

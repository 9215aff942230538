package group

import (
	"time"

	"github.com/etcdwatch/etcdwatch"
	"github.com/etcdwatch/etcdwatch/internal/health"
)

// StreamInfo is one Stream of the group as Streams reports it.
type StreamInfo struct {
	// Name is "0" to "N-1" for the group's N Streams (WithStreams), and
	// "pinned" for the pinned Streams together.
	Name string
	// Member is the address of the member the Stream's Watch RPC is on,
	// as gRPC reports the RPC's peer: "" until the first response on it,
	// and between an RPC's end and the next one's first response. Always
	// "" for the pinned Streams together.
	Member string
	// Stats are the Stream's counters. For the pinned Streams together,
	// every pinned Stream's since New, those closed included.
	Stats etcdwatch.Stats
	// State is the Stream's state. For the pinned Streams together, it is
	// connected while every pinned Stream open now is, and when none is;
	// its Since is when that last changed, as Streams saw it (pinned
	// Streams opening and closing move it no more than a blip between two
	// calls), and its last error is the latest of any pinned Stream's,
	// those closed included.
	State etcdwatch.State
}

// Streams returns each of the group's Streams, in order, then the pinned
// Streams together: always WithStreams + 1 of them, whose Names do not
// change, so that a metric per Stream (etcdwatchprom.NewGroup) keeps its
// label values.
func (g *Group) Streams() []StreamInfo {
	out := make([]StreamInfo, 0, len(g.own)+1)
	for _, sl := range g.own {
		out = append(out, StreamInfo{Name: sl.name, Member: sl.track.where(), Stats: sl.stream.Stats(), State: sl.stream.State()})
	}
	pinned := StreamInfo{Name: "pinned"}
	g.mu.Lock()
	defer g.mu.Unlock()
	pinned.Stats = g.retired
	for sl := range g.pinned {
		pinned.Stats = add(pinned.Stats, sl.stream.Stats())
	}
	pinned.State = g.pinnedState()
	pinned.State.Since = g.steadyPinned.Keep(pinned.State.Connected, pinned.State.Since, time.Time{})
	return append(out, pinned)
}

// pinnedState is the pinned Streams' State together: of those that count
// (neither retiring nor opening), combined, or rest when none does; its
// last error is the latest of theirs and of those closed. Called under mu.
func (g *Group) pinnedState() etcdwatch.State {
	st, first := g.rest, true
	for sl := range g.pinned {
		s := sl.stream.State()
		switch {
		case sl.retiring || opening(s):
		case first:
			st, first = s, false
		default:
			st = combine(st, s)
		}
	}
	return laterError(st, g.rest)
}

// restAfter is rest once a pinned Stream has closed, the pinned State
// having been before just before: it keeps the latest error, and reads
// connected, since before's Since if before was connected, else since now
// (should none count any more, none is down). While others count, only
// its error shows.
func restAfter(rest, before etcdwatch.State, now time.Time) etcdwatch.State {
	next := etcdwatch.State{Connected: true, Since: now, LastError: rest.LastError, LastErrorAt: rest.LastErrorAt}
	if before.Connected {
		next.Since = before.Since
	}
	return laterError(next, before)
}

// opening: a Stream opened for a pinned watch whose server has not
// answered yet, nor has anything failed on it. Left out of the group's
// State, which would otherwise read disconnected for a round trip at each
// WatchPinned (and each relist of a view on the group). The group's own
// Streams count from the start: until their servers answer, the group is
// not connected.
func opening(st etcdwatch.State) bool { return !st.Connected && st.LastError == nil }

// Stats returns the counters of every Stream of the group added together,
// pinned Streams included, those closed too: Watches and Paused are the
// watches running and paused now, and the counts are totals since New.
// Revision and LastMessage are the highest of any Stream, IDsRewritten
// true if it is on any. Streams gives each Stream's.
func (g *Group) Stats() etcdwatch.Stats {
	var total etcdwatch.Stats
	for _, sl := range g.own {
		total = add(total, sl.stream.Stats())
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	total = add(total, g.retired)
	for sl := range g.pinned {
		total = add(total, sl.stream.Stats())
	}
	return total
}

// State returns the group's Streams' State together, pinned ones
// included once their servers have answered (a Stream whose server has
// neither answered nor failed yet is not counted) and until their
// watches end (a pinned Stream closing is no failure): connected while
// every one that counts is, since that last changed as State saw it (a
// pinned Stream joining or leaving does not change Since), and the
// latest error of any. Of the group's own Streams, one with no watch
// whose server has not answered yet (asked nothing: fewer watches than
// Streams, or views alone, whose watches are pinned) counts by its errors
// only, and so does one that failed for good, which placement leaves
// out; while none counts otherwise, they all do, so that a group just
// opened reads disconnected until a server answers. Failed is set once
// every Stream of the group's own has failed for good: one that failed
// alone gets no new watch while another can take it. Streams gives each
// Stream's.
func (g *Group) State() etcdwatch.State {
	var (
		st        etcdwatch.State
		counted   bool
		byError   []etcdwatch.State
		failed    error // the first own Stream's, kept if every one failed
		allFailed = true
	)
	join := func(s etcdwatch.State) {
		if counted {
			st = combine(st, s)
		} else {
			st, counted = s, true
		}
	}
	var ownUp time.Time // the latest an own Stream that counts came up again after going down
	for i, sl := range g.own {
		s := sl.stream.State()
		switch {
		case s.Failed == nil:
			allFailed = false
		case i == 0:
			failed = s.Failed
		}
		if s.Failed != nil || (opening(s) && sl.stream.Stats().Watches == 0) {
			byError = append(byError, s)
		} else {
			join(s)
			if s.Connected && s.LastError != nil && s.Since.After(ownUp) {
				ownUp = s.Since // up again after an error: a blip, where a Stream's first answer is only its joining
			}
		}
	}
	g.mu.Lock()
	for sl := range g.pinned {
		if ps := sl.stream.State(); !sl.retiring && !opening(ps) {
			join(ps)
		}
	}
	g.mu.Unlock()
	all := !counted // every own Stream idle or failed, no pinned one answered: they all count
	for _, s := range byError {
		if all {
			join(s)
		} else {
			st = laterError(st, s)
		}
	}
	if !allFailed {
		failed = nil
	}
	st.Failed = failed
	st.Since = g.steadyAll.Keep(st.Connected, st.Since, ownUp)
	return st
}

// add returns a and b added together, as Stats adds them.
func add(a, b etcdwatch.Stats) etcdwatch.Stats {
	a.Watches += b.Watches
	a.Paused += b.Paused
	a.Created += b.Created
	a.Stalls += b.Stalls
	a.Pauses += b.Pauses
	a.Resumes += b.Resumes
	a.Responses += b.Responses
	a.Events += b.Events
	a.Fragments += b.Fragments
	a.DuplicatesDropped += b.DuplicatesDropped
	a.UnknownResponses += b.UnknownResponses
	a.IDsRewritten = a.IDsRewritten || b.IDsRewritten
	a.Reconnects += b.Reconnects
	a.Moved += b.Moved
	a.Revision = max(a.Revision, b.Revision)
	if b.LastMessage.After(a.LastMessage) {
		a.LastMessage = b.LastMessage
	}
	return a
}

// combine is two Streams' State as one: connected while both are, since
// that last changed, with the later error. (A Stream's two gRPC streams
// are combined the same way.)
func combine(a, b etcdwatch.State) etcdwatch.State {
	st := a
	st.Connected = a.Connected && b.Connected
	st.Since = health.Since(a.Connected, a.Since, b.Connected, b.Since)
	return laterError(st, b)
}

// laterError is a with b's LastError if b's is the later.
func laterError(a, b etcdwatch.State) etcdwatch.State {
	if b.LastErrorAt.After(a.LastErrorAt) {
		a.LastError, a.LastErrorAt = b.LastError, b.LastErrorAt
	}
	return a
}

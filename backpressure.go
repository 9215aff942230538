package etcdwatch

import (
	"math"
	"time"

	"github.com/etcdwatch/etcdwatch/internal/clock"
)

// This file is the slow-consumer policy: how much a watch may hold for a
// consumer that is not reading, and what happens when it holds that much.
//
// A watch holds at most WithBufferLimit events and WithBufferBytes bytes.
// One that reaches either limit is first waited for, then paused. Waiting
// (a stall) means the dispatcher stops reading responses, so that gRPC flow
// control slows the server down, as a client that handles each response
// before reading the next would. It ends as soon as the consumer has taken
// half its backlog. Pausing cancels the watch's server-side watch and
// re-creates it from its next revision once the consumer has taken half
// its backlog; nothing is lost, but the server must replay history.
//
// A stall holds up every watch on the stream, so how long one may last
// depends on whether it holds up anybody:
//   - A watch alone on its stream (no other watch is active or being
//     created) holds up nobody. Its stalls are rationed only to keep a
//     consumer that stopped from parking the server's sends for good:
//     beyond their first stallFree each, they draw on a budget of at most
//     WithStallBudget (default 100ms) that refills at 1/stallShare of the
//     time, and a watch that outlasts it is paused.
//   - A watch with neighbours stalls for at most sharedStall, then is
//     paused. A neighbour is then held up a couple of milliseconds at most,
//     and only by a consumer that is about to catch up anyway.
//
// A short lag is what scheduling alone produces on a busy machine, with a
// consumer that is not run for a moment while thousands of responses
// arrive: on 2 cores at 4 million events a second, half of such stalls
// ended within about 30µs and 99% within 1ms. Pausing for them would cost
// the server a replay of the watch's history.
const (
	stallFree   = time.Millisecond     // the part of each stall not charged
	stallShare  = 10                   // charged stalls get 1/stallShare of the time
	sharedStall = 2 * time.Millisecond // the longest stall that holds up other watches
)

// eventOverhead is what an event costs beyond its keys and values, for the
// byte limit: the Event and its slot in a Response.
const eventOverhead = 96

// bufferLimit bounds what one watch may hold for its consumer. Immutable.
type bufferLimit struct{ events, bytes int }

// load is what a watch holds for its consumer, or a response weighs.
type load struct {
	events int // a bookmark counts as one
	bytes  int
}

// weigh returns what r counts against the buffer limit.
func weigh(r Response) load {
	l := load{events: max(len(r.Events), 1)}
	for i := range r.Events {
		e := &r.Events[i]
		l.bytes += eventOverhead + len(e.Key) + len(e.Value)
		if e.PrevKV != nil {
			l.bytes += len(e.PrevKV.Key) + len(e.PrevKV.Value)
		}
	}
	return l
}

func (l *load) add(o load) { l.events += o.events; l.bytes += o.bytes }
func (l *load) sub(o load) { l.events -= o.events; l.bytes -= o.bytes }

// full reports whether a watch holding q must be waited for or paused.
func (b bufferLimit) full(q load) bool { return q.events >= b.events || q.bytes >= b.bytes }

// caughtUp reports whether a consumer whose watch holds q has taken half its
// backlog, which ends a stall or resumes a paused watch.
func (b bufferLimit) caughtUp(q load) bool {
	return q.events <= b.events/2 && q.bytes <= b.bytes/2
}

// stall is the stream held up for one watch at its buffer limit. While a
// stall lasts no responses are read, so no other watch can reach its limit.
// Owned by the dispatcher; now and the clock are injected for tests.
type stall struct {
	max             time.Duration // the most stall time saved up; 0: never stall
	w               *Watch        // the watch waited for; nil when none
	since           time.Time     // when the stall began
	shared          bool          // the stall holds up other watches
	until           time.Time     // when the stall must end; the timer fires then
	budget          time.Duration // stall time left, as of at
	at              time.Time     // when budget was last brought up to date
	clock.Stoppable               // fires when the stall has lasted as long as it may
}

// begin starts waiting for w if the ration allows, and reports whether it
// did. shared tells whether other watches would be held up; c runs the timer.
func (s *stall) begin(c clock.Clock, w *Watch, now time.Time, shared bool) bool {
	if s.at.IsZero() {
		s.budget = s.max
	} else {
		s.budget = min(addCapped(s.budget, max(now.Sub(s.at), 0)/stallShare), s.max)
	}
	s.at = now
	if s.max == 0 || s.budget <= 0 {
		return false
	}
	s.w, s.since, s.shared = w, now, shared
	s.until = now.Add(s.allowed())
	s.Reset(c, s.allowed())
	return true
}

// allowed is how long the current stall may last in all.
func (s *stall) allowed() time.Duration {
	d := addCapped(s.budget, stallFree)
	if s.shared {
		d = min(d, sharedStall)
	}
	return d
}

// addCapped is a+b for durations >= 0, at most the longest Duration: a
// budget of math.MaxInt64, "always wait", must not wrap to a negative wait.
func addCapped(a, b time.Duration) time.Duration {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// share cuts short a stall that has begun to hold up other watches: a
// create or a progress request now waits behind it.
func (s *stall) share(c clock.Clock, now time.Time) {
	if s.w == nil || s.shared {
		return
	}
	s.shared = true
	s.until = s.since.Add(s.allowed())
	s.Reset(c, max(s.until.Sub(now), 0))
}

// release stops waiting and charges the time waited beyond stallFree to
// the budget.
func (s *stall) release(now time.Time) {
	s.budget = max(s.budget-max(now.Sub(s.since)-stallFree, 0), 0)
	s.at = now
	s.w = nil
	s.Stop()
}

// alone reports whether w is the only watch the stream is serving or
// creating, with no RequestProgress waiting, so that a stall for it would
// hold up nobody.
func (d *dispatcher) alone(w *Watch) bool {
	return len(d.watches) == 1 && d.watches[w.ID()] == w && d.pending.Len() == 0 && d.toCreate.Len() == 0 &&
		!d.progress.waited()
}

// stallShared tells a stall in progress that something else now waits on
// the stream.
func (d *dispatcher) stallShared() {
	if d.stall.w != nil {
		d.stall.share(d.clock, d.clock.Now())
	}
}

// deliver hands r to w, starting a pump if r waits in a backlog. A watch
// whose consumer is behind (its backlog at the buffer limit) holds up the
// stream, or is paused once it may stall no longer.
func (d *dispatcher) deliver(w *Watch, r Response) {
	start, behind := w.out.push(w, r, d.s.limit)
	if start {
		d.s.hooks.at(hookPumpStart)
		d.s.pumps.Add(1)
		go w.pump(w.out.more.stop) // exits when the backlog is empty, aborted, or at Close; Close waits on pumps. push made the backlog in this goroutine.
	}
	if !behind {
		return
	}
	// One watch is waited for at a time: one reaching its limit while the
	// stream waits for another (a bookmark to every watch brings several
	// at once) is paused, not left behind unwatched.
	if d.stall.w == nil && d.stall.begin(d.clock, w, d.clock.Now(), !d.alone(w)) {
		d.s.stats.stalls.Add(1)
		d.log.Debug("etcdwatch: consumer at its buffer limit; stream held up", "id", w.ID(), "revision", w.entry.rev)
		return
	}
	d.pause(w)
}

// handleStallTimeout pauses the watch whose consumer did not catch up in the
// time its stall was given.
func (d *dispatcher) handleStallTimeout() {
	w := d.stall.w
	d.stall.release(d.clock.Now())
	if w != nil {
		d.pause(w)
	}
}

// endStall stops waiting for w, if the stream is waiting for it.
func (d *dispatcher) endStall(w *Watch) {
	if d.stall.w == w && w != nil {
		d.stall.release(d.clock.Now())
	}
}

// handleResume answers a consumer that has caught up: a stall for it ends,
// and a paused watch is re-created from its next revision.
func (d *dispatcher) handleResume(w *Watch) {
	if d.stall.w == w {
		d.endStall(w)
		return
	}
	if w.entry.state != statePaused {
		return
	}
	delete(d.paused, w)
	d.s.stats.paused.Add(-1)
	d.s.stats.resumes.Add(1)
	w.entry.state = stateCreating
	d.toCreate.Push(w)
	d.flushCreates()
}

// pause cancels w's server-side watch until its consumer catches up; the
// pump sends resumeCmd then. Events already in flight for it are dropped and
// fetched again from the revision after its entry's.
func (d *dispatcher) pause(w *Watch) {
	d.endStall(w)
	id := w.ID()
	delete(d.watches, id)
	d.sendCancel(id)
	w.entry.state = statePaused
	delete(d.frags, w)
	d.paused[w] = struct{}{}
	d.s.stats.paused.Add(1)
	d.s.stats.pauses.Add(1)
	d.log.Debug("etcdwatch: consumer fell behind; watch paused", "id", id, "revision", w.entry.rev)
}

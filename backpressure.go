package etcdwatch

import "time"

// A consumer that falls WithBufferLimit events behind is first waited for,
// then paused. Waiting means the dispatcher stops reading responses, so that
// gRPC flow control slows the server down, as a client that handles each
// response before reading the next would. It ends as soon as the consumer
// has taken half its backlog. Waiting holds up every watch on the stream, so
// it is rationed: beyond their first stallFree each, stalls draw on a budget
// of at most WithStallBudget (default 100ms) that refills at 1/stallShare of
// the time. A consumer that has not caught up when the budget runs out is
// paused instead: its server-side watch is canceled and re-created from its
// next revision once the consumer has caught up.
//
// A short lag is what scheduling alone produces on a busy machine, with a
// consumer that is not run for a moment while thousands of responses
// arrive: on 2 cores at 4 million events a second, half of such stalls
// ended within about 30µs and 99% within 1ms. Pausing for them would cost
// the server a replay of the watch's history. The free part is what lets a
// consumer that is never more than a moment late set the stream's pace
// instead, as backpressure; a lasting lag is what the budget keeps from
// holding up the other watches.
const (
	stallFree  = time.Millisecond // the part of each stall not charged
	stallShare = 10               // charged stalls get 1/stallShare of the time
)

// stall is the stream held up for one watch at its buffer limit. While a
// stall lasts no responses are read, so no other watch can reach its limit.
// Owned by the dispatcher.
type stall struct {
	max    time.Duration // the most stall time saved up; 0: never stall
	w      *Watch        // the watch waited for; nil when none
	since  time.Time     // when the stall began
	budget time.Duration // stall time left, as of at
	at     time.Time     // when budget was last brought up to date
	timer                // fires when the budget runs out during a stall
}

// begin starts waiting for w if the ration allows, and reports whether it did.
func (s *stall) begin(w *Watch, now time.Time) bool {
	if s.at.IsZero() {
		s.budget = s.max
	} else {
		s.budget = min(s.budget+now.Sub(s.at)/stallShare, s.max)
	}
	s.at = now
	if s.max == 0 || s.budget <= 0 {
		return false
	}
	s.w, s.since = w, now
	s.timer.reset(s.budget + stallFree)
	return true
}

// end stops waiting and charges the time waited beyond stallFree to the budget.
func (s *stall) end(now time.Time) {
	s.budget = max(s.budget-max(now.Sub(s.since)-stallFree, 0), 0)
	s.at = now
	s.w = nil
	s.timer.stop()
}

// deliver hands r to w. A watch that reaches its buffer limit holds up the
// stream, or is paused once stalls are used up.
func (d *dispatcher) deliver(w *Watch, r Response) {
	if !w.push(r, d.limit) {
		return
	}
	if d.stall.begin(w, time.Now()) {
		d.s.stats.stalls.Add(1)
		d.log.Debug("etcdwatch: consumer at its buffer limit; stream held up", "id", w.ID(), "revision", w.rev)
		return
	}
	d.pause(w)
}

// handleStallTimeout pauses the watch whose consumer did not catch up in the
// time its stall was given.
func (d *dispatcher) handleStallTimeout() {
	w := d.stall.w
	d.stall.end(time.Now())
	if w != nil {
		d.pause(w)
	}
}

// endStall stops waiting for w, if the stream is waiting for it.
func (d *dispatcher) endStall(w *Watch) {
	if d.stall.w == w && w != nil {
		d.stall.end(time.Now())
	}
}

// handleResume answers a consumer that has caught up: a stall for it ends,
// and a paused watch is re-created from its next revision.
func (d *dispatcher) handleResume(w *Watch) {
	if d.stall.w == w {
		d.endStall(w)
		return
	}
	if w.state != statePaused {
		return
	}
	delete(d.paused, w)
	d.s.stats.paused.Add(-1)
	d.s.stats.resumes.Add(1)
	w.state = stateCreating
	d.toCreate.Push(w)
	d.flushCreates()
}

// pause cancels w's server-side watch until its consumer catches up; the
// pump sends resumeCmd then. Events already in flight for it are dropped and
// fetched again from w.rev+1.
func (d *dispatcher) pause(w *Watch) {
	d.endStall(w)
	id := w.ID()
	delete(d.watches, id)
	d.sendCancel(id)
	w.state = statePaused
	delete(d.frags, w)
	d.paused[w] = struct{}{}
	d.s.stats.paused.Add(1)
	d.s.stats.pauses.Add(1)
	d.log.Debug("etcdwatch: consumer fell behind; watch paused", "id", id, "revision", w.rev)
}

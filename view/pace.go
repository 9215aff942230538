package view

import (
	"time"

	"github.com/etcdwatch/etcdwatch"
	"github.com/etcdwatch/etcdwatch/internal/clock"
)

// holdStep adds b to the batches held for publication, joined to the last one
// when both are small, as a Watch joins small responses: a subscriber then
// takes a burst of single events in a few handovers rather than one each. A
// step without changes (a bookmark) extends the last held one, or is held
// as a batch of its own (progress) when there is none.
func holdStep[T any](held []Batch[T], b Batch[T]) []Batch[T] {
	switch n := len(held); {
	case n > 0 && len(b.Changes) == 0:
		held[n-1].Revision = b.Revision
		return held
	case n > 0 && len(held[n-1].Changes)+len(b.Changes) <= etcdwatch.JoinLimit:
		last := &held[n-1]
		last.Changes = append(last.Changes, b.Changes...)
		last.Revision = b.Revision
		return held
	}
	return append(held, b)
}

// publishGap and maxHeld bound how long, and how many responses, the
// pacer holds applied responses before they are published.
const (
	publishGap = time.Millisecond
	maxHeld    = 64
)

// pacer decides when a view publishes what it applied. Each publication
// freezes the state's tree, so the next writes copy the nodes they touch: a
// publication per response would copy most of the tree under a steady flow.
// So a response after a quiet spell (gap since the last publication) is
// published at once, and while responses keep coming they are held until
// gap has passed since the last publication or maxHeld are waiting. Readers
// then see a state at most gap old; WaitForRevision, Sync and subscribers
// see it when it is published. Owned by follow.
type pacer struct {
	gap  time.Duration
	last time.Time // of the last publication
	held int       // responses applied since
}

// applied counts a response applied at now and returns how long it may
// wait to be published: 0 for at once.
func (p *pacer) applied(now time.Time) time.Duration {
	p.held++
	since := now.Sub(p.last)
	if p.held >= maxHeld || since >= p.gap {
		return 0
	}
	return p.gap - since
}

// published records a publication at now.
func (p *pacer) published(now time.Time) { p.last, p.held = now, 0 }

// progressGap is the least time between two batches without changes
// (progress) given to subscribers: the view moves on with every bookmark,
// which any Sync of any view on the lane asks for, but its subscribers
// hear of it at most ten times a second, the latest revision each time.
const progressGap = 100 * time.Millisecond

// unpublished is what follow has applied and not yet published: the steps,
// and the timer that says when the pacer wants them out; and when the last
// progress batch was held, and the timer for the next one when it had to
// wait. Its zero value holds nothing. Owned by follow.
type unpublished[T any] struct {
	pace     pacer
	steps    []Batch[T]
	due      clock.Stoppable // running while steps are held
	progress time.Time       // when the last progress batch was held
	later    clock.Stoppable // running while a progress batch waits for progressGap
}

// moved holds the step of a view that has moved from from to rev without
// changes, as a progress batch, unless one went out less than progressGap
// ago: then it sets later for when the next may go, and holds nothing.
// It reports whether it held the step.
func (u *unpublished[T]) moved(from, rev int64, now time.Time) bool {
	if len(u.steps) > 0 { // the held steps reach rev instead
		u.steps[len(u.steps)-1].Revision = rev
		return true
	}
	if wait := u.progress.Add(progressGap).Sub(now); wait > 0 {
		if u.later.C == nil {
			u.later.Reset(clock.Real, wait)
		}
		return false
	}
	u.steps = append(u.steps, Batch[T]{Kind: Events, From: from, Revision: rev})
	u.progress = now
	u.later.Stop()
	return true
}

// stop stops its timers.
func (u *unpublished[T]) stop() {
	u.due.Stop()
	u.later.Stop()
}

func newUnpublished[T any]() *unpublished[T] {
	return &unpublished[T]{pace: pacer{gap: publishGap}}
}

// add holds the step b.
func (u *unpublished[T]) add(b Batch[T]) { u.steps = holdStep(u.steps, b) }

// paced counts a response applied at now, and reports whether to publish
// now; if not, the timer is set for when.
func (u *unpublished[T]) paced(now time.Time) bool {
	wait := u.pace.applied(now)
	if wait > 0 && u.due.C == nil {
		u.due.Reset(clock.Real, wait)
	}
	return wait == 0
}

// take returns the steps held, to be published at now, and forgets them.
func (u *unpublished[T]) take(now time.Time) []Batch[T] {
	steps := u.steps
	u.steps = nil // the history keeps the published ones
	u.pace.published(now)
	u.due.Stop()
	return steps
}

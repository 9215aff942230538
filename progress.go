package etcdwatch

import (
	"context"
	"iter"
	"math"
	"slices"
	"time"

	"github.com/etcdwatch/etcdwatch/internal/clock"
)

// progressWaiter is one RequestProgress call waiting for an answer from a
// lane.
type progressWaiter struct {
	ctx    context.Context
	minRev int64               // the highest revision the Stream had seen when the call began; an answer below is too old
	reply  chan progressResult // buffered 1: the dispatcher never waits on it
	// needs is the last create id of the watches the call waits for: those
	// whose creates were sent when it began, confirmed or not. A watch
	// created since does not hold it up, or creates made one after another
	// could hold it for ever. It is allCreates while some watch it waits
	// for has no create id on the current stream: a stream's end, after
	// which every watch is created again with a new id, or a watch
	// created again from its next revision (compacted), sets it so until
	// the creates queued then are sent (awaitAll, allSent).
	needs int64
	// upTo is the last watch queued in toCreate when the call began, or
	// when a stream's end or a compaction made it wait for every watch
	// (awaitUpTo): once its create is sent, needs is its create id, and
	// watches queued after it are not waited for, on a stream that takes
	// creates one at a time as on any other. nil otherwise.
	upTo *Watch
}

// gone reports whether w's caller has returned: it is asked for no more.
func gone(w *progressWaiter) bool { return w.ctx.Err() != nil }

// allCreates is a progressWaiter's needs once it waits for every watch.
const allCreates = math.MaxInt64

func newProgressWaiter(ctx context.Context, floor int64) *progressWaiter {
	return &progressWaiter{ctx: ctx, minRev: floor, reply: make(chan progressResult, 1), needs: allCreates}
}

type progressResult struct {
	rev int64
	err error
}

// progressState tracks RequestProgress calls. Owned by the dispatcher.
//
// Answers cannot be matched to requests: etcd 3.6+ drops a request it cannot
// answer yet, and older servers answer late. So a call that joins while a
// request is in flight waits for the next request, sent when an answer
// comes (when the calls left wait only for a create in flight, once it is
// answered) or the retry timer fires; and an answer below the highest
// revision the stream had seen when a call began is too old for that call,
// which waits on.
type progressState struct {
	retry    progressRetry
	waiting  []*progressWaiter // covered by the request in flight
	next     []*progressWaiter // joined after that request was sent
	held     []*progressWaiter // arrived before the servers' release was known
	inFlight bool
	queued   bool // a request waits in the outbox, not yet handed to the session
	// forAll: some call waits for every watch (needs is allCreates) or
	// for the creates up to a queued one (upTo), so that sending creates
	// lowers its needs (sentUpTo, allSent); cleared by allSent. Spares
	// every create that scan while no call needs it.
	forAll bool
	// afterCreate: the last answer left calls waiting only for creates not
	// confirmed yet, which no answer can cover until they are: the next
	// request goes once one is answered (createAnswered), or at the timer.
	afterCreate     bool
	clock.Stoppable // runs while a request is in flight

	// covers are the requests in flight on this stream, oldest first, in
	// runs of requests sent after the same last create id; covered is the
	// last create id an answer covered. See coverage.
	covers  []coverRun
	covered int64
}

// coverRun is n requests in flight, each sent after the create with id
// last or a later one.
type coverRun struct {
	last int64
	n    int
}

// maxCovers bounds covers: a request repeated while the server answers
// nothing joins the newest run, which then covers no more than its first
// request did. Every request is counted, though etcd 3.5.13+ never
// answers one it cannot answer at once (only later ones): a request must
// never go uncounted, or the answer to it would be taken for a later
// request's.
// So after a long hold, later answers cover less than they could: each is
// taken for a request as many back as were ignored. That backlog never
// shrinks: each answer counts off one, and each request asked again adds
// one. A call waiting for a watch created since the hold from a past
// revision asks again that many times, back to back, for as long as the
// stream lives (a known cost: a hold of a minute at the default retry can
// leave a few hundred). A watch from now, or one up to the answer, holds
// up no call whatever the count says (see caughtUp).
// Sending no more while requests are unanswered would be worse: the
// ignored ones are never answered, and the stream would ask no more; and
// leaving a request uncounted could take an answer to it for a later
// request's, which covers creates it does not.
const maxCovers = 8

// sent records a request sent after the creates up to lastCreate.
func (p *progressState) sent(lastCreate int64) {
	switch n := len(p.covers); {
	case n > 0 && (p.covers[n-1].last == lastCreate || n == maxCovers):
		p.covers[n-1].n++
	default:
		p.covers = append(p.covers, coverRun{last: lastCreate, n: 1})
	}
}

// coverage returns, for an answer, the last create id it covers. A
// stream-wide answer covers the watches the server had when it took the
// request, and can reach the client after the created response of a
// watch created later: one from an old revision is then still catching up
// below the answer. The answer is taken for the oldest request in flight
// (the server answers in order, and may drop a request it cannot answer
// yet), which covers no more than the one actually answered.
func (p *progressState) coverage() int64 {
	if len(p.covers) > 0 {
		oldest := &p.covers[0]
		p.covered = max(p.covered, oldest.last)
		if oldest.n--; oldest.n == 0 {
			p.covers = p.covers[1:]
		}
	}
	return p.covered
}

// waited reports whether a RequestProgress call waits for an answer.
func (p *progressState) waited() bool { return len(p.waiting)+len(p.next)+len(p.held) > 0 }

func (d *dispatcher) handleProgressRequest(p *progressWaiter) {
	d.stallShared()
	p.minRev = max(p.minRev, d.maxRev)
	p.needs = d.nextID
	if d.sess == nil || d.toCreate.Len() > 0 {
		d.progress.forAll = true
		p.needs = allCreates // some watches have no create id yet: see allSent
		if last := d.toCreate.Last(); last != nil {
			p.upTo = *last
		}
	}
	switch {
	case d.failed != nil:
		p.reply <- progressResult{err: d.failed}
	case !d.hasWatches(): // on any release, known or not yet: etcd answers nothing then
		p.reply <- progressResult{err: ErrNoWatches}
	case d.progressUnsafe != nil: // set once the release is known
		p.reply <- progressResult{err: d.progressUnsafe}
	case !d.releaseKnown: // its answer could run ahead of events on some releases
		d.progress.held = append(d.progress.held, p)
	case d.progress.inFlight:
		d.progress.next = append(d.progress.next, p)
	default:
		d.progress.waiting = append(d.progress.waiting, p)
		d.sendProgress()
	}
}

// handleStreamProgress takes a stream-wide progress response (id -1): the
// active watches it covers, or that have every event up to it already
// (caughtUp), get a bookmark, and the RequestProgress calls it answers the
// revision.
func (d *dispatcher) handleStreamProgress(resp *wireResponse) {
	if d.progressUnsafe != nil {
		return // an answer to a request sent before the release was known: it may run ahead
	}
	p := &d.progress
	p.waiting, p.next = slices.DeleteFunc(p.waiting, gone), slices.DeleteFunc(p.next, gone)
	covered := p.coverage()
	var uncovered int64 // the oldest create id of a watch the answer did not bookmark, if missed
	missed := false
	rev := resp.Header.Revision
	for _, w := range d.watches {
		switch e := &w.entry; {
		case e.reqID <= covered || e.caughtUp(rev): // created before the request, or up to rev whatever the request
			d.bookmark(w, resp.Header)
		case !missed || e.reqID < uncovered:
			uncovered, missed = e.reqID, true
		}
	}
	var unconfirmed int64 // the oldest create id of a watch not confirmed yet, if waits
	waits := false
	if len(p.waiting) > 0 { // only calls care: not scanned for every answer
		unconfirmed, waits = d.unconfirmed()
	}
	var stay []*progressWaiter
	short := false    // some call waits for a watch the answer did not cover
	creating := false // some call waits for a create not confirmed yet
	for _, w := range p.waiting {
		switch {
		case missed && uncovered <= w.needs:
			stay, short = append(stay, w), true
		case waits && unconfirmed <= w.needs:
			stay, creating = append(stay, w), true
		case rev < w.minRev: // too old for it
			stay = append(stay, w)
		default:
			w.reply <- progressResult{rev: rev}
		}
	}
	p.waiting, p.next = append(stay, p.next...), nil
	p.afterCreate = false // set again below while only creates hold calls
	switch {
	case creating && !short:
		// Asking again before the create is confirmed gets an answer
		// that cannot cover it: the next request goes once a create is
		// answered, or at the timer if none is.
		p.inFlight, p.afterCreate = false, true
		p.Reset(d.clock, p.retry.next())
	case len(stay) > 0 && !short:
		// Too old for some (the member is behind the revision the Stream
		// had seen): the timer asks again, the series of delays going on,
		// rather than a request at once after each answer, at round-trip
		// speed for as long as the member lags.
		p.inFlight = false
		p.Reset(d.clock, p.retry.next())
	case len(p.waiting) > 0:
		// Calls that joined after the request was sent, or calls the
		// answer did not serve because a watch they wait for was created
		// after the request: the next answer covers them all.
		p.retry.reset()
		d.sendProgress()
	default:
		p.retry.reset()
		p.inFlight = false
		p.Stop()
	}
}

// createAnswered asks again, now that a create is answered, for the calls
// the last answer left waiting only for creates (afterCreate).
func (d *dispatcher) createAnswered() {
	p := &d.progress
	if !p.afterCreate {
		return
	}
	p.Stop()
	p.retry.reset() // the server answered: only the create held the calls
	d.handleProgressTimeout()
}

// handleProgressTimeout asks again for everyone still waiting.
func (d *dispatcher) handleProgressTimeout() {
	p := &d.progress
	p.afterCreate = false
	p.waiting = append(slices.DeleteFunc(p.waiting, gone), slices.DeleteFunc(p.next, gone)...)
	p.next = nil
	if !d.hasWatches() {
		p.fail(ErrNoWatches) // etcd answers nothing on a stream without watches
	}
	if len(p.waiting) == 0 {
		p.inFlight = false
		return
	}
	d.sendProgress()
}

// hasWatches reports whether the server has, or is about to have, a watch on
// this stream; paused watches do not count.
func (d *dispatcher) hasWatches() bool {
	return len(d.watches) > 0 || d.pending.Len() > 0 || d.toCreate.Len() > 0
}

// clearOutbox empties the outbox, taken by the session or dropped with its
// stream: no progress request waits in it any more.
func (d *dispatcher) clearOutbox() {
	d.outbox, d.progress.queued = nil, false
}

// sendProgress asks for progress and arms the retry. A request still
// waiting to go out (the stream is opening, as through an outage) is not
// joined by another: asking again is for a server that ignored a request,
// and requests piled up while the connection is down would all go out at
// once when it is back.
func (d *dispatcher) sendProgress() {
	p := &d.progress
	if !p.queued {
		d.outbox = append(d.outbox, wireRequest{kind: requestProgress})
		p.sent(d.nextID)
		p.queued = true
	}
	p.inFlight = true
	p.Reset(d.clock, p.retry.next())
}

// progressRetry is the policy for asking again for progress the server
// has not answered: etcd 3.5.13 and later answer only once every watch on
// the stream is synced, and sync watchers every 100ms, so a stream with a
// watch just created or resumed is answered at the next sync. The first
// request of a series is repeated after first, each next after twice as
// long, up to max (WithProgressRetry), so that such an answer comes a
// moment after that sync, and a stream held up for long (a watch catching
// up, or waiting for a future revision) is asked every max. An answer
// starts a new series. Owned by the dispatcher.
type progressRetry struct {
	first, max time.Duration
	last       time.Duration // the delay before the last request was repeated; 0 at the start of a series
}

// next returns how long to wait for an answer to the request being sent.
func (r *progressRetry) next() time.Duration {
	r.last = min(max(2*r.last, r.first), r.max)
	return r.last
}

// reset starts a new series: the server has answered.
func (r *progressRetry) reset() { r.last = 0 }

// suspend forgets the request in flight when its stream ends; the calls
// waiting for it wait for the next stream, which starts a new series.
func (p *progressState) suspend() {
	p.retry.reset()
	p.covers = nil // never answered: the new stream's requests cover its creates
	p.waiting = append(p.waiting, p.next...)
	p.next = nil
	p.awaitAll() // its watches are created again, with new ids
	p.inFlight, p.afterCreate = false, false
	p.Stop()
}

// awaitAll makes every call waiting wait for every watch, until the creates
// queued now have been sent (allSent): some watch it waits for is created
// again, with a new id.
func (p *progressState) awaitAll() {
	for c := range p.calls() {
		c.needs, c.upTo = allCreates, nil
		p.forAll = true
	}
}

// calls yields the calls waiting for an answer: those the request in
// flight covers, then those that joined after it was sent.
func (p *progressState) calls() iter.Seq[*progressWaiter] {
	return func(yield func(*progressWaiter) bool) {
		for _, c := range p.waiting {
			if !yield(c) {
				return
			}
		}
		for _, c := range p.next {
			if !yield(c) {
				return
			}
		}
	}
}

// awaitUpTo makes the calls that wait for every watch wait for the creates
// queued now, up to last, and not for those queued after it (see upTo).
func (p *progressState) awaitUpTo(last *Watch) {
	for c := range p.calls() {
		if c.needs == allCreates {
			c.upTo = last
			p.forAll = true
		}
	}
}

// unconfirmedAgain marks w, whose create was sent and is to be sent again,
// as one no answer covers until it is confirmed: a call that began once it
// was sent waits for it (see unconfirmed), as it would have on the stream
// it was sent on. A watch its consumer gave up is not marked.
func unconfirmedAgain(w *Watch) {
	if e := &w.entry; e.state == stateCreating && !e.is(probe) {
		e.set(recreated, true)
	}
}

// caughtUp reports whether the active watch e is up to rev, the revision
// of a stream-wide answer that came after its created response, whichever
// request the answer is to: every event <= rev is queued already; or its
// create on this stream asked from now. etcd answers only at a moment when
// every watch it has on the stream is synced, with the store's revision
// then: a watch from now it had by then has had its events up to rev sent
// (those held back for its created response went with it, which came
// first), and one it registered after starts past rev. Such a watch is
// bookmarked at rev as a covered one is, and an answer to a request sent
// before its create holds up no call waiting for it, however many
// requests went unanswered (see maxCovers).
func (e *entry) caughtUp(rev int64) bool {
	return e.is(nowHere) || (e.rev >= rev && !e.is(unanchored))
}

// createdAgain reports whether e is created again (recreated) and not
// confirmed yet, and its consumer has not given it up.
func (e *entry) createdAgain() bool { return e.is(recreated) && e.state != stateAbandoned }

// resendProgress asks the new stream for progress on behalf of waiting calls.
func (d *dispatcher) resendProgress() {
	if len(d.progress.waiting) > 0 {
		d.sendProgress()
	}
}

// unconfirmed returns the create id of the oldest watch whose create on
// this stream is in flight, which no answer can bookmark: a watch's first
// create, a watch created again (after the last stream ended, or
// compacted just past its revision), or a paused watch's resume; 1, below
// every id, while a watch created again still waits in toCreate for its
// create (one create at a time). ok is false when there is none. A create
// in flight counts because etcd's send loop may put an answer before that
// create's created response, and holds the watch's events until after it,
// so the answer says nothing of them. A paused watch whose resume is not
// sent yet does not count: it is not covered until its consumer has caught
// up. A watch its consumer gave up (abandoned) is waited for no longer.
func (d *dispatcher) unconfirmed() (id int64, ok bool) {
	for w := range d.toCreate.All() {
		if w.entry.createdAgain() {
			return 1, true
		}
	}
	for w := range d.pending.All() { // in create order: the first is the oldest
		if e := &w.entry; e.state == stateCreating && !e.is(probe) {
			return e.reqID, true
		}
	}
	return 0, false
}

// allSent is called once every queued create has been sent: calls waiting
// for every watch (see progressWaiter.needs) now wait for those created so
// far, and no later ones.
func (p *progressState) allSent(lastCreate int64) {
	if !p.forAll {
		return
	}
	for c := range p.calls() {
		c.needs, c.upTo = min(c.needs, lastCreate), nil
	}
	p.forAll = false
}

// sentUpTo is called once w's create has been sent (or w dropped unsent),
// with the last create id sent: calls that began with w last in line now
// wait for the creates sent so far, and no later ones.
func (p *progressState) sentUpTo(w *Watch, lastCreate int64) {
	if !p.forAll {
		return
	}
	for c := range p.calls() {
		if c.upTo == w {
			c.needs, c.upTo = min(c.needs, lastCreate), nil
		}
	}
}

// fail answers every waiting call with err.
func (p *progressState) fail(err error) {
	for _, w := range slices.Concat(p.waiting, p.next, p.held) {
		w.reply <- progressResult{err: err}
	}
	p.waiting, p.next, p.held, p.inFlight, p.afterCreate = nil, nil, nil, false, false
	p.Stop()
}

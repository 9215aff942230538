package etcdwatch

import (
	"context"
	"log/slog"
	"time"

	"github.com/etcdwatch/etcdwatch/internal/clock"
	"github.com/etcdwatch/etcdwatch/internal/ring"
)

// dispatcher owns all of a lane's watch state (a Stream has one lane, and
// one more for its isolated watches). Only its run goroutine
// touches its fields, so none of them is locked. Its loop is one select;
// each kind of message has one handler, and none of them blocks.
type dispatcher struct {
	s     *Stream
	l     *lane // the lane it owns
	open  opener
	log   *slog.Logger
	clock clock.Clock

	sess      *session        // the gRPC stream now; nil while waiting to reconnect
	sessStart time.Time       // when the last session started (connect); zero before the first
	sessHeard bool            // the server has said something on sess
	asked     bool            // a create has been sent on some stream, and the lane's state told (stateBox.ask)
	firstOpen bool            // sess is the lane's first stream, not yet open: see handleOpened
	heardAt   time.Time       // when the last burst of responses arrived, on any stream
	discard   bool            // sess's answers cannot be matched: nothing more is read from it
	downSince time.Time       // when the outage began (see handleSessionEnd); zero while a stream works
	failed    error           // a failure reconnecting cannot fix; nil while the stream is usable
	backoff   backoff         // delays between reconnections
	retry     clock.Stoppable // fires to open the next session
	live      liveness        // notices a stream that has gone silent
	hurry     connHurry       // cuts gRPC's reconnect backoff short while a stream waits for it

	watches    map[int64]*Watch              // active watches by server id
	paused     map[*Watch]struct{}           // paused watches, waiting for their consumers
	cancelling map[int64]struct{}            // ids whose cancel was sent and not yet answered
	toCreate   ring.Ring[*Watch]             // creates not yet sent
	pending    ring.Ring[*Watch]             // creates sent, in request order
	nextID     int64                         // last client-chosen id; ids are never reused on a stream
	pipeline   pipeline                      // how many creates may be in flight
	unsent     bool                          // a watch was abandoned since the last dropUnsent
	maxRev     int64                         // highest header revision seen, for RequestProgress freshness
	outbox     []wireRequest                 // requests waiting for the session's sendLoop
	frags      map[*Watch][]Event            // events of fragmented responses awaiting their last piece
	ctxs       map[<-chan struct{}]*ctxGroup // watches by the Done channel of their contexts

	progress       progressState
	releaseKnown   bool  // probeRelease has told what it learned
	progressUnsafe error // why RequestProgress is refused (etcd #15220); nil where it is safe
	stall          stall // a consumer at its buffer limit holding up the stream
}

func newDispatcher(l *lane, open opener) *dispatcher {
	s := l.s
	return &dispatcher{
		s:          s,
		l:          l,
		open:       open,
		log:        s.opts.logger,
		clock:      s.opts.clock,
		watches:    make(map[int64]*Watch),
		paused:     make(map[*Watch]struct{}),
		cancelling: make(map[int64]struct{}),
		frags:      make(map[*Watch][]Event),
		ctxs:       make(map[<-chan struct{}]*ctxGroup),
		nextID:     firstWatchID - 1,
		progress:   progressState{retry: progressRetry{first: s.opts.progressRetryMin, max: s.opts.progressRetry}},
		stall:      stall{max: s.opts.stallBudget},
		backoff:    backoff{min: s.opts.backoffMin, max: s.opts.backoffMax},
		live:       liveness{idle: s.opts.livenessIdle, timeout: s.opts.livenessTimeout},
		hurry:      newConnHurry(s.opts.connectivity, s.opts.connectRetry),
	}
}

// run is the dispatcher's loop. It never blocks on anything but its select,
// and returns when the Stream is closed or the lane retired.
func (d *dispatcher) run() {
	d.connect()
	defer d.shutdown()
	for {
		var (
			recv   <-chan wireResponse
			send   chan<- []wireRequest
			dead   <-chan struct{}
			opened <-chan struct{}
		)
		if d.sess != nil {
			dead = d.sess.dead
			if d.firstOpen {
				opened = d.sess.opened
			}
			if d.reading() {
				recv = d.sess.recv
			}
			if len(d.outbox) > 0 {
				send = d.sess.send
			}
		}
		select {
		case c := <-d.l.cmds:
			d.handleCommands(c)
		case resp := <-recv:
			d.heardAt = d.clock.Now() // once a burst: a clock read costs as much as routing a response
			d.s.stats.lastMessage.Store(d.heardAt.UnixNano())
			d.take(&resp)
			d.drainResponses(recv)
		case send <- d.outbox:
			d.clearOutbox()
		case <-opened:
			d.handleOpened()
		case <-dead:
			d.handleSessionEnd()
			d.s.hooks.at(hookStreamEnd)
		case <-d.retry.C:
			d.connect()
		case <-d.live.C:
			d.handleLivenessTick()
		case <-d.hurry.C:
			d.handleHurryTick()
		case <-d.progress.C:
			d.handleProgressTimeout()
		case <-d.stall.C:
			d.handleStallTimeout()
		case <-d.s.closing:
			return
		case <-d.l.retire: // failed for good, and replaced: no watch is left
			return
		}
	}
}

// reading reports whether the loop reads responses: not while it waits for
// a consumer (a stall), nor from a stream whose answers cannot be matched.
func (d *dispatcher) reading() bool { return d.stall.w == nil && !d.discard }

// drainBatch bounds how many waiting responses the loop takes in a row
// before it looks at commands and timers again.
const drainBatch = 64

// take handles a response the session handed over.
func (d *dispatcher) take(resp *wireResponse) {
	d.sess.took(resp.size)
	d.handleResponse(resp)
	d.s.hooks.at(hookResponse)
}

// drainResponses handles responses that are already waiting, through a
// select far cheaper than the loop's. A burst of them then costs one
// wake-up of the loop, not one each. A stall stops it, and so does a stream
// whose answers cannot be matched.
func (d *dispatcher) drainResponses(recv <-chan wireResponse) {
	for range drainBatch {
		if !d.reading() {
			return
		}
		select {
		case resp := <-recv:
			d.take(&resp)
		default:
			return
		}
	}
}

// handleCommands handles c and the commands already waiting behind it,
// likewise, then drops the creates of watches abandoned meanwhile.
func (d *dispatcher) handleCommands(c command) {
	c.handle(d)
	d.s.hooks.at(hookCommand)
	for range drainBatch {
		select {
		case c := <-d.l.cmds:
			c.handle(d)
			d.s.hooks.at(hookCommand)
		default:
			d.dropUnsent()
			return
		}
	}
	d.dropUnsent()
}

// shutdown ends everything the dispatcher owns, for Close or a retired
// lane: every watch is aborted, and every command that arrives too late is
// refused, with the lane's gone (ErrClosed, or a retired lane's failure).
func (d *dispatcher) shutdown() {
	for w := range d.tracked() {
		d.abortWatch(w, d.l.gone)
	}
	d.untrackAll(d.l.gone)
	if d.sess != nil {
		d.sess.close()
		d.l.state.ended(ErrClosed, d.sessHeard, d.clock.Now())
	}
	d.retry.Stop()
	d.stall.Stop()
	d.live.Stop()
	d.hurry.Stop()
	d.progress.Stop()
	d.l.refuseLeft()
}

// forget drops a watch that has ended or was abandoned.
func (d *dispatcher) forget(w *Watch) {
	e := &w.entry
	if e.state == statePaused {
		delete(d.paused, w)
		d.s.stats.paused.Add(-1)
	}
	d.endStall(w)
	d.unbind(w)
	if !e.is(probe) && e.state != stateAbandoned { // an abandoned watch stopped counting then
		d.s.stats.watches.Add(-1)
	}
	e.state = stateDone
	delete(d.frags, w)
}

// endWatch ends a watch the dispatcher still tracks, for a reason of the
// server's or the stream's, and forgets it. Its consumer still gets what
// was buffered for it.
func (d *dispatcher) endWatch(w *Watch, err error) {
	d.forget(w) // first: whoever hears of the end finds it counted no more
	if !w.entry.is(probe) {
		w.tellCreated(err)
		w.finish(err)
	}
}

// abortWatch ends a watch the dispatcher still tracks at once, its backlog
// dropped, and forgets it.
func (d *dispatcher) abortWatch(w *Watch, err error) {
	d.forget(w) // first, as in endWatch
	if !w.entry.is(probe) {
		w.tellCreated(err)
		w.abort(err)
	}
}

// tracked yields every watch the dispatcher tracks: active, paused, and
// being created.
func (d *dispatcher) tracked() func(yield func(*Watch) bool) {
	return func(yield func(*Watch) bool) {
		for _, w := range d.watches {
			if !yield(w) {
				return
			}
		}
		for w := range d.paused {
			if !yield(w) {
				return
			}
		}
		for _, q := range []*ring.Ring[*Watch]{&d.pending, &d.toCreate} {
			for w := range q.All() {
				if !yield(w) {
					return
				}
			}
		}
	}
}

// untrackAll forgets every watch after they have all been ended, and
// answers every progress waiter with err.
func (d *dispatcher) untrackAll(err error) {
	clear(d.watches)
	clear(d.paused)
	d.pending.Reset()
	d.toCreate.Reset()
	clear(d.cancelling)
	d.progress.fail(err)
}

// endAll ends every watch and progress waiter with err, a failure no new
// stream can cure; consumers still get what was buffered for them.
func (d *dispatcher) endAll(err error) {
	for w := range d.tracked() {
		d.endWatch(w, err)
	}
	d.untrackAll(err)
}

// responseKind is what a response means, before looking at any watch.
type responseKind uint8

const (
	kindCreated        responseKind = iota // answer to the oldest create in flight
	kindCanceled                           // a watch ended, or the answer to our cancel
	kindStreamProgress                     // progress for every watch on the stream
	kindWatch                              // events, fragments or progress of one watch
)

func kindOf(resp *wireResponse) responseKind {
	switch {
	case resp.Created:
		return kindCreated
	case resp.Canceled:
		return kindCanceled
	case resp.WatchID == -1 && len(resp.Events) == 0 && !resp.Fragment:
		return kindStreamProgress
	default:
		return kindWatch
	}
}

func (d *dispatcher) handleResponse(resp *wireResponse) {
	d.s.stats.responses.Add(1)
	d.live.heard = true
	if d.live.probing {
		d.probeAnswered()
	}
	if !d.sessHeard {
		d.streamWorks()
	}
	if resp.Header.Revision > d.maxRev {
		d.maxRev = resp.Header.Revision
		storeMax(&d.s.stats.revision, d.maxRev)
	}
	switch kindOf(resp) {
	case kindCreated:
		d.handleCreated(resp)
	case kindCanceled:
		d.handleCanceled(resp)
	case kindStreamProgress:
		d.handleStreamProgress(resp)
	default:
		d.handleEvents(resp)
	}
}

// handleCanceled ends the watch the server canceled, or settles a cancel of ours.
func (d *dispatcher) handleCanceled(resp *wireResponse) {
	id := resp.WatchID
	if _, ok := d.cancelling[id]; ok {
		delete(d.cancelling, id)
		return
	}
	w, ok := d.watches[id]
	if !ok {
		d.s.stats.unknown.Add(1)
		return
	}
	delete(d.watches, id)
	var err error = classifyReason(resp.CancelReason)
	level := slog.LevelWarn
	if resp.CompactRevision > 0 {
		if d.compacted(w, id, resp.CompactRevision) {
			return
		}
		// Its consumer gets the *CompactedError, and knows what to do (a
		// view lists again): worth telling, not warning about.
		err = &CompactedError{CompactRevision: resp.CompactRevision, Revision: w.entry.rev + 1, Header: resp.Header}
		level = slog.LevelInfo
	}
	d.log.Log(context.Background(), level, "etcdwatch: server ended the watch", "watch", w.Request().String(), "id", id, "err", err)
	d.endWatch(w, err)
}

// compacted handles the server's compaction cancel of w, whose id was id,
// and reports whether w goes on. etcd keeps a compacted watcher on its
// stream until the client cancels it, and answers no stream-wide progress
// request while it is there: so it is canceled. A watch that asked from
// its own revision (see entry.start) and was compacted just past it needs
// only what follows, which the compaction kept: it is created again from
// there, rather than ended with a CompactedError for a revision it has.
func (d *dispatcher) compacted(w *Watch, id, compactRev int64) bool {
	d.sendCancel(id)
	delete(d.frags, w)
	if d.maxRev < compactRev { // the store has reached it: no create asks for its own revision below it
		d.maxRev = compactRev
		storeMax(&d.s.stats.revision, d.maxRev)
	}
	e := &w.entry
	if !e.is(replay) || compactRev > e.rev+1 {
		return false
	}
	e.set(replay, false)
	e.set(recreated, true)
	e.state = stateCreating
	d.progress.awaitAll() // the calls waiting when it was compacted wait for its new create too
	d.toCreate.Push(w)
	d.progress.awaitUpTo(w)
	d.flushCreates()
	return true
}

// handleEvents routes events, fragments and per-watch progress by watch id.
func (d *dispatcher) handleEvents(resp *wireResponse) {
	w, ok := d.watches[resp.WatchID]
	if !ok {
		if !d.ended(resp.WatchID) {
			d.dropUnknown(resp.WatchID, true)
		}
		return
	}
	if len(resp.Events) == 0 && !resp.Fragment { // a progress notification
		d.bookmark(w, resp.Header)
		return
	}
	e := &w.entry
	events, skipped := newerEvents(d.frags[w], resp.Events, e.floor(), e.again())
	d.s.stats.duplicates.Add(uint64(skipped))
	if resp.Fragment {
		d.frags[w] = events
		d.s.stats.fragments.Add(1)
		return
	}
	delete(d.frags, w)
	if len(events) == 0 {
		return
	}
	e.advance(events[len(events)-1].ModRevision)
	d.s.stats.events.Add(uint64(len(events)))
	d.deliver(w, Response{Header: resp.Header, Events: events, Revision: e.rev})
}

// dropUnknown drops a response for an id the stream does not know, and asks
// the server once to cancel the id if it looks live.
func (d *dispatcher) dropUnknown(id int64, live bool) {
	if _, ok := d.cancelling[id]; ok {
		return // a late response for a watch we canceled
	}
	d.s.stats.unknown.Add(1)
	if live && id >= 0 {
		d.log.Debug("etcdwatch: canceling unknown watch id", "id", id)
		d.sendCancel(id)
	}
}

// ended reports whether id is one the client chose on this stream for a
// watch that has ended since: etcd may send a watch's last responses after
// it answered the cancel (its send loop takes them from another queue), and
// they need no cancel of their own.
func (d *dispatcher) ended(id int64) bool { return id >= firstWatchID && id <= d.nextID }

func (d *dispatcher) sendCancel(id int64) {
	d.cancelling[id] = struct{}{}
	d.outbox = append(d.outbox, wireRequest{kind: requestCancel, id: id})
}

// bookmark delivers a progress notification at the header's revision.
func (d *dispatcher) bookmark(w *Watch, h Header) {
	rev := h.Revision
	e := &w.entry
	if _, inside := d.frags[w]; rev < e.rev || inside {
		return // behind the watch (a future start revision), or inside a fragmented revision
	}
	e.advance(rev)
	d.deliver(w, Response{Header: h, Revision: rev})
}

// handleCancel releases a watch its consumer has ended.
func (d *dispatcher) handleCancel(w *Watch) {
	switch w.entry.state {
	case stateCreating: // in toCreate or pending
		d.abandon(w)
	case stateActive:
		delete(d.watches, w.ID())
		d.sendCancel(w.ID())
		d.forget(w)
	case statePaused: // its server-side watch is already canceled
		d.forget(w)
	}
}

package etcdwatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/etcdwatch/etcdwatch/internal/ring"
)

// Commands other goroutines send to the dispatcher through Stream.cmds.
type (
	createCmd struct { // open ws, ending them with ctx
		ws  []*Watch
		ctx context.Context
	}
	cancelCmd   struct{ w *Watch }          // w was ended by its consumer: release it
	cancelsCmd  struct{ ws []*Watch }       // as cancelCmd, for each of ws
	resumeCmd   struct{ w *Watch }          // the consumer of paused w has caught up
	progressCmd struct{ p *progressWaiter } // a RequestProgress call waits
)

// dispatcher owns all of a Stream's watch state. Only its run goroutine
// touches its fields, so none of them is locked.
type dispatcher struct {
	s    *Stream
	open opener
	log  *slog.Logger

	sess      *session  // the gRPC stream now; nil while waiting to reconnect
	sessStart time.Time // when sess was opened
	sessOpen  bool      // sess has opened its gRPC stream
	sessHeard bool      // the server has said something on sess
	downSince time.Time // when the last stream that worked ended; zero while one works
	failed    error     // a failure reconnecting cannot fix; nil while the stream is usable
	backoff   backoff   // delays between reconnections
	retry     timer     // fires to open the next session
	live      liveness  // notices a stream that has gone silent
	hurry     connHurry // cuts gRPC's reconnect backoff short while a stream waits for it

	watches    map[int64]*Watch              // active watches by server id
	paused     map[*Watch]struct{}           // paused watches, waiting for their consumers
	cancelling map[int64]struct{}            // ids whose cancel was sent and not yet answered
	toCreate   ring.Ring[*Watch]             // creates not yet sent
	pending    ring.Ring[*Watch]             // creates sent, in request order
	nextID     int64                         // last client-chosen id; ids are never reused on a stream
	idsTrusted bool                          // this stream has echoed a chosen id
	idsIgnored bool                          // this stream picked its own id (a proxy): one create at a time
	proxySeen  bool                          // a stream has picked its own ids: each new one starts one create at a time
	slowStart  bool                          // the next streams start one create at a time, until one echoes an id
	discard    bool                          // this stream's answers cannot be matched: nothing more is read from it
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

func newDispatcher(s *Stream, open opener) *dispatcher {
	return &dispatcher{
		s:          s,
		open:       open,
		log:        s.opts.logger,
		watches:    make(map[int64]*Watch),
		paused:     make(map[*Watch]struct{}),
		cancelling: make(map[int64]struct{}),
		frags:      make(map[*Watch][]Event),
		ctxs:       make(map[<-chan struct{}]*ctxGroup),
		nextID:     firstWatchID - 1,
		progress:   progressState{retry: s.opts.progressRetry},
		stall:      stall{max: s.opts.stallBudget},
		backoff:    backoff{min: s.opts.backoffMin, max: s.opts.backoffMax},
		live:       liveness{idle: s.opts.livenessIdle, timeout: s.opts.livenessTimeout},
		hurry:      newConnHurry(s.conn, s.opts.connectRetry),
	}
}

// run is the dispatcher's loop. It never blocks on anything but its select,
// and returns when the Stream is closed.
func (d *dispatcher) run() {
	d.connect()
	defer d.shutdown()
	for {
		var (
			recv   <-chan wireResponse
			send   chan<- []wireRequest
			opened <-chan struct{}
			dead   <-chan struct{}
		)
		if d.sess != nil {
			dead = d.sess.dead
			if !d.sessOpen {
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
		case c := <-d.s.cmds:
			d.handleCommand(c)
			d.drainCommands()
			if d.unsent {
				d.dropUnsent()
			}
		case resp := <-recv:
			d.s.stats.lastMessage.Store(time.Now().UnixNano()) // once a burst: a clock read costs as much as routing a response
			d.sess.took(resp.size)
			d.handleResponse(&resp)
			d.drainResponses(recv)
		case send <- d.outbox:
			d.outbox = nil
		case <-opened:
			d.sessOpen = true
			d.s.state.opened(time.Now())
		case <-dead:
			d.handleSessionEnd()
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
		}
	}
}

// reading reports whether the loop reads responses: not while it waits for
// a consumer (a stall), nor from a stream whose answers cannot be matched.
func (d *dispatcher) reading() bool { return d.stall.w == nil && !d.discard }

// drainBatch bounds how many waiting responses the loop takes in a row
// before it looks at commands and timers again.
const drainBatch = 64

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
			d.sess.took(resp.size)
			d.handleResponse(&resp)
		default:
			return
		}
	}
}

// drainCommands handles commands that are already waiting, likewise.
func (d *dispatcher) drainCommands() {
	for range drainBatch {
		select {
		case c := <-d.s.cmds:
			d.handleCommand(c)
		default:
			return
		}
	}
}

// shutdown ends everything the dispatcher owns, for Close.
func (d *dispatcher) shutdown() {
	d.endAll(ErrClosed, true)
	if d.sess != nil {
		d.sess.close()
		d.s.state.ended(ErrClosed, d.sessOpen, time.Now())
	}
	d.retry.stop()
	d.stall.stop()
	d.live.stop()
	d.hurry.stop()
	d.progress.stop()
	for { // commands that arrived too late
		select {
		case c := <-d.s.cmds:
			switch c := c.(type) {
			case createCmd:
				for _, w := range c.ws {
					w.tellCreated(ErrClosed)
					w.end(ErrClosed, true)
				}
			case progressCmd:
				c.p.reply <- progressResult{err: ErrClosed}
			}
		default:
			return
		}
	}
}

func (d *dispatcher) handleCommand(c any) {
	switch c := c.(type) {
	case createCmd:
		d.handleCreate(c.ws, c.ctx)
	case ctxDoneCmd:
		d.handleCtxDone(c.g)
	case cancelCmd:
		d.handleCancel(c.w)
	case cancelsCmd:
		for _, w := range c.ws {
			d.handleCancel(w)
		}
	case resumeCmd:
		d.handleResume(c.w)
	case progressCmd:
		d.handleProgressRequest(c.p)
	case versionCmd:
		d.handleVersion(c)
	default:
		panic(fmt.Sprintf("etcdwatch: dispatcher got an unknown command %T", c))
	}
}

// handleCreate queues the creates of ws, in order, and sends them.
func (d *dispatcher) handleCreate(ws []*Watch, ctx context.Context) {
	for _, w := range ws {
		if d.failed != nil {
			w.tellCreated(d.failed)
			w.end(d.failed, true)
			continue
		}
		d.bind(w, ctx)
		d.s.stats.watches.Add(1)
		d.toCreate.Push(w)
	}
	d.flushCreates()
}

// handleCancel releases a watch its consumer has ended.
func (d *dispatcher) handleCancel(w *Watch) {
	switch w.state {
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

// flushCreates sends queued creates, pipelined. Answers are matched to
// creates by order, which etcd keeps; etcd's gRPC proxy does not (it answers
// a create that joins a range it already watches first) and picks its own
// ids, so until a stream has echoed an id the client chose, the first answer
// must echo the oldest create's id or the stream is given up (see
// handleCreated). On a stream that picks its own ids, and on every stream
// after one did, one create is in flight at a time.
func (d *dispatcher) flushCreates() {
	if d.toCreate.Len() > 0 {
		d.stallShared() // their answers wait behind a stall
	}
	pipeline := !d.idsIgnored && (d.idsTrusted || !d.proxySeen && !d.slowStart)
	for d.toCreate.Len() > 0 && (pipeline || d.pending.Len() == 0) {
		w, _ := d.toCreate.Pop()
		if w.abandoned {
			d.forget(w)
			continue
		}
		w.reqID = d.newID()
		start := w.rev + 1
		if w.fromNow {
			start = 0
		}
		d.outbox = append(d.outbox, wireRequest{kind: requestCreate, id: w.reqID, start: start, watch: &w.req})
		d.pending.Push(w)
	}
}

// firstWatchID is the first id the client chooses. A server that picks its
// own ids counts each stream's watches from 0; starting far above, an id it
// picks can never pass for the echo of one the client asked for.
const firstWatchID = 1 << 32

// newID returns an id never used on this stream and not awaiting a cancel.
func (d *dispatcher) newID() int64 {
	for {
		d.nextID++
		if _, busy := d.cancelling[d.nextID]; !busy {
			return d.nextID
		}
	}
}

func (d *dispatcher) sendCancel(id int64) {
	d.cancelling[id] = struct{}{}
	d.outbox = append(d.outbox, wireRequest{kind: requestCancel, id: id})
}

// abandon releases a watch ended by its consumer while its create is queued
// or in flight: it counts as a watch no more, and its create is not sent if
// it has not been (see dropUnsent). It is forgotten when its turn comes:
// when its create would be sent, or its answer arrives and its server-side
// watch is canceled.
func (d *dispatcher) abandon(w *Watch) {
	w.abandoned = true
	d.unbind(w)
	d.s.stats.watches.Add(-1)
	d.unsent = true
}

// dropUnsent takes the creates of abandoned watches out of the outbox,
// which holds what the stream has not been given yet, and those watches out
// of the creates in flight: the server never hears of them. While the
// stream waits for its connection every create waits there, and a Watch
// call that gave up meanwhile would otherwise cost a create and a cancel
// once it is back. Called after a batch of commands.
func (d *dispatcher) dropUnsent() {
	d.unsent = false
	dropped := make(map[int64]bool) // by create id: true until found unsent
	for w := range d.pending.All() {
		if w.abandoned {
			dropped[w.reqID] = true
		}
	}
	if len(dropped) == 0 {
		return
	}
	d.outbox = slices.DeleteFunc(d.outbox, func(r wireRequest) bool {
		if r.kind != requestCreate || !dropped[r.id] {
			return false
		}
		dropped[r.id] = false
		return true
	})
	d.pending.DeleteFunc(func(w *Watch) bool {
		if found, ok := dropped[w.reqID]; ok && !found && w.abandoned {
			d.forget(w)
			return true
		}
		return false
	})
}

// forget drops a watch that has ended or was abandoned.
func (d *dispatcher) forget(w *Watch) {
	if w.state == statePaused {
		delete(d.paused, w)
		d.s.stats.paused.Add(-1)
	}
	d.endStall(w)
	d.unbind(w)
	w.state = stateDone
	delete(d.frags, w)
	if !w.probe && !w.abandoned { // an abandoned watch stopped counting then
		d.s.stats.watches.Add(-1)
	}
}

// end ends a watch the dispatcher still tracks and forgets it.
func (d *dispatcher) end(w *Watch, err error, drop bool) {
	if w.probe {
		d.forget(w)
		return
	}
	w.tellCreated(err)
	w.end(err, drop)
	d.forget(w)
}

// endAll ends every watch and progress waiter with err.
func (d *dispatcher) endAll(err error, drop bool) {
	for _, w := range d.watches {
		d.end(w, err, drop)
	}
	for w := range d.paused {
		d.end(w, err, drop)
	}
	for _, q := range []*ring.Ring[*Watch]{&d.pending, &d.toCreate} {
		for w, ok := q.Pop(); ok; w, ok = q.Pop() {
			d.end(w, err, drop)
		}
	}
	clear(d.watches)
	clear(d.cancelling)
	d.progress.fail(err)
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
	if !d.sessHeard {
		d.streamWorks()
	}
	if resp.Header.Revision > d.maxRev {
		d.maxRev = resp.Header.Revision
		d.s.stats.revision.Store(d.maxRev)
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

// handleCreated matches a created response to the oldest create in flight:
// the server answers creates in request order, and a refused create carries
// id -1, so order is the only reliable match.
func (d *dispatcher) handleCreated(resp *wireResponse) {
	w, ok := d.pending.Peek()
	if !ok {
		d.log.Warn("etcdwatch: created response without a create in flight", "id", resp.WatchID)
		d.dropUnknown(resp.WatchID, !resp.Canceled)
		return
	}
	if !d.idsTrusted && d.pending.Len() > 1 && (resp.Canceled || resp.WatchID != w.reqID) {
		d.dropUnmatched(resp)
		return
	}
	d.pending.Pop()
	defer d.flushCreates()
	if resp.Canceled {
		d.handleRefused(w, classifyReason(resp.CancelReason))
		return
	}
	id := resp.WatchID
	if _, taken := d.watches[id]; taken || id < 0 {
		d.log.Error("etcdwatch: server confirmed a watch with an unusable id", "id", id)
		d.end(w, &ServerError{Reason: fmt.Sprintf("server confirmed the watch with id %d, which is in use", id), kind: ErrServerCanceled}, false)
		return
	}
	switch {
	case id == w.reqID:
		d.idsTrusted, d.slowStart = true, false
	case !d.idsIgnored:
		d.log.Info("etcdwatch: server picks its own watch ids; creating one watch at a time", "asked", w.reqID, "got", id)
		d.idsIgnored, d.proxySeen = true, true
		d.s.stats.idsRewritten.Store(true)
	}
	d.s.stats.created.Add(1)
	if w.abandoned || w.probe {
		d.sendCancel(id)
		d.forget(w)
		return
	}
	d.activate(w, id, resp.Header.Revision)
}

// dropUnmatched gives up a stream whose first answer to pipelined creates
// cannot be matched for sure: an id the oldest create did not ask for (a
// server that picks its own ids, and may answer out of order), or a refusal,
// which carries no id. No create in flight is matched; all go again on a new
// stream, one at a time until it echoes an id.
func (d *dispatcher) dropUnmatched(resp *wireResponse) {
	if resp.Canceled {
		d.slowStart = true
	} else {
		d.proxySeen = true
		d.s.stats.idsRewritten.Store(true)
	}
	d.log.Info("etcdwatch: cannot match the answers to pipelined creates; new stream, one create at a time",
		"id", resp.WatchID, "refused", resp.Canceled, "in flight", d.pending.Len())
	d.discard = true // until the loop sees the stream end and replaces it
	d.sess.exit(errUnmatched)
}

// handleRefused ends a watch whose create the server refused. A stale auth
// token is the one refusal a new stream can cure, since the connection's
// credentials are attached afresh to each stream (a Dial connection
// WithPassword has dropped the refused token by then, so the next stream
// authenticates anew): the first time, the stream is replaced and the
// watch tried again on the next one.
func (d *dispatcher) handleRefused(w *Watch, err *ServerError) {
	switch {
	case w.abandoned || w.probe:
		d.forget(w)
	case errors.Is(err, ErrUnauthenticated) && !w.authRetried:
		w.authRetried = true
		d.log.Info("etcdwatch: create refused for its credentials; trying a new stream", "reason", err.Reason)
		d.toCreate.Push(w)
		d.sess.exit(errStaleCredentials)
	default:
		d.log.Warn("etcdwatch: create refused; the watch ends", "watch", w.req.String(), "reason", err.Reason)
		d.end(w, err, false)
	}
}

// activate makes w the active watch for id.
func (d *dispatcher) activate(w *Watch, id, headerRev int64) {
	w.id.Store(id)
	w.state = stateActive
	w.authRetried = false
	if w.resuming {
		w.resuming = false
		d.s.stats.resumed.Add(1)
	}
	d.watches[id] = w
	if w.fromNow {
		// The server starts a "from now" watch just after the revision it
		// reads before registering it, and reports the revision it reads
		// after; a write in between makes them differ by one. Taking one
		// less than the header can only admit that write, never skip it.
		w.fromNow = false
		w.rev = max(headerRev-1, 0)
		w.delivered.Store(w.rev)
	}
	w.tellCreated(nil)
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
	if resp.CompactRevision > 0 {
		err = &CompactedError{CompactRevision: resp.CompactRevision, Revision: w.rev + 1}
	}
	d.log.Warn("etcdwatch: server ended the watch", "watch", w.req.String(), "id", id, "err", err)
	d.end(w, err, false)
}

// handleEvents routes events, fragments and per-watch progress by watch id.
func (d *dispatcher) handleEvents(resp *wireResponse) {
	w, ok := d.watches[resp.WatchID]
	if !ok {
		d.dropUnknown(resp.WatchID, true)
		return
	}
	if len(resp.Events) == 0 && !resp.Fragment { // a progress notification
		d.bookmark(w, resp.Header)
		return
	}
	events, skipped := newerEvents(d.frags[w], resp.Events, w.rev)
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
	w.rev = events[len(events)-1].ModRevision
	d.s.stats.events.Add(uint64(len(events)))
	d.deliver(w, Response{Header: resp.Header, Events: events, Revision: w.rev})
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

// bookmark delivers a progress notification at the header's revision.
func (d *dispatcher) bookmark(w *Watch, h Header) {
	rev := h.Revision
	if _, inside := d.frags[w]; rev < w.rev || inside {
		return // behind the watch (a future start revision), or inside a fragmented revision
	}
	w.rev = rev
	d.deliver(w, Response{Header: h, Revision: rev})
}

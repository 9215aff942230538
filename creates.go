package etcdwatch

import (
	"context"
	"errors"
	"fmt"
	"slices"
)

// handleCreate queues the creates of ws, in order, and sends them. The
// watches count in Stats from the call that made them (Stream.open).
func (d *dispatcher) handleCreate(ws []*Watch, ctx context.Context) {
	for _, w := range ws {
		if d.failed != nil {
			// Never tracked: done, so that the cancel the caller sends as
			// it gives up (Stream.open) releases nothing a second time; and
			// counted no more before the caller is told.
			w.entry.state = stateDone
			d.s.stats.watches.Add(-1)
			w.tellCreated(d.failed)
			w.abort(d.failed)
			continue
		}
		d.bind(w, ctx)
		d.toCreate.Push(w)
	}
	d.flushCreates()
}

// flushCreates sends queued creates, as many as the pipelining policy
// lets be in flight (see pipeline.go). Between streams it sends none:
// connect flushes them under the next stream's policy (after a proxy's
// stream, one at a time), not the last one's.
func (d *dispatcher) flushCreates() {
	if d.sess == nil {
		return
	}
	if d.toCreate.Len() > 0 {
		d.stallShared() // their answers wait behind a stall
	}
	limit := d.pipeline.maxInFlight()
	for d.toCreate.Len() > 0 && (limit == 0 || d.pending.Len() < limit) {
		w, _ := d.toCreate.Pop()
		e := &w.entry
		if e.state == stateAbandoned {
			d.progress.sentUpTo(w, d.nextID)
			d.forget(w)
			continue
		}
		e.reqID = d.newID()
		d.outbox = append(d.outbox, wireRequest{kind: requestCreate, id: e.reqID, start: e.start(d.s.stats.revision.Load()), watch: &w.req})
		d.pending.Push(w)
		d.progress.sentUpTo(w, e.reqID)
		if !d.asked {
			d.asked = true
			d.l.state.ask()
		}
	}
	if d.toCreate.Len() == 0 {
		d.progress.allSent(d.nextID)
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

// abandon releases a watch ended by its consumer while its create is queued
// or in flight: it counts as a watch no more, and its create is not sent if
// it has not been (see dropUnsent). It is forgotten when its turn comes:
// when its create would be sent, or its answer arrives and its server-side
// watch is canceled.
func (d *dispatcher) abandon(w *Watch) {
	w.entry.state = stateAbandoned
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
	if !d.unsent {
		return
	}
	d.unsent = false
	dropped := make(map[int64]bool) // by create id: true until found unsent
	for w := range d.pending.All() {
		if w.entry.state == stateAbandoned {
			dropped[w.entry.reqID] = true
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
		if found, ok := dropped[w.entry.reqID]; ok && !found && w.entry.state == stateAbandoned {
			d.forget(w)
			return true
		}
		return false
	})
	d.flushCreates() // what waited behind them, one at a time, goes now
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
	if d.pipeline.unmatchable(d.pending.Len(), resp.Canceled, resp.WatchID == w.entry.reqID) {
		d.dropUnmatched(resp)
		return
	}
	d.pending.Pop()
	defer d.flushCreates()
	defer d.createAnswered() // once w is active, or ended

	if resp.Canceled {
		d.handleRefused(w, classifyReason(resp.CancelReason))
		return
	}
	id := resp.WatchID
	if _, taken := d.watches[id]; taken || id < 0 {
		d.log.Error("etcdwatch: server confirmed a watch with an unusable id", "id", id)
		d.endWatch(w, &ServerError{Reason: fmt.Sprintf("server confirmed the watch with id %d, which is in use", id)})
		return
	}
	if d.pipeline.confirmed(id == w.entry.reqID) {
		d.log.Info("etcdwatch: server picks its own watch ids; creating one watch at a time", "asked", w.entry.reqID, "got", id)
		d.s.stats.idsRewritten.Store(true)
	}
	if e := &w.entry; e.state == stateAbandoned || e.is(probe) {
		d.sendCancel(id)
		d.forget(w)
		return
	}
	d.s.stats.created.Add(1) // a user's watch: a probe's answer is no create of theirs
	d.activate(w, id, resp.Header.Revision)
}

// dropUnmatched gives up a stream whose first answer to pipelined creates
// cannot be matched for sure: an id the oldest create did not ask for (a
// server that picks its own ids, and may answer out of order), or a refusal,
// which carries no id. No create in flight is matched; all go again on a new
// stream, one at a time until it echoes an id.
func (d *dispatcher) dropUnmatched(resp *wireResponse) {
	d.pipeline.unmatched(resp.Canceled)
	if !resp.Canceled {
		d.s.stats.idsRewritten.Store(true)
	}
	d.log.Info("etcdwatch: cannot match the answers to pipelined creates; new stream, one create at a time",
		"id", resp.WatchID, "refused", resp.Canceled, "in flight", d.pending.Len())
	d.discard = true // until the loop sees the stream end and replaces it
	d.sess.exit(errUnmatched)
}

// handleRefused ends a watch whose create the server refused. A stale auth
// token is the one refusal a new stream can cure, since the connection's
// credentials are attached afresh to each stream (a connection from
// package dial WithPassword has dropped the refused token by then, so the
// next stream authenticates anew): the first time, the stream is replaced
// and the watch tried again on the next one.
func (d *dispatcher) handleRefused(w *Watch, err *ServerError) {
	e := &w.entry
	switch {
	case e.state == stateAbandoned || e.is(probe):
		d.forget(w)
	case errors.Is(err, ErrUnauthenticated) && !e.is(authRetried):
		e.set(authRetried, true)
		d.log.Info("etcdwatch: create refused for its credentials; trying a new stream", "reason", err.Reason)
		unconfirmedAgain(w)
		d.toCreate.Push(w)
		d.sess.exit(errStaleCredentials)
	default:
		d.log.Warn("etcdwatch: create refused; the watch ends", "watch", w.Request().String(), "reason", err.Reason)
		d.endWatch(w, err)
	}
}

// activate makes w the active watch for id.
func (d *dispatcher) activate(w *Watch, id, headerRev int64) {
	e := &w.entry
	w.id.Store(id)
	e.state = stateActive
	e.set(authRetried|recreated, false)
	if e.is(moving) {
		e.set(moving, false)
		d.s.stats.moved.Add(1)
	}
	d.watches[id] = w
	if e.created != nil {
		w.createdRev = headerRev
	}
	e.set(nowHere, e.is(fromNow)) // the create confirmed asked from now (see entry.start)
	if e.is(fromNow) {
		// The server starts a "from now" watch just after the store's
		// revision when it registers it, and reports the revision it reads
		// after that: any number of writes in between (under load, dozens)
		// make the header run ahead of the start, and their events come
		// after the created response. The start is not known, so until
		// the first event or bookmark every event is new (etcd sends none
		// twice on one stream), and nothing counts as delivered. A resume
		// meanwhile asks from the header's revision, one below what
		// clientv3 asks from; the events of writes racing the create that
		// had not come yet by then are lost with both.
		e.set(fromNow, false)
		e.set(unanchored, true)
		e.rev = max(headerRev-1, 0)
	} else {
		// Created again, from rev+1 (or rev, see entry.start): its start on
		// this stream is known, and an event at or below rev is a replay,
		// though nothing came on the stream before.
		e.set(unanchored, false)
	}
	w.tellCreated(nil)
}

package etcdwatch

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"

	"github.com/etcdwatch/etcdwatch/internal/clock"
	"github.com/etcdwatch/etcdwatch/internal/ring"
	"github.com/etcdwatch/etcdwatch/internal/rpcerr"
)

// Causes with which the dispatcher itself ends a session, to replace it.
var (
	errSilent           = errors.New("etcdwatch: watch stream silent past its liveness timeout")
	errStaleCredentials = errors.New("etcdwatch: watch refused for its credentials")
	errUnmatched        = errors.New("etcdwatch: answers to pipelined creates could not be matched")
)

// connect opens a new session. Creates and progress requests queued while
// disconnected go out as soon as its stream is open.
//
// A stream that replaces one that ended, with no creates to send, sends a
// liveness probe at once: nothing else would draw an answer from it, and
// until one comes State says it is not connected (so a group, say, leaves
// the Stream out) for as long as the liveness idle, or for ever without
// the checks. The lane's first stream is probed likewise once it opens, if
// its connection failed meanwhile (handleOpened).
func (d *dispatcher) connect() {
	again := !d.sessStart.IsZero() // set by every connect
	d.sess = startSession(d.open, d.clock.Now, d.s.hooks)
	d.firstOpen = !again
	d.pipeline.opened() // the new stream may reach another server
	d.sessStart, d.sessHeard = d.clock.Now(), false
	d.live.arm(d.clock)
	d.hurry.arm(d.clock)
	d.flushCreates()
	d.resendProgress()
	if again && d.pending.Len() == 0 {
		d.sendProbe()
	}
}

// handleOpened probes the lane's first stream once it has opened, if its
// connection failed meanwhile and nothing else on it draws an answer, as a
// stream that replaces one that ended is probed: so that State reads
// connected once the server is back, rather than a liveness idle later
// (never, with the checks off), and a group does not leave the Stream out
// of its placement meanwhile.
func (d *dispatcher) handleOpened() {
	d.firstOpen = false
	if !d.sessHeard && d.pending.Len() == 0 && d.toCreate.Len() == 0 && d.l.state.get().LastError != nil {
		d.sendProbe()
	}
}

// handleSessionEnd reacts to a gRPC stream that ended: a failure that a new
// stream cannot fix ends every watch; any other is retried after a backoff,
// with every live watch re-created from its next revision.
func (d *dispatcher) handleSessionEnd() {
	err := d.sess.err
	for len(d.sess.recv) > 0 && d.reading() { // what arrived before the end still counts
		resp := <-d.sess.recv
		d.take(&resp)
	}
	if w := d.stall.w; w != nil {
		d.pause(w) // its server-side watch is gone; it is re-created once its consumer catches up
	}
	d.sess.close()
	unsent := d.sess.unsent()
	now := d.clock.Now()
	up := d.sess.upFor(now)
	d.sess = nil
	d.discard = false
	d.live.Stop()
	d.l.state.ended(err, d.sessHeard, now)
	if !d.retryable(err) && !d.refuseTooLarge(err, unsent) {
		if d.connClosed() && !rpcerr.Final(err) && !rpcerr.Canceled(err) {
			err = errConnClosing // what ended the stream (a member gone, say) matters no more
		}
		d.log.Warn("etcdwatch: watch stream failed", "err", err)
		d.failed = streamError(err)
		d.l.state.dead(d.failed) // the Stream's State shows its main lane's (combine)
		d.clearOutbox()
		d.endAll(d.failed)
		return
	}
	end := streamEnd{
		// A stream that said nothing worked if it stayed open a while (one
		// without watches has nothing to say), counted from when it opened,
		// not from when it began to wait for its connection; but not one
		// given up as silent: its liveness probe went unanswered.
		worked:   d.sessHeard || (up >= healthyPeriod && !errors.Is(err, errSilent)),
		noLeader: rpcerr.NoLeader(err),
	}
	switch {
	case end.worked && d.sessHeard:
		d.downSince = d.heardAt // the watches have heard nothing since: a silent stream counts from then
	case end.worked && d.downSince.IsZero():
		d.downSince = now // else an outage is under way, and counts from its start
	}
	delay := d.backoff.next(now, end)
	d.s.stats.reconnects.Add(1)
	d.logStreamEnd(err, end, delay)
	d.requeueAll()
	d.retry.Reset(d.clock, delay)
}

// retryable reports whether a new stream may succeed where this one ended
// with err. Refusals about who the caller is or what it asked are final, and
// so is a connection its owner has closed.
func (d *dispatcher) retryable(err error) bool {
	switch {
	case d.connClosed():
		return false
	case errors.Is(err, io.EOF) || errors.Is(err, errSilent) || errors.Is(err, errStaleCredentials) || errors.Is(err, errUnmatched):
		return true
	}
	return !rpcerr.Final(err) && !rpcerr.TooLarge(err)
}

// connClosed reports whether the Stream's connection has been closed by
// its owner, when it can tell (WithConnectivity, or a *grpc.ClientConn
// given to Open).
func (d *dispatcher) connClosed() bool {
	c := d.s.opts.connectivity
	return c != nil && c.GetState() == connectivity.Shutdown
}

// errConnClosing is what a Stream whose connection was closed by its owner
// fails with, whatever ended its last stream: gRPC's own error for an RPC
// on a closed connection, which the stream meets when it is open then.
var errConnClosing = status.Error(codes.Canceled, "grpc: the client connection is closing")

// refuseTooLarge ends the watch whose create broke a message-size limit
// and so ended the stream (err), and reports whether it found it: the
// others go on on a new stream, and it ends alone, with a *ServerError
// matching ErrInvalidRequest, as a refused create does. Without one, the
// limit was the Stream's own receive limit, which the response that broke
// it would break again: err is final.
func (d *dispatcher) refuseTooLarge(err error, unsent wireRequest) bool {
	w := d.oversized(err, unsent)
	if w == nil {
		return false
	}
	d.pending.DeleteFunc(func(p *Watch) bool { return p == w })
	d.handleRefused(w, &ServerError{Reason: status.Convert(err).Message()})
	return true
}

// oversized finds the create in flight that broke the size limit err
// names, if one did. What gRPC's send limit refused, the session names
// (unsent). The server stops at the first message above its limit, so the
// culprit is the first create, in the order sent, whose size is the one
// the error gives. A limit that is the Stream's own receive limit allows
// only that exact match: anything else is a response over it, final. Any
// other limit is the server's: where the error gives no size (checked
// after decompression), or a size none of the creates has (compressed),
// the first create above it is taken for the culprit.
func (d *dispatcher) oversized(err error, unsent wireRequest) *Watch {
	size, limit, ok := rpcerr.Sizes(err)
	switch {
	case !ok:
		return nil
	case unsent.kind != 0:
		if unsent.kind != requestCreate {
			return nil
		}
		return d.firstPending(func(w *Watch) bool { return w.entry.reqID == unsent.id })
	}
	if w := d.firstPending(func(w *Watch) bool {
		lo, hi := d.createMessageSizes(w)
		return size == lo || size == hi
	}); w != nil || limit == d.s.opts.recvLimit() {
		return w
	}
	return d.firstPending(func(w *Watch) bool { _, hi := d.createMessageSizes(w); return hi > limit })
}

// firstPending returns the first create in flight, in the order sent, for
// which match holds.
func (d *dispatcher) firstPending(match func(*Watch) bool) *Watch {
	for w := range d.pending.All() {
		if match(w) {
			return w
		}
	}
	return nil
}

// createMessageSizes are the sizes the WatchRequest that sent w's create
// can have had: its start revision was w's own or the next (see
// entry.start), whose encodings may differ by a byte.
func (d *dispatcher) createMessageSizes(w *Watch) (lo, hi int) {
	r := wireRequest{kind: requestCreate, id: w.entry.reqID, watch: &w.req}
	if w.entry.is(fromNow) {
		n := createMessageSize(r.createSize())
		return n, n
	}
	r.start = w.entry.rev
	lo = createMessageSize(r.createSize())
	r.start++
	hi = createMessageSize(r.createSize())
	return min(lo, hi), max(lo, hi)
}

// requeueAll puts every watch that had or awaited a server-side watch back in
// line to be created on the next stream: creates in flight first, in their
// order, then queued ones, then active watches, each from its next revision.
// Requests meant for the old stream are dropped; paused watches stay paused.
func (d *dispatcher) requeueAll() {
	d.clearOutbox()
	clear(d.cancelling)
	var q ring.Ring[*Watch]
	for _, from := range []*ring.Ring[*Watch]{&d.pending, &d.toCreate} {
		for w, ok := from.Pop(); ok; w, ok = from.Pop() {
			if w.entry.is(probe) {
				continue // it spoke for the old stream
			}
			if from == &d.pending {
				unconfirmedAgain(w)
			}
			q.Push(w)
		}
	}
	for _, w := range d.watches {
		w.entry.state = stateCreating
		w.entry.set(moving|recreated, true) // counted as moved once the new stream confirms it
		q.Push(w)
	}
	clear(d.watches)
	clear(d.frags)
	d.toCreate = q
	d.progress.suspend()
	if last := d.toCreate.Last(); last != nil {
		d.progress.awaitUpTo(*last)
	}
}

// handleLivenessTick checks that the stream is still talking: idle after its
// last message it sends a probe, and if nothing at all arrives within the
// timeout the session is ended, to be replaced by a new one. So a stream
// that goes silent is given up idle plus timeout after its last message.
func (d *dispatcher) handleLivenessTick() {
	l := &d.live
	switch {
	case !d.sess.isOpen(): // waiting for a connection: nothing to probe, and State has why
		l.heard, l.probing = false, false
		l.Reset(d.clock, l.idle)
	case l.heard: // quiet since the last burst: probe once that is idle ago
		l.heard, l.probing = false, false
		l.Reset(d.clock, max(l.idle-d.clock.Now().Sub(d.heardAt), 0))
	case !l.probing:
		l.probing = true
		d.log.Debug("etcdwatch: stream quiet; probing")
		d.sendProbe()
		l.Reset(d.clock, l.timeout)
	default:
		d.log.Warn("etcdwatch: watch stream silent; reconnecting", "timeout", l.timeout)
		d.sess.exit(errSilent)
	}
}

// probeAnswered ends a probe the moment the stream says anything: the
// next is due idle from now.
func (d *dispatcher) probeAnswered() {
	l := &d.live
	l.heard, l.probing = false, false
	l.Reset(d.clock, l.idle)
}

// probeKey is watched, and at once unwatched, by liveness probes.
var probeKey = pack(Key("\x00etcdwatch-liveness-probe"))

// sendProbe creates and cancels a throwaway watch. Unlike a progress request,
// which etcd 3.6+ leaves unanswered while any watch catches up or starts in
// the future, a create is always answered, refused or not. It watches from
// now: from an old revision, etcd would replay history for it (its whole
// store, never compacted) if its next pass of unsynced watches came before
// the cancel.
func (d *dispatcher) sendProbe() {
	d.toCreate.Push(&Watch{lane: d.l, req: probeKey, entry: entry{flags: probe | fromNow}})
	d.flushCreates()
}

// streamWorks notes the first response on a stream, and if it replaces
// streams that failed, says so once, with how long the watches were down.
func (d *dispatcher) streamWorks() {
	d.sessHeard = true
	d.l.state.answered(d.clock.Now())
	d.hurry.Stop()
	if d.downSince.IsZero() {
		return
	}
	d.log.Info("etcdwatch: watch stream back", "down", d.clock.Now().Sub(d.downSince), "watches", d.s.stats.watches.Load())
	d.downSince = time.Time{}
}

// logStreamEnd reports a stream that ended and will be replaced: at Info
// for the first failure after a stream that worked, at Debug for the
// streams that then fail in a row (a member without a leader refuses one
// every noLeaderRetry).
func (d *dispatcher) logStreamEnd(err error, end streamEnd, delay time.Duration) {
	level := slog.LevelDebug
	if end.worked {
		level = slog.LevelInfo
	}
	d.log.Log(context.Background(), level, "etcdwatch: watch stream ended; reconnecting",
		"err", err, "after", delay, "watches", d.s.stats.watches.Load())
}

// The reconnection policy. A new stream follows one that worked at once;
// the backoff only spaces out streams that fail before doing anything, and
// waiting for the connection itself is left to gRPC (see connHurry).
const (
	// healthyPeriod is how long a stream must stay up to count as having
	// worked even if the server never said anything on it (a Stream with
	// nothing to watch).
	healthyPeriod = 10 * time.Second
	// noLeaderRetry spaces out streams refused because their member has no
	// leader (WithRequireLeader): such a refusal costs the server nothing,
	// and the stream should be back as soon as a leader is.
	noLeaderRetry = 50 * time.Millisecond
)

// streamEnd is what the reconnection policy knows of a stream that ended.
type streamEnd struct {
	worked   bool // the server said something on it, or it stayed up for healthyPeriod
	noLeader bool // it was refused or ended because its member had no leader
}

// backoff yields the delay before the next stream, given how the last one
// ended:
//   - after a stream that worked, none, except that immediate retries are
//     spaced at least min apart, so that a stream that fails each time just
//     after it starts working cannot make the Stream spin;
//   - after a stream refused for want of a leader, noLeaderRetry, jittered;
//   - after one that failed before doing anything, about min, doubling with
//     each such stream in a row up to max, with jitter.
//
// Owned by the dispatcher; now is injected for tests.
type backoff struct {
	min, max  time.Duration
	failures  int       // streams in a row that failed before doing anything
	immediate time.Time // when the last retry without backoff was due
}

func (b *backoff) next(now time.Time, end streamEnd) time.Duration {
	switch {
	case end.worked:
		b.failures = 0
		d := max(b.immediate.Add(b.min).Sub(now), 0)
		b.immediate = now.Add(d)
		return d
	case end.noLeader:
		return jitter(noLeaderRetry)
	}
	b.failures++
	return growing(b.min, b.max, b.failures)
}

// growing is the delay after n failures in a row: lo doubling with each
// up to hi, jittered; n below 1 counts as 1. The doubling is compared
// against hi before it is made, so that it cannot overflow however long
// lo is or however many the failures.
func growing(lo, hi time.Duration, n int) time.Duration {
	d := hi
	if shift := max(n-1, 0); shift < 63 && lo <= hi>>shift {
		d = lo << shift
	}
	return jitter(d)
}

// jitter returns a random duration from half of d to all of d.
func jitter(d time.Duration) time.Duration { return d/2 + rand.N(d/2+1) }

// connHurry keeps a connection that the stream is waiting for from sitting
// out gRPC's reconnect backoff: its default waits 1s, then 1.6 times longer
// each time up to 2 minutes, so a member back after a 3s outage would be
// reached 2s late. While a stream waits to open and its connection is in
// TRANSIENT_FAILURE, the connection's backoff is reset every interval,
// so that it tries again at once. A connection with other ready addresses
// (package dial's round_robin with a member down) is not in TRANSIENT_FAILURE and is
// left alone. Owned by the dispatcher.
type connHurry struct {
	conn     connState // nil: the connection cannot be hurried, or WithConnectRetry(0)
	interval time.Duration
	clock.Stoppable
}

func newConnHurry(c connState, interval time.Duration) connHurry {
	if c == nil || interval == 0 {
		return connHurry{}
	}
	return connHurry{conn: c, interval: interval}
}

// arm starts watching the connection for a new stream.
func (h *connHurry) arm(c clock.Clock) {
	if h.conn != nil {
		h.Reset(c, h.interval)
	}
}

// handleHurryTick resets the connection's backoff if the stream still waits
// for it, and keeps watching until the stream has opened: the connection is
// up then, and a stream that ends after is followed by a new watch.
func (d *dispatcher) handleHurryTick() {
	h := &d.hurry
	if d.sess == nil || d.sessHeard || d.sess.isOpen() {
		h.Stop()
		return
	}
	if h.conn.GetState() == connectivity.TransientFailure {
		d.log.Debug("etcdwatch: connection in transient failure; reconnecting now")
		h.conn.ResetConnectBackoff()
	}
	h.Reset(d.clock, h.interval)
}

// liveness tracks whether the stream has said anything lately.
type liveness struct {
	idle, timeout time.Duration // idle 0 disables the checks
	clock.Stoppable
	heard   bool // a response arrived since the last tick
	probing bool // a probe is out and the timeout runs
}

func (l *liveness) arm(c clock.Clock) {
	l.heard, l.probing = false, false
	if l.idle > 0 {
		l.Reset(c, l.idle)
	}
}

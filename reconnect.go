package etcdwatch

import (
	"errors"
	"io"
	"math/rand/v2"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"

	"github.com/etcdwatch/etcdwatch/internal/ring"
)

// healthyPeriod is how long a stream must stay up for the reconnection
// backoff to start again from its shortest delay.
const healthyPeriod = 10 * time.Second

// Causes with which the dispatcher itself ends a session, to replace it.
var (
	errSilent           = errors.New("etcdwatch: watch stream silent past its liveness timeout")
	errStaleCredentials = errors.New("etcdwatch: watch refused for its credentials")
	errUnmatched        = errors.New("etcdwatch: answers to pipelined creates could not be matched")
)

// connect opens a new session. Creates and progress requests queued while
// disconnected go out as soon as its stream is open.
func (d *dispatcher) connect() {
	d.sess = startSession(d.open)
	d.idsTrusted, d.idsIgnored = false, false // the new stream may reach another server
	d.sessStart = time.Now()
	d.live.arm()
	d.flushCreates()
	d.resendProgress()
}

// handleSessionEnd reacts to a gRPC stream that ended: a failure that a new
// stream cannot fix ends every watch; any other is retried after a backoff,
// with every live watch re-created from its next revision.
func (d *dispatcher) handleSessionEnd() {
	err := d.sess.err
	for len(d.sess.recv) > 0 && d.stall.w == nil && !d.discard { // what arrived before the end still counts
		resp := <-d.sess.recv
		d.handleResponse(&resp)
	}
	if w := d.stall.w; w != nil {
		d.pause(w) // its server-side watch is gone; it is re-created once its consumer catches up
	}
	d.sess.close()
	d.sess = nil
	d.discard = false
	d.live.stop()
	if !d.retryable(err) {
		d.log.Warn("etcdwatch: watch stream failed", "err", err)
		d.failed = streamError(err)
		d.outbox = nil
		d.endAll(d.failed, false)
		return
	}
	delay := d.backoff.next(time.Since(d.sessStart))
	d.s.stats.reconnects.Add(1)
	d.log.Info("etcdwatch: watch stream ended; reconnecting", "err", err, "after", delay, "watches", len(d.watches))
	d.requeueAll()
	d.retry.reset(delay)
}

// retryable reports whether a new stream may succeed where this one ended
// with err. Refusals about who the caller is or what it asked are final, and
// so is a connection its owner has closed.
func (d *dispatcher) retryable(err error) bool {
	if errors.Is(err, io.EOF) || errors.Is(err, errSilent) || errors.Is(err, errStaleCredentials) || errors.Is(err, errUnmatched) {
		return true
	}
	if c, ok := d.s.conn.(interface{ GetState() connectivity.State }); ok && c.GetState() == connectivity.Shutdown {
		return false
	}
	switch status.Code(err) {
	case codes.Unimplemented, codes.PermissionDenied, codes.Unauthenticated, codes.InvalidArgument:
		return false
	}
	return true
}

// requeueAll puts every watch that had or awaited a server-side watch back in
// line to be created on the next stream: creates in flight first, in their
// order, then queued ones, then active watches, each from its next revision.
// Requests meant for the old stream are dropped; paused watches stay paused.
func (d *dispatcher) requeueAll() {
	d.outbox = nil
	clear(d.cancelling)
	var q ring.Ring[*Watch]
	for _, from := range []*ring.Ring[*Watch]{&d.pending, &d.toCreate} {
		for w, ok := from.Pop(); ok; w, ok = from.Pop() {
			if w.probe {
				continue // it spoke for the old stream
			}
			q.Push(w)
		}
	}
	for _, w := range d.watches {
		w.state = stateCreating
		q.Push(w)
		d.s.stats.resumed.Add(1)
	}
	clear(d.watches)
	clear(d.frags)
	d.toCreate = q
	d.progress.suspend()
}

// handleLivenessTick checks that the stream is still talking: after a quiet
// interval it sends a probe, and if nothing at all arrives within the
// timeout the session is ended, to be replaced by a new one.
func (d *dispatcher) handleLivenessTick() {
	l := &d.live
	switch {
	case l.heard:
		l.heard, l.probing = false, false
		l.timer.reset(l.idle)
	case !l.probing:
		l.probing = true
		d.log.Debug("etcdwatch: stream quiet; probing")
		d.sendProbe()
		l.timer.reset(l.timeout)
	default:
		d.log.Warn("etcdwatch: watch stream silent; reconnecting", "timeout", l.timeout)
		d.sess.exit(errSilent)
	}
}

// probeKey is watched, and at once unwatched, by liveness probes.
var probeKey = []byte("\x00etcdwatch-liveness-probe")

// sendProbe creates and cancels a throwaway watch. Unlike a progress request,
// which etcd 3.6+ leaves unanswered while any watch catches up or starts in
// the future, a create is always answered, refused or not.
func (d *dispatcher) sendProbe() {
	d.toCreate.Push(&Watch{stream: d.s, req: Request{Key: probeKey}, probe: true})
	d.flushCreates()
}

// backoff yields reconnection delays: the first retry at once, then
// exponential from min to max with jitter; it starts over after a stream
// has been healthy for healthyPeriod.
type backoff struct {
	min, max time.Duration
	attempt  int
}

func (b *backoff) next(upFor time.Duration) time.Duration {
	if upFor >= healthyPeriod {
		b.attempt = 0
	}
	b.attempt++
	if b.attempt == 1 {
		return 0
	}
	d := b.max
	if shift := b.attempt - 2; shift < 30 && b.min<<shift < b.max {
		d = b.min << shift
	}
	return d/2 + rand.N(d/2+1) // half to all of d
}

// liveness tracks whether the stream has said anything lately.
type liveness struct {
	idle, timeout time.Duration // idle 0 disables the checks
	timer
	heard   bool // a response arrived since the last tick
	probing bool // a probe is out and the timeout runs
}

func (l *liveness) arm() {
	l.heard, l.probing = false, false
	if l.idle > 0 {
		l.timer.reset(l.idle)
	}
}

// timer is a reusable timer whose channel C is nil while it is stopped, so
// that a select on it does nothing.
type timer struct {
	t *time.Timer
	C <-chan time.Time
}

func (t *timer) reset(d time.Duration) {
	if t.t == nil {
		t.t = time.NewTimer(d)
	} else {
		t.t.Reset(d)
	}
	t.C = t.t.C
}

func (t *timer) stop() {
	if t.t != nil {
		t.t.Stop()
	}
	t.C = nil
}

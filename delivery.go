package etcdwatch

import (
	"sync"
	"sync/atomic"

	"github.com/etcdwatch/etcdwatch/internal/ring"
)

// delivery is a watch's consumer side: the channel the consumer reads, or
// the Handler that calls for it, and the backlog waiting for a consumer
// that is behind. The dispatcher pushes into it; the pump goroutine (while
// there is a backlog) and the consumer, or the Handler's goroutine serving
// it, take from it; Cancel ends it. They share the fields under mu; ch,
// to, delivered and over are read without it.
//
// An idle watch keeps only what every watch needs here; what some need
// (a backlog, Done's channel, why it ended) is in more, made on first need.
type delivery struct {
	ch        chan Response // Responses(); nil with a Handler; closed exactly once, by closeOut
	to        *Handler      // calls for the watch instead of ch; immutable
	delivered atomic.Int64  // Revision(); written by whoever hands a Response over
	over      atomic.Bool   // ch is closed (or about to be): Err may read more.err

	mu      sync.Mutex
	pumping bool  // a pump goroutine is running and owns sends on ch, or the watch is queued on its Handler or being served there
	behind  bool  // the backlog reached the limit: the pump reports when it is down to half
	ended   bool  // no more pushes are taken
	dropped bool  // the backlog was thrown away: no more pushes are taken
	more    *more // nil until first needed; never nil once ended
}

// more is what a delivery needs once its consumer fell behind, Done was
// called, or the watch ended. Guarded by the delivery's mu; err is read
// without it once over is set.
type more struct {
	backlog
	err     error         // why the watch ended; written before over is set
	done    chan struct{} // Done(); made on first call, closed by closeOut
	calling bool          // a Handler's call for the watch runs: from handled's stepHandle to the next handled or yield (here, not in delivery, where it would cost every watch 16 bytes)
}

// backlog holds responses for a consumer that is behind, for the pump to
// deliver. A watch makes it when a response first finds its consumer busy,
// and keeps it, with a small buffer, for the next burst.
type backlog struct {
	queue  ring.Ring[Response]
	queued load          // what is queued or held by the pump, against the buffer limit
	stop   chan struct{} // closed, once, to make the running pump give up for good; nil with a Handler, and until the first push
}

// keptQueue is the largest queue buffer a watch keeps once drained.
const keptQueue = 4

// closed is a closed channel, Done's answer once a watch without one has ended.
var closed = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func (o *delivery) init(rev int64, to *Handler) {
	o.to = to
	if to == nil {
		o.ch = make(chan Response)
	}
	o.delivered.Store(rev)
}

// extra returns more, making it on first need. Called with mu held.
func (o *delivery) extra() *more {
	if o.more == nil {
		o.more = &more{}
	}
	return o.more
}

func (o *delivery) doneChan() <-chan struct{} {
	o.mu.Lock()
	defer o.mu.Unlock()
	m := o.extra()
	if m.done == nil {
		if o.over.Load() {
			return closed
		}
		m.done = make(chan struct{}) // made on demand: an idle watch need not carry it
	}
	return m.done
}

func (o *delivery) errIfOver() error {
	if o.over.Load() {
		return o.more.err // made when the watch ended, before over was set
	}
	return nil
}

// joinable reports whether the events of r may join queued response q: both
// carry events, few enough together. A Response holds whole revisions in
// order, and so does the joined one.
func joinable(q, r Response) bool {
	return len(q.Events) > 0 && len(r.Events) > 0 && len(q.Events)+len(r.Events) <= JoinLimit
}

// push hands r to w's consumer without ever blocking: straight to a
// waiting reader when nothing is queued, otherwise into the backlog, which
// the caller must then have a pump deliver (start); for a Handler's watch,
// push queues w on its Handler itself, before it lets go of the delivery,
// and start is false. behind reports that the backlog has just reached
// limit: the caller must stall for the consumer or pause the watch.
func (o *delivery) push(w *Watch, r Response, limit bufferLimit) (start, behind bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.ended || o.dropped {
		return false, false
	}
	if !o.pumping && o.to == nil {
		select {
		case o.ch <- r:
			o.delivered.Store(r.Revision)
			return false, false
		default:
		}
	}
	b := &o.extra().backlog
	if b.stop == nil && o.to == nil {
		b.stop = make(chan struct{})
	}
	switch last := b.queue.Last(); {
	case last != nil && r.IsProgress() && last.IsProgress():
		*last = r // a newer bookmark supersedes a queued one
		return false, false
	case last != nil && joinable(*last, r):
		last.Events = append(last.Events, r.Events...)
		last.Header, last.Revision = r.Header, r.Revision
	default:
		b.queue.Push(r)
	}
	b.queued.add(weigh(r))
	start = !o.pumping
	o.pumping = true
	if start && o.to != nil {
		// Queued on its Handler before the lock is let go: a Cancel now
		// finds it queued (endLocked), and a Wait after Done waits for Ended.
		o.to.schedule(w)
		start = false
	}
	if limit.full(b.queued) && !o.behind {
		o.behind = true
		behind = true
	}
	return start, behind
}

// next accounts for what the consumer has just taken (took, as weighed;
// nothing at first) and returns the head of the backlog for the pump,
// which stays counted against the limit until the consumer takes it.
// caughtUp reports that a backlog that was behind has fallen to half the
// limit. When the backlog is empty it ends the pump's run, releasing the
// buffer and closing the channel if the watch has ended, and reports !ok.
func (o *delivery) next(took load, limit bufferLimit) (r Response, ok, caughtUp bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	b := &o.more.backlog // made before the pump started
	caughtUp = o.account(took, limit)
	r, ok = b.queue.Pop()
	if !ok {
		o.pumping = false
		if b.queue.Cap() > keptQueue {
			b.queue.Reset() // a large backlog's buffer goes; a small one stays for the next burst
		}
		if o.ended {
			o.closeOut()
		}
	}
	return r, ok, caughtUp
}

// giveUp ends the pump's run without delivering the backlog, closing the
// channel if the watch has ended (else finish or abort will). Nothing
// more is taken: what would come next follows what was dropped, and the
// consumer would get it after a gap (the dispatcher may still hand out a
// few responses at Close before it ends the watches).
func (o *delivery) giveUp() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.more.queue.Reset()
	o.more.queued = load{}
	o.pumping = false
	o.dropped = true
	if o.ended {
		o.closeOut()
	}
}

// drop lets go of the backlog of a Handler's watch that is served, whose
// goroutine hands nothing more over (the Stream is closing); it goes on
// serving it, to its end.
func (o *delivery) drop() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if m := o.more; m != nil {
		m.backlog.queue.Reset()
		m.backlog.queued = load{}
	}
	o.dropped = true
}

// finish ends the watch with err once the consumer has taken its backlog:
// the channel closes now if no pump runs, else when the pump has delivered
// the rest. It reports whether this call ended the watch, and whether the
// caller must now schedule it on its Handler, to be told.
func (o *delivery) finish(err error) (ended, tell bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.endLocked(err)
}

// abort ends the watch with err at once: the backlog is dropped and nothing
// more is delivered (but for a Handler's call in progress). It reports as
// finish does.
func (o *delivery) abort(err error) (ended, tell bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if m := o.more; !o.dropped && m != nil {
		b := &m.backlog
		o.dropped = true
		b.queue.Reset()
		b.queued = load{}
		if o.pumping && b.stop != nil {
			close(b.stop)
		}
	}
	return o.endLocked(err)
}

func (o *delivery) endLocked(err error) (ended, tell bool) {
	if o.ended {
		return false, false
	}
	o.ended = true
	o.extra().err = err
	switch {
	case o.pumping && o.to != nil && !o.more.calling && o.more.queue.Len() == 0:
		// Queued on its Handler (or between turns) with nothing left to
		// hand over: over now; the goroutine that serves it tells Ended.
		o.closeOut()
	case o.pumping: // the pump or the Handler ends it once the backlog is through
	case o.to != nil: // no call runs nor is due: the caller schedules it, to tell Ended, then closes (Watch.told)
		o.pumping = true
		return true, true
	default:
		o.closeOut()
	}
	return true, false
}

// closeOut closes the consumer's channels. Called with mu held, exactly
// once: by finish or abort when no pump runs nor Handler call is running
// or due (for a Handler's watch, by Watch.told, once Ended is due),
// otherwise by the pump, or the Handler's goroutine, as it finishes. over
// goes first, so that a consumer who sees the channel closed finds Err
// set.
func (o *delivery) closeOut() {
	o.over.Store(true)
	if d := o.more.done; d != nil {
		close(d)
	}
	if o.ch != nil {
		close(o.ch)
	}
}

// pump feeds w's backlog to its consumer, blocking as long as the consumer
// takes, until the backlog is empty, the watch is aborted or the Stream is
// closing. When a backlog that was behind falls to half the limit it asks
// the dispatcher to resume the watch (or end its stall).
func (w *Watch) pump(stop chan struct{}) {
	s := w.lane.s
	defer s.pumps.Done()
	defer s.hooks.at(hookPumpDone)
	r, ok, _ := w.out.next(load{}, s.limit)
	for ok {
		took := weigh(r) // before the consumer, who owns r, can change it
		if !w.out.offer(r, stop, s.closing) {
			w.out.giveUp()
			return
		}
		w.out.delivered.Store(r.Revision)
		var caughtUp bool
		r, ok, caughtUp = w.out.next(took, s.limit)
		if caughtUp {
			w.lane.command(resumeCmd{w})
		}
		s.hooks.at(hookTook)
	}
}

// offer blocks until the consumer takes r, and reports false if stop or
// closing comes first. A consumer already waiting takes r without the cost
// of a select over all three.
func (o *delivery) offer(r Response, stop, closing chan struct{}) bool {
	select {
	case o.ch <- r:
		return true
	default:
	}
	select {
	case o.ch <- r:
		return true
	case <-stop:
		return false
	case <-closing:
		return false
	}
}

// step is what a Handler's goroutine does next with the watch it serves.
type step uint8

const (
	stepHandle step = iota // call the Handler's function with the response
	stepEnd                // tell the Handler the watch has ended, and let it go
	stepIdle               // nothing to do: let it go until the next push
)

// handled accounts for what the Handler's last call for the watch took
// (nothing at first) and returns what comes next: the head of the backlog,
// or the watch's end, once, when the backlog is through, or nothing, which
// ends the run. caughtUp is as for next. Called only by the Handler's
// goroutine serving the watch.
func (o *delivery) handled(took load, limit bufferLimit) (r Response, next step, caughtUp bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	caughtUp = o.account(took, limit)
	if m := o.more; m != nil {
		m.calling = false
		b := &m.backlog
		if r, ok := b.queue.Pop(); ok {
			m.calling = true
			return r, stepHandle, caughtUp
		}
		if b.queue.Cap() > keptQueue {
			b.queue.Reset()
		}
	}
	if o.ended {
		if !o.over.Load() { // else closed as it ended, with nothing to serve
			o.closeOut() // once: the watch is never served again
		}
		return r, stepEnd, false
	}
	o.pumping = false
	return r, stepIdle, caughtUp
}

// yield accounts for what the Handler's last call took, as handled does,
// for a goroutine that lets the watch go to give others a turn; the watch
// stays the Handler's to serve.
func (o *delivery) yield(took load, limit bufferLimit) (caughtUp bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.more != nil {
		o.more.calling = false
	}
	return o.account(took, limit)
}

// account takes what the consumer took off the backlog's load, and reports
// whether a backlog that was behind has fallen to half the limit. Called
// with mu held.
func (o *delivery) account(took load, limit bufferLimit) (caughtUp bool) {
	if o.more == nil || o.ended {
		return false // an ended watch is resumed no more
	}
	b := &o.more.backlog
	b.queued.sub(took)
	if o.behind && limit.caughtUp(b.queued) {
		o.behind = false
		return true
	}
	return false
}

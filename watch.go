package etcdwatch

import (
	"sync"
	"sync/atomic"

	"github.com/etcdwatch/etcdwatch/internal/ring"
)

// watchState is where a watch is in its life. The dispatcher owns it.
type watchState uint8

const (
	stateCreating watchState = iota // create queued or sent, no created response yet
	stateActive                     // confirmed by the server; events flow
	statePaused                     // buffer full: server-side watch canceled until the consumer catches up
	stateDone                       // ended; the dispatcher has forgotten it
)

// Watch is one watch on a Stream. Its methods are safe for concurrent use.
//
// Responses arrive on Responses in revision order. The channel is closed,
// exactly once, when the watch ends; Err then says why. A watch ended by the
// server (compaction, a refused permission, a broken stream) still delivers
// what it had buffered before its channel closes; a watch ended by Cancel, its
// context or Stream.Close delivers nothing more.
type Watch struct {
	stream *Stream
	req    Request // immutable

	id        atomic.Int64 // server's id for the watch; written by the dispatcher
	delivered atomic.Int64 // Revision(); written by whoever hands a Response to the consumer

	out  chan Response // Responses(); closed exactly once, by closeOut
	err  error         // why the watch ended; written before over is set
	over atomic.Bool   // out is closed (or about to be): Err may read err

	// Owned by the dispatcher.
	state       watchState
	fromNow     bool           // created with Revision 0 and not yet confirmed
	probe       bool           // a liveness probe, not a user's watch
	authRetried bool           // refused for its credentials once; refused again, it ends
	abandoned   bool           // ended by its consumer while a create was in flight
	resuming    bool           // re-created on a new stream after a reconnect, not yet confirmed
	created     chan<- created // to Stream.open, the first create's outcome; nil once told
	group       *ctxGroup      // the watches whose contexts end with this one's; nil if it never ends
	reqID       int64          // id asked for in the create in flight
	rev         int64          // every event <= rev has been queued for the consumer

	// Delivery, shared by the dispatcher (producer), the pump goroutine and
	// the consumer's Cancel; guarded by mu.
	mu      sync.Mutex
	pumping bool          // a pump goroutine is running and owns sends on out
	paused  bool          // over the limit: the pump tells the dispatcher when drained
	ended   bool          // no more pushes are taken
	dropped bool          // the backlog was thrown away
	backlog *backlog      // nil until the consumer first falls behind
	done    chan struct{} // Done(); made on first call, closed by closeOut
}

// backlog holds responses for a consumer that is behind, for the pump to
// deliver. A watch makes it when a response first finds its consumer busy,
// and keeps it, with a small buffer, for the next burst. Guarded by the
// watch's mu.
type backlog struct {
	queue  ring.Ring[Response]
	queued load          // what is queued or held by the pump, against the buffer limit
	stop   chan struct{} // closed, once, to make the running pump give up for good
}

// closed is a closed channel, Done's answer once a watch without one has ended.
var closed = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func newWatch(s *Stream, r Request) *Watch {
	w := &Watch{
		stream:  s,
		req:     r,
		out:     make(chan Response),
		fromNow: r.Revision == 0,
		rev:     max(r.Revision-1, 0),
	}
	w.id.Store(-1)
	w.delivered.Store(w.rev)
	return w
}

// ID returns the server's id for the watch. It changes when the watch is
// re-created after a pause, and is -1 before the server confirmed it.
func (w *Watch) ID() int64 { return w.id.Load() }

// Request returns the request the watch was opened with.
func (w *Watch) Request() Request { return w.req.clone() }

// Responses returns the channel of responses. It is closed once the watch has
// ended and everything it is going to deliver has been read.
func (w *Watch) Responses() <-chan Response { return w.out }

// Done is closed when Responses is closed.
func (w *Watch) Done() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done == nil {
		if w.over.Load() {
			return closed
		}
		w.done = make(chan struct{}) // made on demand: an idle watch need not carry it
	}
	return w.done
}

// Err returns nil while the watch runs, then why it ended: ErrCanceled, the
// context's cause, ErrClosed, a *CompactedError, a *ServerError, or an error
// wrapping ErrStreamFailed. Once Responses is closed, Err is set.
func (w *Watch) Err() error {
	if w.over.Load() {
		return w.err
	}
	return nil
}

// Revision returns a revision R such that every event of this watch with a
// revision <= R has been received from Responses. It is updated just after
// a Response is handed over, so it may briefly trail the Response a consumer
// has just received, never lead it; Response.Revision is exact.
func (w *Watch) Revision() int64 { return w.delivered.Load() }

// Cancel ends the watch. It is idempotent, and once it returns nothing more
// is delivered and the channel is closed. The server-side watch is released
// without waiting for the server.
func (w *Watch) Cancel() { w.cancelWith(ErrCanceled) }

// cancelWith ends the watch on its consumer's behalf and tells the dispatcher.
func (w *Watch) cancelWith(err error) {
	if w.end(err, true) {
		w.stream.command(cancelCmd{w})
	}
	<-w.Done()
}

// created is the outcome of a watch's first create: nil once the server has
// confirmed it, else why it failed.
type created struct {
	w   *Watch
	err error
}

// tellCreated gives Stream.open the outcome of the first create, once; the
// channel is dropped then, so that a running watch does not carry it.
// Called by the dispatcher.
func (w *Watch) tellCreated(err error) {
	if w.created != nil {
		w.created <- created{w, err} // buffered for every watch of the call: never blocks
		w.created = nil
	}
}

// keptQueue is the largest queue buffer a watch keeps once drained.
const keptQueue = 4

// joinable reports whether the events of r may join queued response q: both
// carry events, few enough together. A Response holds whole revisions in
// order, and so does the joined one.
func joinable(q, r Response) bool {
	return len(q.Events) > 0 && len(r.Events) > 0 && len(q.Events)+len(r.Events) <= JoinLimit
}

// push hands r to the consumer without ever blocking: straight to a waiting
// reader when nothing is queued, otherwise into the queue served by the pump.
// It reports whether the queue has reached the buffer limit, in which case
// the watch is marked paused and the caller must stall for it or pause it.
func (w *Watch) push(r Response) (full bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ended {
		return false
	}
	if !w.pumping {
		select {
		case w.out <- r:
			w.delivered.Store(r.Revision)
			return false
		default:
		}
	}
	b := w.backlog
	if b == nil {
		b = &backlog{stop: make(chan struct{})}
		w.backlog = b
	}
	switch last := b.queue.Last(); {
	case last != nil && r.IsProgress() && last.IsProgress():
		*last = r // a newer bookmark supersedes a queued one
		return false
	case last != nil && joinable(*last, r):
		last.Events = append(last.Events, r.Events...)
		last.Header, last.Revision = r.Header, r.Revision
	default:
		b.queue.Push(r)
	}
	b.queued.add(weigh(r))
	if !w.pumping {
		w.pumping = true
		w.stream.pumps.Add(1)
		go w.pump(b.stop) // exits when the queue is empty or stop closes; Close waits on stream.pumps
	}
	if w.stream.limit.full(b.queued) && !w.paused {
		w.paused = true
		return true
	}
	return false
}

// pump feeds queued responses to the consumer, blocking as long as the
// consumer takes, until the queue is empty, the watch is dropped or the
// Stream is closing. When the backlog of a paused watch falls to half the
// limit it asks the dispatcher to resume the watch.
func (w *Watch) pump(stop chan struct{}) {
	defer w.stream.pumps.Done()
	r, ok, _ := w.next(load{})
	for ok {
		took := weigh(r) // before the consumer, who owns r, can change it
		if !w.offer(r, stop) {
			w.giveUp()
			return
		}
		w.delivered.Store(r.Revision)
		var resume bool
		r, ok, resume = w.next(took)
		if resume {
			w.stream.command(resumeCmd{w})
		}
	}
}

// offer blocks until the consumer takes r, and reports false if stop or the
// Stream's closing comes first. A consumer already waiting takes r without
// the cost of a select over all three.
func (w *Watch) offer(r Response, stop chan struct{}) bool {
	select {
	case w.out <- r:
		return true
	default:
	}
	select {
	case w.out <- r:
		return true
	case <-stop:
		return false
	case <-w.stream.closing:
		return false
	}
}

// next accounts for what the consumer has just taken (took, as weighed;
// nothing at first) and returns the head of the queue for the pump, which
// stays counted against the limit until the consumer takes it. resume
// reports that a paused watch's backlog has fallen to half the limit, so
// that the watch should resume. When the queue is empty it ends the pump's
// run, releasing the buffer and closing the channel if the watch has ended,
// and reports !ok.
func (w *Watch) next(took load) (r Response, ok, resume bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	b := w.backlog // made before the pump started
	b.queued.sub(took)
	if w.paused && w.stream.limit.caughtUp(b.queued) {
		w.paused = false
		resume = true
	}
	r, ok = b.queue.Pop()
	if !ok {
		w.pumping = false
		if b.queue.Cap() > keptQueue {
			b.queue.Reset() // a large backlog's buffer goes; a small one stays for the next burst
		}
		if w.ended {
			w.closeOut()
		}
	}
	return r, ok, resume
}

// giveUp ends the pump's run without delivering the backlog, closing the
// channel if the watch has ended (else the dispatcher's end will).
func (w *Watch) giveUp() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.backlog.queue.Reset()
	w.backlog.queued = load{}
	w.pumping = false
	if w.ended {
		w.closeOut()
	}
}

// end marks the watch ended with err, dropping its backlog if drop is set.
// The channel closes now if no pump runs, else when the pump finishes. It
// reports whether this call ended the watch.
func (w *Watch) end(err error, drop bool) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	first := !w.ended
	if first {
		w.ended = true
		w.err = err
	}
	if b := w.backlog; drop && !w.dropped && b != nil {
		w.dropped = true
		b.queue.Reset()
		b.queued = load{}
		if w.pumping {
			close(b.stop)
		}
	}
	if first && !w.pumping {
		w.closeOut()
	}
	return first
}

// closeOut closes the consumer's channels. Called with mu held, exactly once:
// by end when no pump runs, otherwise by the pump as it finishes.
// over goes first, so that a consumer who sees out closed finds Err set.
func (w *Watch) closeOut() {
	w.over.Store(true)
	if w.done != nil {
		close(w.done)
	}
	close(w.out)
}

package etcdwatch

import (
	"fmt"
	"runtime"
	"sync"

	"github.com/etcdwatch/etcdwatch/internal/ring"
)

// Handler hands the responses of many watches to one function, called from
// goroutines of the Handler's own, instead of a channel per watch: a million
// watches need no million reading goroutines, and a watch opened with a
// Handler (Stream.Handle) holds no channel at all. The Handler's goroutines
// run only while a watch has something to deliver; an idle Handler has
// none.
//
// The function gets the watch, the index of its request in the Handle call
// that opened it (an application with a slice of state per watch indexes
// it, with no map and no lock), and the response. It may be called for a
// watch before Handle returns.
//
// For each watch, the function gets its responses in revision order, one
// call at a time: the next call begins once the previous one has returned.
// Calls for different watches run concurrently, at most WithGoroutines at
// once. A watch whose calls fall behind is held to its buffer limit as a
// channel consumer that does not read would be (WithBufferLimit): waited
// for, then paused and resumed from its next revision, losing nothing.
//
// A call that blocks holds up its own watch and one of the Handler's
// goroutines, so with a limit of n, n blocked calls hold up every watch of
// the Handler (and none of any other consumer's). Keep calls short, or use
// WithGoroutines(0) for a goroutine per watch with something to deliver.
//
// Its methods are safe for concurrent use. A Handler may serve watches of
// several Streams; its zero value is not usable: call NewHandler.
type Handler struct {
	handle func(*Watch, int, Response) // immutable
	ended  func(*Watch, error)         // immutable; nil: not told
	max    int                         // the most goroutines at once; 0: no limit; immutable

	mu      sync.Mutex
	queue   ring.Ring[*Watch] // watches with something to deliver or an end to tell, each at most once; guarded by mu
	running int               // goroutines running; guarded by mu
	idle    chan struct{}     // closed when running drops to 0, for Wait; nil until a Wait needs one; guarded by mu
}

// HandlerOption configures a Handler.
type HandlerOption func(*Handler)

// WithGoroutines sets the most calls a Handler makes at once, across all
// its watches. Default: runtime.GOMAXPROCS(0) when NewHandler is called.
// n <= 0 sets no limit: each watch with something to deliver gets a
// goroutine of its own for as long as it has, so that a call that blocks
// holds up nothing but its watch.
func WithGoroutines(n int) HandlerOption {
	return func(h *Handler) { h.max = max(n, 0) }
}

// WithEnded has the Handler call ended once for each of its watches, after
// the last call of its function for it, with why the watch ended (what
// Err returns): ErrCanceled, the context's cause, ErrClosed, a
// *CompactedError, a *ServerError, an error wrapping ErrStreamFailed, or,
// when WithCreateTimeout gave up on its Handle call, one wrapping
// ErrCreateTimeout.
// It is called from the Handler's goroutines, possibly after the Close
// that ended the watch has returned; once Close has begun, no response is
// handed over (a call in progress runs to its end, and a goroutine may
// still begin one whose response it had taken and checked as Close
// began), even one that was waiting for a watch the server had ended
// before. Default: nobody is
// told (Done and Err still say it).
func WithEnded(ended func(w *Watch, err error)) HandlerOption {
	return func(h *Handler) { h.ended = ended }
}

// NewHandler returns a Handler calling handle with each response of its
// watches: see Handler. It panics if handle is nil.
func NewHandler(handle func(w *Watch, i int, r Response), opts ...HandlerOption) *Handler {
	if handle == nil {
		panic(fmt.Sprintf("%v: NewHandler with a nil function", ErrInvalidArgument))
	}
	h := &Handler{handle: handle, max: runtime.GOMAXPROCS(0)}
	for _, o := range opts {
		o(h)
	}
	return h
}

// Wait waits until the Handler has nothing to do: no call running and none
// due. It may be called at any time, from any goroutine but one running a
// call of the Handler (which would wait for itself), while responses
// keep coming (unlike a sync.WaitGroup's, whose Wait may not race with a
// count rising from zero); a response arriving after it returned starts
// the Handler again. Once the Streams of its watches are closed, it
// returns after the last call for them (Ended included), when each of the
// Handler's goroutines is returning.
func (h *Handler) Wait() {
	h.mu.Lock()
	if h.running == 0 {
		h.mu.Unlock()
		return
	}
	if h.idle == nil {
		h.idle = make(chan struct{})
	}
	idle := h.idle
	h.mu.Unlock()
	<-idle
}

// schedule queues w, whose delivery it now serves, for one of the
// goroutines, starting one if the limit allows. Called with w's delivery
// locked, or by whoever took the right to serve it from push.
func (h *Handler) schedule(w *Watch) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.queue.Push(w)
	if h.max == 0 || h.running < h.max {
		h.running++
		go h.work() // returns once the queue is empty; Wait waits for it
	}
}

// take returns the next watch to serve, or ends the goroutine's run when
// there is none (!ok), telling Wait when it was the last to run. An empty
// queue and the count going down are one step under mu, so that schedule
// never counts on a goroutine that is leaving.
func (h *Handler) take() (w *Watch, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	w, ok = h.queue.Pop()
	if !ok {
		h.running--
		if h.running == 0 && h.idle != nil {
			close(h.idle)
			h.idle = nil
		}
	}
	return w, ok
}

// work serves queued watches until none is left.
func (h *Handler) work() {
	for w, ok := h.take(); ok; w, ok = h.take() {
		h.serve(w)
	}
}

// handlerTurn is how many responses of one watch a goroutine hands over
// before it lets the other queued watches have a turn.
const handlerTurn = 16

// closing reports whether s's Close has begun.
func closing(s *Stream) bool {
	select {
	case <-s.closing:
		return true
	default:
		return false
	}
}

// serve hands w up to handlerTurn responses, or its end, and queues it
// again if it has more; nothing once the Stream is closing.
func (h *Handler) serve(w *Watch) {
	s := w.lane.s
	var took load
	for range handlerTurn {
		r, step, caughtUp := w.out.handled(took, s.limit)
		if caughtUp {
			w.lane.command(resumeCmd{w})
		}
		switch step {
		case stepIdle:
			return
		case stepEnd:
			if h.ended != nil {
				h.ended(w, w.Err())
			}
			return
		}
		took = weigh(r) // before the function, which owns r, can change it; and before the look at Close, so that nothing lies between that look and the call but the Store
		if closing(s) { // as a channel's pump, hand nothing more over once Close began
			w.out.drop()
			took = load{}
			continue // to the watch's end, or to idle until Close ends it
		}
		w.out.delivered.Store(r.Revision) // in its hands: Revision is r's during the call
		h.handle(w, int(w.entry.index), r)
		s.hooks.at(hookTook)
	}
	if w.out.yield(took, s.limit) {
		w.lane.command(resumeCmd{w})
	}
	h.schedule(w)
}

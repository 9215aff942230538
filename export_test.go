package etcdwatch

import (
	"sync"
	"testing"
	"time"

	"github.com/etcdwatch/etcdwatch/internal/clock"
)

// This file is the seam under the dispatcher for the black-box tests: a
// clock they step, and the points of the Stream's goroutines they wait for.

// WithClock runs the Stream's timers on c, a test's clock.Fake.
func WithClock(c clock.Clock) Option { return func(o *options) { o.clock = c } }

// Hook is a point in a Stream's goroutines.
type Hook = hook

const (
	HookReceived  = hookReceived  // the session is handing a response to the dispatcher: counted before the dispatcher can handle it
	HookResponse  = hookResponse  // the dispatcher handled a response
	HookCommand   = hookCommand   // the dispatcher handled a command
	HookStreamEnd = hookStreamEnd // the dispatcher handled the end of a stream
	HookPumpStart = hookPumpStart // the dispatcher is about to start a pump
	HookTook      = hookTook      // a pump accounted for a response its consumer took
	HookPumpDone  = hookPumpDone  // a pump ended its run
	HookExited    = hookExited    // a session ended
)

// Observer counts the points a Stream's goroutines pass, and wakes those
// waiting for a state at each.
type Observer struct {
	mu      sync.Mutex
	counts  [hookCount]int
	changed chan struct{} // closed and replaced at each point
}

// NewObserver returns an Observer for WithObserver.
func NewObserver() *Observer { return &Observer{changed: make(chan struct{})} }

// WithObserver lets o observe the Stream.
func WithObserver(o *Observer) Option { return func(opts *options) { opts.hooks = &hooks{on: o.at} } }

// WithGate lets o observe the Stream, and calls gate after o at each point,
// on the Stream's goroutine there: a gate that blocks holds that goroutine
// at that point.
func WithGate(o *Observer, gate func(Hook)) Option {
	return func(opts *options) { opts.hooks = &hooks{on: func(p hook) { o.at(p); gate(p) }} }
}

func (o *Observer) at(p hook) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.counts[p]++
	close(o.changed)
	o.changed = make(chan struct{})
}

// Count returns how often the Stream has passed p.
func (o *Observer) Count(p Hook) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.counts[p]
}

// Await waits until cond holds: it checks cond now and after each point
// the Stream passes, and fails t if it does not hold within d.
func (o *Observer) Await(t testing.TB, d time.Duration, cond func() bool, msgAndArgs ...any) {
	t.Helper()
	deadline := time.After(d)
	for {
		o.mu.Lock()
		changed := o.changed
		o.mu.Unlock()
		if cond() {
			return
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatal(append([]any{"condition not met in time: "}, msgAndArgs...)...)
		}
	}
}

// settleCmd is answered once the dispatcher reaches it.
type settleCmd struct{ done chan struct{} }

func (c settleCmd) handle(*dispatcher) { close(c.done) }
func (c settleCmd) refuse(error)       { close(c.done) }

// Settle returns once the dispatcher has handled every command sent to it
// before, or failing t after d.
func Settle(t testing.TB, s *Stream, d time.Duration) {
	t.Helper()
	c := settleCmd{done: make(chan struct{})}
	s.main.command(c)
	select {
	case <-c.done:
	case <-time.After(d):
		t.Fatal("the dispatcher did not settle")
	}
}

// PumpsIdle reports whether every pump the Stream started has ended its run.
func (o *Observer) PumpsIdle() bool { return o.Count(HookPumpStart) == o.Count(HookPumpDone) }

// Load returns how many watches wait in h's queue, and how many of its
// goroutines run.
func (h *Handler) Load() (queued, running int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.queue.Len(), h.running
}

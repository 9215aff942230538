// Package clock is the time source of etcdwatch's goroutines: the real
// one in production, a Fake that a test steps by hand, so that a policy
// with a deadline (a stall, a backoff, a liveness probe) can be checked at
// exact instants rather than in wall-clock windows.
package clock

import (
	"context"
	"time"
)

// Clock tells the time and makes timers.
type Clock interface {
	Now() time.Time
	NewTimer(d time.Duration) Timer
}

// Timer is a time.Timer behind an interface. As with time.Timer since Go
// 1.23, no value sent before a Reset or Stop is received after it.
type Timer interface {
	C() <-chan time.Time
	Reset(d time.Duration)
	Stop()
}

// Real is the wall clock.
var Real Clock = realClock{}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }

type realTimer struct{ t *time.Timer }

func (t realTimer) C() <-chan time.Time   { return t.t.C }
func (t realTimer) Reset(d time.Duration) { t.t.Reset(d) }
func (t realTimer) Stop()                 { t.t.Stop() }

// Sleep waits d on c and returns nil, or ctx's cause if ctx ends first.
func Sleep(ctx context.Context, c Clock, d time.Duration) error {
	t := c.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C():
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// Stoppable is a Timer whose channel is nil while it is stopped, so that
// a select on it does nothing: what an owner goroutine's loop needs. Its
// zero value is stopped. Owned by one goroutine.
type Stoppable struct {
	t Timer
	C <-chan time.Time
}

// Reset arms the timer to fire after d, on c.
func (s *Stoppable) Reset(c Clock, d time.Duration) {
	if s.t == nil {
		s.t = c.NewTimer(d)
	} else {
		s.t.Reset(d)
	}
	s.C = s.t.C()
}

// Stop disarms the timer.
func (s *Stoppable) Stop() {
	if s.t != nil {
		s.t.Stop()
	}
	s.C = nil
}

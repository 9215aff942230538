package clock

import (
	"context"
	"sync"
	"time"
)

// Fake is a Clock that moves only when Advance is called. Its timers fire,
// in the order they are due, during Advance. It is safe for concurrent use.
type Fake struct {
	mu     sync.Mutex
	now    time.Time
	timers map[*fakeTimer]struct{} // armed
	moved  chan struct{}           // closed, and replaced, whenever a timer is armed
}

// NewFake returns a Fake clock reading a fixed instant.
func NewFake() *Fake {
	return &Fake{
		now:    time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC),
		timers: make(map[*fakeTimer]struct{}),
		moved:  make(chan struct{}),
	}
}

// Now returns the clock's time.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// NewTimer returns a timer that fires once the clock has advanced by d.
func (f *Fake) NewTimer(d time.Duration) Timer {
	t := &fakeTimer{f: f, c: make(chan time.Time, 1)}
	t.Reset(d)
	return t
}

// Advance moves the clock by d and fires every timer due by then.
func (f *Fake) Advance(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = f.now.Add(d)
	for t := range f.timers {
		if !t.when.After(f.now) {
			delete(f.timers, t)
			select {
			case t.c <- f.now:
			default:
			}
		}
	}
}

// Armed returns the durations from now after which the armed timers fire.
func (f *Fake) Armed() []time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	var ds []time.Duration
	for t := range f.timers {
		ds = append(ds, t.when.Sub(f.now))
	}
	return ds
}

// AwaitArmed waits until a timer is armed to fire exactly d from now, and
// reports false if ctx ends first. A test calls it before Advance, to step
// past a deadline only once the code under test has set it.
func (f *Fake) AwaitArmed(ctx context.Context, d time.Duration) bool {
	_, ok := f.AwaitArmedIn(ctx, d, d)
	return ok
}

// AwaitArmedIn waits until a timer is armed to fire from lo to hi from
// now, a jittered delay, and returns when it will; ok is false if ctx ends
// first.
func (f *Fake) AwaitArmedIn(ctx context.Context, lo, hi time.Duration) (d time.Duration, ok bool) {
	for {
		f.mu.Lock()
		moved := f.moved
		for t := range f.timers {
			if d := t.when.Sub(f.now); d >= lo && d <= hi {
				f.mu.Unlock()
				return d, true
			}
		}
		f.mu.Unlock()
		select {
		case <-moved:
		case <-ctx.Done():
			return 0, false
		}
	}
}

type fakeTimer struct {
	f    *Fake
	c    chan time.Time
	when time.Time // guarded by f.mu
}

func (t *fakeTimer) C() <-chan time.Time { return t.c }

func (t *fakeTimer) Reset(d time.Duration) {
	f := t.f
	f.mu.Lock()
	defer f.mu.Unlock()
	t.drain()
	t.when = f.now.Add(d)
	if d <= 0 {
		delete(f.timers, t)
		t.c <- f.now
		return
	}
	f.timers[t] = struct{}{}
	close(f.moved)
	f.moved = make(chan struct{})
}

func (t *fakeTimer) Stop() {
	f := t.f
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.timers, t)
	t.drain()
}

// drain drops a value sent and not received, as time.Timer does on Reset
// and Stop. Called with f.mu held.
func (t *fakeTimer) drain() {
	select {
	case <-t.c:
	default:
	}
}

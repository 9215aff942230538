package clock

import (
	"context"
	"errors"
	"testing"
	"time"
)

func fired(t Timer) bool {
	select {
	case <-t.C():
		return true
	default:
		return false
	}
}

func TestFakeFiresOnlyWhenDue(t *testing.T) {
	f := NewFake()
	start := f.Now()
	a, b := f.NewTimer(10*time.Millisecond), f.NewTimer(20*time.Millisecond)
	f.Advance(9 * time.Millisecond)
	if fired(a) || fired(b) {
		t.Fatal("a timer fired early")
	}
	f.Advance(time.Millisecond)
	if !fired(a) || fired(b) {
		t.Fatal("want a alone fired at 10ms")
	}
	if got := f.Now().Sub(start); got != 10*time.Millisecond {
		t.Fatalf("Now moved %v, want 10ms", got)
	}
	b.Stop()
	f.Advance(time.Hour)
	if fired(b) {
		t.Fatal("a stopped timer fired")
	}
}

func TestFakeResetDropsAStaleValue(t *testing.T) {
	f := NewFake()
	tm := f.NewTimer(time.Millisecond)
	f.Advance(time.Millisecond) // fired, not received
	tm.Reset(5 * time.Millisecond)
	if fired(tm) {
		t.Fatal("a value sent before Reset was received after it")
	}
	if got := f.Armed(); len(got) != 1 || got[0] != 5*time.Millisecond {
		t.Fatalf("Armed = %v, want [5ms]", got)
	}
	f.Advance(5 * time.Millisecond)
	if !fired(tm) {
		t.Fatal("the reset timer did not fire")
	}
}

func TestAwaitArmedAndSleep(t *testing.T) {
	f := NewFake()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- Sleep(ctx, f, time.Second) }()
	if !f.AwaitArmed(ctx, time.Second) {
		t.Fatal("Sleep armed no timer")
	}
	f.Advance(time.Second)
	if err := <-done; err != nil {
		t.Fatalf("Sleep = %v", err)
	}
	stop := errors.New("stop")
	sctx, scancel := context.WithCancelCause(ctx)
	scancel(stop)
	if err := Sleep(sctx, f, time.Second); !errors.Is(err, stop) {
		t.Fatalf("Sleep on an ended context = %v, want its cause", err)
	}
}

func TestStoppableIsNilWhileStopped(t *testing.T) {
	f := NewFake()
	var s Stoppable
	if s.C != nil {
		t.Fatal("zero Stoppable has a channel")
	}
	s.Reset(f, time.Second)
	if s.C == nil {
		t.Fatal("armed Stoppable has no channel")
	}
	s.Stop()
	if s.C != nil {
		t.Fatal("stopped Stoppable has a channel")
	}
}

// TestStoppableStopDisarms: Stop disarms the timer under it, so that a
// Reset after it starts afresh rather than finding the old deadline's
// value. Catches a Stop that only drops the channel.
func TestStoppableStopDisarms(t *testing.T) {
	f := NewFake()
	var s Stoppable
	s.Reset(f, time.Second)
	s.Stop()
	if got := f.Armed(); len(got) != 0 {
		t.Fatalf("Armed after Stop = %v, want none", got)
	}
}

// TestFakeResetToZeroFiresAtOnce: a timer reset to 0 fires without an
// Advance, as time.Timer does, and a positive delay does not.
func TestFakeResetToZeroFiresAtOnce(t *testing.T) {
	f := NewFake()
	tm := f.NewTimer(time.Second)
	tm.Reset(time.Nanosecond)
	if fired(tm) {
		t.Fatal("a timer reset to 1ns fired before the clock moved")
	}
	tm.Reset(0)
	if !fired(tm) {
		t.Fatal("a timer reset to 0 did not fire at once")
	}
}

// TestAwaitArmedInTakesOnlyItsRange: AwaitArmedIn returns for a timer
// armed within [lo, hi] alone, and with its delay.
func TestAwaitArmedInTakesOnlyItsRange(t *testing.T) {
	f := NewFake()
	f.NewTimer(time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, ok := f.AwaitArmedIn(ctx, 2*time.Second, 3*time.Second); ok {
		t.Fatal("a timer armed below the range was taken")
	}
	if _, ok := f.AwaitArmedIn(ctx, 0, time.Second/2); ok {
		t.Fatal("a timer armed above the range was taken")
	}
	if d, ok := f.AwaitArmedIn(ctx, time.Second/2, 2*time.Second); !ok || d != time.Second {
		t.Fatalf("AwaitArmedIn = %v, %v; want 1s, true", d, ok)
	}
}

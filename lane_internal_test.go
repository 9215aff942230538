package etcdwatch

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// countedCmd counts its refusals; handling it is a test failure.
type countedCmd struct{ refused *int }

func (c countedCmd) handle(*dispatcher) { panic("a command handled with no dispatcher") }
func (c countedCmd) refuse(error)       { *c.refused++ }

// TestCommandAfterTheDispatcherLeftIsRefused: a command sent once the
// dispatcher has left (done closed) and the lane's last look at its
// buffer is over is refused exactly once, though the buffer has room and
// the send may be the case select picks. Catches: a command left in the
// buffer for nobody, neither handled nor refused.
func TestCommandAfterTheDispatcherLeftIsRefused(t *testing.T) {
	l := &lane{cmds: make(chan command, 1), done: make(chan struct{}), exited: make(chan struct{})}
	close(l.done)
	for i := range 200 { // select picks the send about half the time
		refused := 0
		l.command(countedCmd{&refused})
		require.Equal(t, 1, refused, "try %d", i)
		require.Zero(t, len(l.cmds), "try %d: left in the buffer", i)
	}
}

// TestCombine: a Stream's State over its two lanes is connected while
// both are, and Since is when that last changed: the later coming up when
// both are up, the first going down when both are down, the one down when
// one is. The later error stands. Catches: Since taken as the later of the
// two whatever they are (a lane coming back moved the start of an outage
// the other lane still has).
func TestCombine(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	up := func(s int) State { return State{Connected: true, Since: at(s)} }
	down := func(s int) State { return State{Since: at(s), LastError: ErrClosed, LastErrorAt: at(s)} }
	for _, tc := range []struct {
		name      string
		a, b      State
		connected bool
		since     int
	}{
		{"both up: the later came up", up(1), up(3), true, 3},
		{"both up, the other order", up(3), up(1), true, 3},
		{"a down, b up since later", down(1), up(3), false, 1},
		{"a up, b down", up(1), down(3), false, 3},
		{"a up since later, b down", up(5), down(3), false, 3},
		{"both down: the first went down", down(4), down(2), false, 2},
	} {
		for _, order := range [][2]State{{tc.a, tc.b}, {tc.b, tc.a}} {
			got := combine(order[0], order[1])
			if got.Connected != tc.connected || !got.Since.Equal(at(tc.since)) {
				t.Errorf("%s: connected %v since %v; want %v since %v", tc.name, got.Connected, got.Since.Sub(t0), tc.connected, at(tc.since).Sub(t0))
			}
		}
	}
}

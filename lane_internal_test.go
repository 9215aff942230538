package etcdwatch

import (
	"testing"

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

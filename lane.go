package etcdwatch

import (
	"context"
	"log/slog"
	"sync/atomic"

	"github.com/etcdwatch/etcdwatch/internal/health"
)

// lane is one gRPC Watch stream of a Stream and the dispatcher goroutine
// that owns it. A Stream has a main lane, and an isolated lane for the
// watches that ask for one (Request.Isolated), opened on the first: etcd
// answers a progress request only once every watch on its gRPC stream is
// synced, so a watch catching up from far back, or waiting for a future
// revision, holds up progress for every watch of its lane, and of no
// other. Each lane has its own watch ids, progress requests, reconnections
// and State; the Stream's counters are shared.
type lane struct {
	s      *Stream
	cmds   chan command  // to the dispatcher; after done, to whoever refuses what is left (refuseLeft)
	done   chan struct{} // closed when the dispatcher has exited, after Close or retire
	exited chan struct{} // closed after done, once what was sent too late is refused: Close waits on it
	retire chan struct{} // closed by the Stream when it replaces the lane, which failed for good: the dispatcher exits
	gone   error         // what commands are refused with once the dispatcher has exited: ErrClosed, or a retired lane's failure; written before retire is closed
	state  stateBox
}

// startLane starts a lane's dispatcher; it exits at the Stream's Close, or
// when the lane is retired, and Close waits for it through exited.
func (s *Stream) startLane() *lane {
	l := &lane{s: s, cmds: make(chan command, 64), done: make(chan struct{}), exited: make(chan struct{}), retire: make(chan struct{}), gone: ErrClosed}
	l.state.st.Since = s.opts.clock.Now() // before the dispatcher starts
	open := grpcOpener(s.conn, s.opts.connectivity, s.opts.callOptions, l.connectionFailed)
	if s.opts.requireLeader {
		open = requireLeader(open)
	}
	d := newDispatcher(l, open)
	go func() { // exits at Close or when the lane is retired, after refusing what came too late; Close waits on exited
		defer close(l.exited)
		defer l.refuseLeft()
		defer close(l.done)
		d.run()
	}()
	return l
}

// command hands c to the lane's dispatcher; once the Stream is closed, c
// is refused with ErrClosed instead (by a retired lane, with its failure).
// Either way exactly once: a command sent into the buffer as the
// dispatcher left is refused by whichever of this call and the lane's
// goroutine, both draining after done is closed, takes it.
func (l *lane) command(c command) {
	select {
	case l.cmds <- c:
		select {
		case <-l.done: // perhaps after the lane's last look: nobody else would take c
			l.refuseLeft()
		default:
		}
	case <-l.done:
		c.refuse(l.gone)
	}
}

// refuseLeft refuses with l.gone every command waiting for a dispatcher
// that has stopped taking them.
func (l *lane) refuseLeft() {
	for {
		select {
		case c := <-l.cmds:
			c.refuse(l.gone)
		default:
			return
		}
	}
}

// connectionFailed records why the lane's stream could not open for want
// of a connection, and logs it once per outage: at Warn the first time, at
// Debug after. Called by the goroutine opening the stream.
func (l *lane) connectionFailed(err error) {
	s := l.s
	level := slog.LevelDebug
	if l.state.failed(err, s.opts.clock.Now()) {
		level = slog.LevelWarn
	}
	s.opts.logger.Log(context.Background(), level, "etcdwatch: cannot open the watch stream; waiting for the connection", "err", err)
}

// await waits for the answer to p, which was asked of the lane, or ctx,
// or the lane's end.
func (l *lane) await(ctx context.Context, p *progressWaiter) progressResult {
	select {
	case r := <-p.reply:
		return r
	case <-ctx.Done():
		return progressResult{err: l.state.get().Explain(context.Cause(ctx))} // this lane's: not another's failure
	case <-l.done:
		select {
		case r := <-p.reply: // answered before the dispatcher exited
			return r
		default:
		}
		return progressResult{err: l.gone} // ErrClosed; or, for a lane retired, its failure, which RequestProgress skips
	}
}

// combine is the State of a Stream with lanes a and b: connected while
// both are, since that last changed, and the later error.
func combine(a, b State) State {
	st := laterError(a, b) // Failed: the main stream's (a's)
	st.Connected = a.Connected && b.Connected
	st.Since = health.Since(a.Connected, a.Since, b.Connected, b.Since)
	return st
}

// laterError is a with b's LastError if b's is the later.
func laterError(a, b State) State {
	if b.LastErrorAt.After(a.LastErrorAt) {
		a.LastError, a.LastErrorAt = b.LastError, b.LastErrorAt
	}
	return a
}

// storeMax raises c to v if v is higher.
func storeMax(c *atomic.Int64, v int64) {
	for {
		old := c.Load()
		if v <= old || c.CompareAndSwap(old, v) {
			return
		}
	}
}

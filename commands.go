package etcdwatch

import "context"

// command is what another goroutine asks of the dispatcher, through
// lane.cmds. handle runs in the dispatcher's goroutine. refuse answers a
// command the dispatcher will never handle, because it has stopped: it
// tells whoever waits on the command why, or, for a command nobody waits
// on, says in its doc why nothing is owed.
type command interface {
	handle(d *dispatcher)
	refuse(err error)
}

// createCmd opens ws, ending them when ctx ends.
type createCmd struct {
	ws  []*Watch
	ctx context.Context
}

func (c createCmd) handle(d *dispatcher) { d.handleCreate(c.ws, c.ctx) }

// refuse ends every watch of c, telling Stream.open why.
func (c createCmd) refuse(err error) {
	for _, w := range c.ws {
		w.lane.s.stats.watches.Add(-1) // counted by the call (Stream.open); first, as in handleCreate
		w.tellCreated(err)
		w.abort(err)
	}
}

// cancelCmd releases watches their consumers have ended.
type cancelCmd struct{ ws []*Watch }

func (c cancelCmd) handle(d *dispatcher) {
	for _, w := range c.ws {
		d.handleCancel(w)
	}
}

// refuse owes nothing: the watches ended before the command was sent, and
// their server-side watches went with the stream.
func (cancelCmd) refuse(error) {}

// resumeCmd: the consumer of w, which was behind, has caught up.
type resumeCmd struct{ w *Watch }

func (c resumeCmd) handle(d *dispatcher) { d.handleResume(c.w) }

// refuse owes nothing: the watch has ended with the Stream.
func (resumeCmd) refuse(error) {}

// progressCmd is a RequestProgress call waiting for its answer.
type progressCmd struct{ p *progressWaiter }

func (c progressCmd) handle(d *dispatcher) { d.handleProgressRequest(c.p) }
func (c progressCmd) refuse(err error)     { c.p.reply <- progressResult{err: err} }

// ctxDoneCmd: the contexts of g have ended.
type ctxDoneCmd struct{ g *ctxGroup }

func (c ctxDoneCmd) handle(d *dispatcher) { d.handleCtxDone(c.g) }

// refuse owes nothing: the group's watches have ended with the Stream.
func (ctxDoneCmd) refuse(error) {}

// versionCmd tells the dispatcher the release of the cluster's members, or
// that it will not be known (ok false).
type versionCmd struct {
	release serverRelease
	ok      bool
}

func (c versionCmd) handle(d *dispatcher) { d.handleVersion(c) }

// refuse owes nothing: the progress calls that waited for the release
// were answered at shutdown.
func (versionCmd) refuse(error) {}

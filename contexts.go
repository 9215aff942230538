package etcdwatch

import "context"

// ctxGroup is the watches bounded by contexts that end together: those
// sharing one Done channel. One context.AfterFunc serves the whole group, so
// that ten thousand watches opened under one context cost one registration
// with it, not one each (about 250 bytes a watch). Owned by the dispatcher.
type ctxGroup struct {
	ctx     context.Context // the first watch's: its Done is the group's key, its cause ends the group
	stop    func() bool     // releases the AfterFunc
	watches map[*Watch]struct{}
}

// bind makes w end when ctx does. A context that never ends needs nothing.
func (d *dispatcher) bind(w *Watch, ctx context.Context) {
	done := ctx.Done()
	if done == nil {
		return
	}
	g := d.ctxs[done]
	if g == nil {
		g = &ctxGroup{ctx: ctx, watches: make(map[*Watch]struct{})}
		// The AfterFunc's goroutine exits once the command is taken or the
		// Stream is done.
		g.stop = context.AfterFunc(ctx, func() { d.l.command(ctxDoneCmd{g}) })
		d.ctxs[done] = g
	}
	g.watches[w] = struct{}{}
	w.entry.group = g
}

// unbind removes w from its group, releasing the group's AfterFunc when it
// was the last one.
func (d *dispatcher) unbind(w *Watch) {
	g := w.entry.group
	if g == nil {
		return
	}
	w.entry.group = nil
	delete(g.watches, w)
	if len(g.watches) == 0 && d.ctxs[g.ctx.Done()] == g {
		g.stop()
		delete(d.ctxs, g.ctx.Done())
	}
}

// handleCtxDone ends every watch of g with its context's cause, as Cancel
// would.
func (d *dispatcher) handleCtxDone(g *ctxGroup) {
	if d.ctxs[g.ctx.Done()] != g {
		return // emptied and replaced meanwhile
	}
	delete(d.ctxs, g.ctx.Done())
	cause := context.Cause(g.ctx)
	for w := range g.watches {
		w.entry.group = nil
		if w.abort(cause) {
			d.handleCancel(w)
		}
	}
}

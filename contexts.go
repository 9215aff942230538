package etcdwatch

import (
	"context"
	"slices"
)

// ctxGroup is the watches bounded by contexts that end together: those
// sharing one Done channel. One context.AfterFunc serves the whole group, so
// that ten thousand watches opened under one context cost one registration
// with it, not one each (about 250 bytes a watch). Owned by the dispatcher.
type ctxGroup struct {
	ctx  context.Context // the first watch's: its Done is the group's key, its cause ends the group
	stop func() bool     // releases the AfterFunc
	// watches holds every watch of the group, and watches unbound since
	// (their entry's group is no longer this one), let go of once they are
	// half: a slot each, rather than a map's two to four.
	watches []*Watch
	bound   int // how many of watches are in the group
}

// compactAt is the fewest slots a group lets go of its unbound watches at.
const compactAt = 64

// bind makes w end when ctx does. A context that never ends needs nothing.
func (d *dispatcher) bind(w *Watch, ctx context.Context) {
	done := ctx.Done()
	if done == nil {
		return
	}
	g := d.ctxs[done]
	if g == nil {
		g = &ctxGroup{ctx: ctx}
		// The AfterFunc's goroutine exits once the command is taken or the
		// Stream is done.
		g.stop = context.AfterFunc(ctx, func() { d.l.command(ctxDoneCmd{g}) })
		d.ctxs[done] = g
	}
	g.watches = append(g.watches, w)
	g.bound++
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
	g.bound--
	switch {
	case g.bound == 0 && d.ctxs[g.ctx.Done()] == g:
		g.stop()
		delete(d.ctxs, g.ctx.Done())
	case len(g.watches) >= compactAt && g.bound <= len(g.watches)/2:
		g.watches = slices.DeleteFunc(g.watches, func(x *Watch) bool { return x.entry.group != g })
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
	for _, w := range g.watches {
		if w.entry.group != g {
			continue // unbound before
		}
		w.entry.group = nil
		if w.abort(cause) {
			d.handleCancel(w)
		}
	}
}

package clientv3watch

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdwatch/etcdwatch"
)

// watch is one clientv3 watch: an etcdwatch.Watch on its group's Stream,
// whose Handler hands each response to out in clientv3's form. The
// Handler has a goroutine for the watch only while it has something to
// deliver (etcdwatch.WithGoroutines(0)): an idle watch has none, and one
// whose consumer does not read blocks only itself.
type watch struct {
	w      *watcher
	g      *group
	ctx    context.Context // the caller's: ending it ends the watch, without a word
	out    chan clientv3.WatchResponse
	unbind func() // undoes g.bind

	released atomic.Bool // release has run

	// opened is done once Watch has handed out (or given up on) out, and
	// put the created notification first in it: the Handler's calls,
	// which may begin before Handle returns, wait for it.
	opened sync.WaitGroup
	failed bool // Handle failed, and Watch answered on a channel of its own; written before opened is done

	// By the Handler's calls, one at a time.
	last etcdwatch.Header // of the last response handed over
}

// open starts the watch of spec on g under ctx (wctx, bound to the
// group, for the Stream) and returns the etcdwatch.Watch, or Handle's
// error; the caller must then call done.
func (cw *watch) open(wctx context.Context, spec watchSpec) (*etcdwatch.Watch, error) {
	cw.opened.Add(1)
	h := etcdwatch.NewHandler(cw.handle, etcdwatch.WithGoroutines(0), etcdwatch.WithEnded(cw.ended))
	ws, err := cw.g.s.Handle(wctx, h, spec.req)
	if err != nil {
		return nil, err
	}
	return ws[0], nil
}

// done lets the Handler's calls begin; failed says Watch answered on a
// channel of its own, so that the end of the watch owes out nothing.
func (cw *watch) done(failed bool) {
	cw.failed = failed
	cw.opened.Done()
}

// handle hands r over, unless the group was lost (anything from then on
// may come from another member; clientv3 drops it too) or the caller is
// gone, which ends the watch.
func (cw *watch) handle(ew *etcdwatch.Watch, _ int, r etcdwatch.Response) {
	cw.opened.Wait()
	switch {
	case cw.g.isLost():
		ew.Cancel()
	default:
		cw.last = r.Header
		if !cw.send(toResponse(r)) {
			ew.Cancel()
		}
	}
}

// ended sends the final response clientv3 would send, if any, closes out
// and lets go of the group; or, when Watch answered otherwise, only the
// group.
func (cw *watch) ended(_ *etcdwatch.Watch, err error) {
	if errors.Is(err, etcdwatch.ErrStreamFailed) {
		// New watches open a stream of their own, as with clientv3, rather
		// than join this one until its last consumer has read its end.
		cw.w.forget(cw.g)
	}
	cw.opened.Wait()
	defer cw.release()
	if cw.failed {
		return
	}
	defer close(cw.out)
	if cw.g.isLost() {
		err = errLeaderLost
	}
	if cw.ctx.Err() != nil || cw.w.isClosed() {
		return // clientv3 closes the channel without a word
	}
	if resp, ok := final(err, &cw.last); ok {
		cw.send(resp)
	}
}

// release lets go of the group, once: at the watch's end, or when Watch
// gave up on it, whichever comes first, since Handle may fail before it
// opened a watch to end.
func (cw *watch) release() {
	if cw.released.CompareAndSwap(false, true) {
		cw.unbind()
		cw.w.release(cw.g)
	}
}

// send blocks until the caller takes r, and reports false if it is gone:
// its context ended, or the Watcher closed.
func (cw *watch) send(r clientv3.WatchResponse) bool {
	select {
	case cw.out <- r:
		return true
	case <-cw.ctx.Done():
	case <-cw.w.closed:
	}
	return false
}

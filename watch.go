package etcdwatch

import (
	"context"
	"sync/atomic"
)

// Watch is one watch on a Stream. Its methods are safe for concurrent use.
//
// Responses arrive on Responses in revision order. The channel is closed,
// exactly once, when the watch ends; Err then says why. A watch ended by the
// server (compaction, a refused permission, a broken stream) still delivers
// what it had buffered before its channel closes; a watch ended by Cancel, its
// context or Stream.Close delivers nothing more.
type Watch struct {
	lane *lane // the gRPC stream and dispatcher it runs on
	// A Watch is a thin handle over two parts, each with one owner: its
	// delivery, which the consumer and the goroutine delivering to it
	// share under a mutex, and its entry, which only the dispatcher
	// touches.
	req packed       // immutable
	id  atomic.Int64 // the server's id; written by the dispatcher, read by anyone
	// createdRev is the header revision of the first created response;
	// written by the dispatcher before it tells the caller of Watch, which
	// hands the Watch out only then, and never again.
	createdRev int64
	out        delivery // the consumer's side
	entry      entry    // the dispatcher's side
}

// newWatch returns a watch for r, the i-th request of its call, on l,
// delivering to a channel of its own, or to h if h is not nil.
func newWatch(l *lane, r Request, i int, h *Handler) *Watch {
	w := &Watch{lane: l, req: pack(r)}
	w.id.Store(-1)
	w.entry.init(r, i)
	w.out.init(w.entry.rev, h)
	return w
}

// ID returns the server's id for the watch. It changes whenever the watch
// is created again (after a pause, on a new stream after a reconnect, or
// from the next revision when its own was compacted just past it), and is
// -1 before the server confirmed it.
func (w *Watch) ID() int64 { return w.id.Load() }

// CreatedRevision returns the store's revision when the server first
// confirmed the watch (the header revision of its created response), as
// clientv3's created notification gives it. A "from now" watch may still
// deliver events at or below it (writes racing the create: etcd reads the
// header after registering the watch), so it is no exclusive lower bound.
func (w *Watch) CreatedRevision() int64 { return w.createdRev }

// Request returns the request the watch was opened with.
func (w *Watch) Request() Request { return w.req.request() }

// Responses returns the channel of responses. It is closed once the watch has
// ended and everything it is going to deliver has been read. A watch opened
// with a Handler has none: nil.
func (w *Watch) Responses() <-chan Response { return w.out.ch }

// Done is closed when Responses is closed; for a watch opened with a
// Handler, once the last call for it has returned, before Ended is called.
func (w *Watch) Done() <-chan struct{} { return w.out.doneChan() }

// Err returns nil while the watch runs, then why it ended: ErrCanceled, the
// context's cause, ErrClosed, a *CompactedError, a *ServerError, an error
// wrapping ErrStreamFailed, or, for a watch of a WatchAll or Handle call
// that WithCreateTimeout gave up on, one wrapping ErrCreateTimeout. Once
// Responses is closed, Err is set. For a
// watch opened with a Handler, Err is set, as Done closes, once the last
// call for it has returned: after Cancel returns if a call was still
// running, and not yet inside a call that canceled its own watch.
func (w *Watch) Err() error { return w.out.errIfOver() }

// Revision returns a revision R such that every event of this watch with a
// revision <= R has been received from Responses. It is updated just after
// a Response is handed over, so it may briefly trail the Response a consumer
// has just received, never lead it; Response.Revision is exact.
func (w *Watch) Revision() int64 { return w.out.delivered.Load() }

// RequestProgress asks the server for a revision R such that every watch
// active on w's lane when the call began has queued all its events <= R,
// and delivers R to each of them as a bookmark after those events, as
// Stream.RequestProgress does for every lane: for an isolated watch
// (Request.Isolated), only the isolated watches, so that no other watch of
// the Stream can hold the answer up. Calls on a lane share its requests.
func (w *Watch) RequestProgress(ctx context.Context) (int64, error) {
	if err := context.Cause(ctx); err != nil {
		return 0, err // ended already: ask the server nothing
	}
	p := newProgressWaiter(ctx, w.lane.s.stats.revision.Load())
	w.lane.command(progressCmd{p})
	r := w.lane.await(ctx, p)
	return r.rev, r.err
}

// Cancel ends the watch. It is idempotent, and once it returns nothing more
// is delivered and the channel is closed. For a watch opened with a
// Handler, a call may cancel its own watch; once Cancel returns, at most
// one more call for the watch runs (one in progress, or one whose response
// was already taken), and Ended follows. The server-side watch is released
// without waiting for the server.
func (w *Watch) Cancel() { w.cancelWith(ErrCanceled) }

// cancelWith ends the watch on its consumer's behalf and tells the
// dispatcher. It waits for the channel to close; a Handler's watch may have
// a call in progress, perhaps this one's caller, and is not waited for.
func (w *Watch) cancelWith(err error) {
	if w.abort(err) {
		w.lane.command(cancelCmd{[]*Watch{w}})
	}
	if w.out.to == nil {
		<-w.Done()
	}
}

// finish ends the watch with err once its consumer has taken what it
// holds, and reports whether this call ended it.
func (w *Watch) finish(err error) bool { return w.told(w.out.finish(err)) }

// abort ends the watch with err at once, dropping what it holds, and
// reports whether this call ended it.
func (w *Watch) abort(err error) bool { return w.told(w.out.abort(err)) }

// told hands a Handler's watch the news of its end (tell), and returns
// ended. Ended is due (scheduled) before Err and Done say the watch
// ended, under the delivery's lock, so that a Handler.Wait after them
// waits for it.
func (w *Watch) told(ended, tell bool) bool {
	if tell {
		o := &w.out
		o.mu.Lock()
		o.to.schedule(w)
		o.closeOut()
		o.mu.Unlock()
	}
	return ended
}

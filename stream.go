package etcdwatch

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"reflect"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
)

// Stream is one etcd Watch stream carrying any number of watches. A single
// dispatcher goroutine owns the stream: it sends every create, cancel and
// progress request and routes every response by watch id, so a new watch is
// never confused with another watch's traffic. Watches that ask to be
// isolated (Request.Isolated) share a second such stream of their own, so
// that progress asked for them waits for none of the others. Its methods
// are safe for concurrent use.
type Stream struct {
	conn    grpc.ClientConnInterface
	opts    options
	limit   bufferLimit   // of every watch, from opts
	closing chan struct{} // closed by Close
	once    sync.Once
	pumps   sync.WaitGroup          // running Watch.pump goroutines
	probe   sync.WaitGroup          // the probeRelease goroutine
	base    context.Context         // ends at Close, with ErrClosed: the probe's and the wings' contexts derive from it
	stop    context.CancelCauseFunc // ends base; called by Close
	hooks   *hooks                  // a test's; nil otherwise
	stats   counters                // every lane's
	main    *lane                   // the watches that are not isolated

	mu       sync.Mutex
	isolated *lane       // the isolated watches'; nil until the first; guarded by mu
	retired  []*lane     // isolated lanes that failed for good and were replaced, perhaps still exiting; guarded by mu
	lastGone State       // the latest LastError of the isolated lanes retired, which State keeps; guarded by mu
	release  *versionCmd // what probeRelease learned, for lanes opened after; guarded by mu
	closed   bool        // Close has begun: no lane opens; guarded by mu
}

// Open starts a Stream on conn, typically a *grpc.ClientConn dialed to one or
// more etcd members. It returns at once; the gRPC stream is opened in the
// background and watches requested meanwhile wait for it. Close the Stream to
// release it; conn stays open and belongs to the caller.
//
// The Stream uses conn's NewStream (the Watch RPC) and Invoke (Maintenance
// Status, see RequestProgress). If conn is a *grpc.ClientConn (or has its
// GetState, WaitForStateChange and ResetConnectBackoff), or
// WithConnectivity gives one, it also uses the connection's state: to
// report why the stream cannot open, to cut gRPC's reconnect backoff short
// (WithConnectRetry), and to end the watches once the connection is closed.
// Without, a closed connection is retried until the Stream is closed.
func Open(conn grpc.ClientConnInterface, opts ...Option) (*Stream, error) {
	if isNil(conn) {
		return nil, fmt.Errorf("%w: conn is nil", ErrInvalidArgument)
	}
	o := defaultOptions()
	if c, ok := conn.(connState); ok {
		o.connectivity = c
	}
	for _, opt := range opts {
		opt(&o)
	}
	if err := o.validate(); err != nil {
		return nil, err
	}
	s := &Stream{
		conn:    conn,
		opts:    o,
		limit:   bufferLimit{events: o.bufferLimit, bytes: o.bufferBytes},
		closing: make(chan struct{}),
		hooks:   o.hooks,
	}
	s.main = s.startLane()
	s.base, s.stop = context.WithCancelCause(context.Background())
	s.probe.Go(func() { s.probeRelease(s.base) }) // exits once answered, refused or given up, or at Close; Close waits
	return s, nil
}

// isNil reports whether conn is nil or an interface holding a nil pointer,
// such as the *grpc.ClientConn of a failed grpc.NewClient whose error was
// ignored: it would only fail later, in the background, out of the
// caller's reach.
func isNil(conn grpc.ClientConnInterface) bool {
	if conn == nil {
		return true
	}
	v := reflect.ValueOf(conn)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

// Watch opens a watch and returns once the server has confirmed it, so that
// no write after the call returns is missed. ctx bounds
// both the wait and the watch's life: when ctx ends, the watch ends with
// ctx's cause. An invalid Request is refused with an error wrapping
// ErrInvalidRequest; a create refused by the server returns a *ServerError.
//
// Each call waits for its own confirmation; to open many watches at once,
// use WatchAll. A nil ctx panics, as it does for WatchAll and Handle.
func (s *Stream) Watch(ctx context.Context, r Request) (*Watch, error) {
	ws, _, err := s.open(ctx, []Request{r}, nil)
	if err != nil {
		return nil, err
	}
	return ws[0], nil
}

// WatchAll opens a watch for each request, all at once: their creates go out
// back to back, so that opening thousands of watches costs about one round
// trip rather than one each, and no goroutine each. (Through etcd's gRPC
// proxy, which picks its own watch ids, creates go one at a time whatever
// the call.) It returns the watches, in the order of rs, once the server has
// confirmed every one; an empty rs returns nil.
//
// Events of the watches confirmed first wait in their buffers until the
// call returns, so a watch replaying much history may be paused before its
// consumer starts: nothing is lost.
//
// It is all or nothing. If a request is invalid, nothing is opened. If the
// server refuses a create, ctx ends, WithCreateTimeout passes, the Stream
// closes or its stream fails for good before every watch is confirmed, the
// watches opened so far are canceled. For an invalid or refused request
// the error is a *RequestError, with the request's index, wrapping what
// Watch would have returned for it (match it with errors.Is and
// errors.As); otherwise it is the error Watch returns then. ctx bounds the
// wait and every watch's life, as it does for Watch.
//
// A watch whose start revision has been compacted is not a refusal: etcd
// confirms its create, then cancels it. So it is returned, and ends at
// once with a *CompactedError on its channel.
func (s *Stream) WatchAll(ctx context.Context, rs ...Request) ([]*Watch, error) {
	return s.openAll(ctx, rs, nil)
}

// Handle opens a watch for each request, as WatchAll does, whose responses
// go to h rather than to a channel (Responses is nil): see Handler. h may
// be called for a watch before Handle returns. If Handle fails, every
// watch it opened ends, and h is told of each end (WithEnded) as of any
// other, with the call's error; when the server refused one request, that
// watch ends with the refusal and the others with ErrCanceled; when ctx
// ended, each ends with ctx's cause, as a watch does whose ctx ends (the
// call's error adds why the stream was down, if it was). Handle does
// not wait for those calls. A nil h or ctx panics.
func (s *Stream) Handle(ctx context.Context, h *Handler, rs ...Request) ([]*Watch, error) {
	if h == nil {
		panic(fmt.Sprintf("%v: Handle with a nil Handler", ErrInvalidArgument))
	}
	return s.openAll(ctx, rs, h)
}

// openAll is WatchAll delivering to h, or to channels if h is nil.
func (s *Stream) openAll(ctx context.Context, rs []Request, h *Handler) ([]*Watch, error) {
	if len(rs) == 0 {
		return nil, nil
	}
	ws, i, err := s.open(ctx, rs, h)
	if err != nil && i >= 0 {
		return nil, &RequestError{Index: i, Of: len(rs), Request: rs[i], Err: err}
	}
	return ws, err
}

// open creates a watch for each of rs, delivering to h (nil: to channels),
// and waits until the server has confirmed all of them. On failure it
// cancels them all and returns the index of the request that failed, or -1
// when the failure concerns none in particular: ctx, Close, a stream that
// failed for good.
func (s *Stream) open(ctx context.Context, rs []Request, h *Handler) ([]*Watch, int, error) {
	if ctx == nil {
		panic(fmt.Sprintf("%v: a watch with a nil Context", ErrInvalidArgument)) // before it counts
	}
	// Counted from here, at once, before the requests are checked, so that
	// a group placing watches by Stats sees them as soon as it has handed
	// them over (see group's placed).
	s.stats.watches.Add(int64(len(rs)))
	for i, r := range rs {
		if err := r.Validate(); err != nil {
			s.stats.watches.Add(-int64(len(rs)))
			return nil, i, err
		}
	}
	if err := context.Cause(ctx); err != nil {
		s.stats.watches.Add(-int64(len(rs)))
		return nil, -1, err
	}
	created := make(chan created, len(rs)) // buffered for every outcome: the dispatcher never blocks on it
	ws := make([]*Watch, len(rs))
	for i, r := range rs {
		ws[i] = newWatch(s.laneFor(r), r, i, h)
		ws[i].entry.created = created // the dispatcher's from here on
	}
	for l, lws := range byLane(ws) {
		l.command(createCmd{lws, ctx}) // refused at Close: its watches are told ErrClosed, and stop counting
	}
	failed, err := s.awaitCreated(ctx, created, ws)
	if err == nil {
		return ws, -1, nil
	}
	whole := errors.Is(err, ErrClosed) || errors.Is(err, ErrStreamFailed)
	if whole {
		failed = nil // told to one watch first, but it concerns them all: each ends with it
	}
	ends := err
	if cause := context.Cause(ctx); cause != nil && failed == nil && !whole {
		ends = cause // the watches' ctx ended: each ends with its cause, as ctx's end does (not the call's explained error)
	}
	s.cancelAll(ws, failed, ends)
	if whole {
		return nil, -1, err
	}
	return nil, slices.Index(ws, failed), err
}

// cancelAll ends every watch of ws, as Cancel would, in one command to the
// dispatcher rather than one each: with err, which concerns them all, or,
// when it is the refusal of one of them (failed), that one with err and the
// others with ErrCanceled.
func (s *Stream) cancelAll(ws []*Watch, failed *Watch, err error) {
	var ended []*Watch
	for _, w := range ws {
		why := err
		if failed != nil && w != failed {
			why = ErrCanceled
		}
		if w.abort(why) {
			ended = append(ended, w)
		}
	}
	for l, lws := range byLane(ended) {
		l.command(cancelCmd{lws})
	}
	for _, w := range ws {
		if w.out.to == nil { // a Handler's may have a call in progress: not waited for
			<-w.Done()
		}
	}
}

// awaitCreated waits for the outcomes of the creates of ws and returns the
// first failure: a watch the server refused and why, or no watch and ctx's
// cause, ErrCreateTimeout or ErrClosed, explained by the state of the lanes
// of ws (stateOf).
func (s *Stream) awaitCreated(ctx context.Context, created <-chan created, ws []*Watch) (*Watch, error) {
	var timeout <-chan time.Time
	if d := s.opts.createTimeout; d > 0 {
		t := s.opts.clock.NewTimer(d)
		defer t.Stop()
		timeout = t.C()
	}
	for range ws {
		select {
		case c := <-created:
			if c.err != nil {
				return c.w, c.err
			}
		case <-ctx.Done():
			return nil, s.stateOf(ws).Explain(context.Cause(ctx))
		case <-timeout:
			return nil, s.stateOf(ws).Explain(fmt.Errorf("%w within %v", ErrCreateTimeout, s.opts.createTimeout))
		case <-s.closing:
			return nil, ErrClosed
		}
	}
	return nil, nil
}

// RequestProgress asks the server for a revision R such that every watch
// active on the stream when the call began has queued all its events <= R,
// and delivers R (or more) to each of them as a bookmark after those
// events. R is at least the highest revision the stream had seen when the
// call began. A paused watch (one whose consumer fell behind) is covered
// once its consumer has caught up and its create has gone again before the
// call; until then it catches up after it resumes. A watch created again on a new
// stream meanwhile is, once the new stream confirms it, and so is one
// created again from its next revision because its own was compacted just
// past it. A watch created
// during the call is not waited for, so that watches opened one after
// another cannot hold the call up; it gets the bookmark if the server
// answered after it existed. An answer computed before bookmarks it only
// if its create on that gRPC stream asked from now (it then starts past
// the answer), or it has every event up to the answer already: a watch
// from a past revision may still be catching up below.
//
// It covers every watch, so it waits for the slowest: etcd 3.5.13 and later
// answer only once every watch on a gRPC stream has caught up, and never
// while one waits for a future revision, so the request is repeated
// (WithProgressRetry) until answered or ctx ends: bound ctx. Watch's
// RequestProgress asks for a watch's own lane only, which for an isolated
// watch waits for none of the others. A gRPC stream that failed for good,
// whose watches all ended, is left out (the main one, or the isolated
// watches'); the call returns that failure (ErrStreamFailed) when no other
// is left, and ErrNoWatches when no watch is left the server could answer
// for.
//
// On etcd 3.4.0-3.4.24 and 3.5.0-3.5.7 (etcd #15220), whose answers can
// run ahead of events, it returns ErrProgressUnsupported (ErrNoWatches,
// as on every release, while there is no watch): the Stream asks the
// server its release (Maintenance Status) when it opens, and a call
// waits for that answer.
func (s *Stream) RequestProgress(ctx context.Context) (int64, error) {
	if err := context.Cause(ctx); err != nil {
		return 0, err // ended already: ask the server nothing
	}
	floor := s.stats.revision.Load()
	lanes := s.lanes()
	ps := make([]*progressWaiter, len(lanes))
	for i, l := range lanes { // every lane asked at once; then every answer awaited
		ps[i] = newProgressWaiter(ctx, floor)
		l.command(progressCmd{ps[i]})
	}
	rev, answered := int64(0), false
	var failed error
	for i, l := range lanes {
		r := l.await(ctx, ps[i])
		switch {
		case errors.Is(r.err, ErrNoWatches): // a lane the server has nothing to answer for
		case errors.Is(r.err, ErrStreamFailed): // nor one that failed for good: its watches ended
			failed = r.err
		case r.err != nil:
			return 0, r.err
		case !answered || r.rev < rev:
			rev, answered = r.rev, true
		}
	}
	switch {
	case answered:
		return rev, nil
	case failed != nil:
		return 0, failed
	}
	return 0, ErrNoWatches
}

// Stats returns a snapshot of the stream's counters.
func (s *Stream) Stats() Stats { return s.stats.snapshot() }

// State returns whether the server answers on the stream, since when, and
// the last error that ended it or kept it from opening. With isolated
// watches it is connected while both lanes are, once the isolated lane's
// server has first answered: until then, as it opens for the first
// isolated watch (a view's), only a failure of its own counts, so that
// opening a view does not read as a disconnection. Likewise the main
// stream while nothing has been asked of it (a Stream of views alone): it
// counts by its failures only (its first stream, if its connection failed,
// is probed once it opens), and the isolated stream says whether the
// server answers; from its first create on, it counts as any lane. An isolated lane that failed for
// good counts by its error only, which stays LastError once the next
// isolated watch has opened a new one, until a later error. A Stream
// with no watches at all reads disconnected until its server first
// answers: its first watch, the liveness probe (WithLiveness) of an idle
// stream, or the probe of a first stream that opened after its connection
// failed.
func (s *Stream) State() State {
	st, mainOpening, mainAsked := s.main.state.opening()
	if iso := s.isolatedLane(false); iso != nil {
		ist, opening, _ := iso.state.opening()
		switch {
		case ist.Failed != nil: // its watches ended; the next isolated watch opens a new one
			st = laterError(st, ist)
		case opening:
		case mainOpening && !mainAsked: // nothing asked of it yet (a Stream of views): the isolated lane speaks
			st = ist
		case st.Connected && ist.Connected && ist.LastError == nil:
			// It joined, answered after the main one, and has not gone down
			// since: no change of Connected, so not of Since.
		default:
			st = combine(st, ist)
		}
	}
	s.mu.Lock()
	gone := s.lastGone
	s.mu.Unlock()
	return laterError(st, gone)
}

// stateOf is the State that explains a wait for the watches ws: that of
// their lane when they share one, so that a watch on the main stream is not
// told of the isolated stream's failure, or the other way round; else the
// Stream's.
func (s *Stream) stateOf(ws []*Watch) State {
	for _, w := range ws {
		if w.lane != ws[0].lane {
			return s.State()
		}
	}
	return ws[0].lane.state.get()
}

// Close ends every watch with ErrClosed, ends the gRPC stream and waits for
// every goroutine of the Stream. Views and other wings end with the
// Stream's Context; Close does not wait for their goroutines: a View's own
// Close does. It is idempotent and always returns nil.
func (s *Stream) Close() error {
	s.once.Do(func() {
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
		s.stop(ErrClosed)
		close(s.closing)
	})
	s.probe.Wait()
	for _, l := range s.lanes() {
		<-l.exited
	}
	for _, l := range s.retiredLanes() {
		<-l.exited
	}
	s.pumps.Wait()
	return nil
}

// retire stops l, an isolated lane that failed for good, which the Stream
// replaces: its watches have ended, and commands still sent to it are
// refused with its failure. Close waits for the lanes retired and not yet
// exited. Called with mu held.
func (s *Stream) retire(l *lane) {
	st := l.state.get()
	l.gone = st.Failed
	s.lastGone = laterError(s.lastGone, st)
	close(l.retire)
	s.retired = append(slices.DeleteFunc(s.retired, func(l *lane) bool {
		select {
		case <-l.exited:
			return true
		default:
			return false
		}
	}), l)
}

// retiredLanes returns the isolated lanes retired and perhaps not yet
// exited.
func (s *Stream) retiredLanes() []*lane {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.retired
}

// lanes returns the Stream's lanes: the main one, and the isolated one if
// it is open.
func (s *Stream) lanes() []*lane {
	if iso := s.isolatedLane(false); iso != nil {
		return []*lane{s.main, iso}
	}
	return []*lane{s.main}
}

// laneFor returns the lane a watch for r goes on.
func (s *Stream) laneFor(r Request) *lane {
	if r.Isolated {
		if iso := s.isolatedLane(true); iso != nil {
			return iso
		}
	}
	return s.main // also for an isolated watch once Close has begun: refused there
}

// isolatedLane returns the lane of isolated watches, opening it if open is
// set and the Stream is not closing; nil if there is none. One that has
// failed for good (its watches ended) is replaced when open is set: the
// main lane works on, and so can a new stream for isolated watches.
func (s *Stream) isolatedLane(open bool) *lane {
	s.mu.Lock()
	defer s.mu.Unlock()
	if open && !s.closed && (s.isolated == nil || s.isolated.state.get().Failed != nil) {
		if s.isolated != nil {
			s.retire(s.isolated)
		}
		s.isolated = s.startLane()
		if s.release != nil {
			s.isolated.command(*s.release)
		}
	}
	return s.isolated
}

// byLane yields ws grouped by lane, keeping their order within each:
// ws itself when all are on one lane, as they mostly are. It makes no map:
// a Stream has two lanes at most, and a small map made here would sit on
// the stack of every Watch call (byLane is inlined into open), which then
// outgrows a goroutine's first 2 KiB of stack: 872 bytes of frame for
// open with the map, 520 without (go1.26, amd64).
func byLane(ws []*Watch) iter.Seq2[*lane, []*Watch] {
	return func(yield func(*lane, []*Watch) bool) {
		for rest := ws; len(rest) > 0; {
			first := rest[0].lane
			if !slices.ContainsFunc(rest, func(w *Watch) bool { return w.lane != first }) {
				yield(first, rest)
				return
			}
			var on []*Watch
			on, rest = splitLane(rest, first)
			if !yield(first, on) {
				return
			}
		}
	}
}

// splitLane returns the watches of ws on l, and the others, each in the
// order of ws.
func splitLane(ws []*Watch, l *lane) (on, rest []*Watch) {
	for _, w := range ws {
		if w.lane == l {
			on = append(on, w)
		} else {
			rest = append(rest, w)
		}
	}
	return on, rest
}

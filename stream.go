package etcdwatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
)

// Stream is one etcd Watch stream carrying any number of watches. A single
// dispatcher goroutine owns the stream: it sends every create, cancel and
// progress request and routes every response by watch id, so a new watch is
// never confused with another watch's traffic. Its methods are safe for
// concurrent use.
type Stream struct {
	conn    grpc.ClientConnInterface
	opts    options
	limit   bufferLimit   // of every watch, from opts
	cmds    chan command  // to the dispatcher
	closing chan struct{} // closed by Close
	done    chan struct{} // closed when the dispatcher has exited, after Close
	once    sync.Once
	pumps   sync.WaitGroup          // running Watch.pump goroutines
	probe   sync.WaitGroup          // the probeRelease goroutine
	base    context.Context         // ends at Close, with ErrClosed: the probe's and the wings' contexts derive from it
	stop    context.CancelCauseFunc // ends base; called by Close
	hooks   *hooks                  // a test's; nil otherwise
	stats   counters
	state   stateBox
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
		cmds:    make(chan command, 64),
		closing: make(chan struct{}),
		done:    make(chan struct{}),
		hooks:   o.hooks,
	}
	s.state.st.Since = o.clock.Now() // before the dispatcher starts
	open := grpcOpener(conn, o.connectivity, o.callOptions, s.connectionFailed)
	if o.requireLeader {
		open = requireLeader(open)
	}
	d := newDispatcher(s, open)
	go func() { // exits when Close is called; Close waits on done
		defer close(s.done)
		d.run()
	}()
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
// its events start right after the revision the server reported. ctx bounds
// both the wait and the watch's life: when ctx ends, the watch ends with
// ctx's cause. An invalid Request is refused with an error wrapping
// ErrInvalidRequest; a create refused by the server returns a *ServerError.
//
// Each call waits for its own confirmation; to open many watches at once,
// use WatchAll.
func (s *Stream) Watch(ctx context.Context, r Request) (*Watch, error) {
	ws, _, err := s.open(ctx, []Request{r})
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
// watches opened so far are canceled. For an invalid or refused request the error names it and wraps
// what Watch would have returned for it (match it with errors.Is and
// errors.As); otherwise it is the error Watch returns then. ctx bounds the
// wait and every watch's life, as it does for Watch.
//
// A watch whose start revision has been compacted is not a refusal: etcd
// confirms its create, then cancels it. So it is returned, and ends at
// once with a *CompactedError on its channel.
func (s *Stream) WatchAll(ctx context.Context, rs ...Request) ([]*Watch, error) {
	if len(rs) == 0 {
		return nil, nil
	}
	ws, i, err := s.open(ctx, rs)
	if err != nil && i >= 0 {
		return nil, fmt.Errorf("request %d of %d (%s): %w", i, len(rs), rs[i], err)
	}
	return ws, err
}

// open creates a watch for each of rs and waits until the server has
// confirmed all of them. On failure it cancels them all and returns the index
// of the request that failed, or -1 when the failure concerns none in
// particular: ctx, Close, a stream that failed for good.
func (s *Stream) open(ctx context.Context, rs []Request) ([]*Watch, int, error) {
	for i, r := range rs {
		if err := r.Validate(); err != nil {
			return nil, i, err
		}
	}
	if err := context.Cause(ctx); err != nil {
		return nil, -1, err
	}
	created := make(chan created, len(rs)) // buffered for every outcome: the dispatcher never blocks on it
	ws := make([]*Watch, len(rs))
	for i, r := range rs {
		ws[i] = newWatch(s, r.clone())
		ws[i].entry.created = created // the dispatcher's from here on
	}
	if !s.command(createCmd{ws, ctx}) {
		return nil, -1, ErrClosed
	}
	failed, err := s.awaitCreated(ctx, created, len(ws))
	if err == nil {
		return ws, -1, nil
	}
	s.cancelAll(ws, err)
	if errors.Is(err, ErrClosed) || errors.Is(err, ErrStreamFailed) {
		return nil, -1, err // told to every watch, whichever came first
	}
	return nil, slices.Index(ws, failed), err
}

// cancelAll ends every watch of ws with err, as Cancel would, in one command
// to the dispatcher rather than one each.
func (s *Stream) cancelAll(ws []*Watch, err error) {
	var ended []*Watch
	for _, w := range ws {
		if w.out.abort(err) {
			ended = append(ended, w)
		}
	}
	if len(ended) > 0 {
		s.command(cancelCmd{ended})
	}
	for _, w := range ws {
		<-w.Done()
	}
}

// awaitCreated waits for n outcomes of creates and returns the first failure:
// a watch the server refused and why, or no watch and ctx's cause,
// ErrCreateTimeout or ErrClosed.
func (s *Stream) awaitCreated(ctx context.Context, created <-chan created, n int) (*Watch, error) {
	var timeout <-chan time.Time
	if d := s.opts.createTimeout; d > 0 {
		t := s.opts.clock.NewTimer(d)
		defer t.Stop()
		timeout = t.C()
	}
	for range n {
		select {
		case c := <-created:
			if c.err != nil {
				return c.w, c.err
			}
		case <-ctx.Done():
			return nil, s.state.explain(context.Cause(ctx))
		case <-timeout:
			return nil, s.state.explain(fmt.Errorf("%w within %v", ErrCreateTimeout, s.opts.createTimeout))
		case <-s.done:
			return nil, ErrClosed
		}
	}
	return nil, nil
}

// RequestProgress asks the server for a revision R such that every active
// watch on the stream has queued all its events <= R, and delivers R to
// each of them as a bookmark after those events. R is at least the highest
// revision the stream had seen when the call began. A paused watch (one
// whose consumer fell behind) is not covered: it catches up after it resumes.
//
// etcd 3.6 and later answer only once every watch on the stream has caught
// up, and never while a watch waits for a future revision, so the request is
// repeated (WithProgressRetry) until answered or ctx ends: bound ctx. It
// returns ErrNoWatches when the stream has no watch the server could answer for.
//
// On etcd 3.4.0-3.4.24 and 3.5.0-3.5.7 (etcd #15220), whose answers can
// run ahead of events, it returns ErrProgressUnsupported: the Stream asks
// the server its release (Maintenance Status) when it opens.
func (s *Stream) RequestProgress(ctx context.Context) (int64, error) {
	p := &progressWaiter{ctx: ctx, reply: make(chan progressResult, 1)}
	if !s.command(progressCmd{p}) {
		return 0, ErrClosed
	}
	select {
	case r := <-p.reply:
		return r.rev, r.err
	case <-ctx.Done():
		return 0, s.state.explain(context.Cause(ctx))
	case <-s.done:
		return 0, ErrClosed
	}
}

// Stats returns a snapshot of the stream's counters.
func (s *Stream) Stats() Stats { return s.stats.snapshot() }

// State returns whether the stream is open, since when, and the last error
// that ended it or kept it from opening.
func (s *Stream) State() State { return s.state.get() }

// connectionFailed records why a stream could not open for want of a
// connection, and logs it once per outage: at Warn the first time, at
// Debug after. Called by the goroutine opening the stream.
func (s *Stream) connectionFailed(err error) {
	level := slog.LevelDebug
	if s.state.failed(err, s.opts.clock.Now()) {
		level = slog.LevelWarn
	}
	s.opts.logger.Log(context.Background(), level, "etcdwatch: cannot open the watch stream; waiting for the connection", "err", err)
}

// Close ends every watch with ErrClosed, ends the gRPC stream and waits for
// every goroutine of the Stream. Views and other wings end with the
// Stream's Context; Close does not wait for their goroutines: a View's own
// Close does. It is idempotent and always returns nil.
func (s *Stream) Close() error {
	s.once.Do(func() {
		s.stop(ErrClosed)
		close(s.closing)
	})
	s.probe.Wait()
	<-s.done
	s.pumps.Wait()
	return nil
}

// command hands c to the dispatcher. Once the Stream is closed it refuses
// c with ErrClosed instead, and reports false.
func (s *Stream) command(c command) bool {
	select {
	case s.cmds <- c:
		return true
	case <-s.done:
		c.refuse(ErrClosed)
		return false
	}
}

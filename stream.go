package etcdwatch

import (
	"context"
	"fmt"
	"sync"

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
	cmds    chan any      // typed commands to the dispatcher
	closing chan struct{} // closed by Close
	done    chan struct{} // closed when the dispatcher has exited, after Close
	once    sync.Once
	pumps   sync.WaitGroup // running Watch.pump goroutines
	stats   counters
}

// Open starts a Stream on conn, typically a *grpc.ClientConn dialed to one or
// more etcd members. It returns at once; the gRPC stream is opened in the
// background and watches requested meanwhile wait for it. Close the Stream to
// release it; conn stays open and belongs to the caller.
func Open(conn grpc.ClientConnInterface, opts ...Option) (*Stream, error) {
	o := defaultOptions()
	for _, opt := range opts {
		opt(&o)
	}
	if err := o.validate(); err != nil {
		return nil, err
	}
	open := o.openStreamForTest
	if open == nil {
		if conn == nil {
			return nil, fmt.Errorf("%w: conn is nil", ErrInvalidArgument)
		}
		open = grpcOpener(conn, o.callOptions)
	}
	if o.requireLeader {
		open = requireLeader(open)
	}
	s := &Stream{
		conn:    conn,
		opts:    o,
		cmds:    make(chan any, 64),
		closing: make(chan struct{}),
		done:    make(chan struct{}),
	}
	d := newDispatcher(s, open)
	go func() { // exits when Close is called; Close waits on done
		defer close(s.done)
		d.run()
	}()
	return s, nil
}

// Watch opens a watch and returns once the server has confirmed it, so that
// its events start right after the revision the server reported. ctx bounds
// both the wait and the watch's life: when ctx ends, the watch ends with
// ctx's cause. An invalid Request is refused with an error wrapping
// ErrInvalidRequest; a create refused by the server returns a *ServerError.
func (s *Stream) Watch(ctx context.Context, r Request) (*Watch, error) {
	if err := r.Validate(); err != nil {
		return nil, err
	}
	if err := context.Cause(ctx); err != nil {
		return nil, err
	}
	w := newWatch(s, r.clone())
	created := make(chan error, 1)
	w.created = created // the dispatcher's from here on
	if !s.command(createCmd{w, ctx}) {
		return nil, ErrClosed
	}
	select {
	case err := <-created:
		if err != nil {
			return nil, err
		}
	case <-ctx.Done():
		w.cancelWith(context.Cause(ctx))
		return nil, context.Cause(ctx)
	case <-s.done:
		return nil, ErrClosed
	}
	return w, nil
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
func (s *Stream) RequestProgress(ctx context.Context) (int64, error) {
	p := &progressWaiter{ctx: ctx, reply: make(chan progressResult, 1)}
	if !s.command(progressCmd{p}) {
		return 0, ErrClosed
	}
	select {
	case r := <-p.reply:
		return r.rev, r.err
	case <-ctx.Done():
		return 0, context.Cause(ctx)
	case <-s.done:
		return 0, ErrClosed
	}
}

// Stats returns a snapshot of the stream's counters.
func (s *Stream) Stats() Stats { return s.stats.snapshot() }

// Close ends every watch with ErrClosed, ends the gRPC stream and waits for
// every goroutine of the Stream. It is idempotent and always returns nil.
func (s *Stream) Close() error {
	s.once.Do(func() { close(s.closing) })
	<-s.done
	s.pumps.Wait()
	return nil
}

// command hands c to the dispatcher. It reports false once the Stream is
// closed.
func (s *Stream) command(c any) bool {
	select {
	case s.cmds <- c:
		return true
	case <-s.done:
		return false
	}
}

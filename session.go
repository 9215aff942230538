package etcdwatch

import (
	"context"
	"errors"
	"io"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/etcdwatch/etcdwatch/internal/rpcerr"
)

// wireStream is the part of a gRPC Watch stream the dispatcher needs. Recv
// decodes the next response into r.
type wireStream interface {
	Send(*wireRequest) error
	Recv(r *wireResponse) error
}

// opener opens a wire stream that lives until ctx ends.
type opener func(ctx context.Context) (wireStream, error)

// grpcOpener opens etcd's Watch RPC on conn, decoding responses with codec.
// It takes responses of any size, as etcd's own client does: gRPC's default
// of 4 MiB would refuse an unfragmented revision above it, and the watch
// would be re-created only to meet it again.
//
// The RPC waits for the connection rather than failing at once: after a cut
// the stream reopens the moment gRPC has reconnected, instead of a backoff
// later. With the connection's Connectivity it waits by hand, so as to learn why the
// connection fails: it opens the stream without waiting, and while that
// fails for want of a connection it reports the connection's error (a
// refused connection, a failed TLS handshake) and waits for the
// connection's state to change.
func grpcOpener(conn grpc.ClientConnInterface, cc connState, callOpts []grpc.CallOption, report func(error)) opener {
	base := []grpc.CallOption{grpc.ForceCodecV2(codec{}), grpc.MaxCallRecvMsgSize(math.MaxInt32)}
	ready := slices.Concat(base, []grpc.CallOption{grpc.WaitForReady(true)}, callOpts)
	failFast := slices.Concat(base, []grpc.CallOption{grpc.WaitForReady(false)}, callOpts)
	newStream := func(ctx context.Context, opts []grpc.CallOption) (wireStream, error) {
		cs, err := conn.NewStream(ctx, &pb.Watch_ServiceDesc.Streams[0], pb.Watch_Watch_FullMethodName, opts...)
		if err != nil {
			return nil, err
		}
		return grpcStream{cs}, nil
	}
	if cc == nil {
		return func(ctx context.Context) (wireStream, error) { return newStream(ctx, ready) }
	}
	return func(ctx context.Context) (wireStream, error) {
		for {
			ws, err := newStream(ctx, failFast)
			if err == nil || status.Code(err) != codes.Unavailable || ctx.Err() != nil {
				return ws, err
			}
			report(err)
			if cc.GetState() == connectivity.TransientFailure {
				cc.WaitForStateChange(ctx, connectivity.TransientFailure)
			}
		}
	}
}

type grpcStream struct{ grpc.ClientStream }

func (g grpcStream) Send(r *wireRequest) error  { return g.SendMsg(r) }
func (g grpcStream) Recv(r *wireResponse) error { return g.RecvMsg(r) }

// requireLeader makes the server refuse and end streams while it has no leader.
func requireLeader(open opener) opener {
	return func(ctx context.Context) (wireStream, error) {
		return open(metadata.AppendToOutgoingContext(ctx, "hasleader", "true"))
	}
}

// session is one wire stream and the two goroutines that move its messages:
// recvLoop opens the stream and feeds its responses to the dispatcher, and
// sendLoop writes the request batches the dispatcher hands it. Both end when
// the session's context ends; the first failure tears the session down
// through exit, and close waits for both.
type session struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	recv   chan wireResponse  // recvLoop -> dispatcher, readAhead deep
	send   chan []wireRequest // dispatcher -> sendLoop
	dead   chan struct{}      // closed by exit
	opened chan struct{}      // closed by recvLoop once the stream is open
	now    func() time.Time   // the dispatcher's clock
	err    error              // why the session ended; read after dead is closed
	// openedAt is when the stream opened: written by recvLoop before it
	// closes opened; zero if it never did.
	openedAt time.Time
	// sendLoop's, read after close (unsent): the request Send failed for,
	// and how.
	refused    wireRequest
	refusedErr error
	ahead      atomic.Int64  // bytes of the big messages in recv
	room       chan struct{} // dispatcher -> recvLoop: ahead fell below readAheadBytes
	hooks      *hooks        // a test's; nil otherwise
	once       sync.Once
	wg         sync.WaitGroup // recvLoop and sendLoop
}

// readAhead is how many responses recvLoop may decode ahead of the
// dispatcher. It lets both run at once, and the dispatcher take a burst in
// one wake-up: on 2 cores it lifts 1-event responses from about 300k to
// 450k a second. Beyond 16 nothing more was gained.
//
// readAheadBytes bounds their size as well: while a watch catches up, etcd
// sends up to 1,000 revisions in one message. Only messages of bigMessage
// or more are counted against it, so that the small ones of a busy stream
// cost no shared counter: those waiting add up to 16 times bigMessage at
// most. recvLoop reads on only while less than readAheadBytes of big ones
// waits, so at most one message goes beyond it.
const (
	readAhead      = 16
	readAheadBytes = 4 << 20
	bigMessage     = 64 << 10
)

func startSession(open opener, now func() time.Time, h *hooks) *session {
	ctx, cancel := context.WithCancelCause(context.Background())
	s := &session{
		ctx:    ctx,
		cancel: cancel,
		recv:   make(chan wireResponse, readAhead),
		room:   make(chan struct{}, 1),
		send:   make(chan []wireRequest),
		dead:   make(chan struct{}),
		opened: make(chan struct{}),
		now:    now,
		hooks:  h,
	}
	s.wg.Add(1)
	go func() { // exits when the stream fails or ctx ends; waited for in close
		defer s.wg.Done()
		s.exit(s.recvLoop(open))
	}()
	return s
}

// exit records the first error and ends the session.
func (s *session) exit(err error) {
	s.once.Do(func() {
		s.err = err
		s.cancel(err)
		close(s.dead)
		s.hooks.at(hookExited)
	})
}

// isOpen reports whether the session's stream has opened: until then it
// waits for a connection, whose failures the opener reports.
func (s *session) isOpen() bool {
	select {
	case <-s.opened:
		return true
	default:
		return false
	}
}

// upFor returns how long the session's stream had been open at now: 0 if
// it never opened. Called after close.
func (s *session) upFor(now time.Time) time.Duration {
	if s.openedAt.IsZero() {
		return 0
	}
	return now.Sub(s.openedAt)
}

// close ends the session, if it is still running, and waits for its goroutines.
func (s *session) close() {
	s.exit(ErrClosed)
	s.wg.Wait()
}

// unsent is the request whose Send failed with the error that ended the
// session, whichever loop reported it (gRPC reports a send it refused
// through the stream's receive too); kind 0 when there is none. Called
// after close.
func (s *session) unsent() wireRequest {
	if s.refusedErr != nil && rpcerr.Same(s.refusedErr, s.err) {
		return s.refused
	}
	return wireRequest{}
}

func (s *session) recvLoop(open opener) error {
	ws, err := open(s.ctx)
	if err != nil {
		return err
	}
	s.openedAt = s.now()
	close(s.opened)
	s.wg.Add(1)
	go func() { // exits when a Send fails or ctx ends; waited for in close
		defer s.wg.Done()
		if err := s.sendLoop(ws); err != nil {
			s.exit(err)
		}
	}()
	var resp wireResponse // decoded into, then copied to the dispatcher
	full := false         // readAheadBytes of big messages wait for the dispatcher
	for {
		if full {
			if err := s.awaitRoom(); err != nil {
				return err
			}
		}
		if err := ws.Recv(&resp); err != nil {
			return err
		}
		if resp.size >= bigMessage {
			full = s.ahead.Add(int64(resp.size)) >= readAheadBytes
		}
		if err := s.hand(resp); err != nil {
			return err
		}
		resp = wireResponse{} // hold nothing of a response once it is handed over
	}
}

// hand gives resp to the dispatcher. hookReceived comes first: once the
// dispatcher has resp it may handle it (hookResponse) before this
// goroutine runs again, and a test that saw it handled must count it
// received.
func (s *session) hand(resp wireResponse) error {
	s.hooks.at(hookReceived)
	select {
	case s.recv <- resp: // room, or the dispatcher waiting: no select over ctx needed
		return nil
	default:
	}
	select {
	case s.recv <- resp:
		return nil
	case <-s.ctx.Done():
		return context.Cause(s.ctx)
	}
}

// awaitRoom waits while readAheadBytes of big messages wait for the dispatcher.
func (s *session) awaitRoom() error {
	for s.ahead.Load() >= readAheadBytes {
		select {
		case <-s.room:
		case <-s.ctx.Done():
			return context.Cause(s.ctx)
		}
	}
	return nil
}

// took tells recvLoop that the dispatcher has taken a response of n bytes.
// Called by the dispatcher for every response it receives from recv.
func (s *session) took(n int) {
	if n < bigMessage {
		return // not counted
	}
	if left := s.ahead.Add(-int64(n)); left < readAheadBytes && left+int64(n) >= readAheadBytes {
		select {
		case s.room <- struct{}{}:
		default: // a wake-up is already waiting
		}
	}
}

// sendLoop writes batches until ctx ends or a Send fails. A Send that fails with io.EOF means
// the stream is gone; Recv then reports why, so sendLoop returns nil for it.
func (s *session) sendLoop(ws wireStream) error {
	for {
		select {
		case batch := <-s.send:
			for i := range batch {
				if err := ws.Send(&batch[i]); err != nil {
					if errors.Is(err, io.EOF) {
						return nil
					}
					s.refused, s.refusedErr = batch[i], err // gRPC may report err through Recv first: unsent matches them
					return err
				}
			}
		case <-s.ctx.Done():
			return nil
		}
	}
}

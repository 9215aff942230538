package etcdwatch

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"

	"github.com/etcdwatch/etcdwatch/internal/clock"
)

// Option configures a Stream. Options are applied in order over the
// defaults, then validated together by Open.
type Option func(*options)

type options struct {
	backoffMin, backoffMax        time.Duration
	connectRetry                  time.Duration
	livenessIdle, livenessTimeout time.Duration
	requireLeader                 bool
	bufferLimit, bufferBytes      int
	stallBudget                   time.Duration
	progressRetryMin              time.Duration
	progressRetry                 time.Duration
	createTimeout                 time.Duration
	logger                        *slog.Logger
	callOptions                   []grpc.CallOption
	connectivity                  connState   // the connection's state; nil if unknown
	clock                         clock.Clock // the dispatcher's; a test's Fake
	hooks                         *hooks      // a test's; nil otherwise
}

func defaultOptions() options {
	return options{
		bufferLimit:      1024,
		bufferBytes:      16 << 20,
		stallBudget:      100 * time.Millisecond,
		progressRetryMin: 10 * time.Millisecond,
		progressRetry:    250 * time.Millisecond,
		backoffMin:       100 * time.Millisecond,
		backoffMax:       5 * time.Second,
		connectRetry:     100 * time.Millisecond,
		livenessIdle:     30 * time.Second,
		livenessTimeout:  10 * time.Second,
		logger:           slog.New(slog.DiscardHandler),
		clock:            clock.Real,
	}
}

// WithBufferLimit bounds how many events (a bookmark counts as one) a watch
// may hold for a consumer that is not reading. At the limit the Stream may
// wait for the consumer (WithStallBudget), then pauses the watch on the
// server, losing nothing, until the consumer has read half its backlog. The
// buffer grows on demand: an idle watch holds none. Default 1024; at least 1.
func WithBufferLimit(events int) Option { return func(o *options) { o.bufferLimit = events } }

// WithBufferBytes bounds the bytes a watch may hold for a consumer that is
// not reading (keys and values, previous ones included, and about 100
// bytes an event), as WithBufferLimit does their number; a larger response
// is still delivered whole. Default 16 MiB; at least 1.
func WithBufferBytes(n int) Option { return func(o *options) { o.bufferBytes = n } }

// WithStallBudget bounds how long the Stream may stop reading (a stall) to
// wait for a consumer at its buffer limit to take half its backlog, before
// it pauses the watch: letting gRPC flow control slow the server is far
// cheaper than a pause when a busy process merely ran the consumer late.
// The first millisecond of each stall is free; the rest draws on a budget
// of up to d that refills at a tenth of the time passing. A stall holds up
// every watch on the stream, so one with neighbours (or a create or
// RequestProgress waiting) lasts 2ms at most. 0 never stalls. Default
// 100ms; at least 0.
func WithStallBudget(d time.Duration) Option { return func(o *options) { o.stallBudget = d } }

// WithCreateTimeout bounds how long Watch, WatchAll and Handle wait for the server
// to confirm their watches, apart from their context, which bounds the
// watches' whole lives: a call not answered within d fails with an error
// wrapping ErrCreateTimeout (and why the stream could not open, if it
// could not). Default 0: no bound but the context's; at least 0.
func WithCreateTimeout(d time.Duration) Option { return func(o *options) { o.createTimeout = d } }

// WithProgressRetry sets how long RequestProgress waits for an answer
// before asking again: etcd 3.5.13 and later stay silent while any watch on
// the stream is catching up. A request is first asked again after min,
// then after twice as long each time, up to max, so that an answer held
// back only until etcd's next sync of new watches (every 100ms) comes soon
// after it, and a stream held up for long is asked every max. Default
// 10ms and 250ms; 1ms <= min <= max.
func WithProgressRetry(min, max time.Duration) Option {
	return func(o *options) { o.progressRetryMin, o.progressRetry = min, max }
}

// WithLogger sets the logger for stream-level events (stream failures,
// dropped responses, pauses). Default: discard. A nil logger is invalid.
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// WithCallOptions adds gRPC call options to the Watch RPC, for example
// per-RPC credentials. Options choosing a codec or content-subtype are
// refused: the Stream encodes and decodes the RPC's messages itself. The
// Stream accepts responses of any size; a grpc.MaxCallRecvMsgSize here
// bounds them, a promise about memory the Stream keeps: a revision above
// it (in a watch without fragments) ends the Stream's watches with an
// error wrapping ErrStreamFailed whose gRPC code is ResourceExhausted, as
// clientv3 ends its watches. A create above a grpc.MaxCallSendMsgSize here
// (or above the server's limit) is refused, that watch alone, with a
// *ServerError matching ErrInvalidRequest; so is one within a few bytes of
// the limit when it is created again from its next revision, whose
// encoding is longer. Default: none.
func WithCallOptions(opts ...grpc.CallOption) Option {
	return func(o *options) { o.callOptions = append(o.callOptions, opts...) }
}

// recvLimit is the Stream's receive limit: the last
// grpc.MaxCallRecvMsgSize of its call options, else none (math.MaxInt32,
// as grpcOpener sets).
func (o *options) recvLimit() int {
	limit := math.MaxInt32
	for _, c := range o.callOptions {
		if m, ok := c.(grpc.MaxRecvMsgSizeCallOption); ok {
			limit = m.MaxRecvMsgSize
		}
	}
	return limit
}

// WithReconnectBackoff sets the delays before replacing a gRPC stream that
// failed before the server said anything on it: about min, doubling with
// each such stream in a row up to max, jittered. A stream that worked (the
// server answered, or it stayed open 10s, counted from when it opened, not
// from when it began to wait for its connection) is replaced at once, at
// most once per min; one refused for want of a leader
// (WithRequireLeader), after 25-50ms. Default 100ms and 5s.
func WithReconnectBackoff(min, max time.Duration) Option {
	return func(o *options) { o.backoffMin, o.backoffMax = min, max }
}

// WithConnectRetry sets how often a stream waiting for a connection in
// TRANSIENT_FAILURE resets its reconnect backoff (ResetConnectBackoff), so
// that gRPC's (1s, growing 1.6 times) does not reach a member back from a
// 3s outage 2s late. 0 leaves the connection's backoff alone. Default
// 100ms; at least 0.
func WithConnectRetry(interval time.Duration) Option {
	return func(o *options) { o.connectRetry = interval }
}

// WithLiveness makes the Stream notice a stream that has gone silent, such as
// one behind a dead connection: idle after its last message it probes the
// server, and if nothing arrives within timeout it replaces the stream
// (State.Connected is false from then until a server answers). A stream
// still waiting for its connection is not probed: State says why it
// cannot open. An idle of 0 turns the checks off. Default 30s and 10s.
//
// A probe cannot repair a TCP connection that no longer carries packets:
// dial with gRPC keepalive for that (package dial does).
func WithLiveness(idle, timeout time.Duration) Option {
	return func(o *options) { o.livenessIdle, o.livenessTimeout = idle, timeout }
}

// WithRequireLeader asks etcd to refuse, and to end, the stream while the
// member serving it has no leader, so that the Stream moves to a member that
// has one (the "hasleader" metadata). Default off.
func WithRequireLeader() Option { return func(o *options) { o.requireLeader = true } }

// connState is the part of *grpc.ClientConn a Stream uses beyond
// grpc.ClientConnInterface; see Open.
type connState interface {
	GetState() connectivity.State
	WaitForStateChange(ctx context.Context, source connectivity.State) bool
	ResetConnectBackoff()
}

// WithConnectivity gives the Stream the state of cc, the connection under
// a conn that wraps it and hides its methods (a wrapper that adds metadata
// to each RPC, say): see Open for what the Stream does with it. Default:
// conn's own, if conn is a *grpc.ClientConn or has its methods.
func WithConnectivity(cc *grpc.ClientConn) Option {
	return func(o *options) {
		if cc != nil {
			o.connectivity = cc
		}
	}
}

func (o *options) validate() error {
	switch {
	case o.bufferLimit < 1:
		return fmt.Errorf("%w: WithBufferLimit(%d) must be at least 1", ErrInvalidArgument, o.bufferLimit)
	case o.bufferBytes < 1:
		return fmt.Errorf("%w: WithBufferBytes(%d) must be at least 1", ErrInvalidArgument, o.bufferBytes)
	case o.stallBudget < 0:
		return fmt.Errorf("%w: WithStallBudget(%v) must be at least 0", ErrInvalidArgument, o.stallBudget)
	case o.createTimeout < 0:
		return fmt.Errorf("%w: WithCreateTimeout(%v) must be at least 0", ErrInvalidArgument, o.createTimeout)
	case o.progressRetryMin < time.Millisecond || o.progressRetry < o.progressRetryMin:
		return fmt.Errorf("%w: WithProgressRetry(%v, %v) needs 1ms <= min <= max", ErrInvalidArgument, o.progressRetryMin, o.progressRetry)
	case o.backoffMin <= 0 || o.backoffMax < o.backoffMin:
		return fmt.Errorf("%w: WithReconnectBackoff(%v, %v) needs 0 < min <= max", ErrInvalidArgument, o.backoffMin, o.backoffMax)
	case o.connectRetry < 0:
		return fmt.Errorf("%w: WithConnectRetry(%v) must be at least 0", ErrInvalidArgument, o.connectRetry)
	case o.livenessIdle < 0 || (o.livenessIdle > 0 && o.livenessTimeout <= 0):
		return fmt.Errorf("%w: WithLiveness(%v, %v) needs idle >= 0 and, unless idle is 0, timeout > 0", ErrInvalidArgument, o.livenessIdle, o.livenessTimeout)
	case o.logger == nil:
		return fmt.Errorf("%w: WithLogger(nil)", ErrInvalidArgument)
	}
	for _, c := range o.callOptions {
		switch c.(type) {
		case nil:
			return fmt.Errorf("%w: WithCallOptions with a nil option", ErrInvalidArgument)
		case grpc.ForceCodecCallOption, grpc.ForceCodecV2CallOption, grpc.ContentSubtypeCallOption,
			grpc.CustomCodecCallOption: // CallCustomCodec, deprecated but still choosing
			return fmt.Errorf("%w: WithCallOptions(%T): the Stream chooses the codec of its RPC", ErrInvalidArgument, c)
		}
	}
	return nil
}

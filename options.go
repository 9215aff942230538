package etcdwatch

import (
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/grpc"
)

// Option configures a Stream. Options are applied in order over the
// defaults, then validated together by Open.
type Option func(*options)

type options struct {
	backoffMin, backoffMax        time.Duration
	livenessIdle, livenessTimeout time.Duration
	requireLeader                 bool
	bufferLimit                   int
	stallBudget                   time.Duration
	progressRetry                 time.Duration
	logger                        *slog.Logger
	callOptions                   []grpc.CallOption
	openStreamForTest             opener // nil: a gRPC Watch stream on the connection
}

func defaultOptions() options {
	return options{
		bufferLimit:     1024,
		stallBudget:     100 * time.Millisecond,
		progressRetry:   250 * time.Millisecond,
		backoffMin:      100 * time.Millisecond,
		backoffMax:      5 * time.Second,
		livenessIdle:    30 * time.Second,
		livenessTimeout: 10 * time.Second,
		logger:          slog.New(slog.DiscardHandler),
	}
}

// WithBufferLimit bounds how many events (a bookmark counts as one) a watch
// may hold for a consumer that is not reading. When a watch reaches the
// limit, the Stream first waits for its consumer, reading no more responses
// (see WithStallBudget), and if the consumer does not catch up the watch is
// paused: its server-side watch is canceled, nothing is lost, and it is
// re-created from its next revision once the consumer has read half of its
// backlog. The buffer grows on demand, so an idle watch holds none of it.
// Default 1024; at least 1.
func WithBufferLimit(events int) Option { return func(o *options) { o.bufferLimit = events } }

// WithStallBudget bounds how long the Stream may hold up all its watches
// waiting for a consumer at its buffer limit to take half its backlog, before
// it pauses that watch. Such a wait (a stall) lets gRPC flow control slow the
// server, which is far cheaper than a pause when a busy process merely ran the
// consumer late. The first millisecond of each stall is free; the rest is
// drawn from a budget of up to d that refills at a tenth of the time that
// passes. So a consumer that is never more than a moment late sets the
// stream's pace (backpressure), while one that lags for longer costs the
// other watches at most about a tenth of the stream's time before it is
// paused. 0 pauses a watch as soon as it reaches its limit and never holds
// up the others. Default 100ms; at least 0.
func WithStallBudget(d time.Duration) Option { return func(o *options) { o.stallBudget = d } }

// WithProgressRetry sets how long RequestProgress waits for an answer before
// asking again: etcd 3.6 and later stay silent while any watch on the stream
// is catching up. Default 250ms; at least 1ms.
func WithProgressRetry(d time.Duration) Option { return func(o *options) { o.progressRetry = d } }

// WithLogger sets the logger for stream-level events (stream failures,
// dropped responses, pauses). Default: discard. A nil logger is invalid.
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// WithCallOptions adds gRPC call options to the Watch RPC, for example
// per-RPC credentials. Options choosing a codec or content-subtype are
// refused: the Stream encodes and decodes the RPC's messages itself. The
// Stream accepts responses of any size; a grpc.MaxCallRecvMsgSize here
// lowers that, and a revision above it (unless the watch asks for
// fragments) then breaks the stream each time it is re-created.
// Default: none.
func WithCallOptions(opts ...grpc.CallOption) Option {
	return func(o *options) { o.callOptions = append(o.callOptions, opts...) }
}

// WithReconnectBackoff sets the delays between attempts to replace a broken
// gRPC stream: the first attempt is immediate, the next wait about min, then
// twice as long each time up to max, with jitter; after a stream has stayed
// up for 10s the next failure starts over. Default 100ms and 5s.
func WithReconnectBackoff(min, max time.Duration) Option {
	return func(o *options) { o.backoffMin, o.backoffMax = min, max }
}

// WithLiveness makes the Stream notice a stream that has gone silent, such as
// one behind a dead connection: after idle without any message it probes the
// server, and if nothing arrives within timeout it replaces the stream.
// An idle of 0 turns the checks off. Default 30s and 10s.
//
// A probe cannot repair a TCP connection that no longer carries packets:
// dial with gRPC keepalive for that (Dial does).
func WithLiveness(idle, timeout time.Duration) Option {
	return func(o *options) { o.livenessIdle, o.livenessTimeout = idle, timeout }
}

// WithRequireLeader asks etcd to refuse, and to end, the stream while the
// member serving it has no leader, so that the Stream moves to a member that
// has one (the "hasleader" metadata). Default off.
func WithRequireLeader() Option { return func(o *options) { o.requireLeader = true } }

func (o *options) validate() error {
	switch {
	case o.bufferLimit < 1:
		return fmt.Errorf("%w: WithBufferLimit(%d) must be at least 1", ErrInvalidArgument, o.bufferLimit)
	case o.stallBudget < 0:
		return fmt.Errorf("%w: WithStallBudget(%v) must be at least 0", ErrInvalidArgument, o.stallBudget)
	case o.progressRetry < time.Millisecond:
		return fmt.Errorf("%w: WithProgressRetry(%v) must be at least 1ms", ErrInvalidArgument, o.progressRetry)
	case o.backoffMin <= 0 || o.backoffMax < o.backoffMin:
		return fmt.Errorf("%w: WithReconnectBackoff(%v, %v) needs 0 < min <= max", ErrInvalidArgument, o.backoffMin, o.backoffMax)
	case o.livenessIdle < 0 || (o.livenessIdle > 0 && o.livenessTimeout <= 0):
		return fmt.Errorf("%w: WithLiveness(%v, %v) needs idle >= 0 and, unless idle is 0, timeout > 0", ErrInvalidArgument, o.livenessIdle, o.livenessTimeout)
	case o.logger == nil:
		return fmt.Errorf("%w: WithLogger(nil)", ErrInvalidArgument)
	}
	for _, c := range o.callOptions {
		switch c.(type) {
		case grpc.ForceCodecCallOption, grpc.ForceCodecV2CallOption, grpc.ContentSubtypeCallOption:
			return fmt.Errorf("%w: WithCallOptions(%T): the Stream chooses the codec of its RPC", ErrInvalidArgument, c)
		}
	}
	return nil
}

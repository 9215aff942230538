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
	bufferLimit       int
	progressRetry     time.Duration
	logger            *slog.Logger
	callOptions       []grpc.CallOption
	openStreamForTest opener // nil: a gRPC Watch stream on the connection
}

func defaultOptions() options {
	return options{
		bufferLimit:   1024,
		progressRetry: 250 * time.Millisecond,
		logger:        slog.New(slog.DiscardHandler),
	}
}

// WithBufferLimit bounds how many events (a bookmark counts as one) a watch
// may hold for a consumer that is not reading. When a watch reaches the limit
// it is paused: its server-side watch is canceled, nothing is lost, and it is
// re-created from its next revision once the consumer has read half of its
// backlog. The buffer grows on demand, so an idle watch holds none of it.
// Default 1024; at least 1.
func WithBufferLimit(events int) Option { return func(o *options) { o.bufferLimit = events } }

// WithProgressRetry sets how long RequestProgress waits for an answer before
// asking again: etcd 3.6 and later stay silent while any watch on the stream
// is catching up. Default 250ms; at least 1ms.
func WithProgressRetry(d time.Duration) Option { return func(o *options) { o.progressRetry = d } }

// WithLogger sets the logger for stream-level events (stream failures,
// dropped responses, pauses). Default: discard. A nil logger is invalid.
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// WithCallOptions adds gRPC call options to the Watch RPC, for example
// per-RPC credentials. Default: none.
func WithCallOptions(opts ...grpc.CallOption) Option {
	return func(o *options) { o.callOptions = append(o.callOptions, opts...) }
}

func (o *options) validate() error {
	switch {
	case o.bufferLimit < 1:
		return fmt.Errorf("%w: WithBufferLimit(%d) must be at least 1", ErrInvalidArgument, o.bufferLimit)
	case o.progressRetry < time.Millisecond:
		return fmt.Errorf("%w: WithProgressRetry(%v) must be at least 1ms", ErrInvalidArgument, o.progressRetry)
	case o.logger == nil:
		return fmt.Errorf("%w: WithLogger(nil)", ErrInvalidArgument)
	}
	return nil
}

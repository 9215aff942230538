package etcdwatch

import (
	"context"
	"log/slog"
	"slices"
	"time"

	"google.golang.org/grpc"
)

// What a wing built on a Stream (a view, a group of Streams) may use of it
// beside watches: the connection for RPCs of its own, with the Stream's
// call options; its logger and retry policy; and a context that ends with
// it. A wing holds no field of the Stream and the Stream knows no wing.

// Conn returns the connection the Stream was opened on, for RPCs of a
// wing's own (a view's Range calls), with the options of WithCallOptions
// put on each after the RPC's own. The connection belongs to whoever
// opened the Stream.
func (s *Stream) Conn() grpc.ClientConnInterface {
	if len(s.opts.callOptions) == 0 {
		return s.conn
	}
	return callConn{s.conn, s.opts.callOptions}
}

// callConn puts the Stream's call options on every RPC.
type callConn struct {
	conn grpc.ClientConnInterface
	opts []grpc.CallOption
}

func (c callConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	return c.conn.Invoke(ctx, method, args, reply, slices.Concat(opts, c.opts)...)
}

func (c callConn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	return c.conn.NewStream(ctx, desc, method, slices.Concat(opts, c.opts)...)
}

// Context returns a context that ends at Close, with cause ErrClosed, for
// a wing's goroutines; Close does not wait for them.
func (s *Stream) Context() context.Context { return s.base }

// Logger returns the logger given with WithLogger.
func (s *Stream) Logger() *slog.Logger { return s.opts.logger }

// RetryDelay returns how long to wait after failures attempts in a row
// failed (fewer than 1 count as 1), by WithReconnectBackoff's policy.
func (s *Stream) RetryDelay(failures int) time.Duration {
	return growing(s.opts.backoffMin, s.opts.backoffMax, failures)
}

package etcdwatch

import (
	"context"
	"log/slog"
	"slices"
	"time"

	"google.golang.org/grpc"
)

// What a wing built on a Stream (a view, a group of Streams) may use of it
// beside watches: the connection for RPCs of its own, the Stream's call
// options, logger and retry policy, and a context that ends with it. A
// wing holds no field of the Stream and the Stream knows no wing.

// Conn returns the connection the Stream was opened on, for RPCs of a
// wing's own (a view's Range calls). It belongs to whoever opened the
// Stream.
func (s *Stream) Conn() grpc.ClientConnInterface { return s.conn }

// CallOptions returns a copy of the options given with WithCallOptions,
// for a wing to put on its RPCs.
func (s *Stream) CallOptions() []grpc.CallOption { return slices.Clone(s.opts.callOptions) }

// Context returns a context that ends when Close is called, with cause
// ErrClosed, for the goroutines of a wing to end with the Stream. Close
// does not wait for them.
func (s *Stream) Context() context.Context { return s.base }

// Logger returns the logger given with WithLogger.
func (s *Stream) Logger() *slog.Logger { return s.opts.logger }

// RetryDelay returns how long to wait before trying again after failures
// attempts in a row have failed (failures >= 1), by the policy of
// WithReconnectBackoff: about its min, doubling with each failure up to
// its max, with jitter.
func (s *Stream) RetryDelay(failures int) time.Duration {
	return growing(s.opts.backoffMin, s.opts.backoffMax, failures)
}

package view

import (
	"context"
	"log/slog"
	"reflect"
	"time"

	"google.golang.org/grpc"

	"github.com/etcdwatch/etcdwatch"
)

// Source is what a View uses of the Stream it runs on, and nothing more: a
// watch, the connection for Range calls of its own, a context that ends
// with the Stream, its logger, retry policy, counters and state.
// *etcdwatch.Stream is a Source. So can another wing be (a group of
// Streams, say), by giving these the meaning a Stream gives them. A
// Source's methods must be safe for concurrent use.
type Source interface {
	// Watch opens a watch and returns once the server confirmed it; ctx
	// bounds the watch's life. The view's watch asks for bookmarks and
	// fragments, is isolated (its progress requests wait for no watch
	// but the Source's other isolated ones: the view asks them with the
	// Watch's RequestProgress), and starts at the revision it listed.
	Watch(ctx context.Context, r etcdwatch.Request) (*etcdwatch.Watch, error)
	// Conn is the connection for the view's Range and RangeStream calls,
	// with the Source's own call options put on them.
	Conn() grpc.ClientConnInterface
	// Context ends when the Source does; the view's state ends with it,
	// with its cause.
	Context() context.Context
	// Logger is where the view logs.
	Logger() *slog.Logger
	// RetryDelay is how long to wait before listing again after failures
	// (>= 1) listings in a row failed for a reason that may pass.
	RetryDelay(failures int) time.Duration
	// Stats' Revision, the highest revision seen, gives the view's Lag.
	Stats() etcdwatch.Stats
	// State explains why a wait that gave up found no stream open.
	State() etcdwatch.State
}

var _ Source = (*etcdwatch.Stream)(nil)

// isNil reports whether src is nil or holds a nil pointer, such as a nil
// *etcdwatch.Stream, whose methods would only fail later, in the view's
// goroutine.
func isNil(src Source) bool {
	if src == nil {
		return true
	}
	v := reflect.ValueOf(src)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

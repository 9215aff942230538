package etcdwatch

import (
	"context"
	"fmt"
	"log/slog"
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
	progressRetry                 time.Duration
	createTimeout                 time.Duration
	logger                        *slog.Logger
	callOptions                   []grpc.CallOption
	connectivity                  Connectivity // the connection's state; nil if unknown
	clock                         clock.Clock  // the dispatcher's; a test's Fake
	hooks                         *hooks       // a test's; nil otherwise
}

func defaultOptions() options {
	return options{
		bufferLimit:     1024,
		bufferBytes:     16 << 20,
		stallBudget:     100 * time.Millisecond,
		progressRetry:   250 * time.Millisecond,
		backoffMin:      100 * time.Millisecond,
		backoffMax:      5 * time.Second,
		connectRetry:    100 * time.Millisecond,
		livenessIdle:    30 * time.Second,
		livenessTimeout: 10 * time.Second,
		logger:          slog.New(slog.DiscardHandler),
		clock:           clock.Real,
	}
}

// WithBufferLimit bounds how many events (a bookmark counts as one) a watch
// may hold for a consumer that is not reading; WithBufferBytes bounds their
// bytes. When a watch reaches either limit, the Stream may first wait for
// its consumer, reading no more responses (see WithStallBudget), and if the
// consumer does not catch up the watch is paused: its server-side watch is
// canceled, nothing is lost, and it is re-created from its next revision
// once the consumer has read half of its backlog. The buffer grows on
// demand, so an idle watch holds none of it. Default 1024; at least 1.
func WithBufferLimit(events int) Option { return func(o *options) { o.bufferLimit = events } }

// WithBufferBytes bounds the bytes a watch may hold for a consumer that is
// not reading: its events' keys and values (previous ones included) and
// about 100 bytes an event, as WithBufferLimit does their number. A single
// response larger than the limit is still delivered whole; the watch is
// then at its limit until its consumer takes it. Default 16 MiB; at least 1.
func WithBufferBytes(n int) Option { return func(o *options) { o.bufferBytes = n } }

// WithStallBudget bounds how long the Stream may stop reading to wait for
// the consumer of a watch alone on the stream, at its buffer limit, to take
// half its backlog, before it pauses that watch. Such a wait (a stall) lets
// gRPC flow control slow the server, which is far cheaper than a pause when
// a busy process merely ran the consumer late. The first millisecond of
// each stall is free; the rest is drawn from a budget of up to d that
// refills at a tenth of the time that passes. So a consumer that is never
// more than a moment late sets the stream's pace (backpressure), while one
// that stopped reading is paused within d.
//
// A stall holds up every watch on the stream, so a watch with neighbours
// (other watches active or being created, or a RequestProgress waiting) is
// waited for at most 2ms, within the same budget, before it is paused: a
// consumer that stops reading delays the other watches by that much, once.
// 0 pauses a watch as soon as it reaches its limit and never holds up the
// stream. Default 100ms; at least 0.
func WithStallBudget(d time.Duration) Option { return func(o *options) { o.stallBudget = d } }

// WithCreateTimeout bounds how long Watch and WatchAll wait for the server
// to confirm their watches, apart from their context, which bounds the
// watches' whole lives: a call not answered within d fails with an error
// wrapping ErrCreateTimeout (and, if the stream could not open meanwhile,
// the reason), and its watches are canceled. A confirmed watch then runs for
// as long as its context allows. It is a Stream option because a slow
// confirmation says something about the stream's connection, whichever call
// meets it. Default 0: no bound but the context's; at least 0.
func WithCreateTimeout(d time.Duration) Option { return func(o *options) { o.createTimeout = d } }

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

// WithReconnectBackoff sets the delays between attempts to replace a gRPC
// stream that failed before the server said anything on it: about min,
// then twice as long for each such stream in a row up to max, with jitter.
// A stream that worked (the server answered on it, or it stayed up for
// 10s) is replaced at once, however often that happens, except that such
// immediate retries are at least min apart. Streams refused because their
// member has no leader (WithRequireLeader) are retried every 25-50ms
// instead: the refusal costs the server nothing, and the watches should
// be back as soon as a leader is. Waiting for the connection itself is
// gRPC's part; see WithConnectRetry. Default 100ms and 5s.
func WithReconnectBackoff(min, max time.Duration) Option {
	return func(o *options) { o.backoffMin, o.backoffMax = min, max }
}

// WithConnectRetry sets how often a stream waiting for its connection, if
// the connection is a *grpc.ClientConn in TRANSIENT_FAILURE, resets the
// connection's reconnect backoff (ResetConnectBackoff) so that gRPC tries
// again at once. gRPC's default backoff waits 1s, then 1.6 times longer each
// time up to 2 minutes, so without this a member back after a 3s outage is
// reached about 2s late. A connection with another address ready is not in
// TRANSIENT_FAILURE, and is left alone. 0 leaves the connection's backoff to
// its own settings (grpc.WithConnectParams). Default 100ms; at least 0.
func WithConnectRetry(interval time.Duration) Option {
	return func(o *options) { o.connectRetry = interval }
}

// WithLiveness makes the Stream notice a stream that has gone silent, such as
// one behind a dead connection: after idle without any message it probes the
// server, and if nothing arrives within timeout it replaces the stream.
// An idle of 0 turns the checks off. Default 30s and 10s.
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

// Connectivity is the part of *grpc.ClientConn that a Stream uses, beyond
// grpc.ClientConnInterface, when the connection has it:
//   - while the Watch RPC cannot open for want of a connection, the Stream
//     reads GetState and waits with WaitForStateChange, so as to report the
//     connection's error (State, the logs) and open the RPC the moment the
//     connection is back;
//   - ResetConnectBackoff cuts gRPC's reconnect backoff short (see
//     WithConnectRetry);
//   - a connection in connectivity.Shutdown (closed by its owner) ends the
//     watches rather than waiting for it.
//
// Without it a Stream still works: it waits in the Watch RPC itself
// (grpc.WaitForReady) and reconnects at gRPC's own pace; but it cannot
// tell a closed connection from a failing one, and retries it, backing
// off, until the Stream is closed.
type Connectivity interface {
	GetState() connectivity.State
	WaitForStateChange(ctx context.Context, source connectivity.State) bool
	ResetConnectBackoff()
}

// WithConnectivity gives the Stream the state of the connection under
// conn, for a conn that wraps one and hides its methods (a wrapper that
// adds metadata to each RPC, say). Default: conn itself, if it implements
// Connectivity; nil leaves the Stream without.
func WithConnectivity(c Connectivity) Option { return func(o *options) { o.connectivity = c } }

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
	case o.progressRetry < time.Millisecond:
		return fmt.Errorf("%w: WithProgressRetry(%v) must be at least 1ms", ErrInvalidArgument, o.progressRetry)
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
		case grpc.ForceCodecCallOption, grpc.ForceCodecV2CallOption, grpc.ContentSubtypeCallOption:
			return fmt.Errorf("%w: WithCallOptions(%T): the Stream chooses the codec of its RPC", ErrInvalidArgument, c)
		}
	}
	return nil
}

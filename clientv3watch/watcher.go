package clientv3watch

import (
	"context"
	"errors"
	"fmt"
	"sync"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"

	"github.com/etcdwatch/etcdwatch"
)

// New returns a clientv3.Watcher that runs every watch of c on etcdwatch,
// over c's own connection (c.ActiveConnection()), so that c's TLS settings
// and auth token apply. Assign it to the client:
//
//	cli.Watcher = clientv3watch.New(cli)
//
// and every cli.Watch and cli.RequestProgress runs on it; cli.Close closes
// it. Set c's DialKeepAliveTime: without gRPC keepalive a dead connection
// is never closed (see the package doc). opts configure each etcdwatch.Stream it opens (buffer limits, stall
// budget, logger, ...). WithRequireLeader is not needed: a watch whose
// context carries clientv3.WithRequireLeader goes on a stream that requires
// a leader, as with clientv3. Options are checked when the first stream
// opens: invalid ones make every watch end at once with a canceled response
// whose CancelReason says why (RequestProgress, with no watch open, returns
// nil).
//
// c's receive limit (clientv3.Config.MaxCallRecvMsgSize, math.MaxInt32 if
// 0) is kept as clientv3 keeps it: a response above it, in a watch without
// WithFragment, ends the watches of its stream with a canceled response
// whose Err has gRPC's code ResourceExhausted, and none of its events. An
// etcdwatch.WithCallOptions(grpc.MaxCallRecvMsgSize(n)) in opts replaces it.
func New(c *clientv3.Client, opts ...etcdwatch.Option) clientv3.Watcher {
	if limit := recvLimit(c); limit != nil {
		opts = append([]etcdwatch.Option{etcdwatch.WithCallOptions(limit)}, opts...)
	}
	return NewFromConn(c.ActiveConnection(), opts...)
}

// NewFromConn is New for a connection that is not a clientv3.Client's, for
// example one from dial.New (package github.com/etcdwatch/etcdwatch/dial);
// conn stays the caller's to close, after the Watcher. There is no client
// whose receive limit to keep: responses of any size are taken, unless opts
// set one with etcdwatch.WithCallOptions(grpc.MaxCallRecvMsgSize(n)), which
// a response above it then ends as New describes.
func NewFromConn(conn grpc.ClientConnInterface, opts ...etcdwatch.Option) clientv3.Watcher {
	return &watcher{
		conn:   conn,
		opts:   opts,
		byKey:  map[string]*group{},
		groups: map[*group]struct{}{},
		closed: make(chan struct{}),
	}
}

// recvLimit returns the receive limit c puts on its calls, nil if none. A
// Client keeps its Config to itself, but hands its call options to the
// KVClient of clientv3.NewKVFromKVClient with every call: one Get on a
// KVClient that keeps them and fails reads them, without a word on the
// network.
func recvLimit(c *clientv3.Client) grpc.CallOption {
	var rec callRecorder
	_, _ = clientv3.NewKVFromKVClient(&rec, c).Get(context.Background(), "")
	var limit grpc.CallOption
	for _, o := range rec.opts {
		if _, ok := o.(grpc.MaxRecvMsgSizeCallOption); ok {
			limit = o // the last wins, in gRPC as here
		}
	}
	return limit
}

// callRecorder is a KVClient whose Range keeps its call options and fails;
// nothing calls its other methods.
type callRecorder struct {
	pb.KVClient
	opts []grpc.CallOption
}

var errRecorded = errors.New("clientv3watch: call options recorded")

func (r *callRecorder) Range(_ context.Context, _ *pb.RangeRequest, opts ...grpc.CallOption) (*pb.RangeResponse, error) {
	r.opts = append(r.opts, opts...)
	return nil, errRecorded
}

// watcher implements clientv3.Watcher with one etcdwatch.Stream per
// distinct outgoing metadata of the watches' contexts (a group).
type watcher struct {
	conn grpc.ClientConnInterface
	opts []etcdwatch.Option

	mu     sync.Mutex
	byKey  map[string]*group   // the group new watches with that metadata join; nil once closed
	groups map[*group]struct{} // every group with a Stream, lost ones included; nil once closed
	closed chan struct{}       // closed by Close
	// wg counts the watches (from Watch until their end) and progress requesters.
	// Add is called under mu and only while open, so never after Close
	// has begun to Wait.
	wg sync.WaitGroup
}

// errWatcherClosed is what RequestProgress returns after Close.
var errWatcherClosed = fmt.Errorf("clientv3watch: %w", etcdwatch.ErrClosed)

// Watch implements clientv3.Watcher: it returns once the server confirmed
// the watch (or refused it, or ctx ended), as clientv3 does.
func (w *watcher) Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	spec := specOf(key, opts) // panics where clientv3 does: a lease, limit, sort or filter of Get
	if ctx.Err() != nil || w.isClosed() {
		return finished() // as clientv3's: a closed channel, whatever the request
	}
	if spec.refusal != "" {
		if w.connClosed() { // clientv3 sends it on a stream that fails so, as any request
			return finished(streamEnded(errConnClosing.(grpcError)))
		}
		return finished(canceled(spec.refusal))
	}
	g, err := w.acquire(ctx)
	if err != nil {
		return finished(canceled(err.Error()))
	}
	if g == nil {
		return finished() // closed
	}
	wctx, unbind := g.bind(ctx)
	cw := &watch{w: w, g: g, ctx: ctx, unbind: unbind, out: make(chan clientv3.WatchResponse, 1)}
	ew, err := cw.open(wctx, spec)
	if err != nil {
		cw.done(true)
		cw.release() // the watch's end will not, if Handle opened none
		if ctx.Err() != nil {
			return finished()
		}
		if resp, ok := final(err, nil); ok {
			return finished(resp)
		}
		return finished()
	}
	if spec.createdNotify {
		cw.out <- createdResponse(ew)
	}
	cw.done(false)
	return cw.out
}

// acquire returns the group for ctx's outgoing metadata, opening its
// Stream if need be, and counts one more user of it; nil once closed.
func (w *watcher) acquire(ctx context.Context) (*group, error) {
	key, md := streamKey(ctx)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.byKey == nil {
		return nil, nil
	}
	g := w.byKey[key]
	if g == nil {
		var err error
		if g, err = w.openGroup(key, md); err != nil {
			return nil, err
		}
		w.byKey[key] = g
		w.groups[g] = struct{}{}
	}
	g.refs++
	w.wg.Add(1)
	return g, nil
}

// release undoes acquire; the last user of a group closes its Stream, as
// clientv3 closes a gRPC stream once it has no watches left.
func (w *watcher) release(g *group) {
	defer w.wg.Done()
	w.mu.Lock()
	g.refs--
	last := g.refs == 0
	if last {
		if w.byKey[g.key] == g {
			delete(w.byKey, g.key)
		}
		delete(w.groups, g)
	}
	w.mu.Unlock()
	if last {
		g.s.Close()
		g.lostCancel()
	}
}

// forget makes new watches with g's metadata open a group of their own.
func (w *watcher) forget(g *group) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.byKey[g.key] == g {
		delete(w.byKey, g.key)
	}
}

func (w *watcher) isClosed() bool {
	select {
	case <-w.closed:
		return true
	default:
		return false
	}
}

// RequestProgress implements clientv3.Watcher. Like clientv3's, it returns
// once the request is on its way, and each watch on the stream of ctx's
// metadata then gets a progress notification. Unlike clientv3's, the
// request is repeated until the server answers: etcd 3.4.31+, 3.5.13+ and
// 3.6+ ignore it while a watch on the stream is catching up. Once the
// connection is closed it fails with gRPC's Canceled, as clientv3's does.
func (w *watcher) RequestProgress(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	key, _ := streamKey(ctx)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.byKey == nil {
		return errWatcherClosed
	}
	g := w.byKey[key]
	switch {
	case w.connClosed():
		return errConnClosing // as clientv3's, whose stream has failed so, or whose new stream fails so
	case g == nil:
		return nil // no watches: etcd would answer nothing
	case g.progressRunning:
		g.progressAgain = true // asked again while one is out: one more after it
		return nil
	}
	g.progressRunning = true
	w.wg.Add(1)
	go func() { // exits once answered, or when the group's Stream closes; Close waits for it
		defer w.wg.Done()
		for {
			_, err := g.s.RequestProgress(context.Background())
			w.mu.Lock()
			again := g.progressAgain && err == nil
			g.progressAgain = false
			g.progressRunning = again
			w.mu.Unlock()
			if !again {
				return
			}
		}
	}()
	return nil
}

// Close implements clientv3.Watcher: every watch channel is closed, with
// nothing more delivered, and every Stream is closed. It waits for them.
func (w *watcher) Close() error {
	w.mu.Lock()
	if w.byKey == nil {
		w.mu.Unlock()
		return nil
	}
	groups := w.groups
	w.byKey, w.groups = nil, nil
	close(w.closed)
	w.mu.Unlock()
	for g := range groups {
		g.s.Close()
	}
	w.wg.Wait()
	return nil
}

// finished returns a closed channel holding rs.
func finished(rs ...clientv3.WatchResponse) clientv3.WatchChan {
	ch := make(chan clientv3.WatchResponse, len(rs))
	for _, r := range rs {
		ch <- r
	}
	close(ch)
	return ch
}

// errLeaderLost ends the watches of a group whose member reported that it
// has no leader.
var errLeaderLost = errors.New("clientv3watch: the member has no leader")

// errConnClosing is gRPC's error for an RPC on a closed connection, which
// clientv3's RequestProgress returns then.
var errConnClosing = status.Error(codes.Canceled, "grpc: the client connection is closing")

// connClosed reports whether the watcher's connection is closed, when the
// connection can tell (a *grpc.ClientConn can).
func (w *watcher) connClosed() bool {
	c, ok := w.conn.(interface{ GetState() connectivity.State })
	return ok && c.GetState() == connectivity.Shutdown
}

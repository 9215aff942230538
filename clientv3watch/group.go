package clientv3watch

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/etcdwatch/etcdwatch"
)

// group is the Stream shared by the watches whose contexts carry the same
// outgoing metadata, as clientv3 shares a gRPC stream among them: the
// metadata goes on the Watch RPC, so watches with different metadata
// (clientv3.WithRequireLeader among them) need streams of their own.
type group struct {
	w   *watcher
	key string      // streamKey of md
	md  metadata.MD // sent on every Watch RPC of the Stream
	s   *etcdwatch.Stream

	// requireLeader: md asks the member to refuse and end the stream
	// while it has no leader. clientv3 then ends every watch on the
	// stream with ErrNoLeader, and so does the group: the first such
	// error, on any gRPC stream of the Stream, loses the group.
	requireLeader bool
	lost          atomic.Bool
	lostCtx       context.Context // ended when the group is lost
	lostCancel    context.CancelFunc
	loseOnce      sync.Once

	// Under w.mu.
	refs                           int  // Watch calls and pumps using the group
	progressRunning, progressAgain bool // a RequestProgress is out; another was asked for meanwhile
}

func (w *watcher) openGroup(key string, md metadata.MD) (*group, error) {
	g := &group{w: w, key: key, md: md}
	g.requireLeader = requiresLeader(md)
	g.lostCtx, g.lostCancel = context.WithCancel(context.Background())
	opts := w.opts
	if cc, ok := w.conn.(*grpc.ClientConn); ok {
		// The wrapper hides the connection's state, which the Stream uses
		// to reconnect promptly and to see the connection closed; first, so
		// that a caller's own WithConnectivity wins.
		opts = append([]etcdwatch.Option{etcdwatch.WithConnectivity(cc)}, opts...)
	}
	s, err := etcdwatch.Open(groupConn{w.conn, g}, opts...)
	if err != nil {
		g.lostCancel()
		return nil, err
	}
	g.s = s
	return g, nil
}

func requiresLeader(md metadata.MD) bool {
	v := md.Get(rpctypes.MetadataRequireLeaderKey)
	return len(v) > 0 && v[0] == rpctypes.MetadataHasLeader
}

func (g *group) isLost() bool { return g.lost.Load() }

// lose marks the group lost before the error that lost it reaches the
// Stream, so that a pump drops whatever a stream opened after it delivers.
func (g *group) lose() {
	g.loseOnce.Do(func() {
		g.lost.Store(true)
		g.lostCancel()
		g.w.forget(g)
	})
}

// check loses the group on a "no leader" error of a require-leader stream.
func (g *group) check(err error) {
	if g.requireLeader && errors.Is(rpctypes.Error(err), rpctypes.ErrNoLeader) {
		g.lose()
	}
}

// bind returns the context a watch of the group runs under: ctx, or for a
// require-leader group, ctx ended also when the group is lost.
func (g *group) bind(ctx context.Context) (context.Context, func()) {
	if !g.requireLeader {
		return ctx, func() {}
	}
	wctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(g.lostCtx, func() { cancel(errLeaderLost) })
	return wctx, func() { stop(); cancel(nil) }
}

// streamKey names ctx's outgoing metadata: equal metadata, equal keys.
func streamKey(ctx context.Context) (string, metadata.MD) {
	md, ok := metadata.FromOutgoingContext(ctx)
	if !ok || md.Len() == 0 {
		return "", nil
	}
	names := make([]string, 0, len(md))
	for k := range md {
		names = append(names, k)
	}
	slices.Sort(names)
	var b strings.Builder
	for _, k := range names {
		b.WriteString(strconv.Quote(k))
		for _, v := range md[k] {
			b.WriteByte(' ')
			b.WriteString(strconv.Quote(v))
		}
		b.WriteByte('\n')
	}
	return b.String(), md.Copy()
}

// groupConn puts the group's metadata on the Watch RPC, and watches a
// require-leader stream for the member's "no leader".
type groupConn struct {
	grpc.ClientConnInterface
	g *group
}

func (c groupConn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	return c.g.newStream(c.ClientConnInterface, ctx, desc, method, opts)
}

func (g *group) newStream(conn grpc.ClientConnInterface, ctx context.Context, desc *grpc.StreamDesc, method string, opts []grpc.CallOption) (grpc.ClientStream, error) {
	if len(g.md) > 0 {
		own, _ := metadata.FromOutgoingContext(ctx)
		ctx = metadata.NewOutgoingContext(ctx, metadata.Join(g.md, own))
	}
	cs, err := conn.NewStream(ctx, desc, method, opts...)
	if !g.requireLeader {
		return cs, err
	}
	if err != nil {
		g.check(err)
		return nil, err
	}
	return leaderStream{cs, g}, nil
}

// leaderStream sees the errors a require-leader stream ends with.
type leaderStream struct {
	grpc.ClientStream
	g *group
}

func (s leaderStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err != nil {
		s.g.check(err)
	}
	return err
}

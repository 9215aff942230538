package clientv3watch_test

import (
	"context"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	"github.com/etcdwatch/etcdwatch"
	"github.com/etcdwatch/etcdwatch/clientv3watch"
	"github.com/etcdwatch/etcdwatch/etcdwatchtest"
)

// Properties of the drop-in beyond clientv3's contract, or that clientv3
// cannot show.

func TestDropIn(t *testing.T) {
	srv := etcdwatchtest.StartEtcd(t)
	endpoints := []string{srv.Endpoint}

	t.Run("watches with different outgoing metadata each get their events", func(t *testing.T) {
		cli := client(t, endpoints, "", "")
		cli.Watcher = clientv3watch.New(cli)
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		a := cli.Watch(metadata.AppendToOutgoingContext(ctx, "team", "a"), "md/k")
		b := cli.Watch(metadata.AppendToOutgoingContext(ctx, "team", "b"), "md/k")
		same := cli.Watch(metadata.AppendToOutgoingContext(ctx, "team", "a"), "md/k")
		_, err := cli.Put(ctx, "md/k", "1")
		require.NoError(t, err)
		for _, ch := range []clientv3.WatchChan{a, b, same} {
			events(t, ch, 1)
		}
	})

	t.Run("Close while a progress request waits for an idle future watch", func(t *testing.T) {
		cli := client(t, endpoints, "", "")
		cli.Watcher = clientv3watch.New(cli)
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		ch := cli.Watch(ctx, "future/k", clientv3.WithRev(1<<40), clientv3.WithCreatedNotify())
		require.True(t, next(t, ch).Created)
		require.NoError(t, cli.RequestProgress(ctx)) // etcd never answers while that watch waits
		require.NoError(t, cli.RequestProgress(ctx))
		require.NoError(t, cli.Watcher.Close()) // returns, and goleak sees no requester left
		closed(t, ch)
	})

	t.Run("RequestProgress on a release whose answers can run ahead: nothing sent, and the Stream says so", func(t *testing.T) {
		asReleased := grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoke grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			err := invoke(ctx, method, req, reply, cc, opts...)
			if r, ok := reply.(*pb.StatusResponse); ok && err == nil {
				r.Version = "3.5.7" // etcd #15220
			}
			return err
		})
		cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: wait, DialOptions: []grpc.DialOption{asReleased}})
		require.NoError(t, err)
		defer cli.Close()
		warned := make(chan slog.Record, 1)
		cli.Watcher = clientv3watch.New(cli, etcdwatch.WithLogger(slog.New(warnings(warned))))
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		ch := cli.Watch(ctx, "old/k")
		_, err = cli.Put(ctx, "old/k", "1")
		require.NoError(t, err)
		events(t, ch, 1)
		require.NoError(t, cli.RequestProgress(ctx), "returns at once, as clientv3's")
		select {
		case r := <-warned:
			require.Contains(t, r.Message, "RequestProgress is off")
		case <-ctx.Done():
			t.Fatal("no warning")
		}
	})

	t.Run("invalid options: every watch ends at once, saying why", func(t *testing.T) {
		cli := client(t, endpoints, "", "")
		cli.Watcher = clientv3watch.New(cli, etcdwatch.WithBufferLimit(0))
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		ch := cli.Watch(ctx, "k")
		r := next(t, ch)
		require.True(t, r.Canceled)
		require.ErrorContains(t, r.Err(), "WithBufferLimit")
		closed(t, ch)
	})

	// bigRevision writes a revision whose events with their previous
	// values take ~1.6 MiB, and returns the watch it makes on cli before.
	bigRevision := func(t *testing.T, ctx context.Context, cli *clientv3.Client, w clientv3.Watcher, prefix string) clientv3.WatchChan {
		t.Helper()
		big := strings.Repeat("v", 400<<10)
		write := func() {
			_, err := cli.Txn(ctx).Then(clientv3.OpPut(prefix+"a", big), clientv3.OpPut(prefix+"b", big)).Commit()
			require.NoError(t, err)
		}
		write()
		ch := w.Watch(ctx, prefix, clientv3.WithPrefix(), clientv3.WithPrevKV())
		write()
		return ch
	}
	overLimit := func(t *testing.T, ch clientv3.WatchChan) {
		t.Helper()
		r := next(t, ch)
		require.True(t, r.Canceled, "%d events", len(r.Events))
		require.Empty(t, r.Events)
		requireGRPCError(t, codes.ResourceExhausted, r.Err())
		closed(t, ch)
	}

	t.Run("NewFromConn takes any size, or the limit of WithCallOptions", func(t *testing.T) {
		cli := client(t, endpoints, "", "")
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		conn, err := srv.Dial()
		require.NoError(t, err)
		defer conn.Close()
		unlimited := clientv3watch.NewFromConn(conn)
		defer unlimited.Close()
		require.Len(t, events(t, bigRevision(t, ctx, cli, unlimited, "limit/any/"), 2), 2)
		limited := clientv3watch.NewFromConn(conn, etcdwatch.WithCallOptions(grpc.MaxCallRecvMsgSize(3<<19)))
		defer limited.Close()
		overLimit(t, bigRevision(t, ctx, cli, limited, "limit/conn/"))
	})

	t.Run("New: a WithCallOptions limit replaces the client's", func(t *testing.T) {
		cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: wait, MaxCallRecvMsgSize: 3 << 19})
		require.NoError(t, err)
		defer func() { require.NoError(t, cli.Close()) }()
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		own := clientv3watch.New(cli)
		defer own.Close()
		overLimit(t, bigRevision(t, ctx, cli, own, "limit/client/"))
		wider := clientv3watch.New(cli, etcdwatch.WithCallOptions(grpc.MaxCallRecvMsgSize(4<<20)))
		defer wider.Close()
		require.Len(t, events(t, bigRevision(t, ctx, cli, wider, "limit/wider/"), 2), 2)
	})

	t.Run("a blackholed connection is replaced by the client's keepalive, and the watch goes on", func(t *testing.T) {
		proxy := etcdwatchtest.NewProxy(t, srv.Endpoint)
		// gRPC raises the ping time to its minimum, 10s.
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{proxy.Addr()}, DialTimeout: wait, DialKeepAliveTime: time.Second, DialKeepAliveTimeout: time.Second})
		require.NoError(t, err)
		defer func() { require.NoError(t, cli.Close()) }()
		cli.Watcher = clientv3watch.New(cli)
		writer := client(t, endpoints, "", "")
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		ch := cli.Watch(ctx, "blackhole/k")
		_, err = writer.Put(ctx, "blackhole/k", "1")
		require.NoError(t, err)
		events(t, ch, 1)
		require.Equal(t, 1, proxy.Blackhole())
		_, err = writer.Put(ctx, "blackhole/k", "2")
		require.NoError(t, err)
		select {
		case r := <-ch:
			require.NoError(t, r.Err())
			require.Equal(t, "2", string(r.Events[0].Kv.Value))
		case <-ctx.Done():
			t.Fatal("no event after the connection was blackholed")
		}
		require.GreaterOrEqual(t, proxy.Accepted(), 2, "a new connection")
	})

	t.Run("a consumer that stops reading is paused and resumed: nothing lost", func(t *testing.T) {
		cli := client(t, endpoints, "", "")
		paused := &counting{msg: "etcdwatch: consumer fell behind; watch paused"}
		cli.Watcher = clientv3watch.New(cli, etcdwatch.WithBufferLimit(8), etcdwatch.WithStallBudget(0), etcdwatch.WithLogger(slog.New(paused)))
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		ch := cli.Watch(ctx, "slow/", clientv3.WithPrefix())
		const n = 200
		for i := range n {
			_, err := cli.Put(ctx, "slow/k", string(rune('a'+i%26)))
			require.NoError(t, err)
		}
		evs := events(t, ch, n) // read only now
		for i := 1; i < n; i++ {
			require.Equal(t, evs[i-1].Kv.ModRevision+1, evs[i].Kv.ModRevision)
		}
		require.Positive(t, paused.n.Load(), "the watch was never paused: the test proved nothing")
	})
}

// counting is a slog.Handler that counts the records with message msg.
type counting struct {
	msg string
	n   atomic.Int64
}

func (c *counting) Enabled(context.Context, slog.Level) bool { return true }
func (c *counting) WithAttrs([]slog.Attr) slog.Handler       { return c }
func (c *counting) WithGroup(string) slog.Handler            { return c }

func (c *counting) Handle(_ context.Context, r slog.Record) error {
	if r.Message == c.msg {
		c.n.Add(1)
	}
	return nil
}

// warnings is a slog.Handler that sends the first warning it gets to ch.
type warnings chan<- slog.Record

func (w warnings) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (w warnings) WithAttrs([]slog.Attr) slog.Handler           { return w }
func (w warnings) WithGroup(string) slog.Handler                { return w }

func (w warnings) Handle(_ context.Context, r slog.Record) error {
	select {
	case w <- r:
	default:
	}
	return nil
}

// heldConn is a connection whose Watch streams hold back the first
// stream-wide progress answer (watch id -1) they receive until release is
// closed, and say so on held.
type heldConn struct {
	*grpc.ClientConn
	held    chan struct{}
	release chan struct{}
}

func (c *heldConn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	cs, err := c.ClientConn.NewStream(ctx, desc, method, opts...)
	if err != nil {
		return nil, err
	}
	return &heldStream{ClientStream: cs, c: c}, nil
}

type heldStream struct {
	grpc.ClientStream
	c    *heldConn
	done bool // one answer held already
}

func (s *heldStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err == nil && !s.done && isStreamProgress(m) {
		s.done = true
		s.c.held <- struct{}{}
		<-s.c.release
	}
	return err
}

// isStreamProgress reports whether m, a response as the Stream decodes it
// (a type of its own, with the fields of etcd's WatchResponse), answers a
// progress request: watch id -1, nothing else.
func isStreamProgress(m any) bool {
	v := reflect.ValueOf(m)
	if v.Kind() != reflect.Pointer || v.Elem().Kind() != reflect.Struct {
		return false
	}
	r := v.Elem()
	id, created, canceled, evs := r.FieldByName("WatchID"), r.FieldByName("Created"), r.FieldByName("Canceled"), r.FieldByName("Events")
	if !id.IsValid() || !created.IsValid() || !canceled.IsValid() || !evs.IsValid() {
		panic(fmt.Sprintf("%T: not the Stream's response type any more", m))
	}
	return id.Int() == -1 && !created.Bool() && !canceled.Bool() && evs.Len() == 0
}

// TestDropInProgressAskedWhileOneIsOut: drop-in behaviour clientv3 cannot
// be tested for, with an answer held on the wire.
func TestDropInProgressAskedWhileOneIsOut(t *testing.T) {
	srv := etcdwatchtest.StartEtcd(t)
	endpoints := []string{srv.Endpoint}

	t.Run("RequestProgress while one is out: one more is sent after it, answering at least what came before the call", func(t *testing.T) {
		cli := client(t, endpoints, "", "")
		conn := &heldConn{ClientConn: cli.ActiveConnection(), held: make(chan struct{}, 1), release: make(chan struct{})}
		// No retries within the test: only RequestProgress calls ask.
		w := clientv3watch.NewFromConn(conn, etcdwatch.WithProgressRetry(time.Hour, time.Hour))
		defer func() { require.NoError(t, w.Close()) }()
		defer func() { // before Close, should the case fail with the answer held
			select {
			case <-conn.release:
			default:
				close(conn.release)
			}
		}()
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		ch := w.Watch(ctx, "held/k", clientv3.WithCreatedNotify())
		require.True(t, next(t, ch).Created)

		require.NoError(t, w.RequestProgress(ctx))
		select {
		case <-conn.held: // the first answer, held: that request is still out
		case <-ctx.Done():
			t.Fatal("no progress answer")
		}
		put, err := cli.Put(ctx, "held/k", "1") // after the first answer, before the second call
		require.NoError(t, err)
		require.NoError(t, w.RequestProgress(ctx)) // while the first is out
		close(conn.release)
		var sawEvent bool
		for {
			r := next(t, ch)
			require.NoError(t, r.Err())
			if len(r.Events) > 0 {
				require.Equal(t, put.Header.Revision, r.Events[0].Kv.ModRevision)
				sawEvent = true
				continue
			}
			require.True(t, r.IsProgressNotify(), "%+v", r)
			if r.Header.Revision >= put.Header.Revision {
				require.True(t, sawEvent, "a notification at %d before the event at %d", r.Header.Revision, put.Header.Revision)
				return // the second request's answer
			}
		}
	})
}

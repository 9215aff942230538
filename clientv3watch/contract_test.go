package clientv3watch_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/etcdwatch/etcdwatch/clientv3watch"
	"github.com/etcdwatch/etcdwatch/etcdwatchtest"
)

// The behaviour suite: the documented contract of clientv3.Watcher, one
// table, run against clientv3's own Watcher and against the drop-in, on a
// real etcd. A case clientv3 itself fails says why in clientv3Skip, and one
// the drop-in cannot pass yet says why in dropinSkip; run with
// CLIENTV3WATCH_UNSKIP=1 to see them fail.

// wait bounds every wait of the suite; no case needs more than a moment.
const wait = 10 * time.Second

// impl is a Watcher under test, installed on a client as a user would.
type impl struct {
	name    string
	install func(*clientv3.Client)
}

var impls = []impl{
	{"clientv3", func(*clientv3.Client) {}},
	{"clientv3watch", func(c *clientv3.Client) {
		old := c.Watcher
		c.Watcher = clientv3watch.New(c)
		old.Close()
	}},
}

// env is what a case gets: a client whose Watcher is the one under test
// (it also writes), a context bounding the case, and a key prefix of its own.
type env struct {
	cli    *clientv3.Client
	admin  *clientv3.Client // for what the user may not do (Compact with auth on); cli without auth
	ctx    context.Context
	prefix string

	endpoints []string
	install   func(*clientv3.Client)
	impl      string // "clientv3" or "clientv3watch"
}

func (e *env) key(k string) string { return e.prefix + k }

// client is another client on the case's endpoints, configured by
// configure, with the Watcher under test installed. It is closed when the
// test ends, unless the case closed it (and checked what Close returned).
func (e *env) client(t *testing.T, configure func(*clientv3.Config)) *clientv3.Client {
	t.Helper()
	cfg := clientv3.Config{Endpoints: e.endpoints, DialTimeout: wait}
	configure(&cfg)
	cli, err := clientv3.New(cfg)
	require.NoError(t, err)
	e.install(cli)
	t.Cleanup(func() {
		switch {
		case cli.Ctx().Err() != nil: // closed by the case
		case cli.ActiveConnection().GetState() == connectivity.Shutdown:
			cli.Close() // the case closed the connection under it and failed: not this Close's fault
		default:
			require.NoError(t, cli.Close())
		}
	})
	return cli
}

func (e *env) put(t *testing.T, k, v string) int64 {
	t.Helper()
	r, err := e.cli.Put(e.ctx, e.key(k), v)
	require.NoError(t, err)
	return r.Header.Revision
}

func (e *env) del(t *testing.T, k string) int64 {
	t.Helper()
	r, err := e.cli.Delete(e.ctx, e.key(k))
	require.NoError(t, err)
	return r.Header.Revision
}

type contractCase struct {
	name string
	// clientv3Skip, if set, is why clientv3 itself fails the case.
	clientv3Skip string
	// dropinSkip, if set, is why the drop-in fails the case: a difference
	// it cannot remove yet, also listed in its documentation.
	dropinSkip string
	run        func(t *testing.T, e *env)
}

var cases atomic.Int64

// runContract runs every case against every impl, each with a client of
// its own on endpoints, made by newClient (nil: no auth).
func runContract(t *testing.T, endpoints []string, table []contractCase, newClient func(t *testing.T) *clientv3.Client, admin *clientv3.Client) {
	if newClient == nil {
		newClient = func(t *testing.T) *clientv3.Client { return client(t, endpoints, "", "") }
	}
	for _, c := range table {
		t.Run(c.name, func(t *testing.T) {
			for _, im := range impls {
				t.Run(im.name, func(t *testing.T) {
					if os.Getenv("CLIENTV3WATCH_UNSKIP") == "" {
						if im.name == "clientv3" && c.clientv3Skip != "" {
							t.Skip("clientv3 fails this case: " + c.clientv3Skip)
						}
						if im.name == "clientv3watch" && c.dropinSkip != "" {
							t.Skip("the drop-in fails this case: " + c.dropinSkip)
						}
					}
					cli := newClient(t)
					im.install(cli)
					ctx, cancel := context.WithTimeout(context.Background(), wait)
					t.Cleanup(cancel) // after the client's Close: cleanups run last first
					e := &env{cli: cli, admin: admin, ctx: ctx, prefix: fmt.Sprintf("c%d/", cases.Add(1)), endpoints: endpoints, install: im.install, impl: im.name}
					if e.admin == nil {
						e.admin = cli
					}
					c.run(t, e)
				})
			}
		})
	}
}

// client is a clientv3 client on endpoints, closed when the test ends;
// the cleanup is registered after the caller's context's, so runs first.
func client(t *testing.T, endpoints []string, user, password string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: wait, Username: user, Password: password})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, cli.Close()) })
	return cli
}

// next returns the channel's next response; it fails if the channel
// closes or nothing comes within wait.
func next(t *testing.T, ch clientv3.WatchChan) clientv3.WatchResponse {
	t.Helper()
	select {
	case r, ok := <-ch:
		require.True(t, ok, "watch channel closed")
		return r
	case <-time.After(wait):
		t.Fatal("no watch response")
	}
	panic("unreachable")
}

// closed checks that the channel closes with nothing more on it.
func closed(t *testing.T, ch clientv3.WatchChan) {
	t.Helper()
	select {
	case r, ok := <-ch:
		require.False(t, ok, "a response where the channel should close: %+v", r)
	case <-time.After(wait):
		t.Fatal("watch channel not closed")
	}
}

// closedPerhapsCanceled is closed, allowing one canceled response, with
// no events, before the channel closes.
func closedPerhapsCanceled(t *testing.T, ch clientv3.WatchChan) {
	t.Helper()
	select {
	case r, ok := <-ch:
		if !ok {
			return
		}
		require.True(t, r.Canceled, "a response where the channel should close: %+v", r)
		require.Empty(t, r.Events)
		closed(t, ch)
	case <-time.After(wait):
		t.Fatal("watch channel not closed")
	}
}

// events reads responses until it has n events, failing on any response
// that is not events.
func events(t *testing.T, ch clientv3.WatchChan, n int) []*clientv3.Event {
	t.Helper()
	var evs []*clientv3.Event
	for len(evs) < n {
		r := next(t, ch)
		require.NoError(t, r.Err())
		require.NotEmpty(t, r.Events, "a response without events: %+v", r)
		require.False(t, r.Created || r.Canceled || r.IsProgressNotify())
		for _, e := range r.Events {
			require.LessOrEqual(t, e.Kv.ModRevision, r.Header.Revision, "header revision below its events")
		}
		evs = append(evs, r.Events...)
	}
	require.Len(t, evs, n)
	return evs
}

// fence asks for progress and returns the notification, failing on any
// event before it: everything the server had for the watch came first.
func fence(t *testing.T, e *env, ch clientv3.WatchChan, atLeast int64) clientv3.WatchResponse {
	t.Helper()
	require.NoError(t, e.cli.RequestProgress(e.ctx))
	r := next(t, ch)
	require.True(t, r.IsProgressNotify(), "not a progress notification: %+v", r)
	require.Empty(t, r.Events)
	require.GreaterOrEqual(t, r.Header.Revision, atLeast)
	return r
}

// requireGRPCError checks that err is gRPC's own status error with code,
// as clientv3 passes on the error that ended its watch stream: not
// wrapped, nor turned into another code.
func requireGRPCError(t *testing.T, code codes.Code, err error) {
	t.Helper()
	require.Error(t, err)
	require.Equal(t, code, status.Code(err), "%v", err)
	_, bare := err.(interface{ GRPCStatus() *status.Status })
	require.True(t, bare, "%T %v: not gRPC's status error", err, err)
}

func kvs(evs []*clientv3.Event) []string {
	var out []string
	for _, e := range evs {
		out = append(out, fmt.Sprintf("%s %s=%s", e.Type, e.Kv.Key, e.Kv.Value))
	}
	return out
}

// big is a value of 400 KiB: a transaction of two such keys, with their
// previous values, is above a receive limit of 1.5 MiB.
var big = strings.Repeat("v", 400<<10)

// limited returns a client of e's Watcher with a receive limit of 1.5 MiB,
// and a write of v to keys a and b in one transaction.
func limited(t *testing.T, e *env) (*clientv3.Client, func(v string)) {
	cli := e.client(t, func(c *clientv3.Config) { c.MaxCallRecvMsgSize = 3 << 19 })
	return cli, func(v string) {
		t.Helper()
		_, err := cli.Txn(e.ctx).Then(clientv3.OpPut(e.key("a"), v), clientv3.OpPut(e.key("b"), v)).Commit()
		require.NoError(t, err)
	}
}

// TestContract: options, responses, errors, contexts, progress,
// compaction and Close on one member.
func TestContract(t *testing.T) {
	srv := etcdwatchtest.StartEtcd(t, func(c *embed.Config) {
		c.WatchProgressNotifyInterval = 100 * time.Millisecond // the minimum etcd takes
		c.MaxRequestBytes = 1 << 20                            // fragments from 1.5 MiB
	})
	runContract(t, []string{srv.Endpoint}, contractCases, nil, nil)
}

var contractCases = []contractCase{
	{name: "key: events of that key only, in order, IsCreate then IsModify", run: func(t *testing.T, e *env) {
		ch := e.cli.Watch(e.ctx, e.key("k"))
		r1 := e.put(t, "k", "1")
		e.put(t, "k2", "x")
		r2 := e.put(t, "k", "2")
		evs := events(t, ch, 2)
		require.Equal(t, []string{"PUT " + e.key("k") + "=1", "PUT " + e.key("k") + "=2"}, kvs(evs))
		require.Equal(t, []int64{r1, r2}, []int64{evs[0].Kv.ModRevision, evs[1].Kv.ModRevision})
		require.True(t, evs[0].IsCreate())
		require.False(t, evs[0].IsModify())
		require.True(t, evs[1].IsModify())
		require.Equal(t, int64(2), evs[1].Kv.Version)
		require.Equal(t, r1, evs[1].Kv.CreateRevision)
	}},
	{name: "response header: the server's, cluster and member set", run: func(t *testing.T, e *env) {
		ch := e.cli.Watch(e.ctx, e.key("k"))
		r := e.put(t, "k", "v")
		resp := next(t, ch)
		require.NotZero(t, resp.Header.ClusterId)
		require.NotZero(t, resp.Header.MemberId)
		require.NotZero(t, resp.Header.RaftTerm)
		require.GreaterOrEqual(t, resp.Header.Revision, r)
		require.False(t, resp.Created || resp.Canceled)
		require.Zero(t, resp.CompactRevision)
	}},
	{name: "delete: DELETE event at the deletion's revision", run: func(t *testing.T, e *env) {
		e.put(t, "k", "v")
		ch := e.cli.Watch(e.ctx, e.key("k"))
		r := e.del(t, "k")
		ev := events(t, ch, 1)[0]
		require.Equal(t, mvccpb.DELETE, ev.Type)
		require.Equal(t, r, ev.Kv.ModRevision)
		require.Equal(t, e.key("k"), string(ev.Kv.Key))
		require.False(t, ev.IsCreate() || ev.IsModify())
		require.Nil(t, ev.PrevKv)
	}},
	{name: "WithPrefix", run: func(t *testing.T, e *env) {
		ch := e.cli.Watch(e.ctx, e.key("p/"), clientv3.WithPrefix())
		e.put(t, "p/a", "1")
		e.put(t, "q", "x")
		e.put(t, "p/b", "2")
		require.Equal(t, []string{"PUT " + e.key("p/a") + "=1", "PUT " + e.key("p/b") + "=2"}, kvs(events(t, ch, 2)))
		fence(t, e, ch, 0)
	}},
	{name: "WithRange: [key, end)", run: func(t *testing.T, e *env) {
		ch := e.cli.Watch(e.ctx, e.key("b"), clientv3.WithRange(e.key("d")))
		for _, k := range []string{"a", "b", "c", "d"} {
			e.put(t, k, k)
		}
		require.Equal(t, []string{"PUT " + e.key("b") + "=b", "PUT " + e.key("c") + "=c"}, kvs(events(t, ch, 2)))
		fence(t, e, ch, 0)
	}},
	{name: "WithFromKey: every key >= key", run: func(t *testing.T, e *env) {
		ch := e.cli.Watch(e.ctx, e.key("m"), clientv3.WithFromKey())
		e.put(t, "a", "1")
		e.put(t, "m", "2")
		e.put(t, "z", "3")
		require.Equal(t, []string{"PUT " + e.key("m") + "=2", "PUT " + e.key("z") + "=3"}, kvs(events(t, ch, 2)))
	}},
	{name: "WithRev: history replayed from that revision", run: func(t *testing.T, e *env) {
		r1 := e.put(t, "k", "1")
		e.put(t, "k", "2")
		e.del(t, "k")
		ch := e.cli.Watch(e.ctx, e.key("k"), clientv3.WithRev(r1))
		evs := events(t, ch, 3)
		require.Equal(t, []string{"PUT " + e.key("k") + "=1", "PUT " + e.key("k") + "=2", "DELETE " + e.key("k") + "="}, kvs(evs))
		require.Equal(t, r1, evs[0].Kv.ModRevision)
	}},
	{name: "WithPrevKV: previous value on put and delete", run: func(t *testing.T, e *env) {
		e.put(t, "k", "1")
		ch := e.cli.Watch(e.ctx, e.key("k"), clientv3.WithPrevKV())
		e.put(t, "k", "2")
		e.del(t, "k")
		evs := events(t, ch, 2)
		require.Equal(t, "1", string(evs[0].PrevKv.Value))
		require.Equal(t, "2", string(evs[1].PrevKv.Value))
		require.Equal(t, e.key("k"), string(evs[1].PrevKv.Key))
	}},
	{name: "WithFilterPut: deletes only", run: func(t *testing.T, e *env) {
		ch := e.cli.Watch(e.ctx, e.key("k"), clientv3.WithFilterPut())
		e.put(t, "k", "1")
		r := e.del(t, "k")
		ev := events(t, ch, 1)[0]
		require.Equal(t, mvccpb.DELETE, ev.Type)
		require.Equal(t, r, ev.Kv.ModRevision)
		fence(t, e, ch, r)
	}},
	{name: "WithFilterDelete: puts only", run: func(t *testing.T, e *env) {
		ch := e.cli.Watch(e.ctx, e.key("k"), clientv3.WithFilterDelete())
		e.put(t, "k", "1")
		r := e.del(t, "k")
		e.put(t, "k", "2")
		require.Equal(t, []string{"PUT " + e.key("k") + "=1", "PUT " + e.key("k") + "=2"}, kvs(events(t, ch, 2)))
		fence(t, e, ch, r)
	}},
	{name: "WithFilterPut and WithFilterDelete: no events at all", run: func(t *testing.T, e *env) {
		ch := e.cli.Watch(e.ctx, e.key("k"), clientv3.WithFilterPut(), clientv3.WithFilterDelete())
		e.put(t, "k", "1")
		r := e.del(t, "k")
		fence(t, e, ch, r)
	}},
	{name: "WithFilterPut, WithFilterDelete and WithPrevKV: a deletion above the receive limit is not sent, and the watch goes on", run: func(t *testing.T, e *env) {
		// The drop-in once sent deletes to drop them itself: with their
		// previous values, 2 MiB broke a 1.5 MiB limit and every watch of
		// the stream ended with ResourceExhausted.
		cli := e.client(t, func(c *clientv3.Config) { c.MaxCallRecvMsgSize = 3 << 19 })
		for _, k := range []string{"a", "b", "c", "d", "e"} {
			_, err := cli.Put(e.ctx, e.key(k), big)
			require.NoError(t, err)
		}
		ch := cli.Watch(e.ctx, e.key(""), clientv3.WithPrefix(), clientv3.WithPrevKV(), clientv3.WithFilterPut(), clientv3.WithFilterDelete())
		bothFiltersSendNothing(t, e, cli, ch)
	}},
	{name: "WithFilterPut and WithFilterDelete: a deletion of 1,000 keys above the receive limit is not sent, and the watch goes on", run: func(t *testing.T, e *env) {
		cli := e.client(t, func(c *clientv3.Config) { c.MaxCallRecvMsgSize = 16 << 10 })
		for i := range 1000 {
			_, err := cli.Put(e.ctx, e.key(fmt.Sprintf("many/%04d", i)), "")
			require.NoError(t, err)
		}
		ch := cli.Watch(e.ctx, e.key(""), clientv3.WithPrefix(), clientv3.WithFilterPut(), clientv3.WithFilterDelete())
		bothFiltersSendNothing(t, e, cli, ch)
	}},
	{name: "WithFilterPut, WithFilterDelete and WithProgressNotify: a heartbeat under writes", run: func(t *testing.T, e *env) {
		// etcd holds back a watch's periodic notification after it sent the
		// watch an event: filtered in etcd, the events are never sent.
		ch := e.cli.Watch(e.ctx, e.key("k"), clientv3.WithFilterPut(), clientv3.WithFilterDelete(), clientv3.WithProgressNotify())
		var last int64
		for heard := 0; heard < 3; {
			e.put(t, "k", "1")
			r := e.del(t, "k")
			select {
			case p, ok := <-ch:
				require.True(t, ok, "closed")
				require.True(t, p.IsProgressNotify(), "%+v", p)
				require.GreaterOrEqual(t, p.Header.Revision, last)
				last = p.Header.Revision
				heard++
			case <-e.ctx.Done():
				t.Fatalf("%d progress notifications under writes before the case's time ran out (revision %d)", heard, r)
			default:
			}
		}
	}},
	{name: "WithCreatedNotify: Created first, at the current revision", run: func(t *testing.T, e *env) {
		r := e.put(t, "k", "1")
		ch := e.cli.Watch(e.ctx, e.key("k"), clientv3.WithCreatedNotify())
		c := next(t, ch)
		require.True(t, c.Created)
		require.Empty(t, c.Events)
		require.NoError(t, c.Err())
		require.False(t, c.IsProgressNotify())
		require.Equal(t, r, c.Header.Revision)
		e.put(t, "k", "2")
		require.Equal(t, "2", string(events(t, ch, 1)[0].Kv.Value))
	}},
	{name: "WithCreatedNotify and WithRev: the header has the store's revision, not the start's", run: func(t *testing.T, e *env) {
		r1 := e.put(t, "k", "1")
		e.put(t, "k", "2")
		r3 := e.put(t, "k", "3")
		past := e.cli.Watch(e.ctx, e.key("k"), clientv3.WithRev(r1), clientv3.WithCreatedNotify())
		c := next(t, past)
		require.True(t, c.Created)
		require.Equal(t, r3, c.Header.Revision, "a program starts from here")
		require.Equal(t, []string{"PUT " + e.key("k") + "=1", "PUT " + e.key("k") + "=2", "PUT " + e.key("k") + "=3"}, kvs(events(t, past, 3)))
		future := e.cli.Watch(e.ctx, e.key("k"), clientv3.WithRev(r3+100), clientv3.WithCreatedNotify())
		c = next(t, future)
		require.True(t, c.Created)
		require.Equal(t, r3, c.Header.Revision)
	}},
	{
		name:       "WithCreatedNotify: the header names the cluster, the member and the term, as later headers do",
		dropinSkip: "etcdwatch gives the created response's revision (Watch.CreatedRevision) but not its cluster, member and term",
		run: func(t *testing.T, e *env) {
			ch := e.cli.Watch(e.ctx, e.key("k"), clientv3.WithCreatedNotify())
			c := next(t, ch)
			require.True(t, c.Created)
			e.put(t, "k", "1")
			r := next(t, ch)
			require.NotZero(t, c.Header.ClusterId)
			require.Equal(t, r.Header.ClusterId, c.Header.ClusterId)
			require.Equal(t, r.Header.MemberId, c.Header.MemberId)
			require.Equal(t, r.Header.RaftTerm, c.Header.RaftTerm)
		},
	},
	{name: "no WithCreatedNotify: the first response is an event", run: func(t *testing.T, e *env) {
		ch := e.cli.Watch(e.ctx, e.key("k"))
		e.put(t, "k", "1")
		events(t, ch, 1)
	}},
	{name: "WithProgressNotify: periodic notifications on an idle watch", run: func(t *testing.T, e *env) {
		r := e.put(t, "k", "1")
		ch := e.cli.Watch(e.ctx, e.key("k"), clientv3.WithProgressNotify())
		p := next(t, ch)
		require.True(t, p.IsProgressNotify(), "%+v", p)
		require.NoError(t, p.Err())
		require.GreaterOrEqual(t, p.Header.Revision, r)
		p = next(t, ch) // and again
		require.True(t, p.IsProgressNotify(), "%+v", p)
	}},
	{name: "RequestProgress: a notification after the events, at least their revision", run: func(t *testing.T, e *env) {
		ch := e.cli.Watch(e.ctx, e.key("k"))
		other := e.cli.Watch(e.ctx, e.key("other"))
		r := e.put(t, "k", "1")
		events(t, ch, 1)
		fence(t, e, ch, r)
		p := next(t, other) // every watch on the stream gets one
		require.True(t, p.IsProgressNotify(), "%+v", p)
		require.GreaterOrEqual(t, p.Header.Revision, r)
	}},
	{name: "WithFragment: a revision above the fragment size arrives whole", run: func(t *testing.T, e *env) {
		big := strings.Repeat("v", 400<<10)
		ops := []clientv3.Op{clientv3.OpPut(e.key("a"), big), clientv3.OpPut(e.key("b"), big)}
		_, err := e.cli.Txn(e.ctx).Then(ops...).Commit()
		require.NoError(t, err)
		ch := e.cli.Watch(e.ctx, e.key(""), clientv3.WithPrefix(), clientv3.WithFragment(), clientv3.WithPrevKV())
		ops = []clientv3.Op{clientv3.OpPut(e.key("a"), big+"2"), clientv3.OpPut(e.key("b"), big+"2")}
		txn, err := e.cli.Txn(e.ctx).Then(ops...).Commit() // ~1.6 MiB of events with their previous values
		require.NoError(t, err)
		r := next(t, ch)
		require.NoError(t, r.Err())
		require.Len(t, r.Events, 2, "the revision split across responses")
		for _, ev := range r.Events {
			require.Equal(t, txn.Header.Revision, ev.Kv.ModRevision)
			require.Equal(t, big, string(ev.PrevKv.Value))
		}
	}},
	{name: "receive limit (Config.MaxCallRecvMsgSize): a larger response ends the watch with ResourceExhausted, no events", run: func(t *testing.T, e *env) {
		cli, write := limited(t, e)
		write(big)
		ch := cli.Watch(e.ctx, e.key(""), clientv3.WithPrefix(), clientv3.WithPrevKV())
		write("small") // ~0.8 MiB of previous values: under the limit
		require.Len(t, events(t, ch, 2), 2)
		write(big) // ~0.8 MiB of values and ~0 of previous ones: under
		events(t, ch, 2)
		write(big + "2") // ~1.6 MiB with the previous values: over
		r := next(t, ch)
		require.True(t, r.Canceled, "%d events, revision %d", len(r.Events), r.Header.GetRevision())
		require.Empty(t, r.Events)
		require.Zero(t, r.CompactRevision)
		requireGRPCError(t, codes.ResourceExhausted, r.Err())
		closed(t, ch)
	}},
	{name: "receive limit: a Watch after the stream ended gets a new stream, while another watch on the old one has a response unread", run: func(t *testing.T, e *env) {
		cli, write := limited(t, e)
		write(big)
		ch := cli.Watch(e.ctx, e.key(""), clientv3.WithPrefix(), clientv3.WithPrevKV())
		unread := cli.Watch(e.ctx, e.key("a")) // on the same stream; its consumer never reads
		write("small")
		require.Len(t, events(t, ch, 2), 2)
		write(big)
		events(t, ch, 2)
		write(big + "2") // over the limit: ends the stream
		require.True(t, next(t, ch).Canceled)
		closed(t, ch)
		// clientv3 may refuse a Watch or two while the old stream winds
		// down (it gives up a final send after 250 ms); a Watch that keeps
		// joining the ended stream is refused until the test's deadline.
		var refusal error
		for attempt := 0; ; attempt++ {
			require.NoError(t, e.ctx.Err(), "still refused after %d attempts: %v", attempt, refusal)
			r := next(t, cli.Watch(e.ctx, e.key("c"), clientv3.WithCreatedNotify()))
			if r.Created {
				break
			}
			require.True(t, r.Canceled, "%+v", r)
			refusal = r.Err()
		}
		_ = unread
	}},
	{name: "receive limit with WithFragment: a revision above it arrives whole, in fragments under it", run: func(t *testing.T, e *env) {
		cli := e.client(t, func(c *clientv3.Config) { c.MaxCallRecvMsgSize = 3 << 19 }) // 1.5 MiB
		big := strings.Repeat("v", 400<<10)
		_, err := cli.Txn(e.ctx).Then(clientv3.OpPut(e.key("a"), big), clientv3.OpPut(e.key("b"), big)).Commit()
		require.NoError(t, err)
		ch := cli.Watch(e.ctx, e.key(""), clientv3.WithPrefix(), clientv3.WithPrevKV(), clientv3.WithFragment())
		_, err = cli.Txn(e.ctx).Then(clientv3.OpPut(e.key("a"), big+"2"), clientv3.OpPut(e.key("b"), big+"2")).Commit()
		require.NoError(t, err)
		require.Len(t, events(t, ch, 2), 2)
	}},
	{name: "connection closed: one canceled response, Err is gRPC's Canceled, then closed; a Watch after it the same", run: func(t *testing.T, e *env) {
		cli := e.client(t, func(*clientv3.Config) {})
		ch := cli.Watch(e.ctx, e.key("k"), clientv3.WithCreatedNotify())
		require.True(t, next(t, ch).Created)
		require.NoError(t, cli.ActiveConnection().Close())
		for _, ch := range []clientv3.WatchChan{ch, cli.Watch(e.ctx, e.key("k"))} {
			r := next(t, ch)
			require.True(t, r.Canceled, "%+v", r)
			require.Empty(t, r.Events)
			require.Empty(t, r.CancelReason)
			requireGRPCError(t, codes.Canceled, r.Err())
			closed(t, ch)
		}
		requireGRPCError(t, codes.Canceled, cli.RequestProgress(e.ctx))
		require.ErrorIs(t, cli.Close(), context.Canceled, "what Close says once the connection was closed under it")
	}},
	{name: "connection closed under an unread watch: RequestProgress fails with gRPC's Canceled", run: func(t *testing.T, e *env) {
		cli := e.client(t, func(*clientv3.Config) {})
		cli.Watch(e.ctx, e.key("k")) // never read: its end cannot be handed over
		for i := range 3 {
			e.put(t, "k", fmt.Sprint(i))
		}
		require.NoError(t, cli.ActiveConnection().Close())
		var err error
		require.Eventually(t, func() bool { err = cli.RequestProgress(e.ctx); return err != nil }, wait, time.Millisecond,
			"RequestProgress said nil on a closed connection")
		requireGRPCError(t, codes.Canceled, err)
	}},
	{name: "options as clientv3.OpWatch takes them: WithPrefix then WithFromKey, the last wins; WithLease panics", run: func(t *testing.T, e *env) {
		var ch clientv3.WatchChan
		require.NotPanics(t, func() {
			ch = e.cli.Watch(e.ctx, e.key("m"), clientv3.WithPrefix(), clientv3.WithFromKey())
		})
		e.put(t, "z", "1") // after key m, outside the prefix: from-key wins
		require.Equal(t, []string{"PUT " + e.key("z") + "=1"}, kvs(events(t, ch, 1)))
		require.PanicsWithValue(t, "unexpected lease in watch", func() {
			e.cli.Watch(e.ctx, e.key("m"), clientv3.WithLease(1))
		})
	}},
	{name: "WithRev(-1): canceled, ErrCompacted", run: func(t *testing.T, e *env) {
		ch := e.cli.Watch(e.ctx, e.key("k"), clientv3.WithRev(-1), clientv3.WithCreatedNotify())
		r := next(t, ch)
		require.True(t, r.Canceled)
		require.ErrorIs(t, r.Err(), rpctypes.ErrCompacted)
		closed(t, ch)
	}},
	{name: "empty range (end <= key): canceled with etcd's reason", run: func(t *testing.T, e *env) {
		ch := e.cli.Watch(e.ctx, e.key("b"), clientv3.WithRange(e.key("a")))
		r := next(t, ch)
		require.True(t, r.Canceled)
		require.ErrorContains(t, r.Err(), "watcher range is empty")
		closed(t, ch)
	}},
	{name: "ctx canceled: channel closes, nothing more", run: func(t *testing.T, e *env) {
		ctx, cancel := context.WithCancel(e.ctx)
		ch := e.cli.Watch(ctx, e.key("k"))
		e.put(t, "k", "1")
		events(t, ch, 1)
		cancel()
		closed(t, ch)
	}},
	{name: "ctx deadline: channel closes", run: func(t *testing.T, e *env) {
		ctx, cancel := context.WithTimeout(e.ctx, 300*time.Millisecond)
		defer cancel()
		ch := e.cli.Watch(ctx, e.key("k"))
		closed(t, ch)
	}},
	{name: "ctx already ended: closed channel", run: func(t *testing.T, e *env) {
		ctx, cancel := context.WithCancel(e.ctx)
		cancel()
		closed(t, e.cli.Watch(ctx, e.key("k")))
	}},
	{name: "ctx already ended, a request etcd refuses: closed channel, no response", run: func(t *testing.T, e *env) {
		ctx, cancel := context.WithCancel(e.ctx)
		cancel()
		closed(t, e.cli.Watch(ctx, e.key("b"), clientv3.WithRange(e.key("a"))))
		closed(t, e.cli.Watch(ctx, e.key("k"), clientv3.WithRev(-1)))
	}},
	{name: "ctx ended while responses are unread: channel closes", run: func(t *testing.T, e *env) {
		ctx, cancel := context.WithCancel(e.ctx)
		ch := e.cli.Watch(ctx, e.key("k"))
		for i := range 20 {
			e.put(t, "k", fmt.Sprint(i))
		}
		cancel()
		for { // buffered responses may come first; the channel must then close
			select {
			case r, ok := <-ch:
				if !ok {
					return
				}
				require.NoError(t, r.Err())
			case <-time.After(wait):
				t.Fatal("watch channel not closed")
			}
		}
	}},
	{name: "watches on one ctx: one canceled, the other goes on", run: func(t *testing.T, e *env) {
		ctx, cancel := context.WithCancel(e.ctx)
		a := e.cli.Watch(ctx, e.key("k"))
		b := e.cli.Watch(e.ctx, e.key("k"))
		cancel()
		closed(t, a)
		e.put(t, "k", "1")
		events(t, b, 1)
	}},
	{name: "Close: every channel closes; Watch after it a closed channel; RequestProgress an error", run: func(t *testing.T, e *env) {
		a := e.cli.Watch(e.ctx, e.key("a"))
		b := e.cli.Watch(clientv3.WithRequireLeader(e.ctx), e.key("b"))
		e.put(t, "a", "1")
		events(t, a, 1)
		require.NoError(t, e.cli.Watcher.Close())
		for _, ch := range []clientv3.WatchChan{a, b} {
			if e.impl == "clientv3" {
				// clientv3 at times posts its stream's close error first: its
				// run loop races the gRPC stream's end. The drop-in never does.
				closedPerhapsCanceled(t, ch)
				continue
			}
			closed(t, ch)
		}
		closed(t, e.cli.Watch(e.ctx, e.key("a")))
		require.Error(t, e.cli.RequestProgress(e.ctx))
	}},
	{name: "Close, then a Watch of a request etcd refuses: a closed channel, no response", run: func(t *testing.T, e *env) {
		require.NoError(t, e.cli.Watcher.Close())
		closed(t, e.cli.Watch(e.ctx, e.key("b"), clientv3.WithRange(e.key("a"))))
		closed(t, e.cli.Watch(e.ctx, e.key("k"), clientv3.WithRev(-1)))
	}},
	{name: "connection closed, then a Watch of any request, one etcd refuses too: gRPC's Canceled", run: func(t *testing.T, e *env) {
		cli := e.client(t, func(*clientv3.Config) {})
		require.NoError(t, cli.ActiveConnection().Close())
		for _, ch := range []clientv3.WatchChan{
			cli.Watch(e.ctx, e.key("k")),
			cli.Watch(e.ctx, e.key("b"), clientv3.WithRange(e.key("a"))),
			cli.Watch(e.ctx, e.key("k"), clientv3.WithRev(-1)),
		} {
			r := next(t, ch)
			require.True(t, r.Canceled, "%+v", r)
			require.Empty(t, r.CancelReason)
			requireGRPCError(t, codes.Canceled, r.Err())
			closed(t, ch)
		}
	}},
	{name: "many watches on one ctx: all get their events; ctx canceled: all close", run: func(t *testing.T, e *env) {
		ctx, cancel := context.WithCancel(e.ctx)
		var chs []clientv3.WatchChan
		for i := range 50 {
			chs = append(chs, e.cli.Watch(ctx, e.key(fmt.Sprint(i%5))))
		}
		for i := range 5 {
			e.put(t, fmt.Sprint(i), "v")
		}
		for _, ch := range chs {
			events(t, ch, 1)
		}
		cancel()
		for _, ch := range chs {
			closed(t, ch)
		}
	}},
	{name: "compacted: Canceled, CompactRevision, ErrCompacted, the server's header, then closed", run: func(t *testing.T, e *env) {
		r1 := e.put(t, "k", "1")
		e.put(t, "k", "2")
		r3 := e.put(t, "k", "3")
		_, err := e.cli.Compact(e.ctx, r3)
		require.NoError(t, err)
		ch := e.cli.Watch(e.ctx, e.key("k"), clientv3.WithRev(r1), clientv3.WithCreatedNotify())
		c := next(t, ch)
		require.True(t, c.Created, "etcd confirms a compacted create, then cancels it: %+v", c)
		r := next(t, ch)
		require.True(t, r.Canceled)
		require.Equal(t, r3, r.CompactRevision)
		require.ErrorIs(t, r.Err(), rpctypes.ErrCompacted)
		require.Empty(t, r.Events)
		require.False(t, r.IsProgressNotify())
		// No event came before: the header is the compaction response's own.
		require.NotZero(t, r.Header.ClusterId, "%+v", r.Header)
		require.NotZero(t, r.Header.MemberId, "%+v", r.Header)
		require.NotZero(t, r.Header.RaftTerm, "%+v", r.Header)
		require.Zero(t, r.Header.Revision, "as etcd sends it")
		closed(t, ch)
	}},
	{name: "compacted revision: the watch from the compact revision on still works", run: func(t *testing.T, e *env) {
		e.put(t, "k", "1")
		r2 := e.put(t, "k", "2")
		_, err := e.cli.Compact(e.ctx, r2)
		require.NoError(t, err)
		ch := e.cli.Watch(e.ctx, e.key("k"), clientv3.WithRev(r2))
		require.Equal(t, "2", string(events(t, ch, 1)[0].Kv.Value))
	}},
	{name: "empty key alone: confirmed, not refused, and answers progress", run: func(t *testing.T, e *env) {
		ch := e.cli.Watch(e.ctx, "", clientv3.WithCreatedNotify())
		c := next(t, ch)
		require.True(t, c.Created, "%+v, Err %v", c, c.Err())
		require.NoError(t, c.Err())
		fence(t, e, ch, 0)
	}},
	{name: "WithRange(\"\"): the key alone, as without it", run: func(t *testing.T, e *env) {
		ch := e.cli.Watch(e.ctx, e.key("k"), clientv3.WithRange(""))
		e.put(t, "k", "1")
		e.put(t, "k2", "x")
		r := e.put(t, "k", "2")
		require.Equal(t, []string{"PUT " + e.key("k") + "=1", "PUT " + e.key("k") + "=2"}, kvs(events(t, ch, 2)))
		fence(t, e, ch, r)
	}},
	{name: "empty range, end equal to key: canceled with etcd's reason", run: func(t *testing.T, e *env) {
		ch := e.cli.Watch(e.ctx, e.key("b"), clientv3.WithRange(e.key("b")))
		r := next(t, ch)
		require.True(t, r.Canceled)
		require.ErrorContains(t, r.Err(), "watcher range is empty")
		closed(t, ch)
	}},
	{name: "an event's key-value carries its lease, and so does its previous one", run: func(t *testing.T, e *env) {
		l, err := e.cli.Grant(e.ctx, 60)
		require.NoError(t, err)
		ch := e.cli.Watch(e.ctx, e.key("k"), clientv3.WithPrevKV())
		_, err = e.cli.Put(e.ctx, e.key("k"), "1", clientv3.WithLease(l.ID))
		require.NoError(t, err)
		e.put(t, "k", "2") // no lease
		evs := events(t, ch, 2)
		require.Equal(t, int64(l.ID), evs[0].Kv.Lease)
		require.Zero(t, evs[1].Kv.Lease)
		require.Equal(t, int64(l.ID), evs[1].PrevKv.Lease)
	}},
	{name: "equal outgoing metadata of several keys: one stream, which RequestProgress reaches", run: func(t *testing.T, e *env) {
		// Eight keys: a map of them iterates in an order of its own each
		// time, which naming the metadata must not depend on.
		var kv []string
		for i := range 8 {
			kv = append(kv, fmt.Sprintf("x-md-%d", i), fmt.Sprint(i))
		}
		ctx := metadata.AppendToOutgoingContext(e.ctx, kv...)
		for i := range 4 {
			ch := e.cli.Watch(ctx, e.key(fmt.Sprint(i)))
			require.NoError(t, e.cli.RequestProgress(ctx))
			p := next(t, ch)
			require.True(t, p.IsProgressNotify(), "watch %d: %+v", i, p)
		}
	}},
	{name: "Close under a watch whose ctx never ends: Close returns, the channel closes", run: func(t *testing.T, e *env) {
		ctx, cancel := context.WithCancel(context.Background()) // no deadline: only Close can end the watch
		defer cancel()
		ch := e.cli.Watch(ctx, e.key("k"))
		e.put(t, "k", "1")
		events(t, ch, 1)
		done := make(chan error, 1)
		go func() { done <- e.cli.Watcher.Close() }()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(wait):
			t.Fatal("Close did not return")
		}
		closedPerhapsCanceled(t, ch) // clientv3 may post its stream's close error first (see the Close case)
	}},
	{name: "receive limit: the old stream's last watch ending leaves the new stream to RequestProgress", run: func(t *testing.T, e *env) {
		cli, write := limited(t, e)
		write(big)
		ch := cli.Watch(e.ctx, e.key(""), clientv3.WithPrefix(), clientv3.WithPrevKV())
		unread := cli.Watch(e.ctx, e.key("a")) // on the same stream; read only once the new one is open
		write("small")
		require.Len(t, events(t, ch, 2), 2)
		write(big)
		events(t, ch, 2)
		write(big + "2") // over the limit: ends the stream
		require.True(t, next(t, ch).Canceled)
		closed(t, ch)
		var fresh clientv3.WatchChan
		for attempt := 0; fresh == nil; attempt++ { // as in "receive limit: a Watch after the stream ended ..."
			require.NoError(t, e.ctx.Err(), "still refused after %d attempts", attempt)
			c := cli.Watch(e.ctx, e.key("c"), clientv3.WithCreatedNotify())
			r := next(t, c)
			if r.Created {
				fresh = c
				break
			}
			require.True(t, r.Canceled, "%+v", r)
		}
		for range unread { // its events, perhaps its end, then closed: its stream is let go
		}
		require.NoError(t, cli.RequestProgress(e.ctx))
		p := next(t, fresh)
		require.True(t, p.IsProgressNotify(), "%+v", p)
	}},
}

// TestContractAuth: a create the user may not make is refused on its own
// watch; the user's other watches on the stream go on.
func TestContractAuth(t *testing.T) {
	srv := etcdwatchtest.StartEtcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	root := client(t, []string{srv.Endpoint}, "", "")
	{
		for _, step := range []func() error{
			func() error { _, err := root.UserAdd(ctx, "root", "rootpw"); return err },
			func() error { _, err := root.UserGrantRole(ctx, "root", "root"); return err },
			func() error { _, err := root.RoleAdd(ctx, "rw"); return err },
			func() error {
				_, err := root.RoleGrantPermission(ctx, "rw", "c", "d", clientv3.PermissionType(clientv3.PermReadWrite)) // every case prefix
				return err
			},
			func() error { _, err := root.UserAdd(ctx, "alice", "alicepw"); return err },
			func() error { _, err := root.UserGrantRole(ctx, "alice", "rw"); return err },
			func() error { _, err := root.AuthEnable(ctx); return err },
		} {
			require.NoError(t, step())
		}
	}
	admin := client(t, []string{srv.Endpoint}, "root", "rootpw")
	runContract(t, []string{srv.Endpoint}, authCases, func(t *testing.T) *clientv3.Client {
		return client(t, []string{srv.Endpoint}, "alice", "alicepw")
	}, admin)
}

// refused watches a key alice may not read.
func refused(t *testing.T, e *env) clientv3.WatchResponse {
	ch := e.cli.Watch(e.ctx, "secret", clientv3.WithCreatedNotify())
	r := next(t, ch)
	require.True(t, r.Canceled, "%+v", r)
	require.False(t, r.Created)
	require.Error(t, r.Err())
	closed(t, ch)
	return r
}

var authCases = []contractCase{
	{name: "permission denied: canceled, Err says so, channel closed; other watches go on", run: func(t *testing.T, e *env) {
		ok := e.cli.Watch(e.ctx, e.key("k"))
		e.put(t, "k", "1") // confirmed before the refusal
		events(t, ok, 1)
		r := refused(t, e)
		require.ErrorContains(t, r.Err(), "permission denied")
		e.put(t, "k", "2")
		require.Equal(t, "2", string(events(t, ok, 1)[0].Kv.Value))
	}},
	{
		name:         "permission denied: Err is rpctypes.ErrPermissionDenied",
		clientv3Skip: "Err returns errors.New of the gRPC status text (\"rpc error: code = PermissionDenied desc = ...\"), which rpctypes.Error does not map: neither errors.Is nor status.Code match",
		run: func(t *testing.T, e *env) {
			r := refused(t, e)
			require.ErrorIs(t, r.Err(), rpctypes.ErrPermissionDenied)
		},
	},
	{
		name:         "permission denied, then another watch compacted: one final response, ErrCompacted",
		clientv3Skip: "the refusal stays its stream's error: the compacted watch gets ErrCompacted, then a second final response with the permission error",
		run: func(t *testing.T, e *env) {
			r1 := e.put(t, "k", "1")
			r2 := e.put(t, "k", "2")
			keep := e.cli.Watch(e.ctx, e.key("keep")) // holds the stream open
			refused(t, e)
			_, err := e.admin.Compact(e.ctx, r2)
			require.NoError(t, err)
			ch := e.cli.Watch(e.ctx, e.key("k"), clientv3.WithRev(r1))
			r := next(t, ch)
			require.ErrorIs(t, r.Err(), rpctypes.ErrCompacted)
			closed(t, ch)
			_ = keep
		},
	},
}

// TestContractRequireLeader: under clientv3.WithRequireLeader a watch
// whose member loses its leader ends with ErrNoLeader; a watch without it,
// on the same client, is on another stream and goes on.
func TestContractRequireLeader(t *testing.T) {
	members := etcdwatchtest.StartCluster(t, 3)
	all := []string{members[0].Endpoint, members[1].Endpoint, members[2].Endpoint}
	for _, im := range impls {
		t.Run(im.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*wait)
			t.Cleanup(cancel)
			writer := client(t, all, "", "")
			cli := client(t, []string{members[0].Endpoint}, "", "")
			im.install(cli)
			key := "rl/" + im.name
			leader := cli.Watch(clientv3.WithRequireLeader(ctx), key)
			plain := cli.Watch(ctx, key)
			_, err := writer.Put(ctx, key, "1")
			require.NoError(t, err)
			events(t, leader, 1)
			events(t, plain, 1)

			etcdwatchtest.StopAll(members[1], members[2]) // members[0] loses its quorum
			r := next(t, leader)
			require.True(t, r.Canceled, "%+v", r)
			require.ErrorIs(t, r.Err(), rpctypes.ErrNoLeader)
			closed(t, leader)
			// A new require-leader watch is refused the same way.
			r = next(t, cli.Watch(clientv3.WithRequireLeader(ctx), key))
			require.ErrorIs(t, r.Err(), rpctypes.ErrNoLeader)

			require.NoError(t, members[1].Restart()) // quorum again
			require.NoError(t, members[2].Restart())
			for {
				wctx, wcancel := context.WithTimeout(ctx, time.Second)
				_, err := writer.Put(wctx, key, "2")
				wcancel()
				if err == nil {
					break
				}
				require.NoError(t, ctx.Err(), "no write after the quorum came back: %v", err)
			}
			ev := events(t, plain, 1)[0]
			require.Equal(t, "2", string(ev.Kv.Value))
		})
	}
}

// bothFiltersSendNothing deletes every key of the case and asks for
// progress: the watch ch of cli, with WithFilterPut and WithFilterDelete,
// must hear the answer, at or after the deletion, and no event.
func bothFiltersSendNothing(t *testing.T, e *env, cli *clientv3.Client, ch clientv3.WatchChan) {
	t.Helper()
	r, err := cli.Delete(e.ctx, e.key(""), clientv3.WithPrefix())
	require.NoError(t, err)
	require.NoError(t, cli.RequestProgress(e.ctx))
	p := next(t, ch)
	require.True(t, p.IsProgressNotify(), "%+v, Err %v", p, p.Err())
	require.GreaterOrEqual(t, p.Header.Revision, r.Header.Revision)
}

// TestConnClosedWhileItsMemberIsDown: a connection closed while its member
// is unreachable (the watch stream down, being retried). clientv3 ends the
// watch with gRPC's Canceled, as it does for a connection closed under a
// live stream; the drop-in ended it, 16 runs in 20, with the Unavailable
// error of the stream that had ended, as its Stream failed with that.
func TestConnClosedWhileItsMemberIsDown(t *testing.T) {
	srv := etcdwatchtest.StartEtcd(t)
	for _, im := range impls {
		t.Run(im.name, func(t *testing.T) {
			proxy := etcdwatchtest.NewProxy(t, srv.Endpoint)
			cli, err := clientv3.New(clientv3.Config{Endpoints: []string{proxy.Addr()}, DialTimeout: wait})
			require.NoError(t, err)
			defer cli.Close()
			im.install(cli)
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			ch := cli.Watch(ctx, "down/k", clientv3.WithCreatedNotify())
			require.True(t, next(t, ch).Created)
			proxy.Refuse(true)
			proxy.Cut()
			conn := cli.ActiveConnection()
			for s := conn.GetState(); s == connectivity.Ready; s = conn.GetState() {
				require.True(t, conn.WaitForStateChange(ctx, s), "still ready")
			}
			require.NoError(t, conn.Close())
			r := next(t, ch)
			require.True(t, r.Canceled, "%+v", r)
			require.Empty(t, r.CancelReason)
			requireGRPCError(t, codes.Canceled, r.Err())
			closed(t, ch)
		})
	}
}

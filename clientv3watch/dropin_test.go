package clientv3watch_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
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

	t.Run("a consumer that stops reading is paused and resumed: nothing lost", func(t *testing.T) {
		cli := client(t, endpoints, "", "")
		cli.Watcher = clientv3watch.New(cli, etcdwatch.WithBufferLimit(8), etcdwatch.WithStallBudget(0))
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
	})
}

package group

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"

	"github.com/etcdwatch/etcdwatch/internal/clock"
	ws "github.com/etcdwatch/etcdwatch/internal/watchserver"
)

// TestSettleCountsFromTheLeader: a member connected but without a leader
// (etcd's Status names none) is not up: its settle time starts when it
// names one.
func TestSettleCountsFromTheLeader(t *testing.T) {
	srv := ws.StartRelease(t, "3.6.0")
	ms := newMembers([]*grpc.ClientConn{srv.Dial(t)}, time.Second)
	fake := clock.NewFake()
	ms.clock = fake
	ms.setState(0, connectivity.Ready) // as watch records it

	require.False(t, ms.probe(t.Context(), 0), "Status names no leader")
	fake.Advance(2 * time.Second)
	require.False(t, ms.homeDue(0), "connected without a leader for twice the settle time counts for nothing")

	srv.SetLeader(1)
	require.True(t, ms.probe(t.Context(), 0))
	fake.Advance(time.Second - time.Nanosecond)
	require.False(t, ms.homeDue(0), "a settle time from the leader, not yet")
	fake.Advance(time.Nanosecond)
	require.True(t, ms.homeDue(0))

	srv.SetLeader(0)
	require.False(t, ms.probe(t.Context(), 0))
	require.False(t, ms.homeDue(0), "the leader lost: up no longer")
}

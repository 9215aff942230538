package group

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"

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

// TestMemberFreshUntilReadyOrFailed: a member is fresh (route's tier 1
// waits for it) until its connection has been ready or failed once; a
// member whose first attempt failed is not fresh while it connects again,
// so a Stream whose home is down at Dial takes the next member up rather
// than waiting on each of the home's retries.
func TestMemberFreshUntilReadyOrFailed(t *testing.T) {
	for _, first := range []connectivity.State{connectivity.TransientFailure, connectivity.Ready} {
		cc, err := grpc.NewClient("passthrough:///127.0.0.1:1", grpc.WithTransportCredentials(insecure.NewCredentials()))
		require.NoError(t, err)
		t.Cleanup(func() { _ = cc.Close() })
		ms := newMembers([]*grpc.ClientConn{cc}, 0)
		ms.setState(0, connectivity.Connecting)
		require.True(t, ms.memberState(0).fresh, "first attempt under way")
		ms.setState(0, first)
		ms.setState(0, connectivity.Connecting)
		require.False(t, ms.memberState(0).fresh, "connecting again after %v", first)
	}
}

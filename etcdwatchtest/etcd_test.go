package etcdwatchtest_test

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.etcd.io/etcd/server/v3/embed"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/etcdwatch/etcdwatch"
	"github.com/etcdwatch/etcdwatch/etcdwatchtest"
)

// wait bounds every wait; nothing is timed.
const wait = 30 * time.Second

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	t.Cleanup(cancel)
	return ctx
}

// memberConn returns a connection to srv, closed when the test ends.
func memberConn(t *testing.T, srv *etcdwatchtest.Server, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	conn, err := srv.Dial(opts...)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, conn.Close()) })
	return conn
}

func put(t *testing.T, conn *grpc.ClientConn, key, value string) int64 {
	t.Helper()
	resp, err := pb.NewKVClient(conn).Put(testContext(t), &pb.PutRequest{Key: []byte(key), Value: []byte(value)})
	require.NoError(t, err)
	return resp.Header.Revision
}

func get(t *testing.T, conn *grpc.ClientConn, key string) string {
	t.Helper()
	resp, err := pb.NewKVClient(conn).Range(testContext(t), &pb.RangeRequest{Key: []byte(key)})
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1)
	return string(resp.Kvs[0].Value)
}

// TestStartEtcd is a user's test of watch code, and checks that the member
// it starts serves, keeps its data in the test's temporary directory, and
// is stopped when the test ends.
func TestStartEtcd(t *testing.T) {
	var srv *etcdwatchtest.Server
	t.Run("user", func(t *testing.T) {
		srv = etcdwatchtest.StartEtcd(t)
		require.True(t, strings.HasPrefix(srv.Endpoint, "127.0.0.1:"), srv.Endpoint)
		conn := memberConn(t, srv)
		s, err := etcdwatch.Open(conn)
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, s.Close()) })
		w, err := s.Watch(testContext(t), etcdwatch.Prefix("app/"))
		require.NoError(t, err)
		rev := put(t, conn, "app/color", "blue")
		r, ok := <-w.Responses()
		require.True(t, ok, "watch ended: %v", w.Err())
		require.Len(t, r.Events, 1)
		require.Equal(t, "app/color", string(r.Events[0].Key))
		require.Equal(t, rev, r.Events[0].ModRevision)
		require.True(t, srv.HasLeader())
		require.True(t, srv.IsLeader(), "a member alone leads")
	})
	require.False(t, srv.HasLeader(), "stopped when the test ended")
}

// TestRestart: a restarted member keeps its data and its endpoint; Stop
// and Restart refuse or ignore a second call.
func TestRestart(t *testing.T) {
	srv := etcdwatchtest.StartEtcd(t)
	endpoint := srv.Endpoint
	conn := memberConn(t, srv)
	put(t, conn, "k", "v")
	require.Error(t, srv.Restart(), "the member is running")
	srv.Stop()
	srv.Stop()
	require.False(t, srv.HasLeader())
	require.False(t, srv.IsLeader())
	require.NoError(t, srv.Restart())
	require.Equal(t, endpoint, srv.Endpoint)
	require.Equal(t, "v", get(t, conn, "k"), "on the same connection, after a restart")
}

// TestStartCluster: every member serves and knows the leader; options
// apply to each member; a stopped leader is replaced and comes back as a
// follower.
func TestStartCluster(t *testing.T) {
	var members []*etcdwatchtest.Server
	t.Run("user", func(t *testing.T) { members = userOfCluster(t) })
	for _, m := range members {
		require.False(t, m.HasLeader(), "%s stopped when the test ended", m.Name)
	}
}

func userOfCluster(t *testing.T) []*etcdwatchtest.Server {
	configured := map[string]bool{} // a start tried again runs the Option again
	members := etcdwatchtest.StartCluster(t, 3, func(c *embed.Config) {
		configured[c.Name] = true
	})
	require.Len(t, members, 3)
	require.Equal(t, map[string]bool{"m0": true, "m1": true, "m2": true}, configured)
	var leader *etcdwatchtest.Server
	for i, m := range members {
		require.Equal(t, fmt.Sprint("m", i), m.Name)
		require.True(t, m.HasLeader(), m.Name)
		if m.IsLeader() {
			require.Nil(t, leader, "two leaders")
			leader = m
		}
	}
	require.NotNil(t, leader)
	put(t, memberConn(t, leader), "k", "v")

	leader.Stop()
	require.False(t, leader.HasLeader())
	require.Eventually(t, func() bool {
		for _, m := range members {
			if m.IsLeader() {
				return true
			}
		}
		return false
	}, wait, 10*time.Millisecond, "no new leader")
	require.NoError(t, leader.Restart())
	require.Eventually(t, leader.HasLeader, wait, 10*time.Millisecond)
	kv := pb.NewKVClient(memberConn(t, leader))
	require.Eventually(t, func() bool { // a read may meet an election the restart set off ("leader changed")
		resp, err := kv.Range(testContext(t), &pb.RangeRequest{Key: []byte("k")})
		return err == nil && len(resp.Kvs) == 1 && string(resp.Kvs[0].Value) == "v"
	}, wait, 10*time.Millisecond, "the restarted member does not serve what it had")
	return members
}

// TestIsolate: an isolated follower loses its leader while clients still
// reach it, and refuses a watch stream that requires a leader; the others
// keep theirs and take writes. Rejoined, it has a leader again and the
// writes made meanwhile.
func TestIsolate(t *testing.T) {
	members := etcdwatchtest.StartCluster(t, 3)
	var victim, leader *etcdwatchtest.Server
	for _, m := range members {
		if m.IsLeader() {
			leader = m
		} else {
			victim = m
		}
	}
	require.NotNil(t, leader)
	victim.Isolate()
	require.Eventually(t, func() bool { return !victim.HasLeader() }, wait, 10*time.Millisecond, "the isolated member kept its leader")
	for _, m := range members {
		if m != victim {
			require.True(t, m.HasLeader(), "%s lost its leader", m.Name)
		}
	}
	put(t, memberConn(t, leader), "isolated", "v")

	ctx := metadata.AppendToOutgoingContext(testContext(t), "hasleader", "true")
	stream, err := pb.NewWatchClient(memberConn(t, victim)).Watch(ctx)
	require.NoError(t, err)
	_, err = stream.Recv()
	require.ErrorIs(t, err, rpctypes.ErrGRPCNoLeader, "a watch stream requiring a leader was served")

	victim.Rejoin()
	require.Eventually(t, victim.HasLeader, wait, 10*time.Millisecond, "the member did not rejoin")
	require.Equal(t, "v", get(t, memberConn(t, victim), "isolated"))
}

// TestIsolateOutlastsAPeersRestart: a member isolated while a peer was
// stopped stays cut off from that peer once it restarts, and once it leads.
// Catches the partition made only between running members: the restarted
// peer's heartbeats reached the isolated member, which had a leader again.
// Found by a review.
func TestIsolateOutlastsAPeersRestart(t *testing.T) {
	members := etcdwatchtest.StartCluster(t, 3)
	_, isolated, stopped := roles(t, members)
	stopped.Stop()
	isolated.Isolate()
	require.Eventually(t, func() bool { return !isolated.HasLeader() }, wait, 10*time.Millisecond, "the isolated member kept its leader")
	require.NoError(t, stopped.Restart()) // with the leader it is a quorum
	lead(t, members, stopped)
	require.Never(t, isolated.HasLeader, 2*time.Second, 10*time.Millisecond,
		"the isolated member has a leader: the restarted peer is not cut off from it")
}

// restartedIsolated starts a 3-member cluster and returns a follower of
// it isolated, stopped and restarted: running, and cut off.
func restartedIsolated(t *testing.T) *etcdwatchtest.Server {
	t.Helper()
	_, isolated, _ := roles(t, etcdwatchtest.StartCluster(t, 3))
	isolated.Isolate()
	isolated.Stop()
	require.NoError(t, isolated.Restart())
	return isolated
}

// TestRestartOfAnIsolatedMember: an isolated member stopped and restarted
// is running and still cut off, as Isolate's doc has it, and serves once
// it rejoins. Catches a Restart that waited for it to serve, which it
// cannot while isolated: it returned "not ready after a minute".
func TestRestartOfAnIsolatedMember(t *testing.T) {
	isolated := restartedIsolated(t)
	require.Never(t, isolated.HasLeader, 2*time.Second, 10*time.Millisecond, "the restarted member is not cut off")
	isolated.Rejoin()
	require.Eventually(t, isolated.HasLeader, wait, 10*time.Millisecond, "the member has no leader once it rejoined")
}

// TestStopOfAMemberThatNeverServed: an isolated member restarted, and
// stopped before it rejoined (so before it ever served), stops. Catches
// embed's Close waiting for ever on a server that never served: a test
// that ends with such a member hung in its cleanup.
func TestStopOfAMemberThatNeverServed(t *testing.T) {
	isolated := restartedIsolated(t)
	stopped := make(chan struct{})
	go func() { // returns once Stop does; waited for below, or the test fails
		defer close(stopped)
		isolated.Stop()
	}()
	select {
	case <-stopped:
	case <-time.After(wait):
		t.Fatal("Stop of a member that never served did not return")
	}
	require.False(t, isolated.HasLeader())
}

// TestRejoinLeavesAnotherMemberIsolated: with two members isolated, Rejoin
// of one leaves the other cut off, from it too. Catches Rejoin mending
// every link of the member, that to the member still isolated included,
// which then had a leader once the rejoined member led. Found by a review.
func TestRejoinLeavesAnotherMemberIsolated(t *testing.T) {
	members := etcdwatchtest.StartCluster(t, 3)
	_, first, second := roles(t, members)
	first.Isolate()
	second.Isolate()
	require.Eventually(t, func() bool { return !second.HasLeader() }, wait, 10*time.Millisecond, "the isolated member kept its leader")
	first.Rejoin()
	lead(t, members, first)
	require.Never(t, second.HasLeader, 2*time.Second, 10*time.Millisecond,
		"the member still isolated has a leader: Rejoin of another member reconnected it")
}

// roles returns the leader of members, a 3-member cluster, and the two
// others.
func roles(t *testing.T, members []*etcdwatchtest.Server) (leader, a, b *etcdwatchtest.Server) {
	t.Helper()
	require.Eventually(t, func() bool {
		leader, a, b = nil, nil, nil
		for _, m := range members {
			switch {
			case m.IsLeader():
				leader = m
			case a == nil:
				a = m
			default:
				b = m
			}
		}
		return leader != nil && b != nil
	}, wait, 10*time.Millisecond, "no leader")
	return leader, a, b
}

// lead makes m the leader of members once they have one. A transfer to a
// member still catching up (one that has just rejoined, say) can fail as
// "leader transfer took too long": it is asked again, from whichever
// member leads then, until m leads.
func lead(t *testing.T, members []*etcdwatchtest.Server, m *etcdwatchtest.Server) {
	t.Helper()
	st, err := pb.NewMaintenanceClient(memberConn(t, m)).Status(testContext(t), &pb.StatusRequest{})
	require.NoError(t, err)
	target := &pb.MoveLeaderRequest{TargetID: st.Header.MemberId}
	conns := map[*etcdwatchtest.Server]pb.MaintenanceClient{}
	for _, x := range members {
		conns[x] = pb.NewMaintenanceClient(memberConn(t, x))
	}
	require.Eventually(t, func() bool {
		if m.IsLeader() {
			return true
		}
		for _, x := range members {
			if x.IsLeader() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				if _, err := conns[x].MoveLeader(ctx, target); err != nil {
					t.Logf("moving the leader to %s: %v; again", m.Name, err)
					return false
				}
				return m.IsLeader()
			}
		}
		return false
	}, wait, 100*time.Millisecond, "%s does not lead", m.Name)
}

// TestOption: an Option changes the member's configuration, here to accept
// a request larger than etcd's default limit of 1.5 MiB.
func TestOption(t *testing.T) {
	srv := etcdwatchtest.StartEtcd(t, func(c *embed.Config) { c.MaxRequestBytes = 4 << 20 })
	conn := memberConn(t, srv)
	put(t, conn, "big", strings.Repeat("x", 2<<20))
}

// TestStartClusterIn: the form that returns errors keeps its data under
// the given directory and refuses a cluster without members; StopAll stops
// every member.
func TestStartClusterIn(t *testing.T) {
	dir := t.TempDir()
	members, err := etcdwatchtest.StartClusterIn(dir, 3)
	require.NoError(t, err)
	defer etcdwatchtest.StopAll(members...) // on failure
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.NotEmpty(t, entries)
	put(t, memberConn(t, members[0]), "k", "v")
	start := time.Now()
	etcdwatchtest.StopAll(members...)
	t.Logf("StopAll took %v", time.Since(start))
	for _, m := range members {
		require.False(t, m.HasLeader(), m.Name)
	}

	_, err = etcdwatchtest.StartClusterIn(t.TempDir(), 0)
	require.Error(t, err)
}

// TestStartClusterInRetriesPortsInUseOnly: a start that fails for a port
// in use is tried again, three times in all; one that fails otherwise
// (here a configuration etcd refuses) is not. The Options run once a try.
// Catches retrying every failure, which made a bad Option cost three
// starts.
func TestStartClusterInRetriesPortsInUseOnly(t *testing.T) {
	t.Run("refused configuration", func(t *testing.T) {
		tries := 0
		_, err := etcdwatchtest.StartClusterIn(t.TempDir(), 1, func(c *embed.Config) {
			tries++
			c.ElectionMs = c.TickMs
		})
		require.Error(t, err)
		require.Equal(t, 1, tries, "tried again: %v", err)
	})
	t.Run("port in use", func(t *testing.T) {
		taken, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		defer taken.Close()
		u := url.URL{Scheme: "http", Host: taken.Addr().String()}
		tries := 0
		_, err = etcdwatchtest.StartClusterIn(t.TempDir(), 1, func(c *embed.Config) {
			tries++
			c.ListenPeerUrls, c.AdvertisePeerUrls = []url.URL{u}, []url.URL{u}
		})
		require.ErrorIs(t, err, syscall.EADDRINUSE)
		require.Equal(t, 3, tries)
	})
}

// TestRestartWaitsUntilItServes: Restart returns once the member
// serves, as its doc says: a member alone leads by then. Catches a Restart
// that returns as soon as etcd has started, before it has a leader.
func TestRestartWaitsUntilItServes(t *testing.T) {
	srv := etcdwatchtest.StartEtcd(t)
	srv.Stop()
	require.NoError(t, srv.Restart())
	require.True(t, srv.HasLeader(), "Restart returned before the member served")
	require.True(t, srv.IsLeader())
}

package e2e

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdwatch/etcdwatch"
	"github.com/etcdwatch/etcdwatch/dial"
	"github.com/etcdwatch/etcdwatch/etcdwatchtest"
	"github.com/etcdwatch/etcdwatch/group"
)

// clusterOf returns the members' endpoints, a client on them all, and
// each endpoint's member id.
func clusterOf(t *testing.T, members []*etcdwatchtest.Server) (endpoints []string, setup *clientv3.Client, ids map[string]uint64) {
	t.Helper()
	for _, m := range members {
		endpoints = append(endpoints, m.Endpoint)
	}
	setup = clientFor(t, endpoints...)
	ids = map[string]uint64{}
	for _, ep := range endpoints {
		st, err := setup.Status(ctx(t), ep)
		require.NoError(t, err)
		ids[ep] = st.Header.MemberId
	}
	return endpoints, setup, ids
}

// lastMember returns the member that sent the last response the watch
// delivered.
func (r *recording) lastMember() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.resps) == 0 {
		return 0
	}
	return r.resps[len(r.resps)-1].Header.MemberID
}

// watchedGroup is a Group under test and its watches: recs[i] is on
// Stream i%3 (fresh Streams take turns).
type watchedGroup struct {
	name   string
	g      *group.Group
	recs   []*recording
	before []string // each Stream's member before the kill
}

// watchGroup opens each of the varied watches three times in a row on g,
// so that each of its 3 Streams gets every kind, from revision start.
func watchGroup(t *testing.T, name string, g *group.Group, prefix string, start int64) *watchedGroup {
	t.Helper()
	var reqs []etcdwatch.Request
	for _, r := range []etcdwatch.Request{
		etcdwatch.Prefix(prefix),
		etcdwatch.Prefix(prefix).WithPrevKV(),
		etcdwatch.Prefix(prefix).WithoutDeletes(),
		etcdwatch.Prefix(prefix).WithoutPuts().WithPrevKV(),
		etcdwatch.Key(prefix + "k01").WithPrevKV(),
		etcdwatch.Range(prefix+"k00", prefix+"k05"),
		etcdwatch.Prefix(prefix).WithFragment(),
	} {
		for range 3 {
			reqs = append(reqs, r.FromRevision(start))
		}
	}
	watches, err := g.WatchAll(t.Context(), reqs...) // they end with the test
	require.NoError(t, err)
	wg := &watchedGroup{name: name, g: g}
	for _, w := range watches {
		wg.recs = append(wg.recs, record(w, start))
	}
	for _, s := range g.Streams()[:3] {
		require.NotEmpty(t, s.Member, "%s: Stream %s has answered, from some member", name, s.Name)
		require.NoError(t, s.State.LastError)
		wg.before = append(wg.before, s.Member)
	}
	return wg
}

// bookmarked waits for a bookmark on every watch of the group, asked for
// now, and checks that each watch's comes from its Stream's member.
func (wg *watchedGroup) bookmarked(t *testing.T, ids map[string]uint64) {
	t.Helper()
	rev, err := wg.g.RequestProgress(ctx(t))
	require.NoError(t, err)
	waitDelivered(t, rev, wg.recs...)
	streams := wg.g.Streams()
	for i, r := range wg.recs {
		require.Equal(t, ids[streams[i%3].Member], r.lastMember(), "%s: %s, on Stream %d, answered by its member", wg.name, r.w.Request(), i%3)
	}
}

// TestGroupMemberFailure: two Groups on a 3-member cluster, each with 3
// Streams and 21 varied watches under one writer. Dial's puts Stream i on
// member i; New's, over one dial.New connection, lets round_robin place
// them. A follower is stopped: in each Group the Streams that were on it,
// and only those, reconnect to another member, where their watches resume
// (only their Stats count reconnects and moved watches); the other
// Streams' watches deliver a write made after the cut from the members
// they were on. The victim is restarted, and Dial's Stream whose home it
// is goes back to it, while the others stay. Then every watch's whole
// history is checked.
func TestGroupMemberFailure(t *testing.T) {
	leakCheck(t)
	members := etcdwatchtest.StartCluster(t, 3)
	endpoints, setup, ids := clusterOf(t, members)
	start := currentRevision(t, setup) + 1
	prefix := unique("group")

	dialed, err := group.Dial(endpoints, group.WithDialOptions(dial.WithInsecure()), group.WithStreamOptions(fastRetry),
		group.WithHoming(500*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, dialed.Close()) })
	conn, err := dial.New(endpoints, dial.WithInsecure())
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, conn.Close()) })
	shared, err := group.New(conn, group.WithStreamOptions(fastRetry))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, shared.Close()) })
	groups := []*watchedGroup{
		watchGroup(t, "Dial", dialed, prefix, start),
		watchGroup(t, "New", shared, prefix, start),
	}
	require.Equal(t, endpoints, groups[0].before, "Dial: Stream i on member i")

	// The victim: a follower (no election to wait for), one that New's
	// Streams use if they use one.
	victim := -1
	for i, m := range members {
		if !m.IsLeader() && (victim < 0 || slices.Contains(groups[1].before, m.Endpoint)) {
			victim = i
		}
	}
	var survivors []string
	for i, ep := range endpoints {
		if i != victim {
			survivors = append(survivors, ep)
		}
	}
	w := startWriter(t, clientFor(t, survivors...), prefix, 10) // never waits for the victim
	for _, wg := range groups {
		wg.bookmarked(t, ids)
	}

	// etcd's Stop drains watch streams for up to its request timeout (5s)
	// before it cuts them: the victim is gone for the watches on it once
	// their Stream sees its gRPC stream end.
	down := time.Now()
	stopped := make(chan struct{})
	go func() { // returns once the member has stopped; waited for below
		defer close(stopped)
		members[victim].Stop()
	}()
	require.Eventually(t, func() bool { return dialed.Streams()[victim].State.LastError != nil }, wait, time.Millisecond,
		"the victim's Stream did not see its gRPC stream end")
	cut := time.Now()
	after := w.committedAfter(t) // a write made once the victim's streams were cut
	var moved, stayed []*recording
	for _, wg := range groups {
		for i, r := range wg.recs {
			if wg.before[i%3] == endpoints[victim] {
				moved = append(moved, r)
			} else {
				stayed = append(stayed, r)
			}
		}
	}
	for _, r := range stayed {
		waitDelivered(t, w.lastMatching(r, after), r)
	}
	stayedAt := time.Since(cut)
	for _, r := range moved {
		waitDelivered(t, w.lastMatching(r, after), r)
	}
	movedAt := time.Since(cut)
	<-stopped
	running(t, append(moved, stayed...))

	for _, wg := range groups {
		wg.bookmarked(t, ids) // each watch answered by its Stream's member now
		for i, s := range wg.g.Streams()[:3] {
			if wg.before[i] != endpoints[victim] {
				require.Zero(t, s.Stats.Reconnects, "%s: Stream %d was not on the victim", wg.name, i)
				require.Zero(t, s.Stats.Moved, "%s: Stream %d was not on the victim", wg.name, i)
				require.Equal(t, wg.before[i], s.Member, "%s: Stream %d stayed", wg.name, i)
				continue
			}
			require.GreaterOrEqual(t, s.Stats.Reconnects, uint64(1), "%s: Stream %d was on the victim", wg.name, i)
			require.EqualValues(t, 7, s.Stats.Moved, "%s: each of Stream %d's watches resumed, once", wg.name, i)
			require.NotEqual(t, endpoints[victim], s.Member, "%s: Stream %d moved", wg.name, i)
		}
	}
	require.Equal(t, endpoints[(victim+1)%3], dialed.Streams()[victim].Member, "Dial: the victim's Stream moved to the next member up")

	// The victim comes back. Once it has been up for the settle time,
	// Dial's Stream whose home it is goes back to it, and that Stream's
	// watches resume there; the other Streams stay where they are.
	require.NoError(t, members[victim].Restart())
	require.Eventually(t, func() bool { return dialed.Streams()[victim].Member == endpoints[victim] }, wait, 10*time.Millisecond,
		"the victim's Stream did not go home")
	home := w.committedAfter(t)
	for _, r := range groups[0].recs {
		waitDelivered(t, w.lastMatching(r, home), r)
	}
	groups[0].bookmarked(t, ids) // answered by the victim again on its Stream
	for i, s := range dialed.Streams()[:3] {
		require.Equal(t, endpoints[i], s.Member, "Dial: Stream %d on its own member", i)
		if i != victim {
			require.Zero(t, s.Stats.Reconnects, "Dial: Stream %d never moved", i)
			continue
		}
		require.EqualValues(t, 14, s.Stats.Moved, "Dial: each of Stream %d's watches resumed twice, away and home", i)
	}

	var all []*recording
	for _, wg := range groups {
		all = append(all, wg.recs...)
	}
	events := finish(t, w, all)
	t.Logf("member %d of 3 (a follower) stopped; its watch streams cut %v into the stop. Dial's Streams on %v, New's on %v. "+
		"The %d watches on other members had a write made after the cut %v after it, the %d on the victim %v after; "+
		"%d transactions, %d events checked over %d watches; moved: Dial %d, New %d; lost 0, duplicated 0",
		victim, cut.Sub(down).Round(time.Millisecond), groups[0].before, groups[1].before,
		len(stayed), stayedAt.Round(time.Millisecond), len(moved), movedAt.Round(time.Millisecond),
		w.txns, events, len(all), dialed.Stats().Moved, shared.Stats().Moved)
}

// TestGroupLeaderlessMember: a follower cut off from its peers (etcd's own
// partition hook) loses its leader while clients still reach it, and with
// WithRequireLeader etcd ends the watch streams on it. Dial's Stream whose
// home it is moves to the next member, where its watches deliver the
// writes the others commit; the other Streams never move. Once the member
// rejoins and has a leader for the settle time, that Stream goes home, its
// watches resuming there. Then every watch's whole history is checked.
func TestGroupLeaderlessMember(t *testing.T) {
	leakCheck(t)
	members := etcdwatchtest.StartCluster(t, 3)
	endpoints, setup, ids := clusterOf(t, members)
	victim := slices.IndexFunc(members, func(m *etcdwatchtest.Server) bool { return !m.IsLeader() })
	var survivors []string
	for i, ep := range endpoints {
		if i != victim {
			survivors = append(survivors, ep)
		}
	}
	start := currentRevision(t, setup) + 1
	prefix := unique("leaderless")
	g, err := group.Dial(endpoints, group.WithDialOptions(dial.WithInsecure()),
		group.WithStreamOptions(fastRetry, etcdwatch.WithRequireLeader()), group.WithHoming(500*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, g.Close()) })
	wg := watchGroup(t, "Dial", g, prefix, start)
	require.Equal(t, endpoints, wg.before, "Dial: Stream i on member i")
	w := startWriter(t, clientFor(t, survivors...), prefix, 10) // never waits for the victim
	wg.bookmarked(t, ids)

	members[victim].Isolate()
	require.Eventually(t, func() bool { return g.Streams()[victim].Member != endpoints[victim] }, wait, 10*time.Millisecond,
		"the leaderless member's Stream did not move")
	require.False(t, members[victim].HasLeader())
	away := w.committedAfter(t)
	for _, r := range wg.recs {
		waitDelivered(t, w.lastMatching(r, away), r)
	}
	wg.bookmarked(t, ids) // each watch answered by its Stream's member now
	require.Equal(t, endpoints[(victim+1)%3], g.Streams()[victim].Member, "moved to the next member")
	require.EqualValues(t, 7, g.Streams()[victim].Stats.Moved, "each of its watches resumed once")

	members[victim].Rejoin()
	require.Eventually(t, func() bool { return g.Streams()[victim].Member == endpoints[victim] }, wait, 10*time.Millisecond,
		"the Stream did not go home")
	home := w.committedAfter(t)
	for _, r := range wg.recs {
		waitDelivered(t, w.lastMatching(r, home), r)
	}
	wg.bookmarked(t, ids) // answered by the victim again on its Stream
	for i, s := range g.Streams()[:3] {
		require.Equal(t, endpoints[i], s.Member, "Stream %d on its own member", i)
		if i != victim {
			require.Zero(t, s.Stats.Reconnects, "Stream %d never moved", i)
			continue
		}
		require.EqualValues(t, 14, s.Stats.Moved, "each of Stream %d's watches resumed twice, away and home", i)
	}
	events := finish(t, w, wg.recs)
	t.Logf("member %d of 3 (a follower) isolated, then rejoined; %d transactions, %d events checked over %d watches; moved %d; lost 0, duplicated 0",
		victim, w.txns, events, len(wg.recs), g.Stats().Moved)
}

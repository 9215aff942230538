package group

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/connectivity"
)

func TestChoose(t *testing.T) {
	const (
		ready = connectivity.Ready
		conn  = connectivity.Connecting
		idle  = connectivity.Idle
		fail  = connectivity.TransientFailure
		shut  = connectivity.Shutdown
	)
	up := func(s connectivity.State) memberState { return memberState{state: s} }
	noLeader := func(s connectivity.State) memberState { return memberState{state: s, leaderless: true} }
	fresh := func(s connectivity.State) memberState { return memberState{state: s, fresh: true} }
	for _, tc := range []struct {
		name string
		ms   []memberState
		want int
	}{
		{"home ready", []memberState{up(ready), up(ready), up(ready)}, 0},
		{"home down: the next ready", []memberState{up(fail), up(fail), up(ready)}, 2},
		{"home connecting: another ready first", []memberState{up(conn), up(ready)}, 1},
		{"home leaderless: the next ready with a leader", []memberState{noLeader(ready), up(fail), up(ready)}, 2},
		{"none ready: the first connecting", []memberState{up(fail), up(conn), up(idle)}, 1},
		{"idle counts as connecting", []memberState{up(fail), up(idle)}, 1},
		{"connecting beats ready leaderless", []memberState{noLeader(ready), up(conn)}, 1},
		{"connecting leaderless does not", []memberState{up(fail), noLeader(conn), noLeader(ready)}, 2},
		{"all leaderless: the first ready", []memberState{noLeader(fail), noLeader(ready), noLeader(ready)}, 1},
		{"all down: home", []memberState{up(fail), up(fail), noLeader(fail)}, 0},
		{"closed: home", []memberState{up(shut), up(shut)}, 0},
		{"one member", []memberState{up(fail)}, 0},
		{"home on its first attempt: wait for it", []memberState{fresh(conn), up(ready)}, 0},
		{"home idle before its first attempt", []memberState{fresh(idle), up(ready)}, 0},
		{"home's first attempt failed", []memberState{fresh(fail), up(ready)}, 1},
		{"fresh but leaderless", []memberState{{state: conn, fresh: true, leaderless: true}, up(ready)}, 1},
		{"a fresh member after home", []memberState{up(fail), fresh(conn), up(ready)}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, choose(tc.ms))
		})
	}
}

func TestHomeDue(t *testing.T) {
	now := time.Unix(1000, 0)
	for _, tc := range []struct {
		name   string
		settle time.Duration
		up     time.Time
		want   bool
	}{
		{"up for the settle time", 5 * time.Second, now.Add(-5 * time.Second), true},
		{"up longer", 5 * time.Second, now.Add(-time.Hour), true},
		{"up not long enough", 5 * time.Second, now.Add(-5*time.Second + time.Nanosecond), false},
		{"not up", 5 * time.Second, time.Time{}, false},
		{"homing off", 0, now.Add(-time.Hour), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, homeDue(tc.settle, tc.up, now))
		})
	}
}

package health

import (
	"testing"
	"time"
)

// TestSince: for every pair of states, in both orders. Catches Since taken
// as the later of the two whatever they are (a stream coming back moved
// the start of an outage another stream still had).
func TestSince(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	type state struct {
		up    bool
		since int
	}
	for _, tc := range []struct {
		name string
		a, b state
		want int
	}{
		{"both up: the later came up", state{true, 1}, state{true, 3}, 3},
		{"a down, b up since later", state{false, 1}, state{true, 3}, 1},
		{"a up, b down", state{true, 1}, state{false, 3}, 3},
		{"a up since later, b down", state{true, 5}, state{false, 3}, 3},
		{"both down: the first went down", state{false, 4}, state{false, 2}, 2},
	} {
		for _, o := range [][2]state{{tc.a, tc.b}, {tc.b, tc.a}} {
			if got := Since(o[0].up, at(o[0].since), o[1].up, at(o[1].since)); !got.Equal(at(tc.want)) {
				t.Errorf("%s: since %v, want %v", tc.name, got.Sub(t0), at(tc.want).Sub(t0))
			}
		}
	}
}

// TestSteady: Since moves only when connected changes, or when a stream
// whose blips count came up after the Since kept. Catches a Since that
// follows every read (a stream joining moved it) or none.
func TestSteady(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	var k Steady
	for i, step := range []struct {
		up        bool
		since, by int // by: a counted stream up since then; -1 none
		want      int
	}{
		{true, 1, -1, 1}, // first read
		{true, 3, -1, 1}, // a stream joined, up since 3: no change
		{true, 1, 1, 1},  // it left
		{false, 4, -1, 4},
		{false, 5, -1, 4}, // another went down too
		{true, 6, 6, 6},   // all up again
		{true, 9, 9, 9},   // a counted stream came up at 9: it went down and up between reads
		{true, 12, 2, 9},  // a stream up since 12 joined; the counted one is up since 2
	} {
		up := time.Time{}
		if step.by >= 0 {
			up = at(step.by)
		}
		if got := k.Keep(step.up, at(step.since), up); !got.Equal(at(step.want)) {
			t.Fatalf("step %d: since %v, want %v", i, got.Sub(t0), at(step.want).Sub(t0))
		}
	}
}

// TestSteadyUpBoundaries: a counted stream up since exactly the Since
// kept is no blip (only one up since later is), and a counted stream's up
// time means nothing while the state is down: a down state keeps the Since
// of its first read. Catches "later" read as "not earlier", and the blip
// rule applied to a down state (the start of an outage moved by a stream
// that came back while others were still down).
func TestSteadyUpBoundaries(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	type step struct {
		up        bool
		since, by int // by: a counted stream up since then; -1 none
		want      int
	}
	for name, steps := range map[string][]step{
		"up since the Since kept":               {{true, 1, 1, 1}, {true, 3, 1, 1}},
		"down, a counted stream up since later": {{false, 4, -1, 4}, {false, 6, 5, 4}},
	} {
		var k Steady
		for i, s := range steps {
			up := time.Time{}
			if s.by >= 0 {
				up = at(s.by)
			}
			if got := k.Keep(s.up, at(s.since), up); !got.Equal(at(s.want)) {
				t.Fatalf("%s, step %d: since %v, want %v", name, i, got.Sub(t0), at(s.want).Sub(t0))
			}
		}
	}
}

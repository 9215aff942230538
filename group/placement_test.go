package group

import (
	"slices"
	"testing"
)

// TestPlacement: the Streams placement chooses for a call's watches, one
// watch after another, and the counts it leaves. Candidates are written
// as watches, health, member and pinned; each case places the watches of
// one call (pin marks those pinned) and lists the Stream chosen for each.
func TestPlacement(t *testing.T) {
	ok := func(watches int, member string) candidate {
		return candidate{watches: watches, healthy: true, member: member}
	}
	down := func(watches int, member string) candidate {
		return candidate{watches: watches, member: member}
	}
	pin := func(member string) candidate {
		return candidate{watches: 1, healthy: true, member: member, pinned: true}
	}
	pinOn := func(on int, member string) candidate { // opened on Stream on's connection
		return candidate{watches: 1, healthy: true, member: member, pinned: true, on: on}
	}
	for _, tc := range []struct {
		name  string
		cands []candidate
		pin   []bool // per watch placed; none: n watches, none pinned
		n     int
		want  []int // the Stream of each watch
		after []int // watches per candidate afterwards (pinned ones appended)
	}{
		{name: "fresh Streams take turns, lowest first",
			cands: []candidate{ok(0, ""), ok(0, ""), ok(0, "")}, n: 7,
			want: []int{0, 1, 2, 0, 1, 2, 0}, after: []int{3, 2, 2}},
		{name: "the emptiest Stream until it catches up",
			cands: []candidate{ok(5, "a"), ok(0, "b"), ok(3, "c")}, n: 6,
			want: []int{1, 1, 1, 1, 2, 1}, after: []int{5, 5, 4}},
		{name: "a Stream that failed gets nothing while another is healthy",
			cands: []candidate{down(0, ""), ok(3, "b"), ok(3, "c")}, n: 4,
			want: []int{1, 2, 1, 2}, after: []int{0, 5, 5}},
		{name: "a fresh Stream that has not failed is healthy",
			cands: []candidate{ok(2, "a"), {healthy: true}, down(0, "c")}, n: 3,
			want: []int{1, 1, 0}, after: []int{3, 2, 0}},
		{name: "a Stream that failed for good gets nothing while another has not, healthy or not",
			cands: []candidate{{failed: true}, down(3, "b"), down(4, "c")}, n: 3,
			want: []int{1, 1, 2}, after: []int{0, 5, 5}},
		{name: "a Stream that failed for good is not healthy, whatever it says",
			cands: []candidate{{healthy: true, failed: true}, down(3, "b")}, n: 2,
			want: []int{1, 1}, after: []int{0, 5}},
		{name: "when every Stream failed for good, one is chosen all the same: its refusal says why",
			cands: []candidate{{failed: true, watches: 1}, {failed: true}}, n: 1,
			want: []int{1}, after: []int{1, 1}},
		{name: "when every Stream failed, balanced over them all",
			cands: []candidate{down(1, ""), down(0, ""), down(2, "")}, n: 4,
			want: []int{1, 0, 1, 0}, after: []int{3, 2, 2}},
		{name: "two Streams on one member share its part",
			cands: []candidate{ok(0, "a"), ok(0, "a"), ok(0, "b")}, n: 8,
			// a:0 b:0 -> s0; a:1 b:0 -> s2; a:1 b:1 -> s1 (a's emptier); a:2 b:1 -> s2; ...
			want: []int{0, 2, 1, 2, 0, 2, 1, 2}, after: []int{2, 2, 4}},
		{name: "a Stream whose member is unknown counts as a member of its own",
			cands: []candidate{ok(2, "a"), ok(2, "a"), ok(3, "")}, n: 3,
			// a holds 4 over two Streams, the unknown one 3: it first; then a tie, s0 (fewer watches than s2)
			want: []int{2, 0, 2}, after: []int{3, 2, 5}},
		{name: "health first, then members",
			cands: []candidate{down(4, "a"), ok(4, "b"), ok(0, "b"), ok(3, "c")}, n: 3,
			// b holds 4, c 3: c first; then b:4 c:4, and s2 has the fewest; then b:5 c:4
			want: []int{3, 2, 3}, after: []int{4, 4, 1, 5}},
		{name: "pinned Streams weigh on their member and take no watch",
			cands: []candidate{ok(1, "a"), ok(1, "b"), pin("a"), pin("a")}, n: 3,
			want: []int{1, 1, 0}, after: []int{2, 3, 1, 1}},
		{name: "a pinned watch goes to the emptiest member's connection and weighs on it",
			cands: []candidate{ok(2, "a"), ok(0, "b"), ok(1, "c")},
			pin:   []bool{true, false, true, false},
			// pinned on b (a:2 b:0 c:1), b:1; plain: b:1 c:1, s1 has fewer, b:2;
			// pinned on c (a:2 b:2 c:1), c:2; plain: all 2, s1 and s2 have 1, s1
			want: []int{1, 1, 2, 1}, after: []int{2, 2, 1, 1, 1}},
		{name: "pinned watches on fresh Streams take turns, as plain ones do",
			cands: []candidate{ok(0, ""), ok(0, ""), ok(0, "")}, pin: []bool{true, true, true},
			want: []int{0, 1, 2}, after: []int{0, 0, 0, 1, 1, 1}},
		{name: "a pinned Stream not yet answered weighs on the connection it opened on",
			cands: []candidate{ok(0, ""), ok(0, ""), pinOn(0, "")}, n: 2,
			// s0 carries 1, s1 0: s1; then a tie, s0 (fewer watches of its own)
			want: []int{1, 0}, after: []int{1, 1, 1}},
		{name: "an idle Stream, its member unknown, carries the pinned ones opened on its connection",
			cands: []candidate{ok(0, ""), ok(0, "b"), pinOn(0, "a"), pinOn(0, "a")}, n: 2,
			want: []int{1, 1}, after: []int{0, 2, 1, 1}},
		{name: "a pinned Stream not yet answered weighs on its member for every Stream there",
			cands: []candidate{ok(0, "a"), ok(0, "a"), ok(0, "b"), pinOn(1, "")}, n: 1,
			// member a carries 1, seen from s0 as from s1: b's s2 (s0 saw a empty)
			want: []int{2}, after: []int{0, 0, 1, 1}},
		{name: "a pinned watch is placed by health too",
			cands: []candidate{down(0, "a"), ok(5, "b")}, pin: []bool{true},
			want: []int{1}, after: []int{0, 5, 1}},
		{name: "no Stream to choose",
			cands: []candidate{pin("a")}, n: 1,
			want: []int{-1}, after: []int{1}},
	} {
		p := placement{cands: slices.Clone(tc.cands)}
		pins := tc.pin
		if pins == nil {
			pins = make([]bool, tc.n)
		}
		var got []int
		for _, pinned := range pins {
			got = append(got, p.next(pinned))
		}
		var after []int
		for _, c := range p.cands {
			after = append(after, c.watches)
		}
		if !slices.Equal(got, tc.want) || !slices.Equal(after, tc.after) {
			t.Errorf("%s: chose %v leaving %v; want %v leaving %v", tc.name, got, after, tc.want, tc.after)
		}
		// Each pinned watch adds a pinned candidate on its chosen Stream's member.
		k := len(tc.cands)
		for w, pinned := range pins {
			if !pinned {
				continue
			}
			if c := p.cands[k]; !c.pinned || c.member != tc.cands[got[w]].member || c.on != got[w] {
				t.Errorf("%s: pinned watch %d left %+v; want pinned on Stream %d's connection, member %q", tc.name, w, c, got[w], tc.cands[got[w]].member)
			}
			k++
		}
	}
}

// TestPlacementPinnedStreamsDoNotDecideHealth: pinned Streams take no
// watch, so they count for placement's load only, never for rule 1's "while
// another is healthy" or "while another has not failed for good": a healthy
// pinned Stream must not make every own Stream reconnecting ineligible,
// nor a live pinned Stream every own Stream that failed for good (either
// leaves no Stream to choose: -1, which Group.place indexes with).
func TestPlacementPinnedStreamsDoNotDecideHealth(t *testing.T) {
	pin := func(member string) candidate {
		return candidate{watches: 1, healthy: true, member: member, pinned: true}
	}
	for _, tc := range []struct {
		name  string
		cands []candidate
		n     int
		want  []int
		after []int
	}{
		{name: "every own Stream reconnecting, a pinned one healthy: balanced over the own ones",
			cands: []candidate{{member: "a"}, {member: "b"}, pin("a")}, n: 3,
			// a carries the pinned watch: s1; then a:1 b:1, s0 has fewer; then a:2 b:1
			want: []int{1, 0, 1}, after: []int{1, 2, 1}},
		{name: "every own Stream failed for good, a pinned one alive: one is chosen all the same",
			cands: []candidate{{failed: true, member: "a"}, {failed: true, member: "b"}, pin("a")}, n: 2,
			want: []int{1, 0}, after: []int{1, 1, 1}},
	} {
		p := placement{cands: slices.Clone(tc.cands)}
		var got []int
		for range tc.n {
			got = append(got, p.next(false))
		}
		var after []int
		for _, c := range p.cands {
			after = append(after, c.watches)
		}
		if !slices.Equal(got, tc.want) || !slices.Equal(after, tc.after) {
			t.Errorf("%s: chose %v leaving %v; want %v leaving %v", tc.name, got, after, tc.want, tc.after)
		}
	}
}

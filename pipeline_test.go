package etcdwatch

import (
	"testing"
	"time"
)

// TestPipeline: the create-pipelining policy, event by event. A new stream
// pipelines creates but must see its first answer echo the oldest create's
// id; an echo trusts the stream; a server's own ids make it one at a time
// for good, on that stream and every later one; a refusal that cannot be
// matched makes the next stream one at a time until it echoes.
func TestPipeline(t *testing.T) {
	type step struct {
		event       string // opened, echo, own, unmatchedRefusal, unmatchedID
		wantMode    createMode
		wantStart   startMode
		wantInOrder bool // maxInFlight is 1
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"a server that echoes", []step{
			{"opened", unproven, startUnproven, false},
			{"echo", trusted, startUnproven, false},
			{"own", ownIDs, startProxied, true}, // a trusted stream that stops echoing is not trusted
			{"opened", oneByOne, startProxied, true},
		}},
		{"a proxy found on the first answer", []step{
			{"opened", unproven, startUnproven, false},
			{"own", ownIDs, startProxied, true},
			{"echo", ownIDs, startProxied, true}, // an echo does not undo a proxy on its stream
			{"opened", oneByOne, startProxied, true},
			{"echo", trusted, startProxied, false}, // a stream that echoes is trusted, but the next starts one by one
			{"opened", oneByOne, startProxied, true},
		}},
		{"a proxy found by an unmatchable answer", []step{
			{"opened", unproven, startUnproven, false},
			{"unmatchedID", unproven, startProxied, false},
			{"opened", oneByOne, startProxied, true},
		}},
		{"a refusal that cannot be matched", []step{
			{"opened", unproven, startUnproven, false},
			{"unmatchedRefusal", unproven, startOneByOne, false},
			{"opened", oneByOne, startOneByOne, true},
			{"echo", trusted, startUnproven, false},
			{"opened", unproven, startUnproven, false},
		}},
		{"a refusal after a proxy keeps the proxy", []step{
			{"unmatchedID", unproven, startProxied, false},
			{"unmatchedRefusal", unproven, startProxied, false},
			{"opened", oneByOne, startProxied, true},
		}},
	} {
		var p pipeline
		for i, s := range tc.steps {
			found := false
			switch s.event {
			case "opened":
				p.opened()
			case "echo":
				found = p.confirmed(true)
			case "own":
				found = p.confirmed(false)
			case "unmatchedRefusal":
				p.unmatched(true)
			case "unmatchedID":
				p.unmatched(false)
			}
			if found && s.event != "own" {
				t.Errorf("%s, step %d (%s): reported own ids found", tc.name, i, s.event)
			}
			if p.mode != s.wantMode || p.start != s.wantStart || (p.maxInFlight() == 1) != s.wantInOrder {
				t.Errorf("%s, step %d (%s): mode %d start %d max in flight %d; want %d %d, one by one %v",
					tc.name, i, s.event, p.mode, p.start, p.maxInFlight(), s.wantMode, s.wantStart, s.wantInOrder)
			}
		}
	}
}

// TestUnmatchable: only an unproven stream with several creates in flight
// gives up an answer, and only one it cannot match for sure.
func TestUnmatchable(t *testing.T) {
	for _, tc := range []struct {
		mode            createMode
		inFlight        int
		refused, echoed bool
		want            bool
	}{
		{unproven, 2, false, true, false},
		{unproven, 2, false, false, true},
		{unproven, 2, true, false, true},
		{unproven, 1, true, false, false},
		{unproven, 1, false, false, false},
		{trusted, 5, true, false, false},
		{oneByOne, 1, false, false, false},
		{ownIDs, 1, false, false, false},
	} {
		p := pipeline{mode: tc.mode}
		if got := p.unmatchable(tc.inFlight, tc.refused, tc.echoed); got != tc.want {
			t.Errorf("%+v: unmatchable %v, want %v", tc, got, tc.want)
		}
	}
}

// TestProgressRetry: an unanswered progress request is asked again after
// the first delay, then twice as long each time up to the maximum; an
// answer starts the series again.
func TestProgressRetry(t *testing.T) {
	const ms = time.Millisecond
	for _, tc := range []struct {
		first, max time.Duration
		want       []time.Duration
	}{
		{10 * ms, 250 * ms, []time.Duration{10 * ms, 20 * ms, 40 * ms, 80 * ms, 160 * ms, 250 * ms, 250 * ms}},
		{10 * ms, 100 * ms, []time.Duration{10 * ms, 20 * ms, 40 * ms, 80 * ms, 100 * ms}},
		{5 * ms, 5 * ms, []time.Duration{5 * ms, 5 * ms}},
		{time.Hour, time.Hour, []time.Duration{time.Hour, time.Hour}},
	} {
		r := progressRetry{first: tc.first, max: tc.max}
		for i, want := range tc.want {
			if got := r.next(); got != want {
				t.Errorf("max %v, request %d: %v, want %v", tc.max, i, got, want)
			}
		}
		r.reset()
		if got := r.next(); got != tc.first {
			t.Errorf("max %v: after an answer %v, want the series to start again", tc.max, got)
		}
	}
}

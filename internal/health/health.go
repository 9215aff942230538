// Package health holds the rule by which the connection states of two
// streams combine into one: a Stream's with its isolated lanes', and a
// group's Streams'; and Steady, which keeps the result's Since while its
// connected state does not change.
package health

import (
	"sync"
	"time"
)

// Since is when "both connected" last changed, for two streams a and b,
// each connected (up) or not since the time given: when the later came up
// if both are up, when the first went down if both are down, and when the
// one that is down went down otherwise.
func Since(aUp bool, a time.Time, bUp bool, b time.Time) time.Time {
	switch {
	case aUp && bUp:
		if b.After(a) {
			return b
		}
		return a
	case !aUp && !bUp:
		if b.Before(a) {
			return b
		}
		return a
	case !bUp:
		return b
	}
	return a
}

// Steady keeps the Since of a state made of several streams' (Since, at
// each read) from moving while that state's connected does not change: a
// stream that joins, up since later than the others, or leaves, is no
// change of the whole. It sees the state only when read, so a blip between
// two reads (down and up again) shows only where the caller passes a
// stream's Since as up. The zero value is ready. Safe for concurrent use.
type Steady struct {
	mu        sync.Mutex
	seen      bool
	connected bool
	since     time.Time
}

// Keep returns the Since of the state read now (connected since since) as
// of when its connected last changed, as k saw it. up is when a stream
// whose blips count last came up (zero for none): later than the Since
// kept, the state went down and up again between two reads.
func (k *Steady) Keep(connected bool, since, up time.Time) time.Time {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.seen && connected == k.connected && !(connected && up.After(k.since)) {
		return k.since
	}
	k.seen, k.connected, k.since = true, connected, since
	return since
}

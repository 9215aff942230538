// Package health holds the rule by which the connection states of two
// streams combine into one: a Stream's with its isolated lanes', and a
// group's Streams'.
package health

import "time"

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

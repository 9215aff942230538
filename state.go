package etcdwatch

import (
	"fmt"
	"sync"
	"time"
)

// State is where a Stream's gRPC stream stands, for health checks and for
// telling why watches wait.
type State struct {
	// Connected is true while the server answers on the current Watch
	// stream: from its first message (the answer to a create, or to a
	// liveness probe on a Stream with nothing to watch, which probes a
	// stream that replaces one that ended at once) until the stream
	// ends. A stream that goes silent is given up WithLiveness's idle plus
	// timeout after its last message, so over a connection that stopped
	// carrying packets Connected turns false then, and stays false until a
	// server answers again: it is the Stream's health signal.
	Connected bool
	// Since is when Connected last changed; Open's time at first. The
	// isolated watches' stream joining later, answered after the main one,
	// is no change.
	Since time.Time
	// LastError is the last error that ended a stream or kept one from
	// opening (a refused connection, a failed TLS handshake, a member
	// without a leader), nil before the first. It is kept after the
	// stream is back: compare LastErrorAt with Since.
	LastError error
	// LastErrorAt is when LastError happened.
	LastErrorAt time.Time
	// Failed is why the Stream's Watch stream failed for good (it wraps
	// ErrStreamFailed): its watches have ended, Watch refuses new ones
	// (but isolated ones, which have a stream of their own) and no new
	// stream is tried. Nil while the Stream can watch: a failure a new
	// stream may overcome is only LastError. When the isolated watches'
	// stream fails for good, they end, its failure is LastError, and the
	// next isolated watch opens a new stream.
	Failed error
}

// stateBox holds a lane's State (Stream.State combines the lanes'). The dispatcher writes whether the server
// answers; the goroutine opening a stream writes the connection errors it
// meets while it waits. Readers take a copy.
type stateBox struct {
	mu       sync.Mutex
	st       State
	reported bool // a failure has been recorded since the server last answered
	heard    bool // a server has answered at least once
	asked    bool // a create has been sent: the server owes an answer
}

func (b *stateBox) get() State {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.st
}

// opening returns the State; whether nothing has happened yet, no server
// having answered and nothing having failed, as for a lane just opened;
// and whether a create has been sent all the same.
func (b *stateBox) opening() (st State, opening, asked bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.st, !b.heard && b.st.LastError == nil, b.asked
}

// ask records that a create was sent, which the server must answer.
func (b *stateBox) ask() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.asked = true
}

// answered records a stream on which the server has answered.
func (b *stateBox) answered(now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.st.Connected, b.st.Since = true, now
	b.reported, b.heard = false, true
}

// ended records a stream that has ended with err; answered tells whether
// the server had answered on it.
func (b *stateBox) ended(err error, answered bool, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if answered {
		b.st.Connected, b.st.Since = false, now
	}
	b.st.LastError, b.st.LastErrorAt = err, now
}

// dead records err, with which the stream failed for good.
func (b *stateBox) dead(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.st.Failed = err
}

// failed records err, which ended a stream or kept one from opening, and
// reports whether it is the first failure since the server last answered.
func (b *stateBox) failed(err error, now time.Time) (first bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.st.LastError, b.st.LastErrorAt = err, now
	first = !b.reported
	b.reported = true
	return first
}

// Explain adds to cause, why a call gave up waiting on the Stream, the
// reason the stream could not open, if it could not: errors.Is matches
// both, and status.Code reads gRPC's. It returns cause as it is while the
// stream is open.
func (st State) Explain(cause error) error {
	if st.Connected || st.LastError == nil {
		return cause
	}
	return fmt.Errorf("%w (the server has not answered on a watch stream since %s: %w)", cause, st.Since.Format(time.RFC3339), st.LastError)
}

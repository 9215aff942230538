package etcdwatch

// watchState is where a watch is in its life, as the dispatcher sees it.
type watchState uint8

const (
	stateCreating  watchState = iota // create queued or sent, no created response yet
	stateAbandoned                   // ended by its consumer while its create was queued or in flight: canceled on the server once confirmed
	stateActive                      // confirmed by the server; events flow
	statePaused                      // its consumer is behind: server-side watch canceled until the consumer catches up
	stateDone                        // ended; the dispatcher has forgotten it
)

// entry is what the dispatcher keeps of a watch. Only the dispatcher's
// goroutine touches it, so nothing in it is locked. A million watches keep
// a million entries: its small fields share one word.
type entry struct {
	state   watchState
	flags   entryFlags
	index   int32          // of the watch's request in the call that opened it, for its Handler; immutable, read by anyone
	created chan<- created // to Stream.open, the first create's outcome; nil once told
	group   *ctxGroup      // the watches whose contexts end with this one's; nil if it never ends
	reqID   int64          // id asked for in the create in flight
	rev     int64          // every event <= rev has been queued for the consumer
}

// entryFlags are an entry's yes-or-no facts, one bit each.
type entryFlags uint8

const (
	fromNow     entryFlags = 1 << iota // created with Revision 0 and not yet confirmed
	probe                              // a liveness probe, not a user's watch: it has no consumer
	authRetried                        // refused for its credentials once; refused again, it ends
	moving                             // re-created on a new stream after the last one ended, not yet confirmed: counted as moved once it is
	recreated                          // created again on this stream (a new stream, or compacted just past its revision; or a create sent before, see unconfirmedAgain), not yet confirmed: no progress answer bookmarks it
	replay                             // re-created from rev itself: the server sends rev's events a second time
	unanchored                         // confirmed from now on this stream, nothing since: the server's start is unknown, so every event is new
	nowHere                            // its create on this stream asked from now: see caughtUp
)

func (e *entry) is(f entryFlags) bool { return e.flags&f != 0 }

func (e *entry) set(f entryFlags, on bool) {
	if on {
		e.flags |= f
	} else {
		e.flags &^= f
	}
}

func (e *entry) init(r Request, index int) {
	e.set(fromNow, r.Revision == 0)
	e.rev = max(r.Revision-1, 0)
	e.index = int32(index)
}

// advance records that every event <= rev has been queued: rev's events,
// if it asked for them again, have come. A watch from now is anchored from
// then on.
func (e *entry) advance(rev int64) {
	e.set(unanchored, false)
	if rev != e.rev {
		e.rev = rev
		e.set(replay, false)
	}
}

// floor is the revision at or below which an event on the current stream
// is a duplicate: rev, but for a watch from now that has had nothing since
// its creation, whose events are all new (see activate).
func (e *entry) floor() int64 {
	if e.is(unanchored) {
		return 0
	}
	return e.rev
}

// again is the revision whose events the server sends a second time,
// expected, not duplicates; 0 for none.
func (e *entry) again() int64 {
	if e.is(replay) {
		return e.rev
	}
	return 0
}

// start is the revision a create for the watch asks for: the one after
// what it has delivered, or 0 ("from now") before its first confirmation.
// A watch re-created (after a pause, or on a new stream) that has reached
// head, the highest revision the Stream has seen, asks for its own
// revision again instead: to etcd 3.5.13 and later a watch from a
// revision the store has not reached waits for the future, and no
// progress request on its gRPC stream is answered until the next write
// anywhere. That revision's events, if any, come again, and are dropped as
// expected (replay). A first create asks for what its Request says.
func (e *entry) start(head int64) int64 {
	switch {
	case e.is(fromNow):
		return 0
	case e.created == nil && e.rev >= 1 && e.rev >= head:
		e.set(replay, true)
		return e.rev
	}
	e.set(replay, false)
	return e.rev + 1
}

// created is the outcome of a watch's first create: nil once the server has
// confirmed it, else why it failed.
type created struct {
	w   *Watch
	err error
}

// tellCreated gives Stream.open the outcome of the first create, once; the
// channel is dropped then, so that a running watch does not carry it.
func (w *Watch) tellCreated(err error) {
	e := &w.entry
	if e.created != nil {
		e.created <- created{w, err} // buffered for every watch of the call: never blocks
		e.created = nil
	}
}

package etcdwatch

// This file is the create-pipelining policy: how many creates may be in
// flight on a stream, learned from how the server answers them.
//
// Answers are matched to creates by order, which etcd keeps; a refused
// create carries id -1, so order is the only reliable match. etcd's gRPC
// proxy does not keep it (it answers a create that joins a range it
// already watches first) and picks its own ids. So a new stream sends its
// creates back to back but is unproven: until it has echoed an id the
// client chose, its first answer must echo the oldest create's id, or the
// stream is given up unmatched and its creates go again on the next one,
// one at a time. A stream that echoes is trusted; one that picks its own
// ids gets one create at a time for good, and so does every stream after
// it until one echoes.

// createMode is how a stream takes creates.
type createMode uint8

const (
	unproven createMode = iota // back to back; the first answer must echo the oldest create's id
	trusted                    // back to back: the stream has echoed an id the client chose
	oneByOne                   // one at a time until the stream echoes a chosen id
	ownIDs                     // one at a time for good: the stream picks its own ids
)

// startMode is how the next stream starts.
type startMode uint8

const (
	startUnproven startMode = iota
	startOneByOne           // after a refusal that could not be matched; an echo ends it
	startProxied            // after a stream picked its own ids; no echo ends it
)

// pipeline is the policy's state. Owned by the dispatcher.
type pipeline struct {
	mode  createMode // the current stream's
	start startMode  // the next stream's
}

// opened starts a new stream, which may reach another server.
func (p *pipeline) opened() {
	p.mode = unproven
	if p.start != startUnproven {
		p.mode = oneByOne
	}
}

// maxInFlight is how many creates may await their answers: 0 for no bound.
func (p *pipeline) maxInFlight() int {
	if p.mode == oneByOne || p.mode == ownIDs {
		return 1
	}
	return 0
}

// unmatchable reports whether an answer to the oldest of inFlight creates
// cannot be matched for sure: on an unproven stream with others in flight,
// a refusal (no id) or an id that create did not ask for.
func (p *pipeline) unmatchable(inFlight int, refused, echoed bool) bool {
	return p.mode == unproven && inFlight > 1 && (refused || !echoed)
}

// unmatched records that the stream is given up for an unmatchable answer:
// the next one starts one create at a time.
func (p *pipeline) unmatched(refused bool) {
	switch {
	case !refused:
		p.start = startProxied
	case p.start == startUnproven:
		p.start = startOneByOne
	}
}

// confirmed records a create the server confirmed, with the id it asked
// for (echoed) or one of its own, and reports whether the stream has just
// been found to pick its own ids.
func (p *pipeline) confirmed(echoed bool) (ownIDsFound bool) {
	switch {
	case echoed && p.mode != ownIDs:
		p.mode = trusted
		if p.start == startOneByOne {
			p.start = startUnproven
		}
	case !echoed && p.mode != ownIDs:
		p.mode, p.start = ownIDs, startProxied
		return true
	}
	return false
}

package group

// candidate is what placement knows of one Stream of the group when it
// chooses one for a watch.
type candidate struct {
	// watches running on the Stream now, and being placed there.
	watches int
	// healthy: the server answers on the Stream, or it has not failed
	// yet (a Stream opened a moment ago, whose server has had nothing to
	// say). A Stream that failed and has not been answered since is not.
	healthy bool
	// member is the address of the member the Stream's Watch RPC is on,
	// "" while unknown (before the first response, between RPCs).
	member string
	// pinned: a Stream of one watch. It takes no other, but its watch
	// weighs on its member.
	pinned bool
	// failed: the Stream failed for good (State.Failed); it refuses
	// every watch.
	failed bool
	// on is the index of the group's own Stream: the candidate's own, or
	// for a pinned one, the Stream on whose connection it opened. Where a
	// member is unknown, that is where the pinned watch weighs.
	on int
}

// placement chooses the Streams of a call's watches, one at a time,
// counting each as it goes. It is a value over a snapshot of the group's
// Streams, the first of them the group's own (WithStreams) in order, then
// the pinned ones; the group makes one per call, under its lock.
//
// The rule, for each watch:
//  1. Only healthy Streams, if there is one: a Stream reconnecting
//     after its member failed gets no new watch until it is answered
//     again. Pinned Streams are never chosen, nor Streams that failed for
//     good while another has not (a watch there would be refused at once,
//     where a Stream reconnecting takes it once it is back).
//  2. The member with the fewest watches, counting every Stream on it,
//     pinned ones too; a Stream whose member is unknown counts as a
//     member of its own, with the pinned Streams opened on its connection.
//     So watches spread over members, not just over Streams: two Streams
//     that landed on one member share that member's part, and a member's
//     failure moves as few watches as it can.
//  3. On that member, the Stream with the fewest watches.
//  4. Ties: the lowest index, so that placement is deterministic.
//
// A pinned watch gets a Stream of its own, on the connection of the
// Stream the rule chose (with Dial, the member that Stream is on); it is
// then counted as a pinned Stream on that member.
type placement struct {
	cands []candidate
}

// next returns the index of the Stream chosen for one more watch and
// counts the watch there; for a pinned watch, the Stream whose connection
// its own Stream opens on. It returns -1 if the group has no Stream of
// its own to choose.
func (p *placement) next(pinned bool) int {
	anyHealthy, anyAlive := false, false
	for _, c := range p.cands {
		anyHealthy = anyHealthy || (c.healthy && !c.pinned && !c.failed)
		anyAlive = anyAlive || (!c.pinned && !c.failed)
	}
	best := -1
	var bestLoad, bestWatches int
	for i, c := range p.cands {
		if c.pinned || (anyAlive && c.failed) || (anyHealthy && !c.healthy) {
			continue
		}
		load := p.memberLoad(i)
		if best < 0 || load < bestLoad || (load == bestLoad && c.watches < bestWatches) {
			best, bestLoad, bestWatches = i, load, c.watches
		}
	}
	if best < 0 {
		return -1
	}
	if pinned {
		p.cands = append(p.cands, candidate{watches: 1, healthy: true, member: p.cands[best].member, on: best, pinned: true})
	} else {
		p.cands[best].watches++
	}
	return best
}

// memberLoad is the watches of every Stream on the member of Stream i:
// those whose member is known to be i's, the pinned Streams opened on i's
// connection whose member, or i's, is unknown (a pinned Stream not yet
// answered; an own Stream with no watch, which has not heard from its
// server), and the pinned Streams not yet answered that were opened on
// the connection of another Stream on i's member, so that every Stream on
// a member sees the same load for it.
func (p *placement) memberLoad(i int) int {
	m := p.cands[i].member
	n := 0
	for k, c := range p.cands {
		switch {
		case k == i, m != "" && c.member == m:
			n += c.watches
		case c.pinned && c.on == i && (m == "" || c.member == ""):
			n += c.watches
		case c.pinned && c.member == "" && m != "" && p.cands[c.on].member == m:
			n += c.watches
		}
	}
	return n
}

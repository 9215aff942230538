package etcdwatch

import (
	"sync/atomic"
	"time"
)

// Stats is a snapshot of a Stream's counters. Counts are totals since Open;
// Watches and Paused are current values.
type Stats struct {
	Watches           int64  // watches running now (creating, active or paused), from the call that opens them on; a canceled one stops counting once the dispatcher has the cancel, not when the server answers
	Paused            int64  // watches paused now because their consumer fell behind
	Created           uint64 // created responses accepted for watches: first creates and every create again (a resume, a move to a new stream, a revision compacted just past, a refused token)
	Stalls            uint64 // times the stream waited for a consumer at its buffer limit
	Pauses            uint64 // times a watch was paused
	Resumes           uint64 // times a paused watch was re-created
	Responses         uint64 // responses received from the server
	Events            uint64 // events handed to their watches for consumers (a watch canceled meanwhile drops them)
	Fragments         uint64 // fragment responses joined into whole revisions
	DuplicatesDropped uint64 // events at or below a watch's revision that were dropped, but for those of a revision asked for again on a resume
	UnknownResponses  uint64 // responses for watch ids the stream did not know
	IDsRewritten      bool   // the server chose its own watch ids (a gRPC proxy)
	Reconnects        uint64 // gRPC streams replaced after they ended
	Moved             uint64 // watches re-created on a new stream after the last one ended, once it confirmed them
	Revision          int64  // how far the store is known to be: the highest revision in a response header so far, or a compaction's revision if higher
	// LastMessage is when the last response, or the burst of responses
	// read together with it, arrived; zero before the first.
	LastMessage time.Time
}

// counters are written by the dispatcher only and read by Stats.
type counters struct {
	watches, paused              atomic.Int64
	created, stalls              atomic.Uint64
	pauses, resumes              atomic.Uint64
	responses, events, fragments atomic.Uint64
	duplicates, unknown          atomic.Uint64
	reconnects, moved            atomic.Uint64
	lastMessage                  atomic.Int64 // UnixNano
	revision                     atomic.Int64 // the highest header revision seen
	idsRewritten                 atomic.Bool
}

func (c *counters) snapshot() Stats {
	s := Stats{
		Watches:           c.watches.Load(),
		Paused:            c.paused.Load(),
		Created:           c.created.Load(),
		Stalls:            c.stalls.Load(),
		Pauses:            c.pauses.Load(),
		Resumes:           c.resumes.Load(),
		Responses:         c.responses.Load(),
		Events:            c.events.Load(),
		Fragments:         c.fragments.Load(),
		DuplicatesDropped: c.duplicates.Load(),
		UnknownResponses:  c.unknown.Load(),
		IDsRewritten:      c.idsRewritten.Load(),
		Reconnects:        c.reconnects.Load(),
		Moved:             c.moved.Load(),
		Revision:          c.revision.Load(),
	}
	if ns := c.lastMessage.Load(); ns != 0 {
		s.LastMessage = time.Unix(0, ns)
	}
	return s
}

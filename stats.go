package etcdwatch

import "sync/atomic"

// Stats is a snapshot of a Stream's counters. Counts are totals since Open;
// Watches and Paused are current values.
type Stats struct {
	Watches           int64  // watches running now (creating, active or paused)
	Paused            int64  // watches paused now because their consumer fell behind
	Created           uint64 // created responses accepted, resumes included
	Pauses            uint64 // times a watch was paused
	Resumes           uint64 // times a paused watch was re-created
	Responses         uint64 // responses received from the server
	Events            uint64 // events queued for consumers
	Fragments         uint64 // fragment responses joined into whole revisions
	DuplicatesDropped uint64 // events at or below a watch's revision that were dropped
	UnknownResponses  uint64 // responses for watch ids the stream did not know
	IDsRewritten      bool   // the server chose its own watch ids (a gRPC proxy)
}

// counters are written by the dispatcher only and read by Stats.
type counters struct {
	watches, paused              atomic.Int64
	created, pauses, resumes     atomic.Uint64
	responses, events, fragments atomic.Uint64
	duplicates, unknown          atomic.Uint64
	idsRewritten                 atomic.Bool
}

func (c *counters) snapshot() Stats {
	return Stats{
		Watches:           c.watches.Load(),
		Paused:            c.paused.Load(),
		Created:           c.created.Load(),
		Pauses:            c.pauses.Load(),
		Resumes:           c.resumes.Load(),
		Responses:         c.responses.Load(),
		Events:            c.events.Load(),
		Fragments:         c.fragments.Load(),
		DuplicatesDropped: c.duplicates.Load(),
		UnknownResponses:  c.unknown.Load(),
		IDsRewritten:      c.idsRewritten.Load(),
	}
}

package view

import "sync/atomic"

// Stats is a snapshot of a view's counters. Counts are totals since the
// view started; the others are current values.
type Stats struct {
	Keys                int    // keys in the view
	Bytes               int64  // bytes of those keys and their values as stored
	Revision            int64  // the view's revision
	Lag                 int64  // the highest revision the Source has seen minus Revision; a range nobody writes lags until its next bookmark
	Relists             uint64 // listings after the first: compactions, gaps, repairs
	Resyncs             uint64 // whole states given to subscribers that fell behind
	DecodeErrors        uint64 // values the decode function refused
	IntegrityChecks     uint64 // comparisons with the server completed (WithIntegrityCheck)
	IntegrityMismatches uint64 // comparisons that found the view wrong, each repaired by a relist
	Subscribers         int    // open subscriptions
	HistoryBytes        int64  // bytes of changes kept for subscribers
}

// counters are written by the state's goroutines and read by Stats.
type counters struct {
	relists, resyncs, decodeErrors atomic.Uint64
	checks, mismatches             atomic.Uint64
}

func (c *core[T]) statsNow() Stats {
	s := c.snap.Load()
	if s == nil {
		s = &Snapshot[T]{}
	}
	subs, held := c.hist.size()
	return Stats{
		Keys:                s.Len(),
		Bytes:               s.bytes,
		Revision:            s.rev,
		Lag:                 max(c.src.Stats().Revision-s.rev, 0),
		Relists:             c.stats.relists.Load(),
		Resyncs:             c.stats.resyncs.Load(),
		DecodeErrors:        c.stats.decodeErrors.Load(),
		IntegrityChecks:     c.stats.checks.Load(),
		IntegrityMismatches: c.stats.mismatches.Load(),
		Subscribers:         subs,
		HistoryBytes:        held,
	}
}

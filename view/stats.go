package view

// Stats is a snapshot of a view's counters. Counts are totals since the
// view started; the others are current values. Views of one state (Share)
// share all but Resyncs and Subscribers, which are each View's own.
type Stats struct {
	Keys                int    // keys in the view
	Bytes               int64  // bytes of those keys and their values as stored
	Revision            int64  // the view's revision
	Lag                 int64  // the highest revision the Source has seen minus Revision; a range nobody writes lags until its next bookmark; once the view has ended, what it was then
	Relists             uint64 // listings that replaced a state (a restored one too): after compactions, and repairs
	Resyncs             uint64 // whole states given to this View's subscribers that fell behind
	DecodeErrors        uint64 // values the decode function refused
	IntegrityChecks     uint64 // comparisons with the server completed (WithIntegrityCheck)
	IntegrityMismatches uint64 // comparisons that found the view wrong; one relist repairs what they found, those made while it lists included
	Subscribers         int    // this View's open subscriptions
	HistoryBytes        int64  // bytes of changes kept for subscribers
	RestoreRefusals     uint64 // saved states refused or let go at the start (WithRestore, WithStateFile): the view listed instead; Restored says why
	SaveFailures        uint64 // saves to WithStateFile's file that failed, each logged at Warn
}

package view

import (
	"fmt"
	"time"

	"github.com/etcdwatch/etcdwatch"
)

// Option configures a View. Options are applied in order over the
// defaults, then validated together by New. Views of a state (Share) share
// its options.
type Option func(*options)

// options are a state's settings, read only once New has validated them.
type options struct {
	historyBytes int
	pageSize     int
	pageBytes    int
	integrity    time.Duration
	bookmark     time.Duration
	warm         warmOptions // WithSave, WithRestore, WithStateFile (warm.go)
}

func defaultOptions() options {
	return options{
		historyBytes: 8 << 20,
		pageSize:     1000,
		pageBytes:    4 << 20,
		bookmark:     time.Minute,
	}
}

// WithHistoryBytes bounds the changes a view keeps for its subscribers,
// counted as their keys and values (previous ones included) and about 64
// bytes a change. A subscriber that falls further behind gets a resync
// rather than holding the view up; the newest batch is kept whatever its
// size. Default 8 MiB; at least 1.
func WithHistoryBytes(n int) Option { return func(o *options) { o.historyBytes = n } }

// WithPageSize sets how many keys a Range of the view's listing asks for at
// a time, on servers before etcd 3.7 (etcd 3.7 streams the range in chunks
// of its own choosing). Default 1000, as clientv3's mirror; at least 1.
func WithPageSize(keys int) Option { return func(o *options) { o.pageSize = keys } }

// WithPageBytes sets about how many bytes each page of a listing after the
// first asks for, on servers before etcd 3.7: as many keys as n bytes hold
// at the mean size of the keys of the page before (key, value, and about
// 32 bytes of revisions and framing), never fewer than WithPageSize and at
// most twice as many as the page before. etcd counts the rest of the range
// for every page, so listing N keys in pages of P costs it about N*N/(2P)
// key visits: a large range lists several times faster in fewer, larger
// pages. A grown page refused as above the Stream's receive limit (a
// grpc.MaxCallRecvMsgSize in etcdwatch.WithCallOptions) is asked for again
// at WithPageSize keys, as are the pages after it. Default 4 MiB; 0 for
// pages of WithPageSize keys each; at least 0.
func WithPageBytes(n int) Option { return func(o *options) { o.pageBytes = n } }

// WithIntegrityCheck makes the view compare itself, every interval, with a
// Range of its range at the view's revision (keys and revisions, without
// values). A mismatch, which only a bug or a server fault can cause, is
// counted (Stats.IntegrityMismatches), logged at Error on the Source's
// logger, and repaired by a relist. Default 0: off; at least 0.
func WithIntegrityCheck(interval time.Duration) Option {
	return func(o *options) { o.integrity = interval }
}

// WithBookmarkInterval sets how often a view that has not heard from the
// server asks for progress (on its watch, Watch.RequestProgress): it looks
// every d, and asks if nothing came since it last looked, so after between
// d and 2d of silence. Its revision, and the revision its watch would
// resume from after a reconnect, then keep up with the store even when
// nobody writes its range: an idle range is not compacted out from under
// it. 0 leaves that to the server's own
// progress notifications (every 10 minutes by default). On etcd
// 3.4.0-3.4.24 and 3.5.0-3.5.7 progress requests are unsafe and never sent
// (see etcdwatch.ErrProgressUnsupported), so there this option does
// nothing: an idle range's revision, and its Lag, move only with the
// server's own notifications. Default 1 minute; at least 0.
func WithBookmarkInterval(d time.Duration) Option {
	return func(o *options) { o.bookmark = d }
}

func (o options) validate() error {
	switch {
	case o.historyBytes < 1:
		return fmt.Errorf("%w: WithHistoryBytes(%d): at least 1", etcdwatch.ErrInvalidArgument, o.historyBytes)
	case o.pageSize < 1:
		return fmt.Errorf("%w: WithPageSize(%d): at least 1", etcdwatch.ErrInvalidArgument, o.pageSize)
	case o.pageBytes < 0:
		return fmt.Errorf("%w: WithPageBytes(%d): at least 0", etcdwatch.ErrInvalidArgument, o.pageBytes)
	case o.integrity < 0:
		return fmt.Errorf("%w: WithIntegrityCheck(%v): at least 0", etcdwatch.ErrInvalidArgument, o.integrity)
	case o.bookmark < 0:
		return fmt.Errorf("%w: WithBookmarkInterval(%v): at least 0", etcdwatch.ErrInvalidArgument, o.bookmark)
	}
	return o.warm.validate()
}

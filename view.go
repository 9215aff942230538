package etcdwatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"sync"

	"github.com/etcdwatch/etcdwatch/internal/cow"
)

// Entry is one key of a view: its decoded value and the revisions of the
// KeyValue it was decoded from. Entries are shared by the view, its
// snapshots and its subscribers' changes: never modify one, nor what its
// Value points to.
type Entry[T any] struct {
	Key   string
	Value T // the zero T when Err is set
	// Err is the decode function's error for this value; the key is in the
	// view all the same, so that the view holds every key of its range.
	Err            error
	CreateRevision int64 // revision of the key's last creation
	ModRevision    int64 // revision of the key's last change
	Version        int64 // number of changes since creation
	Lease          int64 // lease ID, 0 when none
	size           int   // bytes of the key and of the value as stored
}

// Decoder turns a key's value into a view's T. It may keep value (the view
// gives each one a buffer of its own) and must not modify key. It is called
// from the view's own goroutine, one value at a time.
type Decoder[T any] func(key, value []byte) (T, error)

// DecodeBytes is the Decoder of a plain view: the value as it was stored.
func DecodeBytes(_, value []byte) ([]byte, error) { return value, nil }

// DecodeJSON is a Decoder of JSON values, with encoding/json.
func DecodeJSON[T any](_, value []byte) (T, error) {
	var v T
	err := json.Unmarshal(value, &v)
	return v, err
}

// ChangeKind says what a Change did to its key.
type ChangeKind uint8

const (
	Created ChangeKind = iota + 1 // the key did not exist before
	Updated                       // the key existed and has a new value
	Deleted                       // the key no longer exists
)

// String returns "created", "updated" or "deleted".
func (k ChangeKind) String() string {
	switch k {
	case Created:
		return "created"
	case Updated:
		return "updated"
	case Deleted:
		return "deleted"
	}
	return fmt.Sprintf("ChangeKind(%d)", k)
}

// Change is one key's change in a Batch.
type Change[T any] struct {
	Kind     ChangeKind
	Key      string
	Revision int64     // of the change; for a relist, the revision listed
	Entry    *Entry[T] // the key after the change; nil when Deleted
	Prev     *Entry[T] // the key before it; nil when Created
}

// BatchKind says how a Batch came about.
type BatchKind uint8

const (
	// Events: the changes of whole revisions, as the watch reported them.
	Events BatchKind = iota + 1
	// Relisted: the view could not follow its watch (its history was
	// compacted, or a check found it wrong) and listed its range again at
	// Revision. Changes is exactly the difference between the state at From
	// and the state at Revision; unchanged keys are not in it. A key deleted
	// and created again in between comes as Deleted then Created. The batch
	// is the marker that the view is synced at Revision.
	Relisted
	// Resync: the whole state at Revision, every key as Created, given to a
	// subscriber instead of the changes it fell too far behind to be kept
	// for it, or first when it asked for no revision. Replace what you hold.
	Resync
)

// String returns "events", "relisted" or "resync".
func (k BatchKind) String() string {
	switch k {
	case Events:
		return "events"
	case Relisted:
		return "relisted"
	case Resync:
		return "resync"
	}
	return fmt.Sprintf("BatchKind(%d)", k)
}

// Batch is a step of a view from the state at revision From to the state at
// Revision: the changes of whole revisions, in order, never half of one.
type Batch[T any] struct {
	Kind           BatchKind
	From, Revision int64
	Changes        []Change[T]
}

// Snapshot is a view's state at one revision. It never changes, and reading
// it never holds the view up.
type Snapshot[T any] struct {
	m     cow.Map[*Entry[T]]
	rev   int64
	bytes int64
}

// Revision is the revision whose state the snapshot holds.
func (s *Snapshot[T]) Revision() int64 { return s.rev }

// Len is the number of keys.
func (s *Snapshot[T]) Len() int { return s.m.Len() }

// Get returns the key's entry, and whether the key exists.
func (s *Snapshot[T]) Get(key string) (Entry[T], bool) {
	e, ok := s.m.Get(key)
	if !ok {
		return Entry[T]{}, false
	}
	return *e, true
}

// All iterates every key in key order.
func (s *Snapshot[T]) All() iter.Seq2[string, Entry[T]] {
	return func(yield func(string, Entry[T]) bool) {
		for k, e := range s.m.All() {
			if !yield(k, *e) {
				return
			}
		}
	}
}

// View is a local copy of a range of keys, kept current by a watch on a
// Stream: a consistent list of the range at a revision R, then the range's
// changes from R+1, applied a whole revision at a time. Readers always see
// the state at one revision. The view survives compaction: when its watch
// cannot go on, it lists the range again and reports the difference
// (Relisted batches). Its methods are safe for concurrent use.
//
// Views of the same range on the same Stream, with the same decode function
// and options, share one state and one server-side watch; each NewView
// returns its own View, and the state goes once every one is closed.
type View[T any] struct {
	core *viewCore[T]
	// ctx ends with this View: at its Close (cause ErrViewClosed), or when
	// the shared state ends (cause why).
	ctx    context.Context
	cancel context.CancelCauseFunc
	once   sync.Once
	mu     sync.Mutex
	subs   map[*Subscription[T]]struct{} // open subscriptions, ended by Close; nil after
	closed bool                          // Close has begun; guarded by mu
}

// NewView lists r's range on s's connection and watches it on s, and returns
// once the list is applied and the watch confirmed. ctx bounds that wait
// only: the view lives until Close, or until s is closed (Err then returns
// ErrClosed) or the server refuses it for good (a permission, say).
//
// r names the keys (Key, Prefix, Range or FromKey); the view sets the rest as
// it needs (every event, with bookmarks and fragments), so a Request with a
// Revision or a filter is refused with an error wrapping ErrInvalidRequest.
// decode makes each value's T: DecodeBytes for plain values.
//
// The listing reads linearizably at a revision R: with etcd 3.7's RangeStream
// (one snapshot, streamed) where the server has it, else with pages of
// WithPageSize keys, each pinned to R. It retries, after
// WithReconnectBackoff's delays, what may succeed when tried again.
func NewView[T any](ctx context.Context, s *Stream, r Request, decode Decoder[T], opts ...ViewOption) (*View[T], error) {
	o := defaultViewOptions()
	for _, opt := range opts {
		opt(&o)
	}
	if err := checkViewArgs(s, r, decode == nil, o); err != nil {
		return nil, err
	}
	c := acquireView(s, r, decode, o)
	v := &View[T]{core: c}
	v.ctx, v.cancel = context.WithCancelCause(c.ctx)
	select {
	case <-c.ready:
		if err := c.failed(); err != nil {
			v.Close()
			return nil, err
		}
		return v, nil
	case <-ctx.Done():
		v.Close()
		return nil, s.state.explain(context.Cause(ctx))
	}
}

func checkViewArgs(s *Stream, r Request, noDecode bool, o viewOptions) error {
	switch {
	case s == nil:
		return fmt.Errorf("%w: NewView: stream is nil", ErrInvalidArgument)
	case noDecode:
		return fmt.Errorf("%w: NewView: decode is nil (use DecodeBytes for plain values)", ErrInvalidArgument)
	case r.Revision != 0:
		return fmt.Errorf("%w: a view lists its range at the newest revision; Revision must be 0", ErrInvalidRequest)
	case r.NoPut || r.NoDelete:
		return fmt.Errorf("%w: a view needs every event; NoPut and NoDelete must be false", ErrInvalidRequest)
	}
	if err := r.Validate(); err != nil {
		return err
	}
	return o.validate()
}

// Snapshot returns the view's current state.
func (v *View[T]) Snapshot() *Snapshot[T] { return v.core.snap.Load() }

// Get returns the key's entry in the current state, and whether it exists.
func (v *View[T]) Get(key string) (Entry[T], bool) { return v.Snapshot().Get(key) }

// All iterates the current state in key order: every key at one revision,
// however the view changes meanwhile.
func (v *View[T]) All() iter.Seq2[string, Entry[T]] { return v.Snapshot().All() }

// Revision is the revision of the current state: every change of the range
// up to it has been applied.
func (v *View[T]) Revision() int64 { return v.Snapshot().Revision() }

// Len is the number of keys in the current state.
func (v *View[T]) Len() int { return v.Snapshot().Len() }

// Done is closed when the view has ended: after Close, when its Stream was
// closed, or when the server refused it for good.
func (v *View[T]) Done() <-chan struct{} { return v.ctx.Done() }

// Err returns nil while the view runs, then why it ended: ErrViewClosed after
// Close, ErrClosed after its Stream's Close, or the server's refusal.
func (v *View[T]) Err() error {
	if v.ctx.Err() == nil {
		return nil
	}
	return context.Cause(v.ctx)
}

// bound returns ctx, ended also when the view ends, with the view's Err.
func (v *View[T]) bound(ctx context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(v.ctx, func() { cancel(context.Cause(v.ctx)) })
	return ctx, func() {
		stop()
		cancel(nil)
	}
}

// Stats returns the view's counters. Views sharing a state share them.
func (v *View[T]) Stats() ViewStats { return v.core.statsNow() }

// WaitForRevision waits until the view has applied every change up to rev,
// or ctx ends, or the view ends. The revision of a range nobody writes only
// moves with bookmarks (see WithBookmarkInterval); Sync asks for one.
func (v *View[T]) WaitForRevision(ctx context.Context, rev int64) error {
	ctx, stop := v.bound(ctx)
	defer stop()
	return v.core.await(ctx, func(s *Snapshot[T]) bool { return s.rev >= rev })
}

// Sync waits until the view is at least as fresh as a linearizable read of
// its range made when Sync was called: every change made before the call
// is then in the view.
//
// It asks the Stream for progress (RequestProgress) and waits for the view
// to reach the revision the server answered. Where progress requests are
// unsafe (etcd 3.4.0-3.4.24 and 3.5.0-3.5.7, see ErrProgressUnsupported),
// or go unanswered for a second (etcd 3.5+ answers none while a watch on
// the stream catches up or waits for a future revision), it makes one
// linearizable Range of the range instead, sorted by revision and without
// values, and waits until the view holds as many keys, none changed since:
// the state that read saw. The view's Revision may then stay below the
// read's revision when nothing in the range changed since. That Range makes
// the server read the whole range, without sending it.
func (v *View[T]) Sync(ctx context.Context) error {
	ctx, stop := v.bound(ctx)
	defer stop()
	return v.core.sync(ctx)
}

// Subscribe returns a subscription to the view's batches of changes with
// revisions from fromRev on. When the view's history no longer reaches back
// to fromRev (or fromRev <= 0), the first batch is a Resync of the current
// state. The view never waits for a subscriber: one that falls more than
// WithHistoryBytes behind gets a Resync instead of what it missed.
func (v *View[T]) Subscribe(fromRev int64) *Subscription[T] {
	sub := v.core.subscribe(fromRev)
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.closed {
		sub.end() // a View's subscriptions end with it
		return sub
	}
	if v.subs == nil {
		v.subs = make(map[*Subscription[T]]struct{})
	}
	v.subs[sub] = struct{}{}
	sub.onClose = func() { v.forget(sub) }
	return sub
}

func (v *View[T]) forget(sub *Subscription[T]) {
	v.mu.Lock()
	defer v.mu.Unlock()
	delete(v.subs, sub)
}

// Close releases the view and ends its subscriptions. The shared state, its
// watch and its goroutines go with the last View of it; Close then waits for
// them. It is idempotent and always returns nil.
func (v *View[T]) Close() error {
	v.once.Do(func() {
		v.mu.Lock()
		subs := v.subs
		v.subs, v.closed = nil, true
		v.mu.Unlock()
		for sub := range subs {
			sub.end()
		}
		v.cancel(ErrViewClosed)
		releaseView(v.core)
	})
	return nil
}

// ErrViewClosed ends a View after Close, and a Subscription after its own
// Close or its View's.
var ErrViewClosed = errors.New("etcdwatch: view closed")

// ViewStats is a snapshot of a view's counters. Counts are totals since the
// view started; the others are current values.
type ViewStats struct {
	Keys                int    // keys in the view
	Bytes               int64  // bytes of those keys and their values as stored
	Revision            int64  // the view's revision
	Lag                 int64  // the highest revision the Stream has seen minus Revision; a range nobody writes lags until its next bookmark
	Relists             uint64 // listings after the first: compactions, gaps, repairs
	Resyncs             uint64 // whole states given to subscribers that fell behind
	DecodeErrors        uint64 // values the decode function refused
	IntegrityChecks     uint64 // comparisons with the server completed (WithIntegrityCheck)
	IntegrityMismatches uint64 // comparisons that found the view wrong, each repaired by a relist
	Subscribers         int    // open subscriptions
	HistoryBytes        int64  // bytes of changes kept for subscribers
}

package view

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/etcdwatch/etcdwatch"
)

// core is the state that Views of one range share. Its goroutine, a runner
// started by New, lists the range, watches it and applies the watch's
// responses; readers take the published Snapshot, which never changes, and
// subscribers read the history. The fields are grouped by who writes them.
type core[T any] struct {
	// Set by newCore, then read only.
	src    Source
	req    etcdwatch.Request // the range, watched with bookmarks and fragments
	decode Decoder[T]
	opts   options
	log    *slog.Logger
	reads  *lister // Sync's reads (fresh, any goroutine) and the integrity check's listings (list, checkLoop only)

	// What readers see: the runner publishes a state and the steps to it
	// together, storing snap under hist.mu. stats are atomics, added to by
	// whoever counts.
	snap  atomic.Pointer[Snapshot[T]]
	hist  history[T]
	stats counters
	warm  warm[T] // warm restarts: what the state was restored from, and saving (warm.go, save.go)

	// The state's life. ctx ends it (the last View closed, the Source's
	// Context ended, or a refusal); start closes done once every goroutine
	// of the state has returned, after writing err.
	ctx    context.Context
	cancel context.CancelCauseFunc
	ready  chan struct{}  // closed by the runner once the first state is published and watched; by finish if it never was
	done   chan struct{}  // closed by finish
	err    error          // why the state ended; written before done is closed
	unmade error          // why the state ended before it was ready; written by finish before it closes ready
	endLag int64          // Stats.Lag when the state ended, which Stats reports from then on; written before done is closed
	tasks  sync.WaitGroup // checkLoop and askProgress's requests; start waits for them

	// Between the runner, its tasks and the callers of Sync and
	// WaitForRevision.
	watch    atomic.Pointer[etcdwatch.Watch] // the runner's current watch, for progress requests; stored by the runner
	moves    chan freshness                  // reads whose state the view has: the runner moves the view to their revision
	repair   chan uint64                     // buffered 1: the integrity check asks the runner to list again the state of this listing
	asking   atomic.Bool                     // a bookmark request is in flight
	answered atomic.Pointer[etcdwatch.Watch] // the last watch of the view's whose progress request was answered
	noAsk    atomic.Bool                     // the server's progress answers are unsafe: never ask

	// The Views of this state, each held by its done channel: closed by
	// leave, or by finish for those still held. nil once the state has
	// ended. Guarded by mu.
	mu    sync.Mutex
	holds map[chan struct{}]struct{}
}

// counters are added to by the state's goroutines and read by Stats.
type counters struct {
	relists, decodeErrors atomic.Uint64
	checks, mismatches    atomic.Uint64
}

func newCore[T any](src Source, r etcdwatch.Request, decode Decoder[T], o options) *core[T] {
	// The state's context ends with the Source's, or when the last View
	// goes (ErrClosed).
	ctx, cancel := context.WithCancelCause(src.Context())
	c := &core[T]{
		src:    src,
		req:    etcdwatch.Request{Key: r.Key, End: r.End, ProgressNotify: true, Fragment: true, Isolated: true},
		decode: decode,
		opts:   o,
		log:    src.Logger().With("view", r.String()),
		reads:  newLister(src, r.Key, r.End, o.pageSize, o.pageBytes),
		ctx:    ctx,
		cancel: cancel,
		ready:  make(chan struct{}),
		done:   make(chan struct{}),
		repair: make(chan uint64, 1),
		moves:  make(chan freshness, 16),
		holds:  make(map[chan struct{}]struct{}),
	}
	c.hist.init(int64(o.historyBytes))
	return c
}

// join holds the state for one more View and returns that View's done
// channel; nil if from, the done channel of the View asking (nil for the
// first), no longer holds it: closed, or the state has ended.
func (c *core[T]) join(from chan struct{}) chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.holds[from]; (from != nil && !ok) || c.holds == nil {
		return nil
	}
	done := make(chan struct{})
	c.holds[done] = struct{}{}
	return done
}

// leave lets go of the hold of a View whose ctx has ended, and reports
// whether it held it: the caller then closes done. The last View to leave
// ends the state and first waits for its goroutines. A hold the state's
// end has already taken is left to finish, which closes its done.
func (c *core[T]) leave(done chan struct{}) (held bool) {
	c.mu.Lock()
	_, held = c.holds[done]
	delete(c.holds, done)
	last := held && len(c.holds) == 0
	c.mu.Unlock()
	if last {
		c.cancel(ErrClosed)
		<-c.done
	}
	return held
}

// finish records why the state ended, wakes its waiters and subscribers,
// and ends every View still holding it: their ctx ended with the state's.
// ready tells whether the runner closed core.ready; if not, finish does,
// with err as the reason New fails (a restored state may have been
// published, and even so never made ready).
func (c *core[T]) finish(err error, ready bool) {
	c.err = err
	c.endLag = c.lag()
	c.hist.end()
	close(c.done)
	if !ready {
		c.unmade = err
		close(c.ready)
	}
	c.mu.Lock()
	holds := c.holds
	c.holds = nil
	c.mu.Unlock()
	for done := range holds {
		close(done)
	}
}

// failed returns why the state ended before it was ready, or nil if it
// was made ready. Call after ready is closed.
func (c *core[T]) failed() error { return c.unmade }

// lag is how far the state is behind its Source's revision.
func (c *core[T]) lag() int64 {
	var rev int64
	if s := c.snap.Load(); s != nil {
		rev = s.rev
	}
	return max(c.src.Stats().Revision-rev, 0)
}

// statsNow is Stats of the state now, without what is a View's own. Once
// the state has ended, Lag is what it was then: the Source may go on.
func (c *core[T]) statsNow() Stats {
	s := c.snap.Load()
	if s == nil {
		s = &Snapshot[T]{}
	}
	lag := c.lag()
	select {
	case <-c.done:
		lag = c.endLag
	default:
	}
	held := c.hist.size()
	return Stats{
		Keys:                s.Len(),
		Bytes:               s.bytes,
		Revision:            s.rev,
		Lag:                 lag,
		Relists:             c.stats.relists.Load(),
		DecodeErrors:        c.stats.decodeErrors.Load(),
		IntegrityChecks:     c.stats.checks.Load(),
		IntegrityMismatches: c.stats.mismatches.Load(),
		HistoryBytes:        held,
		RestoreRefusals:     c.warm.refusals.Load(),
		SaveFailures:        c.warm.saveFailures.Load(),
	}
}

// entry decodes a value into an Entry; a decode error is kept in it, and
// counted.
func (c *core[T]) entry(key string, k, v []byte, create, mod, version, lease int64) Entry[T] {
	e := c.decodeEntry(key, k, v, create, mod, version, lease)
	if e.Err != nil {
		c.stats.decodeErrors.Add(1)
	}
	return e
}

// listed is the Entry of a listed key, decoded as decodeEntry does; a
// value the decoder refused is added to refused, which the listing counts
// once its state is installed.
func (c *core[T]) listed(key string, kv *mvccpb.KeyValue, refused *uint64) Entry[T] {
	e := c.decodeEntry(key, kv.Key, kv.Value, kv.CreateRevision, kv.ModRevision, kv.Version, kv.Lease)
	if e.Err != nil {
		*refused++
	}
	return e
}

// decodeEntry is entry without counting a decode error: for a listing,
// which counts those of the state it installs only, not those of tries
// that failed.
func (c *core[T]) decodeEntry(key string, k, v []byte, create, mod, version, lease int64) Entry[T] {
	val, err := c.decode(k, v)
	if err != nil {
		c.log.Debug("etcdwatch: view cannot decode a value", "key", string(k), "revision", mod, "err", err)
		var zero T
		val = zero
	}
	return Entry[T]{
		Key: key, Value: val, Err: err,
		CreateRevision: create, ModRevision: mod, Version: version, Lease: lease,
		size: len(k) + len(v),
	}
}

// askProgress asks for a bookmark on the view's watch in the background,
// one request at a time, so that an idle range's revision keeps up with
// the store.
func (c *core[T]) askProgress() {
	if c.noAsk.Load() || !c.asking.CompareAndSwap(false, true) {
		return
	}
	c.tasks.Go(func() { // returns when answered, refused, or after one interval; start waits
		defer c.asking.Store(false)
		ctx, cancel := context.WithTimeout(c.ctx, max(c.opts.bookmark, time.Second))
		defer cancel()
		if _, err := c.progress(ctx); errors.Is(err, etcdwatch.ErrProgressUnsupported) {
			c.noAsk.Store(true) // the server's own notifications will do
		}
	})
}

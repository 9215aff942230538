package view

import (
	"bytes"
	"context"
	"fmt"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// compacted reports whether the server's history no longer holds revision
// rev (at most its current one): a Range of the range's first key at rev,
// counted, is refused as out of range.
func (l *lister) compacted(ctx context.Context, rev int64) (bool, error) {
	_, err := l.kv.Range(ctx, &pb.RangeRequest{Key: l.key, Revision: rev, CountOnly: true}, l.call...)
	if status.Code(err) == codes.OutOfRange {
		return true, nil
	}
	return false, err
}

// relistSaved starts the state from a listing of the range, compared as it
// goes with the saved state, whose history since is compacted: the saved
// entries are read beside the listing (a merge), not built into a state
// first, so that this costs a listing, as a cold start does, and a read of
// the file. Every key's entry comes from the listing, decoded as a first
// listing decodes it; the saved value of a key that changed is its Prev,
// decoded once the whole file is read and its checksum holds, so that the
// Decoder never sees a value of a state that is then refused. The state is
// published with one Relisted batch from the saved
// revision, exactly the difference, once the saved state's checksum holds;
// if it does not, the state is published as a first listing's, and the
// saved state refused. It reports what restore reports.
func (r *runner[T]) relistSaved(sr *stateReader, h stateHeader) (bool, error) {
	var loadErr error
	saved := func(yield func(string, savedEntry) bool) {
		loadErr = sr.readEntries(h, true, func(e savedEntry) bool { return yield(e.key, e) })
	}
	d := &savedDiffer[T]{c: r.core, ed: table[T]{}.Edit(), raw: editRaws(r.opts, &Snapshot[T]{})}
	walk := newMerge(saved, d)
	defer walk.stop()
	rev, err := r.list.list(r.ctx, listing{}, walk.take)
	if err != nil { // the saved state is let go: the next attempt lists
		r.refuse(fmt.Errorf("listing against it: %w", err))
		return true, &readError{"listing the range", err}
	}
	walk.finish()
	w, err := r.src.Watch(r.ctx, r.req.FromRevision(rev)) // from rev, as listAndWatch
	if err != nil {
		r.refuse(fmt.Errorf("watching from the listing against it: %w", err))
		return true, err
	}
	r.install(d.ed, d.raw, rev, d.bytes, r.list.cluster, w)
	r.stats.decodeErrors.Add(d.refused)
	if loadErr != nil {
		r.refuse(loadErr)
		r.publishFirst()
		return true, nil
	}
	d.decodePrevs()
	relisted(d.changes, rev)
	r.warm.restored = h.revision
	r.stats.relists.Add(1)
	r.log.Info("etcdwatch: view's saved state is compacted; listed against it", "path", r.opts.warm.path, "saved", h.revision, "revision", rev, "changes", len(d.changes), "keys", d.ed.Len())
	r.hist.floor, r.from = h.revision, h.revision
	r.publish(Batch[T]{Kind: Relisted, From: h.revision, Revision: rev, Changes: d.changes, same: h.revision})
	r.from = rev
	return true, nil
}

// savedDiffer is the outcomes of relistSaved's merge: it builds the
// listing's state, as a first listing does, and records how it differs
// from the saved one, as the differ does (a key deleted and created again
// is both). Owned by the runner.
type savedDiffer[T any] struct {
	c       *core[T]
	ed      *tableEditor[T]
	raw     raws
	bytes   int64
	refused uint64      // values the decoder refused, counted once the state is installed
	changes []Change[T] // dated once the listing's revision is known (relisted)
	prevs   []savedPrev[T]
}

// savedPrev is the Prev of a change, p, to be decoded from s once the saved
// state is known good (decodePrevs); s holds a copy of the bytes the reader
// lent.
type savedPrev[T any] struct {
	p *Entry[T]
	s savedEntry
}

// listed adds a listed key, after every key added before.
func (d *savedDiffer[T]) listed(kv *mvccpb.KeyValue) Entry[T] {
	e := d.c.listed(string(kv.Key), kv, &d.refused)
	d.ed.Append(&e)
	d.raw.add(e.Key, kv.Value)
	d.bytes += int64(e.size)
	return e
}

// saved returns the Prev of a change, a saved entry, to be decoded by
// decodePrevs from a copy of its bytes (the reader lends them).
func (d *savedDiffer[T]) saved(s savedEntry) *Entry[T] {
	s.kv = bytes.Clone(s.kv)
	p := new(Entry[T])
	d.prevs = append(d.prevs, savedPrev[T]{p, s})
	return p
}

// decodePrevs decodes the changes' Prevs, once the saved state they come
// from has been read to its end and its checksum holds.
func (d *savedDiffer[T]) decodePrevs() {
	for _, sp := range d.prevs {
		s, k := sp.s, len(sp.s.key)
		*sp.p = d.c.entry(s.key, s.kv[:k:k], s.kv[k:], s.create, s.mod, s.version, s.lease)
	}
	d.prevs = nil
}

func (d *savedDiffer[T]) listedOnly(kv *mvccpb.KeyValue) {
	e := d.listed(kv)
	d.changes = append(d.changes, Change[T]{Kind: Created, Key: e.Key, Entry: kept(e)})
}

func (d *savedDiffer[T]) both(s savedEntry, kv *mvccpb.KeyValue) {
	e := d.listed(kv)
	d.changes = replaced(d.changes, e, s.create, s.mod, func() *Entry[T] { return d.saved(s) })
}

func (d *savedDiffer[T]) stateOnly(key string, s savedEntry) {
	d.changes = append(d.changes, Change[T]{Kind: Deleted, Key: key, Prev: d.saved(s)})
}

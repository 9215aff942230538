package view

import (
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// differ builds a new state from a listing, in key order, against the
// published state it replaces, and records the difference: keys gone,
// keys new, keys whose ModRevision moved (a different CreateRevision means
// deleted and created again). A key whose ModRevision is unchanged keeps its
// entry: it is neither decoded again nor reported. A merge walks the two;
// the differ is its outcomes. Owned by the goroutine listing.
type differ[T any] struct {
	c       *core[T]
	walk    *merge[Entry[T]]
	ed      *tableEditor[T]
	raw     raws // the values as sent, for Save (WithSave; save.go)
	bytes   int64
	record  bool   // keep changes: not for the first listing
	refused uint64 // values the decoder refused, counted once the state is installed
	build   bool   // the base is empty: keys arrive in order, so Append

	changes []Change[T] // dated once the listing's revision is known (relisted)
}

func newDiffer[T any](c *core[T], base *Snapshot[T], record bool) *differ[T] {
	d := &differ[T]{c: c, ed: base.m.Edit(), raw: editRaws(c.opts, base), bytes: base.bytes, record: record, build: base.Len() == 0}
	d.walk = newMerge(base.m.All(), d)
	return d
}

// take is the listing's callback, for each key in order.
func (d *differ[T]) take(kv *mvccpb.KeyValue) error { return d.walk.take(kv) }

func (d *differ[T]) stop() { d.walk.stop() }

// listedOnly adds a key the base does not have.
func (d *differ[T]) listedOnly(kv *mvccpb.KeyValue) {
	e := d.c.listed(string(kv.Key), kv, &d.refused)
	if d.build {
		d.ed.Append(&e)
		d.raw.add(e.Key, kv.Value)
	} else {
		d.ed.Set(&e)
		d.raw.set(e.Key, kv.Value)
	}
	d.bytes += int64(e.size)
	if d.record {
		d.note(Change[T]{Kind: Created, Key: e.Key, Entry: kept(e)})
	}
}

// both replaces old, whose key the listing has, if its record differs:
// its revision moved or, at the same revision, it was held wrong.
func (d *differ[T]) both(old Entry[T], kv *mvccpb.KeyValue) {
	if sameRecord(old, kv) {
		return
	}
	e := d.c.listed(old.Key, kv, &d.refused)
	d.ed.Set(&e)
	d.raw.set(e.Key, kv.Value)
	d.bytes += int64(e.size - old.size)
	if !d.record {
		return
	}
	if old.ModRevision == kv.ModRevision { // the same revision, recorded wrong: what the integrity check finds, repaired
		d.note(Change[T]{Kind: Updated, Key: e.Key, Entry: kept(e), Prev: kept(old)})
		return
	}
	d.changes = replaced(d.changes, e, old.CreateRevision, old.ModRevision, func() *Entry[T] { return kept(old) })
}

// sameRecord reports whether e is kv as the state should hold it: the same
// revisions, version and lease. The integrity check and a relist compare
// alike, so that a relist repairs whatever a check found.
func sameRecord[T any](e Entry[T], kv *mvccpb.KeyValue) bool {
	return e.ModRevision == kv.ModRevision && e.CreateRevision == kv.CreateRevision && e.Version == kv.Version && e.Lease == kv.Lease
}

// replaced appends the changes that took a key from its earlier form, of
// revisions create and mod (prev gives its Entry), to e: none while mod is
// e's; deleted and created again when create is not e's; else updated. The
// one place a listing's difference per key is decided, for relists and
// for restores found compacted alike.
func replaced[T any](changes []Change[T], e Entry[T], create, mod int64, prev func() *Entry[T]) []Change[T] {
	switch {
	case mod == e.ModRevision:
		return changes
	case create != e.CreateRevision:
		return append(changes, Change[T]{Kind: Deleted, Key: e.Key, Prev: prev()}, Change[T]{Kind: Created, Key: e.Key, Entry: kept(e)})
	default:
		return append(changes, Change[T]{Kind: Updated, Key: e.Key, Entry: kept(e), Prev: prev()})
	}
}

// stateOnly deletes a key of the base that the listing passed without.
func (d *differ[T]) stateOnly(key string, old Entry[T]) {
	d.ed.Delete(key)
	d.raw.delete(key)
	d.bytes -= int64(old.size)
	if d.record {
		d.note(Change[T]{Kind: Deleted, Key: key, Prev: kept(old)})
	}
}

func (d *differ[T]) note(ch Change[T]) { d.changes = append(d.changes, ch) }

// kept returns a copy of e of its own, for a Change: the state keeps its
// entries as records (record.go), not as Entries to point to.
func kept[T any](e Entry[T]) *Entry[T] { return &e }

// finish deletes the base's keys after the listing's last, and dates the
// changes (relisted).
func (d *differ[T]) finish(rev int64) {
	d.walk.finish()
	relisted(d.changes, rev)
}

// relisted gives the changes of a Relisted batch, found by a listing at
// rev, their Revision: a put's own ModRevision, exact; a delete's, rev,
// since etcd keeps no record of when a deleted key went, only that it
// went by then. The one place this rule is applied (see Change.Revision).
func relisted[T any](changes []Change[T], rev int64) {
	for i := range changes {
		ch := &changes[i]
		if ch.Entry != nil {
			ch.Revision = ch.Entry.ModRevision
		} else {
			ch.Revision = rev
		}
	}
}

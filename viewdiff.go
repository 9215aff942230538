package etcdwatch

import (
	"iter"

	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/etcdwatch/etcdwatch/internal/cow"
)

// differ builds a new state from a listing, in key order, against the
// published state it replaces, and records the difference: keys gone,
// keys new, keys whose ModRevision moved (a different CreateRevision means
// deleted and created again). A key whose ModRevision is unchanged keeps its
// entry: it is neither decoded again nor reported.
type differ[T any] struct {
	c      *viewCore[T]
	ed     *cow.Editor[*Entry[T]]
	bytes  int64
	record bool // keep changes: not for the first listing
	build  bool // the base is empty: keys arrive in order, so Append

	next    func() (string, *Entry[T], bool) // the base's keys in order
	stop    func()
	oldKey  string    // the base's next key not yet passed; valid while more
	old     *Entry[T] // its entry
	more    bool
	changes []Change[T] // their Revision is the listing's, known at its end
}

func newDiffer[T any](c *viewCore[T], base *Snapshot[T], record bool) *differ[T] {
	d := &differ[T]{c: c, ed: base.m.Edit(), bytes: base.bytes, record: record, build: base.Len() == 0}
	d.next, d.stop = iter.Pull2(base.m.All())
	d.advance()
	return d
}

func (d *differ[T]) advance() { d.oldKey, d.old, d.more = d.next() }

// take is the listing's callback, for each key in order.
func (d *differ[T]) take(kv *mvccpb.KeyValue) error {
	for d.more && d.oldKey < string(kv.Key) {
		d.gone()
	}
	if d.more && d.oldKey == string(kv.Key) {
		old := d.old
		d.advance()
		if old.ModRevision != kv.ModRevision {
			d.changed(old, kv)
		}
		return nil
	}
	e := d.entry(string(kv.Key), kv)
	if d.build {
		d.ed.Append(e.Key, e)
	} else {
		d.ed.Set(e.Key, e)
	}
	d.bytes += int64(e.size)
	d.note(Change[T]{Kind: Created, Key: e.Key, Entry: e})
	return nil
}

func (d *differ[T]) entry(key string, kv *mvccpb.KeyValue) *Entry[T] {
	return d.c.entry(key, kv.Key, kv.Value, kv.CreateRevision, kv.ModRevision, kv.Version, kv.Lease)
}

// changed replaces old, whose key the listing has with another revision.
func (d *differ[T]) changed(old *Entry[T], kv *mvccpb.KeyValue) {
	e := d.entry(old.Key, kv)
	d.ed.Set(e.Key, e)
	d.bytes += int64(e.size - old.size)
	if old.CreateRevision != kv.CreateRevision {
		d.note(Change[T]{Kind: Deleted, Key: e.Key, Prev: old})
		d.note(Change[T]{Kind: Created, Key: e.Key, Entry: e})
		return
	}
	d.note(Change[T]{Kind: Updated, Key: e.Key, Entry: e, Prev: old})
}

// gone deletes the base's next key, which the listing passed without.
func (d *differ[T]) gone() {
	d.ed.Delete(d.oldKey)
	d.bytes -= int64(d.old.size)
	d.note(Change[T]{Kind: Deleted, Key: d.oldKey, Prev: d.old})
	d.advance()
}

func (d *differ[T]) note(ch Change[T]) {
	if d.record {
		d.changes = append(d.changes, ch)
	}
}

// finish deletes the base's keys after the listing's last, at revision rev.
func (d *differ[T]) finish(rev int64) {
	for d.more {
		d.gone()
	}
	for i := range d.changes {
		d.changes[i].Revision = rev
	}
}

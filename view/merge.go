package view

import (
	"iter"

	"go.etcd.io/etcd/api/v3/mvccpb"
)

// merge walks a view's state beside a listing of its range, both in key
// order, and tells its outcomes of every key: the state's alone, the
// listing's alone, or both's. The listing pushes its keys (take is a
// lister's callback); the state's are pulled from an iterator, which stop
// releases. An outcome gets the state's value before the next is pulled,
// so that an iterator may lend it until then (a saved state read as it
// goes). Owned by the goroutine that calls take.
type merge[V any] struct {
	out  outcomes[V]
	next func() (string, V, bool)
	stop func()
	key  string // the state's next key not yet passed; valid while more
	val  V      // its value
	more bool
}

// outcomes is what a merge tells its user, in key order.
type outcomes[V any] interface {
	stateOnly(key string, v V)      // a key of the state that the listing passed without
	listedOnly(kv *mvccpb.KeyValue) // a listed key the state does not have
	both(v V, kv *mvccpb.KeyValue)  // a key of both
}

func newMerge[V any](state iter.Seq2[string, V], out outcomes[V]) *merge[V] {
	m := &merge[V]{out: out}
	m.next, m.stop = iter.Pull2(state)
	m.advance()
	return m
}

func (m *merge[V]) advance() { m.key, m.val, m.more = m.next() }

// take is the listing's callback, for each key in order: it first settles
// the state's keys before kv's.
func (m *merge[V]) take(kv *mvccpb.KeyValue) error {
	for m.more && m.key < string(kv.Key) {
		m.passed()
	}
	if m.more && m.key == string(kv.Key) {
		m.out.both(m.val, kv)
		m.advance()
		return nil
	}
	m.out.listedOnly(kv)
	return nil
}

// finish settles the state's keys after the listing's last.
func (m *merge[V]) finish() {
	for m.more {
		m.passed()
	}
}

func (m *merge[V]) passed() {
	m.out.stateOnly(m.key, m.val)
	m.advance()
}

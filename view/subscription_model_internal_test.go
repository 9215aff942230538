package view

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"sort"
	"sync/atomic"
	"testing"
)

// A model of the runner's publications (Events steps of one or several
// revisions, progress batches, rationed progress published as a state
// alone, late progress batches, relists with same) against subscribers
// that hold the store's state at any revision (behind, inside a batch, ahead
// of the view), read at their own pace. Each batch must start where the
// subscriber stands (or be a Resync) and leave it with the store's state at
// the batch's Revision.

// mkv is a key's value in the model: what a subscriber must hold.
type mkv struct {
	val         string
	create, mod int64
}

// mview is the model: a store, its state at each revision (truth), and a
// view's core fed as the runner feeds it.
type mview struct {
	t        *testing.T
	rnd      *rand.Rand
	c        *core[string]
	ed       *tableEditor[string]
	store    map[string]mkv
	storeRev int64
	truth    map[int64]map[string]mkv
	rev      int64 // the view's
	from     int64
}

// bump makes a store revision, changing the range or not.
func (m *mview) bump() {
	m.storeRev++
	m.truth[m.storeRev] = maps.Clone(m.store)
}

// change makes one store revision changing the range, returning the key.
func (m *mview) change() (string, bool) {
	k := fmt.Sprintf("k%d", m.rnd.IntN(6))
	old, ok := m.store[k]
	if ok && m.rnd.IntN(3) == 0 {
		delete(m.store, k)
		m.bump()
		return k, true
	}
	rev := m.storeRev + 1
	nv := mkv{val: fmt.Sprint(rev), create: rev, mod: rev}
	if ok {
		nv.create = old.create
	}
	m.store[k] = nv
	m.bump()
	return k, false
}

// entryOf is the Entry of k holding v.
func entryOf(k string, v mkv) *Entry[string] {
	return &Entry[string]{Key: k, Value: v.val, CreateRevision: v.create, ModRevision: v.mod, Version: 1, size: len(k) + len(v.val)}
}

// publish publishes the model's state with bs as the steps to it, as the
// runner's publish does.
func (m *mview) publish(bs ...Batch[string]) {
	if cur := m.c.snap.Load(); cur != nil && cur.rev == m.rev && len(bs) == 0 {
		return
	}
	m.c.hist.publish(&m.c.snap, &Snapshot[string]{m: m.ed.Map(), rev: m.rev}, bs)
}

// writes: 1..3 revisions changing the range, seen by the view, one batch.
func (m *mview) writes() {
	var chs []Change[string]
	for range 1 + m.rnd.IntN(3) {
		k, deleted := m.change()
		if deleted {
			old, _ := m.ed.Delete(k)
			chs = append(chs, Change[string]{Kind: Deleted, Key: k, Revision: m.storeRev, Prev: kept(old)})
		} else {
			e := entryOf(k, m.store[k])
			old, replaced := m.ed.Set(e)
			ch := Change[string]{Kind: Created, Key: k, Revision: m.storeRev, Entry: e}
			if replaced {
				ch.Kind, ch.Prev = Updated, kept(old)
			}
			chs = append(chs, ch)
		}
		m.rev = m.storeRev
	}
	m.publish(Batch[string]{Kind: Events, From: m.from, Revision: m.rev, Changes: chs})
	m.from = m.rev
}

// bookmark: the view moves to the store's revision without changes: a
// progress batch, or rationed (a state alone).
func (m *mview) bookmark(rationed bool) {
	if m.rev == m.storeRev {
		return
	}
	m.rev = m.storeRev
	if rationed {
		m.publish()
		return
	}
	m.publish(Batch[string]{Kind: Events, From: m.from, Revision: m.rev})
	m.from = m.rev
}

// late: the rationed progress batch, published later.
func (m *mview) late() {
	if m.rev > m.from {
		m.publish(Batch[string]{Kind: Events, From: m.from, Revision: m.rev})
		m.from = m.rev
	}
}

// relist: changes the view does not see, then a listing at the store's
// revision.
func (m *mview) relist() {
	for range m.rnd.IntN(4) {
		if m.rnd.IntN(2) == 0 {
			m.bump()
		} else {
			m.change()
		}
	}
	base := m.rev
	keys := map[string]bool{}
	for k := range m.ed.Map().All() {
		keys[k] = true
	}
	for k := range m.store {
		keys[k] = true
	}
	ks := make([]string, 0, len(keys))
	for k := range keys {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	var chs []Change[string]
	for _, k := range ks {
		old, had := m.ed.Map().Get(k)
		nv, has := m.store[k]
		switch {
		case had && !has:
			m.ed.Delete(k)
			chs = append(chs, Change[string]{Kind: Deleted, Key: k, Prev: kept(old)})
		case !had && has:
			e := entryOf(k, nv)
			m.ed.Set(e)
			chs = append(chs, Change[string]{Kind: Created, Key: k, Entry: e})
		case had && has && old.ModRevision != nv.mod:
			e := entryOf(k, nv)
			m.ed.Set(e)
			chs = replaced(chs, *e, old.CreateRevision, old.ModRevision, func() *Entry[string] { return kept(old) })
		}
	}
	relisted(chs, m.storeRev)
	m.rev = m.storeRev
	m.publish(Batch[string]{Kind: Relisted, From: m.from, Revision: m.rev, Changes: chs, same: base})
	m.from = m.rev
}

// msub is a subscriber: its subscription, and the state it holds at rev.
type msub struct {
	s     *Subscription[string]
	state map[string]mkv
	rev   int64
	desc  string
}

// check applies b to sub's state and fails unless b starts where sub stands
// (or is a Resync) and leaves it with the store's state at b.Revision.
func (m *mview) check(sub *msub, b Batch[string]) {
	t := m.t
	t.Helper()
	switch b.Kind {
	case Resync:
		sub.state = map[string]mkv{}
		for _, ch := range b.Changes {
			sub.state[ch.Key] = mkv{ch.Entry.Value, ch.Entry.CreateRevision, ch.Entry.ModRevision}
		}
	default:
		if b.From != sub.rev {
			t.Fatalf("%s: %v batch from %d, the subscriber is at %d", sub.desc, b.Kind, b.From, sub.rev)
		}
		for _, ch := range b.Changes {
			_, had := sub.state[ch.Key]
			switch ch.Kind {
			case Created:
				if had {
					t.Fatalf("%s: %v batch %d->%d creates %s, which it holds", sub.desc, b.Kind, b.From, b.Revision, ch.Key)
				}
				sub.state[ch.Key] = mkv{ch.Entry.Value, ch.Entry.CreateRevision, ch.Entry.ModRevision}
			case Updated:
				if !had {
					t.Fatalf("%s: %v batch %d->%d updates %s, which it lacks", sub.desc, b.Kind, b.From, b.Revision, ch.Key)
				}
				sub.state[ch.Key] = mkv{ch.Entry.Value, ch.Entry.CreateRevision, ch.Entry.ModRevision}
			case Deleted:
				if !had {
					t.Fatalf("%s: %v batch %d->%d deletes %s, which it lacks", sub.desc, b.Kind, b.From, b.Revision, ch.Key)
				}
				delete(sub.state, ch.Key)
			}
		}
	}
	sub.rev = b.Revision
	if want := m.truth[b.Revision]; !maps.Equal(want, sub.state) {
		t.Fatalf("%s: after %v batch %d->%d: %v, the store's %v", sub.desc, b.Kind, b.From, b.Revision, sub.state, want)
	}
}

// TestSubscriptionModel runs 3,000 seeded models of 60 steps each. It fails
// when a subscriber misses, repeats or reorders a change, or is given a
// batch that does not start where it stands: for example with the check of
// a start inside a restored relist (unknownStart) or of the history's floor
// taken out.
func TestSubscriptionModel(t *testing.T) {
	for seed := range uint64(3000) {
		runModel(t, seed)
		if t.Failed() {
			return
		}
	}
}

// read checks up to n of the batches sub has ready (n < 0: all of them).
func (m *mview) read(sub *msub, n int) {
	for ; n != 0; n-- {
		b, wait, err := sub.s.poll()
		if err != nil {
			m.t.Fatal(err)
		}
		if wait != nil {
			return
		}
		m.check(sub, b)
	}
}

// runModel runs the model of seed.
func runModel(t *testing.T, seed uint64) {
	rnd := rand.New(rand.NewPCG(seed, 1))
	c := &core[string]{}
	c.hist.init(int64(200 + rnd.IntN(2000)))
	m := &mview{t: t, rnd: rnd, c: c, ed: table[string]{}.Edit(), store: map[string]mkv{}, truth: map[int64]map[string]mkv{}}
	for range 3 {
		m.change()
	}
	m.rev, m.from = m.storeRev, m.storeRev
	c.hist.floor = m.rev
	m.ed = table[string]{}.Edit()
	for k, v := range m.store {
		m.ed.Set(entryOf(k, v))
	}
	m.publish()
	first := m.rev
	var subs []*msub
	var resyncs atomic.Uint64
	for step := range 60 {
		switch op := rnd.IntN(10); {
		case op < 4:
			m.writes()
		case op == 4:
			m.bump()
		case op == 5:
			m.bookmark(true)
		case op == 6:
			m.bookmark(false)
		case op == 7:
			m.late()
		case op == 8:
			m.relist()
		case op == 9:
			// a subscriber: from nothing, the view's state, or any revision
			var rev int64
			switch rnd.IntN(3) {
			case 0:
				rev = m.c.snap.Load().rev
			case 1:
				rev = first + rnd.Int64N(m.storeRev-first+1)
			}
			sub := &msub{s: c.subscribe(t.Context(), rev, &resyncs, nil), rev: rev, state: maps.Clone(m.truth[rev]), desc: fmt.Sprintf("seed %d step %d sub from %d (view at %d, store at %d)", seed, step, rev, m.rev, m.storeRev)}
			if rev == 0 {
				sub.state = map[string]mkv{}
			}
			subs = append(subs, sub)
		}
		for _, sub := range subs {
			m.read(sub, rnd.IntN(3))
		}
	}
	for _, sub := range subs {
		m.read(sub, -1)
		if !maps.Equal(sub.state, m.truth[m.rev]) {
			t.Fatalf("%s: ends at %d with %v, the view at %d holds %v", sub.desc, sub.rev, sub.state, m.rev, m.truth[m.rev])
		}
		sub.s.Close()
	}
}

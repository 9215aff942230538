package view

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// The tests in this file check table and differ against plain maps, over
// random edits with snapshots held across them: every field of every
// Entry, narrow and wide records alike (a decode error, a Version above 32
// bits), and that the side map of wides holds exactly the wide keys.

// tsnap is a table snapshot and what it must hold.
type tsnap struct {
	tb   table[[]byte]
	want map[string]Entry[[]byte]
}

// randEntry is an Entry of k at rev, wide one time in two.
func randEntry(rng *rand.Rand, k string, rev int64) Entry[[]byte] {
	e := Entry[[]byte]{Key: k, Value: []byte(fmt.Sprint(rev)), CreateRevision: rev, ModRevision: rev, Version: int64(rng.IntN(5) + 1), Lease: int64(rng.IntN(3)), size: rng.IntN(100)}
	switch rng.IntN(4) {
	case 0:
		e.Err, e.Value = errors.New("bad"+k), nil
	case 1:
		e.Version = math.MaxUint32 + int64(rng.IntN(10))
	}
	return e
}

// checkTable fails t unless tb holds want exactly, in key order, with a
// wide for each wide record and no other.
func checkTable(t *testing.T, tb table[[]byte], want map[string]Entry[[]byte]) {
	t.Helper()
	if len(want) != tb.Len() {
		t.Fatalf("Len %d want %d", tb.Len(), len(want))
	}
	keys := slices.Sorted(maps.Keys(want))
	i, nw := 0, 0
	for k, e := range tb.All() {
		if keys[i] != k {
			t.Fatalf("key #%d %q want %q", i, k, keys[i])
		}
		w := want[k]
		if (w.Err == nil) != (e.Err == nil) || (w.Err != nil && w.Err.Error() != e.Err.Error()) {
			t.Fatalf("%q: err %v want %v", k, e.Err, w.Err)
		}
		if w.Err != nil || w.Version > math.MaxUint32 {
			nw++
		}
		if e.Key != w.Key || string(e.Value) != string(w.Value) || e.CreateRevision != w.CreateRevision || e.ModRevision != w.ModRevision || e.Version != w.Version || e.Lease != w.Lease || e.size != w.size {
			t.Fatalf("%q: got %+v want %+v", k, e, w)
		}
		i++
	}
	if i != len(keys) {
		t.Fatalf("walked %d want %d", i, len(keys))
	}
	if nw != tb.wides.Len() {
		t.Fatalf("wides %d want %d", tb.wides.Len(), nw)
	}
	for k := range tb.wides.All() {
		if _, ok := want[k]; !ok {
			t.Fatalf("wide for missing key %q", k)
		}
	}
}

// requireSame fails t unless got, an Entry the table returned as replaced
// or deleted, is the one the model held.
func requireSame(t *testing.T, want, got Entry[[]byte]) {
	t.Helper()
	require.Equal(t, want.Key, got.Key)
	require.Equal(t, want.ModRevision, got.ModRevision)
	require.Equal(t, want.Version, got.Version)
	require.Equal(t, want.Err == nil, got.Err == nil)
	require.Equal(t, want.size, got.size)
}

// TestTableAgainstAModel: Set, Delete, Append and Map at random, every
// snapshot checked at the end. Catches a wide left behind or lost as a
// record turns narrow or wide, and an old Entry misreported.
func TestTableAgainstAModel(t *testing.T) {
	for seed := uint64(0); seed < 4; seed++ {
		rng := rand.New(rand.NewPCG(seed, 1))
		ed := table[[]byte]{}.Edit()
		want := map[string]Entry[[]byte]{}
		var snaps []tsnap
		rev := int64(0)
		nextApp := 100000
		space := 50 + rng.IntN(1000)
		for op := 0; op < 1000; op++ {
			rev++
			switch r := rng.IntN(10); {
			case r < 4:
				k := fmt.Sprintf("%06d", rng.IntN(space))
				e := randEntry(rng, k, rev)
				old, rep := ed.Set(&e)
				w, ok := want[k]
				require.Equal(t, ok, rep)
				if ok {
					requireSame(t, w, old)
				}
				want[k] = e
			case r < 7:
				k := fmt.Sprintf("%06d", rng.IntN(space))
				old, ok := ed.Delete(k)
				w, wok := want[k]
				require.Equal(t, wok, ok)
				if ok {
					requireSame(t, w, old)
				}
				delete(want, k)
			case r < 9:
				n := rng.IntN(40)
				for range n {
					k := fmt.Sprintf("%06d", nextApp)
					nextApp++
					e := randEntry(rng, k, rev)
					ed.Append(&e)
					want[k] = e
				}
			default:
				snaps = append(snaps, tsnap{ed.Map(), maps.Clone(want)})
			}
		}
		snaps = append(snaps, tsnap{ed.Map(), maps.Clone(want)})
		for _, s := range snaps {
			checkTable(t, s.tb, s.want)
		}
	}
}

// TestDifferAgainstAModel: a random state built as a first listing does,
// then a random listing of it (keys deleted, updated, recreated, new; some
// wide). The differ's table must equal the listing; its changes applied to
// the state must give the listing, each with the right Prev; its byte count
// must be right; and the state must not change.
func TestDifferAgainstAModel(t *testing.T) {
	c := &core[[]byte]{log: slog.New(slog.DiscardHandler), decode: func(_, v []byte) ([]byte, error) {
		if len(v) > 0 && v[0] == 'x' {
			return nil, errors.New("bad")
		}
		return v, nil
	}}
	for seed := uint64(0); seed < 40; seed++ {
		rng := rand.New(rand.NewPCG(seed, 2))
		space := 1 + rng.IntN(2000)
		type kvs = map[string]*mvccpb.KeyValue
		mk := func(k string, create, mod int64) *mvccpb.KeyValue {
			v := []byte(fmt.Sprint("v", mod))
			if rng.IntN(3) == 0 {
				v = []byte(fmt.Sprint("x", mod))
			}
			ver := int64(1 + rng.IntN(3))
			if rng.IntN(4) == 0 {
				ver = math.MaxUint32 + 3
			}
			return &mvccpb.KeyValue{Key: []byte(k), Value: v, CreateRevision: create, ModRevision: mod, Version: ver}
		}
		base := kvs{}
		for i := 0; i < space; i++ {
			if rng.IntN(2) == 0 {
				k := fmt.Sprintf("%05d", i)
				base[k] = mk(k, 1, 1+int64(rng.IntN(3)))
			}
		}
		// The state, built by a first listing's differ, as the runner does.
		d0 := newDiffer(c, &Snapshot[[]byte]{}, false)
		for _, k := range slices.Sorted(maps.Keys(base)) {
			require.NoError(t, d0.take(base[k]))
		}
		d0.finish(10)
		d0.stop()
		snap := &Snapshot[[]byte]{m: d0.ed.Map(), rev: 10, bytes: d0.bytes}
		// A listing of it, later.
		list := kvs{}
		for k, kv := range base {
			switch rng.IntN(4) {
			case 0: // deleted
			case 1:
				list[k] = mk(k, kv.CreateRevision, kv.ModRevision+10)
			case 2:
				list[k] = mk(k, 15, 16)
			default:
				list[k] = kv
			}
		}
		for i := 0; i < space/3; i++ {
			k := fmt.Sprintf("%05d", rng.IntN(space+100))
			if _, ok := base[k]; !ok {
				list[k] = mk(k, 17, 17)
			}
		}
		d := newDiffer(c, snap, true)
		for _, k := range slices.Sorted(maps.Keys(list)) {
			require.NoError(t, d.take(list[k]))
		}
		d.finish(20)
		d.stop()
		got := d.ed.Map()
		// The differ's table is the listing.
		require.Equal(t, len(list), got.Len())
		nw := 0
		var bytes int64
		for k, e := range got.All() {
			kv := list[k]
			require.NotNil(t, kv, k)
			require.Equal(t, kv.ModRevision, e.ModRevision)
			require.Equal(t, kv.Version, e.Version)
			require.Equal(t, kv.Value[0] == 'x', e.Err != nil)
			if e.Err != nil || e.Version > math.MaxUint32 {
				nw++
			}
			bytes += int64(e.size)
		}
		require.Equal(t, nw, got.wides.Len())
		require.Equal(t, bytes, d.bytes)
		// The changes take the state to the listing.
		m := map[string]int64{}
		for k, kv := range base {
			m[k] = kv.ModRevision
		}
		for _, ch := range d.changes {
			switch ch.Kind {
			case Deleted:
				_, ok := m[ch.Key]
				require.True(t, ok)
				require.Equal(t, base[ch.Key].ModRevision, ch.Prev.ModRevision)
				require.Equal(t, base[ch.Key].Version, ch.Prev.Version)
				delete(m, ch.Key)
			case Created:
				_, ok := m[ch.Key]
				require.False(t, ok)
				m[ch.Key] = ch.Entry.ModRevision
			case Updated:
				require.Equal(t, base[ch.Key].ModRevision, ch.Prev.ModRevision)
				require.Equal(t, base[ch.Key].Version, ch.Prev.Version)
				m[ch.Key] = ch.Entry.ModRevision
			}
		}
		require.Equal(t, len(list), len(m))
		for k, kv := range list {
			require.Equal(t, kv.ModRevision, m[k])
		}
		// The state did not change.
		require.Equal(t, len(base), snap.Len())
		for k, e := range snap.All() {
			require.Equal(t, base[k].ModRevision, e.ModRevision)
			require.Equal(t, base[k].Version, e.Version)
		}
	}
}

package view

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/etcdwatch/etcdwatch"
)

// kvAt is a listed key: its create and mod revisions.
type kvAt struct {
	key         string
	create, mod int64
}

func stateOf(c *core[[]byte], kvs ...kvAt) *Snapshot[[]byte] {
	ed := (&Snapshot[[]byte]{}).m.Edit()
	bytes := int64(0)
	for _, kv := range kvs {
		e := c.entry(kv.key, []byte(kv.key), []byte("v"), kv.create, kv.mod, 1, 0)
		ed.Set(kv.key, e)
		bytes += int64(e.size)
	}
	return &Snapshot[[]byte]{m: ed.Map(), rev: 10, bytes: bytes}
}

// TestDiffer: a listing against the state it replaces gives exactly the
// keys gone, new, changed, and deleted then created again; a key whose
// revision did not move is kept as it was, not decoded again.
func TestDiffer(t *testing.T) {
	for _, tc := range []struct {
		name      string
		base, got []kvAt
		want      []string
	}{
		{"nothing", nil, nil, nil},
		{"first keys", nil, []kvAt{{"a", 1, 1}, {"b", 2, 2}}, []string{"created a", "created b"}},
		{"all gone", []kvAt{{"a", 1, 1}, {"b", 2, 2}}, nil, []string{"deleted a", "deleted b"}},
		{"unchanged", []kvAt{{"a", 1, 1}, {"b", 2, 2}}, []kvAt{{"a", 1, 1}, {"b", 2, 2}}, nil},
		{"updated", []kvAt{{"a", 1, 1}}, []kvAt{{"a", 1, 5}}, []string{"updated a"}},
		{"recreated", []kvAt{{"a", 1, 1}}, []kvAt{{"a", 4, 5}}, []string{"deleted a", "created a"}},
		{"interleaved", []kvAt{{"b", 1, 1}, {"d", 2, 2}, {"f", 3, 3}},
			[]kvAt{{"a", 4, 4}, {"b", 1, 1}, {"c", 5, 5}, {"f", 3, 6}, {"g", 7, 7}},
			[]string{"created a", "created c", "deleted d", "updated f", "created g"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			decoded := 0
			c := &core[[]byte]{log: slog.New(slog.DiscardHandler), decode: func(_, v []byte) ([]byte, error) { decoded++; return v, nil }}
			base := stateOf(c, tc.base...)
			decoded = 0
			d := newDiffer(c, base, true)
			defer d.stop()
			for _, kv := range tc.got {
				require.NoError(t, d.take(&mvccpb.KeyValue{Key: []byte(kv.key), Value: []byte("v"), CreateRevision: kv.create, ModRevision: kv.mod}))
			}
			d.finish(20)
			var got []string
			for _, ch := range d.changes {
				got = append(got, ch.Kind.String()+" "+ch.Key)
				require.EqualValues(t, 20, ch.Revision)
			}
			require.Equal(t, tc.want, got)
			var keys []string
			for k, e := range d.ed.All() {
				keys = append(keys, k)
				require.Equal(t, k, e.Key)
			}
			var want []string
			for _, kv := range tc.got {
				want = append(want, kv.key)
			}
			require.Equal(t, want, keys)
			created := 0
			for _, ch := range d.changes {
				if ch.Kind == Created || ch.Kind == Updated {
					created++
				}
			}
			require.Equal(t, created, decoded, "only new values are decoded")
			require.EqualValues(t, 2*len(tc.got), d.bytes, "bytes follow the keys")
		})
	}
}

// TestHistoryBound: the history keeps the newest batches within its bound,
// the newest whatever its size, and its floor says what it still covers.
func TestHistoryBound(t *testing.T) {
	var h history[[]byte]
	h.init(3 * (changeWeight + 2))
	batch := func(rev int64, n int) Batch[[]byte] {
		b := Batch[[]byte]{Kind: Events, From: rev - 1, Revision: rev}
		for i := range n {
			k := fmt.Sprint(i)
			b.Changes = append(b.Changes, Change[[]byte]{Kind: Created, Key: k, Revision: rev, Entry: &Entry[[]byte]{Key: k, size: 2}})
		}
		return b
	}
	h.floor = 1
	for rev := int64(2); rev <= 4; rev++ {
		h.push(batch(rev, 1))
	}
	require.Len(t, h.items, 3)
	require.EqualValues(t, 1, h.floor)
	h.push(batch(5, 1))
	require.Len(t, h.items, 3)
	require.EqualValues(t, 2, h.floor, "the change of revision 2 is gone")
	require.EqualValues(t, 1, h.first)
	h.push(batch(6, 10))
	require.Len(t, h.items, 1, "the newest is kept whatever its size")
	require.EqualValues(t, 5, h.floor)
}

// TestTrim: a batch of several revisions, asked for from one inside it,
// starts there; a Relisted one is one step and stays whole.
func TestTrim(t *testing.T) {
	b := Batch[[]byte]{Kind: Events, From: 1, Revision: 4, Changes: []Change[[]byte]{{Key: "a", Revision: 2}, {Key: "b", Revision: 3}, {Key: "c", Revision: 3}, {Key: "d", Revision: 4}}}
	got := trim(b, 3)
	require.EqualValues(t, 2, got.From)
	require.Len(t, got.Changes, 3)
	require.Equal(t, b, trim(b, 2))
	b.Kind = Relisted
	require.Equal(t, b, trim(b, 3))
}

// TestPacer: a response after a quiet spell is published at once; while
// responses keep coming they wait for the gap since the last publication,
// or until maxHeld of them wait.
func TestPacer(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ms := time.Millisecond
	for _, tc := range []struct {
		name  string
		after []time.Duration // arrival of each response after the last publication, at t0
		want  []time.Duration // how long each may wait
	}{
		{"quiet", []time.Duration{5 * ms}, []time.Duration{0}},
		{"at the gap", []time.Duration{ms}, []time.Duration{0}},
		{"a burst", []time.Duration{0, ms / 4, ms / 2}, []time.Duration{ms, 3 * ms / 4, ms / 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := pacer{gap: ms}
			p.published(t0)
			for i, d := range tc.after {
				require.Equal(t, tc.want[i], p.applied(t0.Add(d)), "response %d", i)
			}
		})
	}
	p := pacer{gap: ms}
	p.published(t0)
	for i := range maxHeld - 1 {
		require.NotZero(t, p.applied(t0), "response %d", i)
	}
	require.Zero(t, p.applied(t0), "maxHeld responses are published at once")
	p.published(t0)
	require.NotZero(t, p.applied(t0), "published resets the count")
}

// TestHoldStep: small steps held for publication are joined, up to etcdwatch.JoinLimit
// changes, into one step from the first's From to the last's Revision.
func TestHoldStep(t *testing.T) {
	step := func(from, n int) Batch[[]byte] {
		return Batch[[]byte]{Kind: Events, From: int64(from), Revision: int64(from + 1), Changes: make([]Change[[]byte], n)}
	}
	var held []Batch[[]byte]
	held = holdStep(held, step(1, 1))
	held = holdStep(held, step(2, 0))
	held = holdStep(held, step(2, 1))
	require.Len(t, held, 1)
	require.EqualValues(t, 1, held[0].From)
	require.EqualValues(t, 3, held[0].Revision)
	require.Len(t, held[0].Changes, 2)
	held = holdStep(held, step(3, etcdwatch.JoinLimit-1))
	require.Len(t, held, 2, "past etcdwatch.JoinLimit changes a step is kept apart")
	require.EqualValues(t, 3, held[1].From)
}

package view

import (
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/mvccpb"
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
		ed.Set(&e)
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
				require.NoError(t, d.take(&mvccpb.KeyValue{Key: []byte(kv.key), Value: []byte("v"), CreateRevision: kv.create, ModRevision: kv.mod, Version: 1}))
			}
			d.finish(20)
			var got []string
			for _, ch := range d.changes {
				got = append(got, ch.Kind.String()+" "+ch.Key)
				if ch.Kind == Deleted {
					require.EqualValues(t, 20, ch.Revision, "a delete's revision is not known: the listing's")
				} else {
					require.Equal(t, ch.Entry.ModRevision, ch.Revision, "a put's revision is its key's")
				}
			}
			require.Equal(t, tc.want, got)
			var keys []string
			for k, e := range d.ed.Map().All() {
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

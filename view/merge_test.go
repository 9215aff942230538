package view

import (
	"fmt"
	"maps"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// mergeLog records a merge's outcomes in the order told.
type mergeLog struct{ got []string }

func (l *mergeLog) stateOnly(key string, v int) {
	l.got = append(l.got, fmt.Sprintf("state %s=%d", key, v))
}
func (l *mergeLog) listedOnly(kv *mvccpb.KeyValue) {
	l.got = append(l.got, "listed "+string(kv.Key))
}
func (l *mergeLog) both(v int, kv *mvccpb.KeyValue) {
	l.got = append(l.got, fmt.Sprintf("both %s=%d", kv.Key, v))
}

// TestMerge: every key of the state and of the listing is told once, in key
// order, as the state's, the listing's or both's, with the state's value.
func TestMerge(t *testing.T) {
	for _, tc := range []struct {
		name   string
		state  map[string]int
		listed []string
		want   []string
	}{
		{"nothing", nil, nil, nil},
		{"state only", map[string]int{"a": 1, "b": 2}, nil, []string{"state a=1", "state b=2"}},
		{"listed only", nil, []string{"a", "b"}, []string{"listed a", "listed b"}},
		{"same keys", map[string]int{"a": 1, "b": 2}, []string{"a", "b"}, []string{"both a=1", "both b=2"}},
		{"interleaved", map[string]int{"b": 1, "d": 2, "f": 3}, []string{"a", "b", "c", "f", "g"},
			[]string{"listed a", "both b=1", "listed c", "state d=2", "both f=3", "listed g"}},
		{"state after the last listed", map[string]int{"a": 1, "y": 2, "z": 3}, []string{"a", "b"},
			[]string{"both a=1", "listed b", "state y=2", "state z=3"}},
		{"a prefix of a key", map[string]int{"ab": 1}, []string{"a", "abc"}, []string{"listed a", "state ab=1", "listed abc"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			state := func(yield func(string, int) bool) {
				for _, k := range slices.Sorted(maps.Keys(tc.state)) {
					if !yield(k, tc.state[k]) {
						return
					}
				}
			}
			var l mergeLog
			m := newMerge(state, &l)
			defer m.stop()
			for _, k := range tc.listed {
				require.NoError(t, m.take(&mvccpb.KeyValue{Key: []byte(k)}))
			}
			m.finish()
			require.Equal(t, tc.want, l.got)
		})
	}
}

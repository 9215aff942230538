package group

import (
	"reflect"
	"testing"
	"time"

	"github.com/etcdwatch/etcdwatch"
)

// TestAddCoversEveryField: add carries every field of etcdwatch.Stats, so
// that a field added to Stats cannot be left out of the group's total
// unnoticed: each field set alone in b must come out of add(zero, b), and
// counts must add up.
func TestAddCoversEveryField(t *testing.T) {
	typ := reflect.TypeFor[etcdwatch.Stats]()
	for i := range typ.NumField() {
		var b etcdwatch.Stats
		f := reflect.ValueOf(&b).Elem().Field(i)
		switch f.Kind() {
		case reflect.Int64:
			f.SetInt(7)
		case reflect.Uint64:
			f.SetUint(7)
		case reflect.Bool:
			f.SetBool(true)
		default:
			if f.Type() != reflect.TypeFor[time.Time]() {
				t.Fatalf("Stats.%s: a %s, which add does not know", typ.Field(i).Name, f.Type())
			}
			f.Set(reflect.ValueOf(time.Unix(1700000000, 0)))
		}
		if got := add(etcdwatch.Stats{}, b); got != b {
			t.Errorf("Stats.%s: add(zero, b) = %+v; want %+v", typ.Field(i).Name, got, b)
		}
		twice := add(b, b)
		g := reflect.ValueOf(twice).Field(i)
		switch name := typ.Field(i).Name; {
		case name == "Revision":
			if g.Int() != 7 {
				t.Errorf("Revision: the highest, not a sum; got %d", g.Int())
			}
		case f.Kind() == reflect.Int64 && g.Int() != 14, f.Kind() == reflect.Uint64 && g.Uint() != 14:
			t.Errorf("Stats.%s: 7 + 7 = %v", name, g)
		}
	}
	later := etcdwatch.Stats{Revision: 9, LastMessage: time.Unix(1700000009, 0)}
	earlier := etcdwatch.Stats{Revision: 3, LastMessage: time.Unix(1700000001, 0)}
	if got := add(later, earlier); got.Revision != 9 || !got.LastMessage.Equal(later.LastMessage) {
		t.Errorf("add keeps the highest revision and the latest message: %+v", got)
	}
}

// TestCombine: the group's State over two Streams is connected while
// both are, and Since is when that last changed: the later coming up when
// both are up, the first going down when both are down, the one down when
// one is. The later error stands. Catches: Since taken as the later of the
// two whatever they are (a Stream coming back moved the start of an
// outage another Stream still has).
func TestCombine(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	up := func(s int) etcdwatch.State { return etcdwatch.State{Connected: true, Since: at(s)} }
	down := func(s int) etcdwatch.State {
		return etcdwatch.State{Since: at(s), LastError: etcdwatch.ErrClosed, LastErrorAt: at(s)}
	}
	for _, tc := range []struct {
		name      string
		a, b      etcdwatch.State
		connected bool
		since     int
	}{
		{"both up: the later came up", up(1), up(3), true, 3},
		{"both up, the other order", up(3), up(1), true, 3},
		{"a down, b up since later", down(1), up(3), false, 1},
		{"a up, b down", up(1), down(3), false, 3},
		{"a up since later, b down", up(5), down(3), false, 3},
		{"both down: the first went down", down(4), down(2), false, 2},
	} {
		for _, order := range [][2]etcdwatch.State{{tc.a, tc.b}, {tc.b, tc.a}} {
			got := combine(order[0], order[1])
			if got.Connected != tc.connected || !got.Since.Equal(at(tc.since)) {
				t.Errorf("%s: connected %v since %v; want %v since %v", tc.name, got.Connected, got.Since.Sub(t0), tc.connected, at(tc.since).Sub(t0))
			}
		}
	}
}

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

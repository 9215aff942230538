package cow

import (
	"math/rand/v2"
	"testing"
)

const benchN = 100_000

func sortedKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = key(i * 2)
	}
	return keys
}

func shuffled(n int) []string {
	keys := sortedKeys(n)
	rand.New(rand.NewPCG(1, 2)).Shuffle(n, func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
	return keys
}

func built(keys []string) *Editor[*payload] {
	var e Editor[*payload]
	v := new(payload)
	for _, k := range keys {
		e.Set(k, v)
	}
	return &e
}

// BenchmarkSetRandom100k builds a 100k map by Set in random order: one op is
// the whole build.
func BenchmarkSetRandom100k(b *testing.B) {
	keys, v := shuffled(benchN), new(payload)
	for b.Loop() {
		var e Editor[*payload]
		for _, k := range keys {
			e.Set(k, v)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*benchN), "ns/key")
}

// BenchmarkSetSorted100k is Set fed the input Append takes, for comparison.
func BenchmarkSetSorted100k(b *testing.B) {
	keys, v := sortedKeys(benchN), new(payload)
	for b.Loop() {
		var e Editor[*payload]
		for _, k := range keys {
			e.Set(k, v)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*benchN), "ns/key")
}

// BenchmarkAppend100k builds a 100k map by Append: one op is the build.
func BenchmarkAppend100k(b *testing.B) {
	keys, v := sortedKeys(benchN), new(payload)
	for b.Loop() {
		var e Editor[*payload]
		for _, k := range keys {
			e.Append(k, v)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*benchN), "ns/key")
}

// BenchmarkSetInto100k inserts random new keys into a map of 100k, one op
// a Set, deleting each again when the pool wraps so that the size stays.
func BenchmarkSetInto100k(b *testing.B) {
	e, v := built(shuffled(benchN)), new(payload)
	fresh := make([]string, benchN)
	for i, k := range shuffled(benchN) {
		fresh[i] = k + "x" // between the map's keys
	}
	i := 0
	for b.Loop() {
		if i == len(fresh) {
			b.StopTimer()
			for _, k := range fresh {
				e.Delete(k)
			}
			i = 0
			b.StartTimer()
		}
		e.Set(fresh[i], v)
		i++
	}
}

func BenchmarkGet100k(b *testing.B) {
	keys := shuffled(benchN)
	m := built(keys).Map()
	i := 0
	for b.Loop() {
		if _, ok := m.Get(keys[i]); !ok {
			b.Fatal("missing")
		}
		i++
		if i == len(keys) {
			i = 0
		}
	}
}

// BenchmarkAll100k iterates a 100k map: one op is the whole iteration.
func BenchmarkAll100k(b *testing.B) {
	m := built(shuffled(benchN)).Map()
	for b.Loop() {
		n := 0
		for range m.All() {
			n++
		}
		if n != benchN {
			b.Fatal(n)
		}
	}
}

// BenchmarkSetMap100k replaces a random key of a 100k map and publishes
// after every Set, so each op copies a root-to-leaf path.
func BenchmarkSetMap100k(b *testing.B) {
	keys := shuffled(benchN)
	e, v := built(keys), new(payload)
	e.Map()
	i := 0
	for b.Loop() {
		e.Set(keys[i], v)
		_ = e.Map()
		i++
		if i == len(keys) {
			i = 0
		}
	}
}

// BenchmarkDeleteSetMap100k deletes a random key and sets it back,
// publishing after each: the churn of a view under updates.
func BenchmarkDeleteSetMap100k(b *testing.B) {
	keys := shuffled(benchN)
	e, v := built(keys), new(payload)
	e.Map()
	i := 0
	for b.Loop() {
		e.Delete(keys[i])
		_ = e.Map()
		e.Set(keys[i], v)
		_ = e.Map()
		i++
		if i == len(keys) {
			i = 0
		}
	}
}

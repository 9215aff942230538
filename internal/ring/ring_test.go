package ring

import (
	"slices"
	"testing"
)

func TestRingFIFOAcrossGrowthAndWrap(t *testing.T) {
	var r Ring[int]
	if _, ok := r.Pop(); ok {
		t.Fatal("Pop on empty ring reported a value")
	}
	next, want := 0, 0
	// Interleave pushes and pops so that the head wraps before each growth.
	for round := 1; round <= 50; round++ {
		for range round {
			r.Push(next)
			next++
		}
		for range round / 2 {
			if head, ok := r.Peek(); !ok || head != want {
				t.Fatalf("Peek = %d, %v; want %d, true", head, ok, want)
			}
			got, ok := r.Pop()
			if !ok || got != want {
				t.Fatalf("Pop = %d, %v; want %d, true", got, ok, want)
			}
			want++
		}
		if l := r.Last(); l == nil || *l != next-1 {
			t.Fatalf("Last = %v; want %d", l, next-1)
		}
	}
	for r.Len() > 0 {
		got, _ := r.Pop()
		if got != want {
			t.Fatalf("Pop = %d; want %d", got, want)
		}
		want++
	}
	if want != next {
		t.Fatalf("popped %d values, pushed %d", want, next)
	}
	if r.Last() != nil {
		t.Fatal("Last on empty ring is not nil")
	}
	if _, ok := r.Peek(); ok {
		t.Fatal("Peek on empty ring reported a value")
	}
	r.Push(1)
	r.Reset()
	if r.Len() != 0 || r.buf != nil {
		t.Fatal("Reset did not release the buffer")
	}
}

// TestRingDeleteFunc: deleting keeps the rest in order, across a wrapped
// head, and the ring stays usable.
func TestRingDeleteFunc(t *testing.T) {
	var r Ring[int]
	for i := range 6 {
		r.Push(i)
	}
	r.Pop()
	r.Pop()
	for i := 6; i < 10; i++ { // wraps around the buffer of 8
		r.Push(i)
	}
	var seen []int
	r.DeleteFunc(func(v int) bool { seen = append(seen, v); return v%3 == 0 })
	if want := []int{2, 3, 4, 5, 6, 7, 8, 9}; !slices.Equal(seen, want) {
		t.Fatalf("DeleteFunc saw %v, want %v", seen, want)
	}
	if got, want := slices.Collect(r.All()), []int{2, 4, 5, 7, 8}; !slices.Equal(got, want) {
		t.Fatalf("after DeleteFunc: %v, want %v", got, want)
	}
	r.Push(10)
	if l := r.Last(); l == nil || *l != 10 {
		t.Fatalf("Last = %v, want 10", l)
	}
	r.DeleteFunc(func(int) bool { return true })
	if r.Len() != 0 {
		t.Fatalf("Len = %d after deleting all", r.Len())
	}
	r.Push(11)
	if v, ok := r.Pop(); !ok || v != 11 {
		t.Fatalf("Pop = %d, %v after deleting all", v, ok)
	}
}

// TestRingReleasesALargeBufferOnceDrained: a queue that grew past
// keptBuffer lets its buffer go when Pop empties it, and a small one keeps
// its own for the next burst.
func TestRingReleasesALargeBufferOnceDrained(t *testing.T) {
	for _, c := range []struct{ n, kept int }{{keptBuffer, keptBuffer}, {keptBuffer + 1, 0}, {3, 4}} {
		var r Ring[int]
		for i := range c.n {
			r.Push(i)
		}
		for i := range c.n {
			if v, ok := r.Pop(); !ok || v != i {
				t.Fatalf("Pop = %d, %v; want %d", v, ok, i)
			}
		}
		if r.Cap() != c.kept {
			t.Fatalf("after %d: Cap %d, want %d", c.n, r.Cap(), c.kept)
		}
		r.Push(7)
		if v, _ := r.Pop(); v != 7 {
			t.Fatalf("Pop after reuse = %d", v)
		}
	}
}

// TestRingLetsGoOfWhatItRemoves: a slot Pop or DeleteFunc has emptied no
// longer holds its element, so the garbage collector may have it though
// the ring keeps its buffer. Catches a removed element kept reachable.
func TestRingLetsGoOfWhatItRemoves(t *testing.T) {
	var r Ring[*int]
	for i := range 4 {
		r.Push(&i)
	}
	r.Pop()
	r.DeleteFunc(func(p *int) bool { return *p == 2 })
	if r.Len() != 2 || r.Cap() != 4 {
		t.Fatalf("Len %d, Cap %d; want 2, 4", r.Len(), r.Cap())
	}
	held := 0
	for _, p := range r.buf {
		if p != nil {
			held++
		}
	}
	if held != r.Len() {
		t.Fatalf("the buffer holds %d elements, the ring %d", held, r.Len())
	}
}

// TestRingAllStopsWhenAsked: a range over All may break off. Catches All
// calling yield again after it returned false, which panics.
func TestRingAllStopsWhenAsked(t *testing.T) {
	var r Ring[int]
	for i := range 5 {
		r.Push(i)
	}
	var seen []int
	for v := range r.All() {
		seen = append(seen, v)
		if v == 1 {
			break
		}
	}
	if len(seen) != 2 || seen[0] != 0 || seen[1] != 1 {
		t.Fatalf("saw %v, want [0 1]", seen)
	}
}

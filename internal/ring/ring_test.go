package ring

import "testing"

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

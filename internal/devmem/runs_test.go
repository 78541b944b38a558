package devmem

import "testing"

// TestRuns: the lowest aligned fit is taken, what is given back merges
// with its neighbours, and a range partly free already is refused.
func TestRuns(t *testing.T) {
	rs := NewRuns(1 << 20)
	a, ok := rs.Take(1000, 1)
	if !ok || a != 0 {
		t.Fatalf("first take at %d (%v), want 0", a, ok)
	}
	b, ok := rs.Take(4096, 4096)
	if !ok || b != 4096 {
		t.Fatalf("aligned take at %d (%v), want 4096", b, ok)
	}
	if count(&rs) != 2 {
		t.Fatalf("%d runs, want 2 (the gap before the aligned take, the rest)", count(&rs))
	}
	c, ok := rs.Take(3000, 1)
	if !ok || c != 1000 {
		t.Fatalf("a take that fits the gap at %d (%v), want 1000", c, ok)
	}
	if !rs.Put(a, 1000) || count(&rs) != 3 {
		t.Fatalf("[0, 1000) given back: %d runs, want 3", count(&rs))
	}
	if rs.Put(b, 4096) != true || rs.Put(b, 4096) != false || rs.Put(b+100, 10) != false {
		t.Fatal("a range given back twice, or inside a free run, was taken")
	}
	if count(&rs) != 2 {
		t.Fatalf("[4096, 8192) given back: %d runs, want 2 (merged with the gap and the rest)", count(&rs))
	}
	if !rs.Put(c, 3000) || count(&rs) != 1 {
		t.Fatalf("everything given back: %d runs, want 1", count(&rs))
	}
	if _, ok := rs.Take(1<<20+1, 1); ok {
		t.Fatal("a take larger than the range succeeded")
	}
	if got, ok := rs.Take(1<<20, 1); !ok || got != 0 {
		t.Fatalf("the whole range at %d (%v), want 0", got, ok)
	}
}

func count(rs *Runs) int {
	n := 0
	for range rs.All() {
		n++
	}
	return n
}

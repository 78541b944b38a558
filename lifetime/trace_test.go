package lifetime

import (
	"cmp"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// gapsOverlapOracle is the trivially correct pairwise check.
func gapsOverlapOracle(gaps []Gap) bool {
	for i := range gaps {
		for j := range i {
			if Overlaps(gaps[i].Start, gaps[i].End, gaps[j].Start, gaps[j].End) {
				return true
			}
		}
	}
	return false
}

// TestGapsDisjointOracle: the sorted-neighbours check agrees with the
// pairwise one on random gap sets, in and out of order.
func TestGapsDisjointOracle(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for iter := range 5000 {
		n := rng.IntN(8)
		gaps := make([]Gap, n)
		for i := range gaps {
			s := rng.Int64N(40)
			gaps[i] = Gap{Start: s, End: s + 1 + rng.Int64N(6)}
		}
		b := Buffer{Size: 8, Start: 0, End: 100, Gaps: gaps}
		err := b.validate()
		if want := gapsOverlapOracle(gaps); (err != nil) != want {
			t.Fatalf("iteration %d: gaps %v: validate says %v, oracle says overlap=%v", iter, gaps, err, want)
		}
		if err != nil && !strings.Contains(err.Error(), "overlap") {
			t.Fatalf("gaps %v: %v", gaps, err)
		}
	}
}

// TestValidateManyGaps: a buffer with 2^20 gaps validates in O(n log n)
// (the pairwise check took 27 s for 100k gaps and would not end here),
// without allocating when the gaps are in order and with one copy when
// they are not; an overlap between the last two gaps is found.
func TestValidateManyGaps(t *testing.T) {
	const n = 1 << 20
	gaps := make([]Gap, n)
	for i := range gaps {
		gaps[i] = Gap{Start: int64(2*i + 1), End: int64(2*i + 2)}
	}
	b := Buffer{Size: 8, Start: 0, End: 2*n + 1, Gaps: gaps}
	if a := testing.AllocsPerRun(3, func() {
		if err := b.validate(); err != nil {
			t.Fatal(err)
		}
	}); a != 0 {
		t.Errorf("sorted gaps: %v allocations, want 0", a)
	}
	shuffled := append([]Gap(nil), gaps...)
	rand.New(rand.NewPCG(3, 4)).Shuffle(n, func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
	b.Gaps = shuffled
	if a := testing.AllocsPerRun(2, func() {
		if err := b.validate(); err != nil {
			t.Fatal(err)
		}
	}); a > 1 {
		t.Errorf("shuffled gaps: %v allocations, want at most 1", a)
	}
	gaps[n-1].Start = gaps[n-2].Start // overlaps its neighbour
	b.Gaps = gaps
	if err := b.validate(); err == nil || !strings.Contains(err.Error(), "overlap") {
		t.Errorf("overlapping last gaps: %v", err)
	}
	if slices.IsSortedFunc(shuffled, func(x, y Gap) int { return cmp.Compare(x.Start, y.Start) }) {
		t.Error("validate sorted the caller's gaps in place")
	}
}

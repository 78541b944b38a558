package planner

import (
	"math/rand/v2"
	"testing"
)

// TestChmaxTree checks the range-raise, range-maximum tree against an
// array.
func TestChmaxTree(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	for _, n := range []int{1, 2, 3, 7, 64, 100} {
		tr := newChmaxTree(n)
		ref := make([]int64, n)
		for range 2000 {
			lo := rng.IntN(n)
			hi := lo + 1 + rng.IntN(n-lo)
			if rng.IntN(2) == 0 {
				v := rng.Int64N(1000)
				tr.chmax(lo, hi, v)
				for i := lo; i < hi; i++ {
					ref[i] = max(ref[i], v)
				}
				continue
			}
			var want int64
			for i := lo; i < hi; i++ {
				want = max(want, ref[i])
			}
			if got := tr.max(lo, hi); got != want {
				t.Fatalf("n %d: max [%d, %d) = %d, want %d", n, lo, hi, got, want)
			}
		}
	}
}

package planner

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/arenaplan/arenaplan/lifetime"
)

// randomSmallTrace draws k buffers with small sizes and lifetimes.
func randomSmallTrace(rng *rand.Rand, k int, fixed bool) *lifetime.Trace {
	t := &lifetime.Trace{Name: "random"}
	for i := range k {
		s := rng.Int64N(6)
		b := lifetime.Buffer{
			ID: lifetime.ID(i), Size: 1 + rng.Int64N(4), Start: s, End: s + 1 + rng.Int64N(4),
		}
		if fixed && rng.IntN(6) == 0 {
			b.Fixed, b.HasFixed = rng.Int64N(4), true
		}
		t.Buffers = append(t.Buffers, b)
	}
	return t
}

// bruteHeight returns the least arena any placement reaches (align 1),
// by trying every offset below limit for every buffer; -1 if none fits.
func bruteHeight(t *lifetime.Trace, limit int64) int64 {
	n := len(t.Buffers)
	offs := make([]int64, n)
	best := int64(-1)
	var rec func(i int, top int64)
	rec = func(i int, top int64) {
		if best >= 0 && top >= best {
			return
		}
		if i == n {
			best = top
			return
		}
		b := &t.Buffers[i]
		lo, hi := int64(0), limit-b.Size
		if b.HasFixed {
			lo, hi = b.Fixed, b.Fixed
		}
		for o := lo; o <= hi; o++ {
			ok := true
			for j := 0; j < i && ok; j++ {
				c := &t.Buffers[j]
				if lifetime.Overlaps(b.Start, b.End, c.Start, c.End) && o < offs[j]+c.Size && offs[j] < o+b.Size {
					ok = false
				}
			}
			if ok {
				offs[i] = o
				rec(i+1, max(top, o+b.Size))
			}
		}
	}
	rec(0, 0)
	return best
}

// TestExactAgainstBruteForce checks that the exact search finds a packing
// at the optimum and proves that one unit less is infeasible, on every
// preorder, for small random traces (some with fixed buffers).
func TestExactAgainstBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for iter := range 1500 {
		tr := randomSmallTrace(rng, 2+rng.IntN(6), iter%3 == 0)
		opt := bruteHeight(tr, 24)
		if opt < 0 {
			continue // contradictory fixed offsets
		}
		p, err := newProblem(tr, 1)
		if err != nil {
			t.Fatal(err)
		}
		offs := make([]int64, len(p.items))
		leaves := p.decompose(offs)
		for h := range exactHeuristics {
			// Every leaf must pack at capacity opt/unit; one leaf at least
			// must fail at one unit less.
			capacity := opt / p.unit
			failedBelow := false
			for k := range leaves {
				d := newLeafData(p, &leaves[k], p.times)
				rank := exactHeuristics[h]
				s := newDFS(d, capacity, rank, 1<<40, nil)
				if st := s.solve(); st != found {
					t.Fatalf("iter %d heur %s: leaf %d not packed at the optimum %d (status %d): %+v", iter, exactHeuristics[h], k, opt, st, tr.Buffers)
				}
				for j := range d.k {
					offs[d.ids[j]] = s.sol[j]
				}
				s = newDFS(d, capacity-1, rank, 1<<40, nil)
				if st := s.solve(); st == notFound {
					failedBelow = true
				} else if st == found && height(d, s.sol) <= capacity-1 {
					// fine only if other leaves hold the arena up
				}
			}
			plan := &Plan{Align: 1, Offsets: make([]int64, len(offs))}
			for i := range offs {
				plan.Offsets[i] = offs[i] * p.unit
			}
			plan.Arena = ArenaSize(tr, plan.Offsets, 1)
			if err := Check(tr, plan); err != nil {
				t.Fatalf("iter %d: %v", iter, err)
			}
			if plan.Arena != opt {
				// Stacked buffers sit at the bottom; leaves may stop below opt.
				if plan.Arena > opt {
					t.Fatalf("iter %d: arena %d above optimum %d", iter, plan.Arena, opt)
				}
			}
			_ = failedBelow
		}
	}
}

// TestDFSReset checks that a search readied by reset, after searches
// that found, failed or were cut short, does what a new one does: the
// same outcome, nodes and offsets.
func TestDFSReset(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var seen [3]int
	for iter := range 300 {
		tr := randomSmallTrace(rng, 4+rng.IntN(40), iter%3 == 0)
		p, err := newProblem(tr, 1)
		if err != nil {
			t.Fatal(err)
		}
		offs := make([]int64, len(p.items))
		for _, l := range p.decompose(offs) {
			d := newLeafData(p, &l, p.times)
			var reused *dfs
			for range 8 {
				capacity := d.lb + rng.Int64N(d.lb/4+2)
				order := exactHeuristics[rng.IntN(len(exactHeuristics))]
				limit := int64(1 + rng.IntN(4*d.k+8))
				fresh := newDFS(d, capacity, order, limit, nil)
				want := fresh.solve()
				if reused == nil {
					reused = newDFS(d, capacity, order, limit, nil)
				} else {
					reused.reset(capacity, order, limit, nil)
				}
				got := reused.solve()
				seen[want]++
				if got != want || reused.nodes != fresh.nodes {
					t.Fatalf("iter %d: after reset status %d in %d nodes, new: %d in %d", iter, got, reused.nodes, want, fresh.nodes)
				}
				if want == found && !slices.Equal(reused.sol, fresh.sol) {
					t.Fatalf("iter %d: after reset offsets %v, new: %v", iter, reused.sol, fresh.sol)
				}
			}
		}
	}
	if seen[found] == 0 || seen[notFound] == 0 || seen[aborted] == 0 {
		t.Fatalf("found, not found, aborted: %v; want each", seen)
	}
	t.Logf("found, not found, aborted: %v", seen)
}

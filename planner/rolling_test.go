package planner

import (
	"math/rand/v2"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
)

// TestRollingAgainstBruteForce checks the rolling search on small random
// traces (some with fixed buffers): with a window as large as the leaf it
// is the exact search, so it packs every leaf at the optimum the brute
// force finds; with smaller windows every packing it returns is valid
// (Check) and within the capacity, and never below the optimum.
func TestRollingAgainstBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var stop atomic.Bool
	packed := 0
	for iter := range 1500 {
		tr := randomSmallTrace(rng, 2+rng.IntN(7), iter%3 == 0)
		opt := bruteHeight(tr, 24)
		if opt < 0 {
			continue // contradictory fixed offsets
		}
		p, err := newProblem(tr, 1)
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range []int{len(tr.Buffers), 1, 2, 3} {
			for _, capacity := range []int64{opt / p.unit, opt/p.unit + 1} {
				offs := make([]int64, len(p.items))
				leaves := p.decompose(offs)
				ok := true
				for k := range leaves {
					d := newLeafData(p, &leaves[k], p.times)
					sol, _, res := d.rollOnce(capacity, w, 1<<40, p.times[leaves[k].lo:], &stop)
					if res != found {
						if w == len(tr.Buffers) {
							t.Fatalf("iter %d: window %d: leaf %d not packed at capacity %d >= optimum %d: %+v", iter, w, k, capacity, opt, tr.Buffers)
						}
						ok = false
						break
					}
					if h := height(d, sol); h > capacity {
						t.Fatalf("iter %d: window %d: height %d above capacity %d", iter, w, h, capacity)
					}
					for j := range d.k {
						offs[d.ids[j]] = sol[j]
					}
				}
				if !ok {
					continue
				}
				packed++
				plan := &Plan{Align: 1, Offsets: make([]int64, len(offs))}
				for i := range offs {
					plan.Offsets[i] = offs[i] * p.unit
				}
				plan.Arena = ArenaSize(tr, plan.Offsets, 1)
				if err := Check(tr, plan); err != nil {
					t.Fatalf("iter %d: window %d: %v: %+v", iter, w, err, tr.Buffers)
				}
				if plan.Arena < opt || plan.Arena > capacity*p.unit {
					t.Fatalf("iter %d: window %d: arena %d, optimum %d, capacity %d", iter, w, plan.Arena, opt, capacity*p.unit)
				}
			}
		}
		// One unit below the optimum, no window packs every leaf.
		if c := opt/p.unit - 1; c >= 0 {
			offs := make([]int64, len(p.items))
			leaves := p.decompose(offs)
			all := true
			for k := range leaves {
				d := newLeafData(p, &leaves[k], p.times)
				sol, _, res := d.rollOnce(c, len(tr.Buffers), 1<<40, p.times[leaves[k].lo:], &stop)
				if res != found {
					all = false
					break
				}
				for j := range d.k {
					offs[d.ids[j]] = sol[j]
				}
			}
			top := int64(0)
			for i := range offs {
				top = max(top, offs[i]+p.items[i].size)
			}
			if all && top <= c {
				t.Fatalf("iter %d: packed at %d, below the optimum %d: %+v", iter, top, opt, tr.Buffers)
			}
		}
	}
	if packed < 1000 {
		t.Fatalf("only %d packings checked", packed)
	}
}

// thinLeaf returns the largest leaf of a testdata trace at alignment 256.
func thinLeaf(t *testing.T, file string) (*problem, *leaf, *leafData) {
	t.Helper()
	tr, err := readTestCSV(filepath.Join("testdata", file))
	if err != nil {
		t.Fatal(err)
	}
	p, err := newProblem(tr, DefaultAlign)
	if err != nil {
		t.Fatal(err)
	}
	leaves := p.decompose(make([]int64, len(p.items)))
	l := &leaves[0]
	for k := range leaves {
		if len(leaves[k].items) > len(l.items) {
			l = &leaves[k]
		}
	}
	return p, l, newLeafData(p, l, p.times)
}

// TestDiveAtBound: on a decode step as PyTorch records it with the math
// attention in bf16, every greedy pass ends above the peak and the
// rolling search fails, but a dive packs the leaf at the peak.
func TestDiveAtBound(t *testing.T) {
	_, _, d := thinLeaf(t, "torch-decode-math16-b8.csv")
	var stop atomic.Bool
	offs, nodes, complete, parked := d.dive(d.lb, &stop, nil)
	for _, pk := range parked {
		pk.drop()
	}
	if offs == nil || !complete {
		t.Fatalf("no dive packed the leaf at its peak %d (%d nodes)", d.lb, nodes)
	}
	if h := height(d, offs); h > d.lb {
		t.Fatalf("dive: height %d above the capacity %d", h, d.lb)
	}
	if max := int64(len(diveOrders)) * (int64(d.k) + diveSlack); nodes > max {
		t.Fatalf("dives searched %d nodes, more than %d", nodes, max)
	}
	// With a spare core the later dives run ahead, and the outcome is
	// the same: at the peak (the second dive packs it) and far above it
	// (the first does, and the second's search is dropped).
	for _, c := range []int64{d.lb, 2 * d.lb} {
		want, wantNodes, _, parked := d.dive(c, &stop, nil)
		for _, pk := range parked {
			pk.drop()
		}
		spare := &spareCores{}
		spare.give()
		got, gotNodes, complete, parked := d.dive(c, &stop, spare)
		for _, pk := range parked {
			pk.drop()
		}
		if !slices.Equal(got, want) || gotNodes != wantNodes || !complete || spare.n.Load() != 1 {
			t.Errorf("capacity %d: with a spare core %d nodes, alone %d; the same plan %v; spare cores after %d",
				c, gotNodes, wantNodes, slices.Equal(got, want), spare.n.Load())
		}
	}
}

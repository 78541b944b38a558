package planner

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/arenaplan/arenaplan/lifetime"
)

// TestSweepFillValid: on random traces with alignments, any window and
// any valid packing of its core (bysize's), the sweep places every other
// buffer so that the whole passes Check, at or above base, and reports
// the plan's true height.
func TestSweepFillValid(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	for k := range 2000 {
		tr := randomSmallTrace(rng, 2+rng.IntN(60), false)
		for i := range tr.Buffers {
			if rng.IntN(8) == 0 {
				tr.Buffers[i].Align = 2 << rng.IntN(2)
			}
		}
		p, err := newProblem(tr, 1)
		if err != nil {
			t.Fatal(err)
		}
		if p.nsec == 0 {
			continue
		}
		all := make([]int32, len(p.items))
		for i := range all {
			all[i] = int32(i)
		}
		wlo := int32(rng.IntN(p.nsec))
		whi := wlo + 1 + int32(rng.IntN(p.nsec-int(wlo)))
		base := int64(rng.IntN(3)) * 4 // a multiple of every alignment
		sub, core := p.cut(all, 0, int32(p.nsec), base, wlo, whi)
		cp, err := planBySize(context.Background(), sub, Options{Align: 1})
		if err != nil {
			t.Fatal(err)
		}
		offs := make([]int64, len(all))
		inCore := make([]bool, len(all))
		for c, j := range core {
			offs[j], inCore[j] = base+cp.Offsets[c], true
		}
		h, ok := p.sweepFill(all, wlo, whi, base, offs, inCore)
		if !ok {
			t.Fatalf("trace %d: refused a trace without fixed buffers", k)
		}
		plan := &Plan{Align: 1, Offsets: make([]int64, len(offs))}
		for i := range offs {
			if offs[i] < base {
				t.Fatalf("trace %d: item %d at %d, below base %d", k, i, offs[i], base)
			}
			plan.Offsets[i] = offs[i] * p.unit
		}
		plan.Arena = ArenaSize(tr, plan.Offsets, 1)
		if err := Check(tr, plan); err != nil {
			t.Fatalf("trace %d (%d buffers, window [%d,%d) of %d): %v", k, len(tr.Buffers), wlo, whi, p.nsec, err)
		}
		if max(plan.Arena, base*p.unit) != h*p.unit {
			t.Fatalf("trace %d: height %d units of %d, arena %d", k, h, p.unit, plan.Arena)
		}
	}
}

// TestSweepFillRefusesOwnFixed: a buffer outside the window with a fixed
// offset of its own is not something the sweep can honour; it says so.
func TestSweepFillRefusesOwnFixed(t *testing.T) {
	tr := &lifetime.Trace{Buffers: []lifetime.Buffer{
		{ID: 0, Size: 4, Start: 0, End: 2, Fixed: 8, HasFixed: true},
		{ID: 1, Size: 4, Start: 2, End: 4},
	}}
	p, err := newProblem(tr, 1)
	if err != nil {
		t.Fatal(err)
	}
	offs := []int64{0, 0}
	if _, ok := p.sweepFill([]int32{0, 1}, 1, 2, 0, offs, []bool{false, true}); ok {
		t.Fatal("the sweep accepted a fixed buffer outside the window")
	}
}

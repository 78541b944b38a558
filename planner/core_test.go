package planner

import (
	"context"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/arenaplan/arenaplan/lifetime"
	"github.com/arenaplan/arenaplan/lifetime/tracegen"
)

// TestCoreKeepsEveryConflict: two buffers that overlap in time and both
// meet the window still overlap once cut to it, so no plan of the core
// can put conflicting buffers in the same memory; and a core buffer's cut
// lifetime lies inside both the window and its own lifetime.
func TestCoreKeepsEveryConflict(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for k := range 200 {
		tr := randomSmallTrace(rng, 2+rng.IntN(30), false)
		p, err := newProblem(tr, 1)
		if err != nil {
			t.Fatal(err)
		}
		if p.nsec == 0 {
			continue
		}
		wlo := rng.IntN(p.nsec)
		whi := wlo + 1 + rng.IntN(p.nsec-wlo)
		all := make([]int32, len(p.items))
		for i := range all {
			all[i] = int32(i)
		}
		sub, core := p.cut(all, 0, int32(p.nsec), 0, int32(wlo), int32(whi))
		if len(sub.Buffers) != len(core) {
			t.Fatalf("trace %d: %d core buffers for %d items", k, len(sub.Buffers), len(core))
		}
		in := map[int]bool{}
		for c, i := range core {
			in[i] = true
			it, b := &p.items[i], &sub.Buffers[c]
			if b.Start < int64(max(wlo, int(it.lo))) || b.End > int64(min(whi, int(it.hi))) || b.Start >= b.End {
				t.Fatalf("trace %d: item [%d,%d) cut to [%d,%d) in window [%d,%d)", k, it.lo, it.hi, b.Start, b.End, wlo, whi)
			}
			if b.Size != it.size {
				t.Fatalf("trace %d: size %d became %d", k, it.size, b.Size)
			}
		}
		for i := range p.items {
			meets := int(p.items[i].lo) < whi && int(p.items[i].hi) > wlo
			if meets != in[i] {
				t.Fatalf("trace %d: item %d meets the window %v, in the core %v", k, i, meets, in[i])
			}
		}
		for a := range core {
			for b := range a {
				x, y := &p.items[core[a]], &p.items[core[b]]
				if x.lo < y.hi && y.lo < x.hi {
					ca, cb := &sub.Buffers[a], &sub.Buffers[b]
					if !lifetime.Overlaps(ca.Start, ca.End, cb.Start, cb.End) {
						t.Fatalf("trace %d: items %d and %d conflict but their cut lifetimes do not", k, core[a], core[b])
					}
				}
			}
		}
	}
}

// TestPeakCoreValidPlans runs the core stage alone on generated traces,
// some with fixed buffers, gaps and alignments: every plan it returns
// passes Check on the original trace, and none is below the lower bound.
func TestPeakCoreValidPlans(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	for k := range 12 {
		tr, err := tracegen.Generate(tracegen.Options{Buffers: 300 + rng.IntN(3000), Seed: uint64(k), StepBuffers: 200 + rng.IntN(800)})
		if err != nil {
			t.Fatal(err)
		}
		align := []int64{1, 256, 512}[k%3]
		for i := range tr.Buffers {
			b := &tr.Buffers[i]
			b.Fixed, b.HasFixed, b.Hint, b.HasHint = 0, false, 0, false
			switch {
			case k%2 == 1 && rng.IntN(50) == 0 && b.End-b.Start > 2:
				m := b.Start + 1
				b.Gaps = []lifetime.Gap{{Start: m, End: m + 1}}
			case k%4 == 3 && rng.IntN(500) == 0:
				b.Align = 4096
			}
		}
		if k%4 == 2 {
			// One fixed buffer at the bottom, live throughout.
			tr.Buffers[0].Fixed, tr.Buffers[0].HasFixed = 0, true
			tr.Buffers[0].Start, tr.Buffers[0].End = 0, 1<<40
		}
		if err := tr.Validate(); err != nil {
			t.Fatalf("trace %d: %v", k, err)
		}
		opt := Options{Align: align, Budget: time.Second, Workers: 1 + k%2}.normalized()
		p, err := newProblem(tr, opt.Align)
		if err != nil {
			t.Fatal(err)
		}
		r := &anytimeRun{ctx: context.Background(), opt: opt, start: time.Now(), p: p}
		all := make([]int32, len(p.items))
		for i := range all {
			all[i] = int32(i)
		}
		offs, h := r.coreStage(all, 0, int32(p.nsec), 0, time.Now().Add(time.Second))
		if offs == nil {
			t.Fatalf("trace %d: no plan", k)
		}
		plan := &Plan{Align: opt.Align, Offsets: offs}
		for i := range offs {
			offs[i] *= p.unit
		}
		plan.Arena = ArenaSize(tr, offs, opt.Align)
		if plan.Arena != h*p.unit {
			t.Fatalf("trace %d: height %d units of %d, arena %d", k, h, p.unit, plan.Arena)
		}
		if err := Check(tr, plan); err != nil {
			t.Fatalf("trace %d (%d buffers, align %d): %v", k, len(tr.Buffers), align, err)
		}
		lb, _ := tr.LowerBound(opt.Align)
		if plan.Arena < lb || plan.Arena != ArenaSize(tr, plan.Offsets, opt.Align) {
			t.Fatalf("trace %d: arena %d, lower bound %d, recomputed %d", k, plan.Arena, lb, ArenaSize(tr, plan.Offsets, opt.Align))
		}
		t.Logf("trace %d: %d buffers, align %d: %.5f × LB", k, len(tr.Buffers), align, float64(plan.Arena)/float64(lb))
	}
}

// TestAutoIopddlLowerBound: the two iopddl traces too large for conflict
// lists (S_1: 28.5k buffers, 43M conflicting pairs; Y_1: 62k) pack at
// their lower bound through the peak core, where every skyline pass
// stops above it (S_1: 1.0018), and the same plan twice.
func TestAutoIopddlLowerBound(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: reads and plans 90k buffers")
	}
	for _, f := range dataFiles(t, "minimalloc/related/idealloc/iopddl/[SY]_1.csv") {
		tr, err := readTestCSV(f)
		if err != nil {
			t.Fatal(err)
		}
		p, err := Run(context.Background(), "auto", tr, Options{Align: 1, Budget: 6 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if !p.Optimal {
			t.Errorf("%s: arena %d is %.5f × the lower bound", filepath.Base(f), p.Arena, p.Ratio())
			continue
		}
		// Ended before its budget: a second run gives the same plan.
		q, err := Run(context.Background(), "auto", tr, Options{Align: 1, Budget: 6 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(p.Offsets, q.Offsets) {
			t.Errorf("%s: two runs that reached the bound gave different plans", filepath.Base(f))
		}
	}
}

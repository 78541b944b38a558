package planner

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// TestEveryAlgorithmOnRandomTraces is the metamorphic test: every
// registered algorithm plans thousands of random traces through Run, and
// every plan must pass Check, the oracle, and reach at least the lower
// bound; fixed offsets must be kept.
func TestEveryAlgorithmOnRandomTraces(t *testing.T) {
	traces := 10000
	if testing.Short() {
		traces = 1000
	}
	var fixed, gaps, windows, ownAlign int // what the traces exercised
	planned := map[string]int{}
	aligns := []int64{1, 2, 8, 256}
	rng := rand.New(rand.NewPCG(1, 2))
	names := Names()
	if len(names) < 3 {
		t.Fatalf("registered algorithms %v: want at least bestfit, bysize, auto", names)
	}
	for k := 0; k < traces; k++ {
		align := aligns[rng.IntN(len(aligns))]
		tr := genTrace(rng, genOptions{maxBuffers: 30, maxTime: 24, align: align})
		// Searches get a small budget and every fifth trace, so that
		// thousands of traces fit in a test run; one worker keeps them
		// deterministic.
		opt := Options{Align: align, Workers: 1, Budget: time.Millisecond}
		lb, _ := tr.LowerBound(align)
		for _, b := range tr.Buffers {
			fixed += btoi(b.HasFixed)
			ownAlign += btoi(b.Align > 1)
			for _, g := range b.Gaps {
				gaps++
				windows += btoi(g.HasWindow)
			}
		}
		for _, name := range names {
			if k%5 != 0 && !slices.Contains(Baselines, name) {
				continue
			}
			planned[name]++
			p, err := Run(context.Background(), name, tr, opt)
			if err != nil {
				t.Fatalf("trace %d (align %d), %s: %v\n%s", k, align, name, err, dumpTrace(tr))
			}
			if err := Check(tr, p); err != nil {
				t.Fatalf("trace %d, %s: Check after Run: %v", k, name, err)
			}
			if err := oracleCheck(tr, p); err != nil {
				t.Fatalf("trace %d, %s: Check accepted a plan the oracle rejects: %v\n%s", k, name, err, dumpTrace(tr))
			}
			if p.Arena < lb || p.LowerBound != lb {
				t.Fatalf("trace %d, %s: arena %d, lower bound %d (want %d)", k, name, p.Arena, p.LowerBound, lb)
			}
			if p.Arena != ArenaSize(tr, p.Offsets, align) {
				t.Fatalf("trace %d, %s: arena %d is not the plan's top %d", k, name, p.Arena, ArenaSize(tr, p.Offsets, align))
			}
			if p.Algo == "" {
				t.Fatalf("trace %d, %s: plan names no algorithm", k, name)
			}
		}
	}
	t.Logf("traces planned by each algorithm: %v", planned)
	t.Logf("%d traces: %d fixed buffers, %d with their own alignment, %d gaps (%d with windows)", traces, fixed, ownAlign, gaps, windows)
	if fixed == 0 || ownAlign == 0 || gaps == 0 || windows == 0 {
		t.Fatal("the generator no longer exercises every feature")
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestAutoKeepsTheSmallest checks that auto is never worse than any
// baseline.
func TestAutoKeepsTheSmallest(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	opt := Options{Align: 1, Workers: 1, Budget: time.Millisecond}
	for k := 0; k < 300; k++ {
		tr := genTrace(rng, genOptions{maxBuffers: 25, maxTime: 20, align: 1})
		auto, err := Run(context.Background(), "auto", tr, opt)
		if err != nil {
			t.Fatal(err)
		}
		if auto.Algo != "auto" {
			t.Fatalf("trace %d: auto's plan names %q", k, auto.Algo)
		}
		for _, name := range Baselines {
			p, err := Run(context.Background(), name, tr, opt)
			if err != nil {
				t.Fatal(err)
			}
			if auto.Arena > p.Arena {
				t.Fatalf("trace %d: auto's arena %d is larger than %s's %d", k, auto.Arena, name, p.Arena)
			}
		}
	}
}

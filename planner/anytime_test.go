package planner

import (
	"context"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/arenaplan/arenaplan/lifetime"
)

// TestAutoTorchReachesLowerBound: every real PyTorch trace packs at its
// lower bound, at alignment 1 and 512 (the benchmark asks for 100 ms; the
// test allows more so that a loaded machine does not fail it).
func TestAutoTorchReachesLowerBound(t *testing.T) {
	for _, f := range dataFiles(t, "torch/*.csv") {
		tr, err := readTestCSV(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, align := range []int64{1, 512} {
			p, err := Run(context.Background(), "auto", tr, Options{Align: align, Budget: 5 * time.Second})
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if !p.Optimal {
				t.Errorf("%s align %d: arena %d above the lower bound %d", filepath.Base(f), align, p.Arena, p.LowerBound)
			}
		}
	}
}

// TestAutoOmnimallocOptimum: the 7 small hand-made instances reach the
// optimum written in their file names (which the planner never sees).
func TestAutoOmnimallocOptimum(t *testing.T) {
	for _, f := range dataFiles(t, "minimalloc/related/omnimalloc_small/*.csv") {
		tr, err := readTestCSV(f)
		if err != nil {
			t.Fatal(err)
		}
		want, err := strconv.ParseInt(strings.Split(filepath.Base(f), ".")[1], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		for _, workers := range []int{1, 2} {
			p, err := Run(context.Background(), "auto", tr, Options{Align: 1, Budget: 5 * time.Second, Workers: workers})
			if err != nil {
				t.Fatal(err)
			}
			if p.Arena != want || !p.Optimal {
				t.Errorf("%s: arena %d (optimal %v), want %d", filepath.Base(f), p.Arena, p.Optimal, want)
			}
		}
	}
}

// TestAutoChallenging runs the exact search on MiniMalloc's hard instances
// that reach their lower bound fastest.
func TestAutoChallenging(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	for _, name := range []string{"C", "K", "G"} {
		for _, f := range dataFiles(t, "minimalloc/challenging/"+name+".*.csv") {
			tr, err := readTestCSV(f)
			if err != nil {
				t.Fatal(err)
			}
			p, err := Run(context.Background(), "auto", tr, Options{Align: 1, Budget: 20 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			if !p.Optimal {
				t.Errorf("%s: arena %d, lower bound %d", name, p.Arena, p.LowerBound)
			}
		}
	}
}

// TestAutoDeterministic: with one worker the plan never depends on timing;
// with two it does not either whenever the search ends early (optimal).
func TestAutoDeterministic(t *testing.T) {
	var traces []*lifetime.Trace
	rng := rand.New(rand.NewPCG(5, 6))
	for range 30 {
		traces = append(traces, randomSmallTrace(rng, 8+rng.IntN(20), false))
	}
	for _, name := range []string{"C", "K"} {
		for _, f := range dataFiles(t, "minimalloc/challenging/"+name+".*.csv") {
			tr, err := readTestCSV(f)
			if err != nil {
				t.Fatal(err)
			}
			traces = append(traces, tr)
		}
	}
	for k, tr := range traces {
		for _, workers := range []int{1, 2} {
			opt := Options{Align: 1, Budget: 3 * time.Second, Workers: workers}
			a, err := Run(context.Background(), "auto", tr, opt)
			if err != nil {
				t.Fatal(err)
			}
			if a.Elapsed >= opt.Budget*9/10 {
				continue // the budget ended it (a slow machine, the race detector): timing may matter
			}
			b, err := Run(context.Background(), "auto", tr, opt)
			if err != nil {
				t.Fatal(err)
			}
			if b.Elapsed >= opt.Budget*9/10 {
				continue
			}
			if !slices.Equal(a.Offsets, b.Offsets) {
				t.Errorf("trace %d (%s), %d workers: two runs gave different plans (arenas %d, %d)", k, tr.Name, workers, a.Arena, b.Arena)
			}
		}
	}
}

// TestAutoRandomTraces plans random traces with fixed buffers and
// alignments; Run checks every plan.
func TestAutoRandomTraces(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for k := range 300 {
		tr := randomSmallTrace(rng, 2+rng.IntN(7), true)
		for i := range tr.Buffers {
			if rng.IntN(5) == 0 {
				tr.Buffers[i].Align = 2
			}
			if b := &tr.Buffers[i]; b.HasFixed && b.Align > 1 {
				b.Fixed &^= 1
			}
		}
		opt := Options{Align: 1, Budget: 20 * time.Millisecond, Workers: 1 + k%2}
		p, err := Run(context.Background(), "auto", tr, opt)
		if err != nil {
			// Contradictory fixed offsets are the only acceptable failure.
			if bruteHeight(tr, 24) >= 0 {
				t.Fatalf("trace %d: %v", k, err)
			}
			continue
		}
		if opt := bruteHeight(tr, p.Arena); opt >= 0 && opt < p.Arena && p.Optimal {
			t.Fatalf("trace %d: plan says optimal at %d but %d fits", k, p.Arena, opt)
		}
	}
}

// TestAutoCancel: a cancelled context still gets a valid plan, at once.
func TestAutoCancel(t *testing.T) {
	var tr *lifetime.Trace
	for _, f := range dataFiles(t, "minimalloc/challenging/D.*.csv") {
		var err error
		if tr, err = readTestCSV(f); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	var calls int
	start := time.Now()
	p, err := Run(ctx, "auto", tr, Options{Align: 1, Budget: time.Minute, Progress: func(Progress) { calls++ }})
	if err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("cancelled search took %v", el)
	}
	t.Logf("arena %d, lower bound %d, %d progress calls", p.Arena, p.LowerBound, calls)
	// Cancelled before it starts: still a plan.
	done, stop := context.WithCancel(context.Background())
	stop()
	if _, err := Run(done, "auto", tr, Options{Align: 1}); err != nil {
		t.Errorf("cancelled context: %v", err)
	}
}

// TestAutoPanguLowerBound: somas_tensors/pangu_2.6B (18.7k buffers) packs
// at its lower bound; the skyline with long-lived buffers first ("LTAW")
// reaches it, where the other greedy passes stop 0.76% above.
func TestAutoPanguLowerBound(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	for _, f := range dataFiles(t, "minimalloc/related/idealloc/somas_tensors/pangu_2.6B.csv") {
		tr, err := readTestCSV(f)
		if err != nil {
			t.Fatal(err)
		}
		p, err := Run(context.Background(), "auto", tr, Options{Budget: 10 * time.Second, Workers: 1})
		if err != nil {
			t.Fatal(err)
		}
		if !p.Optimal {
			t.Errorf("arena %d above the lower bound %d", p.Arena, p.LowerBound)
		}
	}
}

// TestSpareCoresSamePlans: a search with one worker that borrows spare
// cores (the window bound beside the greedy passes, the portfolio on two
// goroutines, the dives and the rolling search side by side) makes the
// plan it makes without them, byte for byte, on the generated decode
// steps and decode families: every stage runs, and every search ends
// at the bound or by the stop rule, never by the clock.
func TestSpareCoresSamePlans(t *testing.T) {
	var traces []*lifetime.Trace
	for _, c := range decodeCases {
		tr, err := readTestCSV(filepath.Join("testdata", c.file))
		if err != nil {
			t.Fatal(err)
		}
		traces = append(traces, tr)
	}
	for _, att := range []string{"math16", "efficient"} {
		for _, m := range torchDecodeFamily(att) {
			traces = append(traces, m.Trace)
		}
	}
	for k, tr := range traces {
		opt := Options{Workers: 1, Budget: time.Minute}
		want, err := Run(context.Background(), Auto, tr, opt)
		if err != nil {
			t.Fatal(err)
		}
		for _, spare := range []int{1, 2} {
			opt.spare = &spareCores{}
			for range spare {
				opt.spare.give()
			}
			got, err := Run(context.Background(), Auto, tr, opt)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got.Offsets, want.Offsets) || got.Stop != want.Stop || got.Bound != want.Bound {
				t.Fatalf("trace %d (%s), %d spare cores: arena %d, stop %q, bound %d; alone %d, %q, %d",
					k, tr.Name, spare, got.Arena, got.Stop, got.Bound, want.Arena, want.Stop, want.Bound)
			}
			if n := opt.spare.n.Load(); n != int32(spare) {
				t.Fatalf("trace %d: %d spare cores lent, %d given back", k, spare, n)
			}
		}
	}
}

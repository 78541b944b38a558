package planner

import (
	"context"
	"slices"
	"testing"
	"time"
)

// exactLeaf reads a challenging trace and returns a search over its
// largest leaf that gets the exact search, its greedy start included.
func exactLeaf(t *testing.T, name string, workers int) (*anytimeRun, *leafSearch) {
	t.Helper()
	files := dataFiles(t, "minimalloc/challenging/"+name+".*.csv")
	tr, err := readTestCSV(files[0])
	if err != nil {
		t.Fatal(err)
	}
	p, err := newProblem(tr, 1)
	if err != nil {
		t.Fatal(err)
	}
	offs := make([]int64, len(p.items))
	leaves := p.decompose(offs)
	k := -1
	for i := range leaves {
		if n := len(leaves[i].items); n <= bigLeaf && (k < 0 || n > len(leaves[k].items)) {
			k = i
		}
	}
	if k < 0 {
		t.Fatalf("%s: no leaf for the exact search", name)
	}
	r := &anytimeRun{ctx: context.Background(), opt: Options{Align: 1, Workers: workers}, start: time.Now(), p: p, offs: offs}
	ls := r.newLeafSearch(p, &leaves[k])
	ls.best, ls.offs = r.portfolio(ls.d, ls.target, time.Now().Add(time.Hour), portfolioEntries, len(portfolioEntries))
	if ls.best <= ls.target {
		t.Fatalf("%s: the greedy passes reach the bound; nothing for the exact search", name)
	}
	return r, ls
}

// TestExactTurnsResume: an exact search cut into short turns goes on
// where each stopped (the job the clock stopped runs again) and, with one
// worker, ends on the same plan as the same search run in one go.
func TestExactTurnsResume(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	r, ls := exactLeaf(t, "K", 1)
	whole := newExactSearch(ls.d, ls.target, ls.best, ls.offs, 0)
	defer whole.close()
	h, offs, _, done, _ := r.exact(whole, time.Now().Add(time.Minute))
	if !done || h != ls.target {
		t.Fatalf("in one go: height %d (bound %d), done %v", h, ls.target, done)
	}
	cut := newExactSearch(ls.d, ls.target, ls.best, ls.offs, 0)
	defer cut.close()
	turns, redone := 0, 0
	for turn := time.Millisecond; ; turn *= 2 {
		turns++
		var h2 int64
		h2, offs2, _, done2, idle := r.exact(cut, time.Now().Add(turn))
		redone += len(cut.redo)
		if done2 {
			if h2 != h || !slices.Equal(offs2, offs) {
				t.Fatalf("after %d turns: height %d, another plan than in one go (height %d)", turns, h2, h)
			}
			break
		}
		if idle || turns > 30 {
			t.Fatalf("turn %d: not done, idle %v", turns, idle)
		}
	}
	if turns < 3 || redone == 0 {
		t.Fatalf("%d turns, %d jobs run again: the search was not cut; the test proves nothing", turns, redone)
	}
	t.Logf("K: %d turns, %d jobs stopped by the clock and run again", turns, redone)
}

// TestExactOneWorkerShare: with one worker, the descent gets its share
// of the work beside the lower-bound jobs (on D, whose bound no job
// reaches, the lower-bound jobs used to take nearly all of it).
func TestExactOneWorkerShare(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	r, ls := exactLeaf(t, "D", 1)
	st := newExactSearch(ls.d, ls.target, ls.best, ls.offs, 0)
	defer st.close()
	// Turns (each twice as long as the last: a job the clock stops starts
	// again) until five lower-bound jobs past the first rounds have run,
	// however long that takes on this machine (a minute at most).
	enough := lbRounds*len(exactHeuristics) + 5
	end := time.Now().Add(time.Minute)
	for turn := 250 * time.Millisecond; st.lbNext < enough && time.Now().Before(end); turn *= 2 {
		r.exact(st, time.Now().Add(turn))
	}
	if st.lbNext < enough {
		t.Fatalf("%d lower-bound jobs in a minute; too slow a machine to tell", st.lbNext)
	}
	if st.detNodes == 0 || st.lbNodes > 2*lbShare*st.detNodes {
		t.Fatalf("lower-bound jobs %d nodes, descent %d (share %d:1)", st.lbNodes, st.detNodes, lbShare)
	}
	t.Logf("D: lower-bound jobs %d nodes, descent %d", st.lbNodes, st.detNodes)
}

// TestAutoSpendsBudget: a search that neither reaches the bound nor
// proves its height optimal uses its budget (all but the reserve for
// Check), with one worker and with two.
func TestAutoSpendsBudget(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	tr, err := readTestCSV(dataFiles(t, "minimalloc/challenging/D.*.csv")[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, workers := range []int{1, 2} {
		opt := Options{Align: 1, Budget: 400 * time.Millisecond, Workers: workers}
		p, err := Run(context.Background(), "auto", tr, opt)
		if err != nil {
			t.Fatal(err)
		}
		if p.Optimal {
			t.Fatalf("%d workers: D at its lower bound; pick another trace", workers)
		}
		if min := opt.Budget - reserve(opt.Budget, len(tr.Buffers), 15); p.Elapsed < min {
			t.Errorf("%d workers: returned after %v of %v, neither at the bound nor proven", workers, p.Elapsed, opt.Budget)
		}
	}
}

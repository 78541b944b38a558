package planner

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/arenaplan/arenaplan/lifetime"
)

// The anytime planner ("auto"). It
//
//  1. splits the trace where no buffer is live across a time (or only
//     fixed ones are) and stacks at the bottom of each part the buffers
//     that live through all of it;
//  2. packs each remaining leaf with a portfolio of greedy orders and
//     placement rules, raced on Options.Workers goroutines;
//  3. where a leaf is still above the lower bound, runs the exact search
//     (exact.go) at capacity = lower bound under node limits that double
//     round by round, with several preorders; interleaved with it, the
//     same search at capacity = best − 1 descends from the best plan so
//     far (anytime);
//  4. stops when the lower bound is reached or the budget is spent, and
//     returns the best plan found.
//
// Determinism: the search stops early only when a capacity = lower bound
// job succeeds. Those jobs form a fixed sequence (preorder × node limit),
// each deterministic, and the plan is taken from the lowest-numbered one
// that succeeded after every lower-numbered one has finished; so a search
// that ends before its budget returns the same plan whatever the timing.
// With Workers == 1 everything runs in one fixed order.

func init() { register("search", anytime) }

// searchStats are counters for tests and reports.
type searchStats struct {
	leaves, exactLeaves int
	nodes               int64
}

type anytimeRun struct {
	ctx      context.Context
	opt      Options
	start    time.Time
	deadline time.Time
	p        *problem
	offs     []int64 // units
	stats    searchStats

	mu     sync.Mutex
	best   int64 // best arena so far in units (max over leaves done so far)
	bestAt time.Duration
}

func anytime(ctx context.Context, t *lifetime.Trace, opt Options) (*Plan, error) {
	r := &anytimeRun{ctx: ctx, opt: opt, start: time.Now()}
	r.deadline = r.start.Add(opt.Budget)
	p, err := newProblem(t, opt.Align)
	if err != nil {
		return nil, err
	}
	r.p = p
	r.offs = make([]int64, len(p.items))
	leaves := p.decompose(r.offs)
	r.stats.leaves = len(leaves)
	// Leaves are independent; the arena is the highest of them. Stacked
	// buffers set a floor too.
	for i := range p.items {
		r.best = max(r.best, r.offs[i]+p.items[i].size)
	}
	heights := make([]int64, len(leaves))
	for k := range leaves {
		if err := r.ctx.Err(); err != nil && k > 0 {
			return nil, fmt.Errorf("search: %w", err)
		}
		left := len(leaves) - k
		until := time.Now().Add(time.Until(r.deadline) / time.Duration(left))
		var at time.Duration
		heights[k], at = r.solveLeaf(p, &leaves[k], until)
		r.mu.Lock()
		r.best = max(r.best, heights[k])
		r.bestAt = max(r.bestAt, at)
		r.mu.Unlock()
	}
	plan := &Plan{Algo: "auto", Offsets: make([]int64, len(p.items))}
	for i := range p.items {
		plan.Offsets[i] = r.offs[i] * p.unit
	}
	plan.ToBest = r.bestAt
	return plan, nil
}

// solveLeaf packs one leaf as low as it can (at best the global lower
// bound) before until, writes its offsets and returns its height.
func (r *anytimeRun) solveLeaf(p *problem, l *leaf, until time.Time) (int64, time.Duration) {
	target := p.lb
	d := newLeafData(p, l, p.times)
	best, offs := r.portfolio(d, until)
	at := time.Since(r.start)
	if best > target {
		r.stats.exactLeaves++
		best, offs, at = r.exact(d, target, best, offs, at, until)
	}
	for j, i := range d.ids {
		r.offs[i] = offs[j]
	}
	return best, at
}

// greedyOrders are the preorders the portfolio tries, each with both
// placement rules.
var greedyOrders = []preorder{"ZW", "AZ", "WZ", "TZ", "OZ", "SZ", "TAW", "WAT"}

// portfolio runs every greedy order with both rules on the workers and
// returns the lowest height (the first in portfolio order among equals).
func (r *anytimeRun) portfolio(d *leafData, until time.Time) (int64, []int64) {
	type res struct {
		h    int64
		offs []int64
	}
	n := 2 * len(greedyOrders)
	results := make([]res, n)
	var next atomic.Int32
	var wg sync.WaitGroup
	for w := 0; w < min(r.opt.Workers, n); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var scratch []span
			for {
				i := int(next.Add(1) - 1)
				if i >= n || (i > 0 && time.Now().After(until)) {
					return
				}
				offs := make([]int64, d.k)
				rank := d.rank(greedyOrders[i/2])
				var h int64
				h, scratch = d.greedy(rank, greedyRule(i%2), offs, scratch)
				results[i] = res{h, offs}
			}
		}()
	}
	wg.Wait()
	bi := -1
	for i := range results {
		if results[i].offs != nil && (bi < 0 || results[i].h < results[bi].h) {
			bi = i
		}
	}
	return results[bi].h, results[bi].offs
}

// exactHeuristics are the preorders of the exact search, tried round robin.
var exactHeuristics = []preorder{"WAT", "TAW", "TWA", "ZWA", "AWT", "OZW"}

type exactJob struct {
	lbIndex int // index among capacity = lower bound jobs, -1 for descent
	heur    int
	limit   int64
	cap     int64
	stop    atomic.Bool
}

// exact runs the exact search on a leaf whose best greedy height is best.
func (r *anytimeRun) exact(d *leafData, target, best int64, offs []int64, at time.Duration, until time.Time) (int64, []int64, time.Duration) {
	ranks := make([][]int32, len(exactHeuristics))
	for h := range exactHeuristics {
		ranks[h] = d.rank(exactHeuristics[h])
	}
	var (
		mu       sync.Mutex
		round    int
		pos      int // position in the round: 2 per heuristic
		lbNext   int // next lower-bound job index
		running  = map[*exactJob]bool{}
		lbWin    = -1 // lowest lower-bound job index that succeeded
		lbWinSol []int64
		lbAt     time.Duration
		lbProven bool // a complete search at the lower bound failed
		stopAll  atomic.Bool
		nodes    int64
	)
	timer := time.AfterFunc(time.Until(until), func() { stopAll.Store(true) })
	defer timer.Stop()
	stopCtx := context.AfterFunc(r.ctx, func() { stopAll.Store(true) })
	defer stopCtx()

	base := int64(max(d.k, 64))
	// nextJob returns the next job or nil when there is nothing left to
	// dispatch. Called with mu held.
	nextJob := func() *exactJob {
		for {
			if stopAll.Load() || lbWin >= 0 {
				return nil
			}
			if lbProven && best <= target {
				return nil
			}
			limit := base << min(round+1, 40)
			h := pos / 2
			descent := pos%2 == 1
			pos++
			if pos == 2*len(exactHeuristics) {
				pos = 0
				round++
			}
			if !descent {
				if lbProven {
					continue
				}
				j := &exactJob{lbIndex: lbNext, heur: h, limit: limit, cap: target}
				lbNext++
				return j
			}
			if best-1 < target || best-1 <= target && !lbProven {
				// best - 1 == target is the lower-bound job's business.
				continue
			}
			return &exactJob{lbIndex: -1, heur: h, limit: limit, cap: best - 1}
		}
	}
	var wg sync.WaitGroup
	for w := 0; w < r.opt.Workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				j := nextJob()
				if j == nil {
					mu.Unlock()
					return
				}
				running[j] = true
				mu.Unlock()

				s := newDFS(d, j.cap, ranks[j.heur], j.limit, &j.stop)
				s.stop2 = &stopAll
				st := s.solve()

				mu.Lock()
				delete(running, j)
				nodes += s.nodes
				if j.lbIndex >= 0 {
					switch st {
					case found:
						if lbWin < 0 || j.lbIndex < lbWin {
							lbWin = j.lbIndex
							lbWinSol = s.sol
							lbAt = time.Since(r.start)
						}
						// Later jobs cannot win any more; earlier ones
						// still may, and must finish.
						for o := range running {
							if o.lbIndex < 0 || o.lbIndex > lbWin {
								o.stop.Store(true)
							}
						}
					case notFound:
						lbProven = true
					}
				} else if st == found {
					h := height(d, s.sol)
					if h < best {
						best, offs = h, s.sol
						at = time.Since(r.start)
					}
				}
				mu.Unlock()
			}
		}()
	}
	r.progressLoop(&wg, func() int64 {
		mu.Lock()
		defer mu.Unlock()
		if lbWin >= 0 {
			return target
		}
		return best
	})
	r.stats.nodes += nodes
	if lbWin >= 0 {
		return height(d, lbWinSol), lbWinSol, lbAt
	}
	return best, offs, at
}

// height is the highest top of a leaf's offsets (at least its base).
func height(d *leafData, offs []int64) int64 {
	h := d.base
	for j := range d.k {
		h = max(h, offs[j]+d.size[j])
	}
	return h
}

// progressLoop waits for the workers, calling Options.Progress now and
// then from this goroutine.
func (r *anytimeRun) progressLoop(wg *sync.WaitGroup, best func() int64) {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	if r.opt.Progress == nil {
		<-done
		return
	}
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-done:
			return
		case <-tick.C:
			r.mu.Lock()
			b := max(r.best, best())
			r.mu.Unlock()
			r.opt.Progress(Progress{Best: b * r.p.unit, LowerBound: r.p.lb * r.p.unit, Elapsed: time.Since(r.start)})
		}
	}
}

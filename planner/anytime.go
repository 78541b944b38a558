package planner

import (
	"context"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/arenaplan/arenaplan/lifetime"
)

// The anytime planner ("auto"). It
//
//  1. turns the trace into sections (times between events) in units of
//     the alignment, splits it where no free buffer is live across a
//     time, and stacks at the bottom of each part the buffers that live
//     through all of it (search.go);
//  2. runs the baselines (bysize, bestfit): auto is never worse;
//  3. packs each remaining leaf with a portfolio of greedy passes
//     (skyline and placement rules in several orders, search_greedy.go),
//     raced on Options.Workers goroutines;
//  4. where a leaf is still above the lower bound: for leaves up to
//     bigLeaf buffers, the exact search (exact.go) at capacity = lower
//     bound under node limits that double round by round, beside a
//     descent that asks for capacities below the best plan so far; for
//     larger leaves, the peak core (core.go: the buffers around the peak
//     packed on their own, the rest filled in around them), then repair
//     around the peak (improve.go). Leaves share the time evenly, in
//     order; time a leaf leaves unused goes to the later ones, and what
//     is left after the last to a second try at the leaves that were cut
//     off;
//  5. for traces with too many conflicting pairs to list, the peak core
//     of the whole trace, then range-maximum skylines beside the bestfit
//     baseline (huge);
//  6. stops when the lower bound is reached or the budget is spent
//     (aiming at 85% of it, leaving room for Check and output) and
//     returns the best plan found.
//
// Determinism: every stage is deterministic on its own; the search stops
// before its budget only when a stage reaches the lower bound, or when
// the descent, whose sequence depends on nothing but its own results,
// proves its best height optimal. Parallel
// stages pick their result in a fixed order: the portfolio the first
// pass, in portfolio order, among those that finished before one reached
// the bound; the exact search the lowest-numbered lower-bound job that
// succeeded, after every lower-numbered one has finished. So a search
// that ends before its budget returns the same plan whatever the timing,
// and with Workers == 1 everything runs in one fixed order.

func init() { register(Auto, anytime) }

type anytimeRun struct {
	ctx      context.Context
	opt      Options
	start    time.Time
	deadline time.Time
	p        *problem
	offs     []int64 // units
	nested   bool    // planning a peak core: no core stage

	mu     sync.Mutex
	best   int64 // best arena so far in units (max over leaves done so far)
	bestAt time.Duration
}

func anytime(ctx context.Context, t *lifetime.Trace, opt Options) (*Plan, error) {
	return anytimeIn(ctx, t, opt, false)
}

// anytimeIn is anytime; nested is set for the search of a peak core
// (core.go), which does not look for a core of its own.
func anytimeIn(ctx context.Context, t *lifetime.Trace, opt Options, nested bool) (*Plan, error) {
	r := &anytimeRun{ctx: ctx, opt: opt, start: time.Now(), nested: nested}
	// Leave room for what follows the search (Run's Check, writing the
	// plan): aim at 85% of the budget.
	r.deadline = r.start.Add(opt.Budget * 85 / 100)
	p, err := newProblem(t, opt.Align)
	if err != nil {
		return nil, err
	}
	r.p = p
	r.offs = make([]int64, len(p.items))
	leaves := p.decompose(r.offs)
	// Leaves are independent; the arena is the highest of them. Stacked
	// buffers set a floor too.
	for i := range p.items {
		r.best = max(r.best, r.offs[i]+p.items[i].size)
	}
	var pairs int64
	for k := range leaves {
		pairs += countPairs(p, &leaves[k])
	}
	if pairs > maxPairs {
		// Too many conflicts to list: the skyline by range maxima.
		return r.huge(t)
	}
	// auto is never worse than the baselines, which scale to any size
	// and cost little next to the search: run them first.
	var base *Plan
	for _, b := range []struct {
		name string
		f    Func
	}{{"bysize", planBySize}, {"bestfit", planBestFit}} {
		// Not cancelled with ctx: they are quick here, and a cancelled
		// search still owes its caller a plan.
		q, err := b.f(context.WithoutCancel(ctx), t, opt)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", b.name, err)
		}
		q.Arena = ArenaSize(t, q.Offsets, opt.Align)
		if base == nil || q.Arena < base.Arena {
			base = q
			base.ToBest = time.Since(r.start)
		}
	}
	base.Algo = "auto"
	lbBytes := p.lb * p.unit
	if base.Arena <= lbBytes {
		return base, nil
	}
	// Each leaf gets an even share of the time left. A leaf that ends
	// early (at the lower bound, or proven) leaves its time to the next
	// ones; what is left after the last goes to a second try, from
	// scratch, at the leaves that were cut off (a leaf that needs most
	// of the budget may sit before ones that need none).
	floor := r.best
	heights := make([]int64, len(leaves))
	var retry []int
	for k := range leaves {
		left := len(leaves) - k
		until := time.Now().Add(time.Until(r.deadline) / time.Duration(left))
		h, at, done := r.solveLeaf(p, &leaves[k], until)
		heights[k] = h
		if !done {
			retry = append(retry, k)
		}
		r.mu.Lock()
		r.best = max(r.best, h)
		r.bestAt = max(r.bestAt, at)
		r.mu.Unlock()
	}
	if len(retry) < len(leaves) {
		for x, k := range retry {
			if time.Until(r.deadline) <= 0 || r.ctx.Err() != nil {
				break
			}
			until := time.Now().Add(time.Until(r.deadline) / time.Duration(len(retry)-x))
			l := &leaves[k]
			kept := make([]int64, len(l.items))
			for j, i := range l.items {
				kept[j] = r.offs[i]
			}
			h, at, done := r.solveLeaf(p, l, until)
			if h < heights[k] || done {
				heights[k] = h
				r.mu.Lock()
				r.bestAt = max(r.bestAt, at)
				r.mu.Unlock()
			} else {
				for j, i := range l.items {
					r.offs[i] = kept[j]
				}
			}
		}
		r.mu.Lock()
		r.best = floor
		for _, h := range heights {
			r.best = max(r.best, h)
		}
		r.mu.Unlock()
	}
	if r.best*p.unit >= base.Arena {
		return base, nil
	}
	plan := &Plan{Algo: "auto", Offsets: make([]int64, len(p.items))}
	for i := range p.items {
		plan.Offsets[i] = r.offs[i] * p.unit
	}
	plan.ToBest = r.bestAt
	return plan, nil
}

// hugePasses are the range-maximum skylines (order, slack; see
// wideSkyline) tried on traces too large for conflict lists, in this
// order. Chosen on iopddl/S_1 and Y_1: the first is best on S_1 (1.0018
// in 0.55 s), the second on Y_1 (1.0003 in 1.9 s).
var hugePasses = []struct {
	order preorder
	slack int64
}{{"AWT", 16384}, {"TWA", 8192}, {"TAW", 65536}}

// huge plans a trace too large for conflict lists: the peak core first
// (returned at once when it reaches the lower bound), then the bestfit baseline
// (fast, so that there is a plan whatever happens), and the hugePasses on
// the workers until the deadline, then bysize if it can finish in time;
// the deadline is earlier here: checking and writing a plan of this size
// takes a while. The lowest arena wins: bestfit's, unless a pass (in pass
// order) or bysize is strictly lower.
func (r *anytimeRun) huge(t *lifetime.Trace) (*Plan, error) {
	p := r.p
	deadline := r.start.Add(r.opt.Budget * 70 / 100)
	// First the peak core (core.go), which reaches the lower bound on
	// the large traces measured; the passes get what time it leaves.
	// Progress here reports whole plans only (0 until there is one), not
	// the floor the stacked buffers set.
	r.mu.Lock()
	r.best = 0
	r.mu.Unlock()
	var core *Plan
	if !r.nested {
		all := make([]int32, len(p.items))
		for i := range all {
			all[i] = int32(i)
		}
		var (
			offs []int64
			wg   sync.WaitGroup
		)
		wg.Add(1)
		go func() {
			defer wg.Done()
			offs, _ = r.coreStage(all, 0, int32(p.nsec), 0, deadline)
		}()
		r.progressLoop(&wg, func() int64 { return 0 })
		if offs != nil {
			for i := range offs {
				offs[i] *= p.unit
			}
			core = &Plan{Algo: "auto", Offsets: offs, Arena: ArenaSize(t, offs, r.opt.Align), ToBest: time.Since(r.start)}
			if core.Arena <= p.lb*p.unit {
				return core, nil
			}
			r.mu.Lock()
			r.best = core.Arena / p.unit
			r.mu.Unlock()
		}
	}
	results := make([][]int64, len(hugePasses))
	var next atomic.Int32
	var wg sync.WaitGroup
	var stop atomic.Bool
	quit := func() bool { return stop.Load() || time.Now().After(deadline) || r.ctx.Err() != nil }
	var bysize []int64
	passes := func() {
		for i := int(next.Add(1) - 1); i <= len(hugePasses) && !quit(); i = int(next.Add(1) - 1) {
			if i == len(hugePasses) {
				// Last, the bysize baseline, when it can finish in time
				// (about 12 µs a buffer on the traces measured).
				if time.Until(deadline) > time.Duration(len(t.Buffers))*12*time.Microsecond {
					if q, err := planBySize(r.ctx, t, r.opt); err == nil {
						bysize = q.Offsets
					}
				}
				continue
			}
			offs, _ := p.wideSkyline(hugePasses[i].order, p.lb/hugePasses[i].slack, quit)
			for k := range offs {
				offs[k] *= p.unit
			}
			results[i] = offs
		}
	}
	// bestfit takes about 2.5 µs a buffer on the traces measured. Where
	// it fits easily in the time kept after the deadline, it runs last,
	// so that the passes have every worker from the start (on iopddl/Y_1
	// the best pass needs most of the window); otherwise first, on one
	// worker beside the passes, so that there is a plan in time.
	bestfitLast := time.Duration(len(t.Buffers))*4*time.Microsecond < r.opt.Budget*15/100
	for range r.opt.Workers - 1 {
		wg.Add(1)
		go func() { defer wg.Done(); passes() }()
	}
	var q *Plan
	if !bestfitLast {
		var err error
		q, err = planBestFit(context.WithoutCancel(r.ctx), t, r.opt) // a plan even when cancelled
		if err != nil {
			stop.Store(true)
			wg.Wait()
			return nil, fmt.Errorf("bestfit: %w", err)
		}
	}
	wg.Add(1)
	go func() { defer wg.Done(); passes() }()
	r.progressLoop(&wg, func() int64 { return 0 })
	if bestfitLast {
		var err error
		q, err = planBestFit(context.WithoutCancel(r.ctx), t, r.opt) // a plan even when cancelled
		if err != nil {
			return nil, fmt.Errorf("bestfit: %w", err)
		}
	}
	best := &Plan{Algo: "auto", Offsets: q.Offsets, Arena: ArenaSize(t, q.Offsets, r.opt.Align), ToBest: time.Since(r.start)}
	for _, offs := range append(results, bysize) {
		if offs == nil {
			continue
		}
		if a := ArenaSize(t, offs, r.opt.Align); a < best.Arena {
			best = &Plan{Algo: "auto", Offsets: offs, Arena: a, ToBest: time.Since(r.start)}
		}
	}
	if core != nil && core.Arena < best.Arena {
		best = core
	}
	return best, nil
}

// solveLeaf packs one leaf as low as it can (at best the global lower
// bound) before until, writes its offsets and returns its height, and
// whether the search ended on its own (the lower bound reached, or the
// height proven optimal) rather than at until.
func (r *anytimeRun) solveLeaf(p *problem, l *leaf, until time.Time) (int64, time.Duration, bool) {
	target := p.lb
	d := newLeafData(p, l, p.times)
	big := d.k > bigLeaf
	core := big && !r.nested // the peak core gets a turn
	entries := portfolioEntries
	if core {
		// The first two greedy passes (LTAW alone packs pangu_2.6B), then
		// the peak core, then the other passes, which take seconds on
		// large leaves and rarely win there. No pass is cut short on the
		// way except by until, so a leaf that reaches the bound gets the
		// same plan whatever the timing.
		entries = portfolioEntries[:2]
	}
	best, offs := r.portfolio(d, target, until, entries, 1)
	at := time.Since(r.start)
	if core && best > target {
		if c, h := r.coreStage(l.items, l.lo, l.hi, l.base, until); c != nil && h < best {
			best, offs, at = h, c, time.Since(r.start)
		}
		if best > target && time.Now().Before(until) {
			if h, o := r.portfolio(d, target, until, portfolioEntries[2:], 0); h < best {
				best, offs, at = h, o, time.Since(r.start)
			}
		}
	}
	done := false
	switch {
	case best <= target:
		done = true
	case big:
		// The exact search costs too much per node here: repair the
		// best plan around its peak.
		h := d.improve(offs, target, until, 1, func() bool { return r.ctx.Err() != nil })
		if h < best {
			best, at = h, time.Since(r.start)
		}
	default:
		best, offs, at, done = r.exact(d, target, best, offs, at, until)
	}
	for j, i := range d.ids {
		r.offs[i] = offs[j]
	}
	return best, at, done || best <= target
}

// bigLeaf is the size above which a leaf gets the improvement search
// instead of the exact one.
const bigLeaf = 2500

// portfolioEntry is one greedy pass: the skyline (lowest offset first)
// or a placement rule in a fixed order.
type portfolioEntry struct {
	skyline bool
	order   preorder
	rule    greedyRule
}

// portfolioEntries, cheapest and most often best first (measured on the
// shared traces). "LTAW" places the buffers that live through half the
// leaf or more before the rest: on somas_tensors/pangu_2.6B it packs at
// the lower bound (0.2 s) where every other pass stops 0.76% above, held
// up by a small long-lived buffer that ends on top.
var portfolioEntries = []portfolioEntry{
	{skyline: true, order: "ZWA"},
	{skyline: true, order: "LTAW"},
	{skyline: true, order: "TAW"},
	{skyline: true, order: "TWA"},
	{skyline: true, order: "AWT"},
	{order: "ZW", rule: bestFit},
	{order: "ZW", rule: firstFit},
	{skyline: true, order: "WAT"},
	{order: "AZ", rule: bestFit},
	{order: "TZ", rule: bestFit},
	{order: "WZ", rule: firstFit},
	{order: "OZ", rule: bestFit},
	{order: "SZ", rule: firstFit},
}

// portfolio runs the greedy passes on the workers and returns the lowest
// height (the first in portfolio order among equals). A pass that reaches
// target ends it: later passes are not started and do not count, so the
// result does not depend on timing unless until passes. The first must
// passes (0 or 1) run to their end whatever the time; with must 0 and no
// time left it returns math.MaxInt64 and no plan.
func (r *anytimeRun) portfolio(d *leafData, target int64, until time.Time, entries []portfolioEntry, must int) (int64, []int64) {
	type res struct {
		h    int64
		offs []int64
	}
	n := len(entries)
	results := make([]res, n)
	var (
		mu   sync.Mutex
		next int
		last = n - 1 // no pass after this one counts
		wg   sync.WaitGroup
	)
	for w := 0; w < min(r.opt.Workers, n); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var scratch []span
			for {
				mu.Lock()
				i := next
				next++
				stop := i > last || (i >= must && time.Now().After(until)) || r.ctx.Err() != nil
				mu.Unlock()
				if stop {
					return
				}
				e := entries[i]
				offs := make([]int64, d.k)
				rank := d.rank(e.order)
				var h int64
				// A pass after one that reached target no longer counts:
				// stop it rather than wait for it.
				quit := func() bool {
					mu.Lock()
					late := i > last
					mu.Unlock()
					return late || i >= must && time.Now().After(until) || r.ctx.Err() != nil
				}
				if e.skyline {
					h = d.skyline(rank, offs, quit)
				} else {
					h, scratch = d.greedy(rank, e.rule, offs, scratch, quit)
				}
				mu.Lock()
				if h >= 0 {
					results[i] = res{h, offs}
					if h <= target {
						last = min(last, i)
					}
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	bi := -1
	for i := 0; i <= last; i++ {
		if results[i].offs != nil && (bi < 0 || results[i].h < results[bi].h) {
			bi = i
		}
	}
	if bi < 0 && must == 0 {
		return math.MaxInt64, nil // out of time before any pass
	}
	if bi < 0 {
		// Not even the first pass finished (cancelled): the skyline
		// cannot take fixed buffers, the first-fit pass can.
		offs := make([]int64, d.k)
		h, _ := d.greedy(d.rank("ZW"), firstFit, offs, nil, nil)
		return h, offs
	}
	return results[bi].h, results[bi].offs
}

// exactHeuristics are the preorders of the exact search, tried round
// robin ("s": ranked once instead of afresh in every partition).
var exactHeuristics = []preorder{"TWA", "TAW", "sTWA", "WAT", "AWT"}

type exactJob struct {
	lbIndex int  // index among capacity = lower bound jobs, -1 for descent
	det     bool // part of the deterministic descent sequence
	heur    preorder
	limit   int64
	cap     int64
	stop    atomic.Bool
}

// descentHeuristics are the preorders the descent sweeps with, in turn.
var descentHeuristics = []preorder{"TWA", "WAT"}

// descentMisses is how many capacities in a row a sweep tries below the
// best before it moves on: solve time is far from monotone in the
// capacity, so one failure says little about the next capacity down.
const descentMisses = 12

// descent generates capacities to try below the best height: rounds of
// sweeps, one per preorder, each going down from one below the best until
// descentMisses failures in a row; the node limit doubles every round.
type descent struct {
	heurs    []preorder
	base     int64
	stride   int64 // capacities step down by this much (0 or 1: by one)
	round, h int
	next     int64 // next capacity of the current sweep; 0: start one
	misses   int
	floor    int64 // no height below floor is feasible
}

// job returns the next job given the best height known, or nil when there
// is none left: the best is proven optimal (best <= floor), or only the
// lower-bound jobs could do better.
func (g *descent) job(best, target int64) *exactJob {
	lo := max(g.floor, target+1)
	if best <= g.floor || best-1 < lo {
		return nil
	}
	step := max(g.stride, 1)
	for {
		if g.next == 0 || g.next > best-1 {
			g.next = max(best-1-(step-1), lo)
		}
		if g.next >= lo && g.misses < descentMisses {
			return &exactJob{lbIndex: -1, heur: g.heurs[g.h], limit: g.base << min(g.round, 40), cap: g.next}
		}
		g.misses, g.next = 0, 0
		g.h++
		if g.h == len(g.heurs) {
			g.h = 0
			g.round++
		}
	}
}

// report takes the outcome of the job that job returned.
func (g *descent) report(j *exactJob, res int) {
	switch res {
	case found:
		g.next = 0 // go on below the new best, same preorder and limit
	case notFound:
		g.floor = max(g.floor, j.cap+1)
		g.next = 0
	default:
		g.misses++
		g.next = j.cap - max(g.stride, 1)
		if g.next <= 0 {
			g.next = -1
		}
	}
}

// exactState is what the workers of one leaf share, under mu.
type exactState struct {
	mu       sync.Mutex
	best     int64 // lowest height found by anyone
	offs     []int64
	at       time.Duration
	lbNext   int // next lower-bound job index
	running  map[*exactJob]bool
	lbWin    int // lowest lower-bound job index that succeeded, -1 if none
	lbWinSol []int64
	lbAt     time.Duration
	lbProven bool // the lower bound is infeasible
	detBest  int64
	detOffs  []int64 // the deterministic descent's best
	detAt    time.Duration
	proven   bool // the descent proved detBest optimal
	nodes    int64
}

// lbRounds is how many rounds of lower-bound jobs run before the workers
// that run them start to alternate with descent jobs.
const lbRounds = 4

// exact runs the exact search on a leaf whose best greedy height is best.
//
// With one worker it alternates lower-bound jobs and descent jobs in one
// fixed sequence. With more, worker 0 runs the descent (which depends only
// on its own results, so it is deterministic) and the others the
// lower-bound jobs, later alternating with extra descent jobs whose plans
// count only when the budget runs out.
func (r *anytimeRun) exact(d *leafData, target, best int64, offs []int64, at time.Duration, until time.Time) (int64, []int64, time.Duration, bool) {
	st := &exactState{best: best, offs: offs, at: at, running: map[*exactJob]bool{}, lbWin: -1,
		detBest: best, detOffs: offs, detAt: at}
	var stopAll atomic.Bool
	timer := time.AfterFunc(time.Until(until), func() { stopAll.Store(true) })
	defer timer.Stop()
	stopCtx := context.AfterFunc(r.ctx, func() { stopAll.Store(true) })
	defer stopCtx()
	base := int64(max(2*d.k, 512))

	// run executes one job and records its outcome.
	run := func(j *exactJob) int {
		st.mu.Lock()
		st.running[j] = true
		st.mu.Unlock()
		s := newDFS(d, j.cap, j.heur, j.limit, &j.stop)
		s.stop2 = &stopAll
		res := s.solve()
		st.mu.Lock()
		defer st.mu.Unlock()
		delete(st.running, j)
		st.nodes += s.nodes
		if res == found {
			h := height(d, s.sol)
			if h < st.best {
				st.best, st.offs, st.at = h, s.sol, time.Since(r.start)
			}
			if j.det && h < st.detBest {
				st.detBest, st.detOffs, st.detAt = h, s.sol, time.Since(r.start)
			}
		}
		if j.lbIndex >= 0 && res == found {
			if st.lbWin < 0 || j.lbIndex < st.lbWin {
				st.lbWin, st.lbWinSol, st.lbAt = j.lbIndex, s.sol, time.Since(r.start)
			}
			// Later jobs cannot win any more; earlier ones still may,
			// and must finish.
			for o := range st.running {
				if o.lbIndex > st.lbWin || (o.lbIndex < 0 && !o.det) {
					o.stop.Store(true)
				}
			}
		}
		if j.cap >= target && res == notFound {
			st.lbProven = true
		}
		return res
	}
	done := func() bool {
		st.mu.Lock()
		defer st.mu.Unlock()
		return stopAll.Load() || st.lbWin >= 0 || st.proven
	}
	nextLB := func() *exactJob {
		st.mu.Lock()
		defer st.mu.Unlock()
		if st.lbProven || st.lbWin >= 0 || stopAll.Load() {
			return nil
		}
		nh := len(exactHeuristics)
		j := &exactJob{lbIndex: st.lbNext, heur: exactHeuristics[st.lbNext%nh], limit: base << min(st.lbNext/nh, 40), cap: target}
		st.lbNext++
		return j
	}
	lbEarly := func() bool {
		st.mu.Lock()
		defer st.mu.Unlock()
		return st.lbNext < lbRounds*len(exactHeuristics)
	}
	// detStep runs one job of the deterministic descent; false when it has
	// nothing left to do.
	det := &descent{heurs: descentHeuristics, base: base, floor: target}
	detStep := func() bool {
		st.mu.Lock()
		b := st.detBest
		st.mu.Unlock()
		j := det.job(b, target)
		if j == nil {
			// A descent plan at the lower bound itself could race with a
			// lower-bound job's: with several workers, leave that to them.
			if b <= det.floor && (b > target || r.opt.Workers <= 1) {
				st.mu.Lock()
				st.proven = true
				st.mu.Unlock()
			}
			return false
		}
		j.det = true
		det.report(j, run(j))
		return true
	}
	var wg sync.WaitGroup
	if r.opt.Workers <= 1 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !done() {
				lb := nextLB()
				if lb != nil {
					run(lb)
					if lbEarly() {
						continue
					}
				}
				if !done() && !detStep() && lb == nil {
					return
				}
			}
		}()
	} else {
		wg.Add(r.opt.Workers)
		go func() {
			defer wg.Done()
			for !done() && detStep() {
			}
		}()
		for w := 1; w < r.opt.Workers; w++ {
			go func() {
				defer wg.Done()
				extra := &descent{heurs: []preorder{"sTWA", "TWA", "TAW"}, base: base, stride: int64(w) + 1, floor: target}
				for !done() {
					lb := nextLB()
					if lb != nil {
						run(lb)
						if lbEarly() {
							continue
						}
					}
					st.mu.Lock()
					b := st.best
					st.mu.Unlock()
					j := extra.job(b, target)
					if j == nil {
						if lb == nil {
							return
						}
						continue
					}
					extra.report(j, run(j))
				}
			}()
		}
	}
	r.progressLoop(&wg, func() int64 {
		st.mu.Lock()
		defer st.mu.Unlock()
		if st.lbWin >= 0 {
			return target
		}
		return st.best
	})
	switch {
	case st.lbWin >= 0:
		return height(d, st.lbWinSol), st.lbWinSol, st.lbAt, true
	case st.proven || r.opt.Workers <= 1:
		return st.detBest, st.detOffs, st.detAt, st.proven
	}
	return st.best, st.offs, st.at, false
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

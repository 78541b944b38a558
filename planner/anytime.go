package planner

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"slices"
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
//  4. where a leaf is still above the lower bound: on long thin leaves
//     (rollThin), the rolling search (rolling.go), the exact search one
//     window of buffers at a time at the lower bound, under a node
//     budget; then, for leaves up to
//     bigLeaf buffers, the exact search (exact.go) at capacity = lower
//     bound under node limits that double round by round, beside a
//     descent that asks for capacities below the best plan so far; for
//     larger leaves, the peak core (core.go: the buffers around the peak
//     packed on their own, the rest filled in around them), then repair
//     around the peak (improve.go). Leaves take turns: in each, the
//     leaves not yet done share the time left evenly, in order; time a
//     leaf leaves unused goes to the later ones, and a leaf cut off goes
//     on where it stopped in the next turn (its exact search keeps its
//     jobs, and reruns the one the clock stopped);
//  5. for traces with too many conflicting pairs to list, the peak core
//     of the whole trace, then range-maximum skylines beside the bestfit
//     baseline (huge);
//  6. stops when the lower bound is reached, every leaf is proven, out
//     of work or stopped by the stop rule (Options.FullBudget), or the
//     budget is spent, less what Check and the output need (reserve),
//     and returns the best plan found, with why it stopped (Plan.Stop).
//
// Determinism: every stage is deterministic on its own; the search stops
// before its budget only when a stage reaches the lower bound, when
// the descent, whose sequence depends on nothing but its own results,
// proves its best height optimal, when the stop rule, which counts the
// nodes of finished jobs, ends a leaf, or when nothing is left to try. Parallel
// stages pick their result in a fixed order: the portfolio the first
// pass, in portfolio order, among those that finished before one reached
// the bound; the exact search the lowest-numbered lower-bound job that
// succeeded, after every lower-numbered one has finished. So a search
// that ends before its budget returns the same plan whatever the timing,
// and with Workers == 1 everything runs in one fixed order.

func init() { register(Auto, anytime) }

// reserve is the part of a budget kept for what follows the search, Run's
// Check and the caller writing the plan, which grow with the trace (Check
// takes about 0.55 µs a buffer on 1M buffers): a fixed 2 ms and 1 µs a
// buffer, at most pct percent of the budget. On small traces the search
// gets nearly all of it.
func reserve(budget time.Duration, buffers int, pct int64) time.Duration {
	return min(budget*time.Duration(pct)/100, 2*time.Millisecond+time.Duration(buffers)*time.Microsecond)
}

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
	// No more search goroutines than CPUs the process may run on
	// (runtime.NumCPU follows the affinity mask, as under taskset): more
	// only slice one core between the descent and the lower-bound jobs,
	// where the one-worker schedule splits the work by nodes. Two workers
	// on one core took challenging E 3.5 s of its 4.6 s budget, one worker
	// 2.0 s. Fewer workers never make a plan depend on timing.
	opt.Workers = max(1, min(opt.Workers, runtime.NumCPU()))
	r := &anytimeRun{ctx: ctx, opt: opt, start: time.Now(), nested: nested}
	r.deadline = r.start.Add(opt.Budget - reserve(opt.Budget, len(t.Buffers), 15))
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
		base.Stop = StopBound
		return base, nil
	}
	// Turns: each leaf not yet done gets an even share of the time left,
	// in order; a leaf that ends early (at the lower bound, proven, or out
	// of work) leaves its time to the next ones. A leaf cut off by its
	// share keeps its search and goes on where it stopped in the next
	// turn, so time left after the last leaf goes to the leaves that need
	// it, until the deadline or until every leaf is done.
	floor := r.best
	states := make([]*leafSearch, len(leaves))
	stop := StopBudget
	for turn := 0; ; turn++ {
		var open []int
		for k := range leaves {
			if s := states[k]; s == nil || !s.done && !s.idle {
				open = append(open, k)
			}
		}
		if len(open) == 0 {
			// Every leaf at its bound or proven optimal, or left
			// by the stop rule with nothing more worth trying.
			stop = StopProof
			for _, s := range states {
				if !s.done {
					stop = StopRule
				}
			}
			break
		}
		if turn > 0 && (time.Until(r.deadline) <= 0 || r.ctx.Err() != nil) {
			break
		}
		for x, k := range open {
			until := time.Now().Add(time.Until(r.deadline) / time.Duration(len(open)-x))
			if states[k] == nil {
				states[k] = r.newLeafSearch(p, &leaves[k])
			}
			r.solveLeaf(states[k], until)
			r.mu.Lock()
			r.best = floor
			for _, s := range states {
				if s != nil {
					r.best = max(r.best, s.best)
					r.bestAt = max(r.bestAt, s.at)
				}
			}
			r.mu.Unlock()
		}
	}
	if r.best*p.unit >= base.Arena {
		base.Stop = stop
		return base, nil
	}
	plan := &Plan{Algo: "auto", Offsets: make([]int64, len(p.items)), Stop: stop}
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
	deadline := r.start.Add(r.opt.Budget - reserve(r.opt.Budget, len(t.Buffers), 30))
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
			core = &Plan{Algo: "auto", Offsets: offs, Arena: ArenaSize(t, offs, r.opt.Align), ToBest: time.Since(r.start), Stop: StopBound}
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
	best.Stop = StopBudget // Run says StopBound where it is at the bound
	return best, nil
}

// leafSearch is one leaf's search, kept between its turns.
type leafSearch struct {
	d      *leafData
	l      *leaf
	target int64
	big    bool // above bigLeaf: the peak core and repair, not the exact search
	core   bool // the peak core gets a turn

	best int64   // height of offs
	offs []int64 // the best plan so far, by local index
	at   time.Duration
	done bool // at the lower bound, or proven optimal
	idle bool // nothing left to try

	greedy, coreTried, rest, rolled bool // stages done
	repairs                         uint64
	ex                              *exactSearch
}

func (r *anytimeRun) newLeafSearch(p *problem, l *leaf) *leafSearch {
	d := newLeafData(p, l, p.times)
	big := d.k > bigLeaf
	return &leafSearch{d: d, l: l, target: p.lb, big: big, core: big && !r.nested}
}

// solveLeaf packs one leaf as low as it can (at best the global lower
// bound) before until, going on from where its last turn stopped, and
// writes its offsets. Its stages: the greedy passes, the peak core (large
// leaves), then the exact search or repair. No stage is cut short on the
// way except by until, so a leaf that reaches the bound gets the same
// plan whatever the timing.
func (r *anytimeRun) solveLeaf(ls *leafSearch, until time.Time) {
	d, target := ls.d, ls.target
	better := func(h int64, offs []int64) {
		if h < ls.best {
			ls.best, ls.offs, ls.at = h, offs, time.Since(r.start)
		}
	}
	if !ls.greedy {
		entries := portfolioEntries
		if ls.core {
			// The first two greedy passes (LTAW alone packs pangu_2.6B),
			// then the peak core, then the other passes, which take
			// seconds on large leaves and rarely win there.
			entries = portfolioEntries[:2]
		}
		ls.best, ls.offs = r.portfolio(d, target, until, entries, 1)
		ls.at = time.Since(r.start)
		ls.greedy, ls.rest = true, !ls.core
	}
	if ls.core && !ls.coreTried && ls.best > target {
		c, h := r.coreStage(ls.l.items, ls.l.lo, ls.l.hi, ls.l.base, until)
		if c != nil {
			better(h, c)
		}
		// Tried unless the clock stopped it before it had a plan.
		ls.coreTried = c != nil || time.Now().Before(until)
	}
	if !ls.rest && ls.best > target {
		h, o := r.portfolio(d, target, until, portfolioEntries[2:], 0)
		if o != nil {
			better(h, o)
		}
		ls.rest = time.Now().Before(until)
	}
	if !ls.rolled && (ls.big || ls.best <= target || !d.thin()) {
		ls.rolled = true // not for this leaf
	}
	if !ls.rolled && ls.best > target {
		// The rolling search (rolling.go), at the lower bound, on long
		// thin leaves: cheap, and where it fails the exact search gets
		// the time.
		var stop atomic.Bool
		timer := time.AfterFunc(time.Until(until), func() { stop.Store(true) })
		stopCtx := context.AfterFunc(r.ctx, func() { stop.Store(true) })
		offs, complete := d.roll(target, r.p.times[ls.l.lo:], &stop)
		timer.Stop()
		stopCtx()
		if offs != nil {
			better(height(d, offs), offs)
		}
		// Cut off by the clock: it runs again, from the start, next turn.
		ls.rolled = complete
	}
	switch {
	case ls.best <= target:
		ls.done = true
	case !ls.rolled:
		// Out of time in the rolling search: it comes first next turn.
	case ls.core && (!ls.coreTried || !ls.rest):
		// Out of time before the core or the last greedy passes: they
		// come first next turn.
	case ls.big:
		// The exact search costs too much per node here: repair the
		// best plan around its peak, with another seed every turn.
		ls.repairs++
		offs := slices.Clone(ls.offs)
		if h := d.improve(offs, target, until, ls.repairs, func() bool { return r.ctx.Err() != nil }); h < ls.best {
			better(h, offs)
		}
		// improve gives up at once on leaves with fixed buffers.
		ls.idle = ls.best > target && time.Now().Before(until) && r.ctx.Err() == nil
	default:
		if ls.ex == nil {
			ls.ex = newExactSearch(d, target, ls.best, ls.offs, ls.at)
		}
		ls.best, ls.offs, ls.at, ls.done, ls.idle = r.exact(ls.ex, until)
	}
	ls.done = ls.done || ls.best <= target
	for j, i := range d.ids {
		r.offs[i] = ls.offs[j]
	}
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

// exactSearch is one leaf's exact search: what its workers share, under
// mu, and what it keeps between the leaf's turns.
type exactSearch struct {
	d      *leafData
	target int64
	base   int64 // the node limit of the first round

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
	// Nodes of the finished lower-bound jobs and descent jobs.
	lbNodes, detNodes int64
	// Nodes of every job that ran to its end (not cut off by the clock),
	// and their count when best last fell: the stop rule's measure.
	doneNodes, bestNodes int64
	settled              bool // the stop rule ended the search

	det   *descent
	extra []*descent  // the descents of workers 1, 2, ...
	redo  []*exactJob // jobs the clock stopped: they run first next turn
}

func newExactSearch(d *leafData, target, best int64, offs []int64, at time.Duration) *exactSearch {
	base := int64(max(2*d.k, 512))
	return &exactSearch{d: d, target: target, base: base, best: best, offs: offs, at: at, lbWin: -1,
		detBest: best, detOffs: offs, detAt: at,
		det: &descent{heurs: descentHeuristics, base: base, floor: target}}
}

// The stop rule (Options.FullBudget): a leaf's exact search ends once its
// best height is within 1/stopGap of the leaf's target (the lower bound)
// and it has searched stopBase + stopNodes × buffers nodes, counting only
// jobs that ran to their end, since that height was found. A gap that
// small is worth less than the search it would take: on decode-step
// traces (internal/tracegen.Decode), before the rolling search reached
// their bound, the exact search found nothing below the greedy passes'
// plans in millions of nodes;
// leaves further from their bound (MiniMalloc's challenging set, gaps of
// 4% and more) search on as before.
const (
	stopGap   = 256
	stopNodes = 4
	stopBase  = 1024
)

// lbRounds is how many rounds of lower-bound jobs run before the workers
// that run them start to alternate with descent jobs.
const lbRounds = 4

// lbShare: with one worker, after the first lbRounds, the lower-bound
// jobs get this many nodes for every node of the descent. Before, they
// took turns job for job, and the lower-bound jobs, whose limits double
// faster, took nearly all the work: on one core D and J (whose lower bound
// no job reaches) ended 8.8% above it, against 3.9% on two cores, where
// the descent has a worker of its own. An even split costs the leaves
// whose bound is reachable (B, E) about 20% more time to it; 2 keeps
// them near their old time and D and J where an even split puts them
// (challenging set, taskset -c 0).
const lbShare = 2

// cutOff is the outcome of a job the clock stopped (not its node limit):
// it is run again, from the start, in the leaf's next turn.
const cutOff = aborted + 1

// exact runs the exact search on a leaf until it reaches the lower bound,
// proves its best height optimal, runs out of jobs or until passes, going
// on from where its last turn stopped. It returns the best height, its
// plan and when it was found, whether the search is done (the bound
// reached or the height proven) and whether it ran out of work.
//
// With one worker it runs lower-bound jobs for lbRounds rounds, then
// lower-bound jobs while they have had at most lbShare times the nodes
// of the descent, else the descent: one sequence that depends on nothing
// but the jobs' results, where both get a share of the work whatever the
// speed of the machine.
// With more, worker 0 runs the descent (which depends only on its own
// results, so it is deterministic) and the others the lower-bound jobs,
// later alternating with extra descent jobs whose plans count only when
// the budget runs out. A job the clock stops runs again next turn, so
// the sequence of outcomes does not depend on where the turns end. What
// it had done is lost: a job longer than the leaf's turns would start
// again every turn, but the last leaf of a turn gets all the time left,
// and turns repeat until the deadline.
func (r *anytimeRun) exact(st *exactSearch, until time.Time) (int64, []int64, time.Duration, bool, bool) {
	d, target, base := st.d, st.target, st.base
	st.running = map[*exactJob]bool{}
	var stopAll atomic.Bool
	timer := time.AfterFunc(time.Until(until), func() { stopAll.Store(true) })
	defer timer.Stop()
	stopCtx := context.AfterFunc(r.ctx, func() { stopAll.Store(true) })
	defer stopCtx()

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
		if res == aborted && stopAll.Load() && !j.stop.Load() && s.nodes <= j.limit {
			if j.lbIndex >= 0 || j.det {
				st.redo = append(st.redo, j)
			}
			return cutOff
		}
		// Only finished jobs count towards the split and the stop rule,
		// so that they do not depend on where the clock stopped one.
		st.doneNodes += s.nodes
		switch {
		case j.lbIndex >= 0:
			st.lbNodes += s.nodes
		case j.det:
			st.detNodes += s.nodes
		}
		if res == found {
			h := height(d, s.sol)
			if h < st.best {
				st.best, st.offs, st.at = h, s.sol, time.Since(r.start)
				st.bestNodes = st.doneNodes
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
	stall := stopBase + stopNodes*int64(d.k)
	finished := func() bool {
		if !r.opt.FullBudget && !st.settled && st.lbWin < 0 && (st.best-target)*stopGap <= target && st.doneNodes-st.bestNodes >= stall {
			st.settled = true
		}
		return st.lbWin >= 0 || st.proven || st.settled
	}
	done := func() bool {
		st.mu.Lock()
		defer st.mu.Unlock()
		return stopAll.Load() || finished()
	}
	// redone takes the earliest job of a kind (lower bound or descent)
	// that the clock stopped in an earlier turn; under mu.
	redone := func(lb bool) *exactJob {
		bi := -1
		for i, j := range st.redo {
			if (j.lbIndex >= 0) == lb && (bi < 0 || j.lbIndex < st.redo[bi].lbIndex) {
				bi = i
			}
		}
		if bi < 0 {
			return nil
		}
		j := st.redo[bi]
		st.redo = slices.Delete(st.redo, bi, bi+1)
		return j
	}
	nextLB := func() *exactJob {
		st.mu.Lock()
		defer st.mu.Unlock()
		if st.lbProven || st.lbWin >= 0 || stopAll.Load() {
			return nil
		}
		if j := redone(true); j != nil {
			return j
		}
		nh := len(exactHeuristics)
		j := &exactJob{lbIndex: st.lbNext, heur: exactHeuristics[st.lbNext%nh], limit: base << min(st.lbNext/nh, 40), cap: target}
		st.lbNext++
		return j
	}
	lbFirst := func() bool {
		st.mu.Lock()
		defer st.mu.Unlock()
		return st.lbNext < lbRounds*len(exactHeuristics) || st.lbNodes <= lbShare*st.detNodes
	}
	lbEarly := func() bool {
		st.mu.Lock()
		defer st.mu.Unlock()
		return st.lbNext < lbRounds*len(exactHeuristics)
	}
	// detStep runs one job of the deterministic descent; false when it has
	// nothing left to do.
	detStep := func() bool {
		st.mu.Lock()
		b := st.detBest
		j := redone(false)
		st.mu.Unlock()
		if j == nil {
			j = st.det.job(b, target)
			if j == nil {
				// A descent plan at the lower bound itself could race
				// with a lower-bound job's: with several workers, leave
				// that to them.
				if b <= st.det.floor && (b > target || r.opt.Workers <= 1) {
					st.mu.Lock()
					st.proven = true
					st.mu.Unlock()
				}
				return false
			}
			j.det = true
		}
		if res := run(j); res != cutOff {
			st.det.report(j, res)
		}
		return true
	}
	var wg sync.WaitGroup
	if r.opt.Workers <= 1 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !done() {
				if lbFirst() {
					if lb := nextLB(); lb != nil {
						run(lb)
						continue
					}
				}
				if done() {
					return
				}
				if !detStep() {
					lb := nextLB()
					if lb == nil {
						return
					}
					run(lb)
				}
			}
		}()
	} else {
		for len(st.extra) < r.opt.Workers-1 {
			w := len(st.extra) + 1
			st.extra = append(st.extra, &descent{heurs: []preorder{"sTWA", "TWA", "TAW"}, base: base, stride: int64(w) + 1, floor: target})
		}
		wg.Add(r.opt.Workers)
		go func() {
			defer wg.Done()
			for !done() && detStep() {
			}
		}()
		for w := 1; w < r.opt.Workers; w++ {
			go func() {
				defer wg.Done()
				extra := st.extra[w-1]
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
					if res := run(j); res != cutOff {
						extra.report(j, res)
					}
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
	idle := !stopAll.Load() && !finished()
	switch {
	case st.lbWin >= 0:
		return height(d, st.lbWinSol), st.lbWinSol, st.lbAt, true, false
	case st.proven || r.opt.Workers <= 1:
		return st.detBest, st.detOffs, st.detAt, st.proven, idle || st.settled
	}
	return st.best, st.offs, st.at, false, idle || st.settled
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

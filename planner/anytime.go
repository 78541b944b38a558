package planner

import (
	"context"
	"fmt"
	"runtime"
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
//     (rollThin), within 1/stopGap of it, dives (one path of the exact
//     search per order), then on long thin leaves the rolling search
//     (rolling.go), the exact search one window of buffers at a time at
//     the lower bound, under a node budget; within 1/stopGap, the hot
//     set (hot.go): the buffers live where the load comes within the
//     gap of the bound, packed alone at it, the others around them;
//     then, for leaves up to bigLeaf buffers, the exact search
//     (exact.go) at capacity = lower bound under node limits that
//     double round by round, beside a
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
// and with Workers == 1 everything runs in one fixed order. Cores lent by
// runs planned beside this one (Options.spare, in a family) only run
// ahead what that order would run anyway, and count it where it would.

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

	// The window bound (bound.go) in units, once a leaf's greedy passes
	// stay above the peak: the target of every leaf searched after it.
	bound, ceil int64 // ceil: the baselines' arena, a height known feasible
	bounded     bool
	t           *lifetime.Trace
	// The window bound computed ahead on a borrowed core, beside the
	// first greedy passes (boundAhead): proveBound takes its result.
	ahead *aheadBound

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
	if opt.Goal > 0 && base.Arena <= opt.Goal {
		base.Stop = StopGoal
		return base, nil
	}
	r.t, r.ceil = t, base.Arena/p.unit
	defer r.dropAhead()
	// Turns: each leaf not yet done gets an even share of the time left,
	// in order; a leaf that ends early (at the lower bound, proven, or out
	// of work) leaves its time to the next ones. A leaf cut off by its
	// share keeps its search and goes on where it stopped in the next
	// turn, so time left after the last leaf goes to the leaves that need
	// it, until the deadline or until every leaf is done.
	floor := r.best
	states := make([]*leafSearch, len(leaves))
	defer func() {
		for _, s := range states {
			if s != nil {
				s.close()
			}
		}
	}()
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
	// The bound is news only where it was proven (Run keeps the peak
	// where it is lower): with gaps, p.lb itself may exceed the peak.
	var bound int64
	if r.bounded && windowBoundHolds(t, opt.Align) {
		bound = r.bound * p.unit
	}
	if r.best*p.unit >= base.Arena {
		base.Stop, base.Bound = stop, bound
		return base, nil
	}
	plan := &Plan{Algo: "auto", Offsets: make([]int64, len(p.items)), Stop: stop, Bound: bound}
	for i := range p.items {
		plan.Offsets[i] = r.offs[i] * p.unit
	}
	plan.ToBest = r.bestAt
	return plan, nil
}

// proveBound computes the window bound of the trace below r.ceil once,
// and returns it (units); p.lb where windowBoundHolds says it may not.
func (r *anytimeRun) proveBound() int64 {
	if r.bounded {
		return r.bound
	}
	r.bounded, r.bound = true, r.p.lb
	if !windowBoundHolds(r.t, r.opt.Align) {
		return r.bound
	}
	if a := r.ahead; a != nil {
		<-a.done
		r.bound = a.bound
		return r.bound
	}
	var stop atomic.Bool
	quit := context.AfterFunc(r.ctx, func() { stop.Store(true) })
	defer quit()
	r.bound, _ = r.p.windowBound(r.ceil, boundBudget(len(r.p.items)), &stop)
	return r.bound
}

// aheadBound is the window bound computed on a borrowed core.
type aheadBound struct {
	done  chan struct{}
	stop  atomic.Bool
	bound int64
}

// boundAhead starts the window bound on a spare core (Options.spare),
// where there is one and the bound may be needed: beside the greedy
// passes, whose plan decides whether it is. It is the computation
// proveBound would make, so the plan is the same either way.
func (r *anytimeRun) boundAhead() {
	if r.bounded || r.ahead != nil || r.nested || !windowBoundHolds(r.t, r.opt.Align) || !r.opt.spare.borrow() {
		return
	}
	a := &aheadBound{done: make(chan struct{})}
	r.ahead = a
	quit := context.AfterFunc(r.ctx, func() { a.stop.Store(true) })
	go func() {
		defer close(a.done)
		defer r.opt.spare.give()
		defer quit()
		a.bound, _ = r.p.windowBound(r.ceil, boundBudget(len(r.p.items)), &a.stop)
	}()
}

// dropAhead stops and waits for a bound computed ahead that no leaf
// asked for.
func (r *anytimeRun) dropAhead() {
	if a := r.ahead; a != nil {
		a.stop.Store(true)
		<-a.done
	}
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

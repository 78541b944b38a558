package planner

// The exact search as the anytime search runs it: jobs of a descent and of
// lower-bound proofs, node limits, the stop rule, and progress.

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

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
	// The lower-bound searches stopped by their node limit, by preorder:
	// the next job of the same preorder goes on from there.
	parked map[preorder]*parkedDFS
}

// keep parks pk as the lower-bound search of its preorder, or drops it
// where one that went further is parked already; under mu.
func (st *exactSearch) keep(pk *parkedDFS) {
	o := pk.s.order
	if pk.s.static {
		o = "s" + o
	}
	if old := st.parked[preorder(o)]; old != nil {
		if old.s.limit >= pk.s.limit {
			pk.drop()
			return
		}
		old.drop()
	}
	if st.parked == nil {
		st.parked = map[preorder]*parkedDFS{}
	}
	st.parked[preorder(o)] = pk
}

// close drops the parked searches.
func (st *exactSearch) close() {
	st.mu.Lock()
	defer st.mu.Unlock()
	for o, pk := range st.parked {
		pk.drop()
		delete(st.parked, o)
	}
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
// jobs that ran to their end, since that height was found; the nodes of
// the dives and of the rolling search before it, which found nothing
// lower, count too (leafSearch.stale). A gap that
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
		// A lower-bound job goes on with the search of its preorder
		// where an earlier one stopped at a smaller limit.
		var pk *parkedDFS
		if j.lbIndex >= 0 && j.cap == target {
			if pk = st.parked[j.heur]; pk != nil && pk.s.limit < j.limit {
				delete(st.parked, j.heur)
			} else {
				pk = nil
			}
		}
		st.mu.Unlock()
		var (
			s   *dfs
			res int
		)
		switch {
		case pk != nil:
			res = pk.resume(j.limit, &j.stop, &stopAll)
		case j.lbIndex >= 0:
			pk, res = startParked(d, j.cap, j.heur, j.limit, &j.stop, &stopAll)
		default:
			s = newDFS(d, j.cap, j.heur, j.limit, &j.stop)
			s.stop2 = &stopAll
			res = s.solve()
		}
		st.mu.Lock()
		defer st.mu.Unlock()
		if pk != nil {
			s = pk.s
			if res == paused {
				// As a search under this limit alone: aborted.
				res = aborted
				st.keep(pk)
			}
		}
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

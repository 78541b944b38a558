package planner

// A leaf's search: the portfolio of greedy orders, the rolling search and
// the exact search in turn, until the leaf reaches its bound or its time.

import (
	"context"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

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

	greedy, coreTried, rest, rolled, hotTried bool // stages done
	// stale is the nodes the dives and the rolling search spent without
	// finding a plan below best: where the stop rule's count starts in
	// the exact search.
	stale   int64
	repairs uint64
	ex      *exactSearch
	parked  []*parkedDFS // the dives' searches, for the exact search
}

// close drops the searches the leaf keeps parked (parkedDFS).
func (ls *leafSearch) close() {
	for _, pk := range ls.parked {
		pk.drop()
	}
	ls.parked = nil
	if ls.ex != nil {
		ls.ex.close()
	}
}

func (r *anytimeRun) newLeafSearch(p *problem, l *leaf) *leafSearch {
	d := newLeafData(p, l, p.times)
	big := d.k > bigLeaf
	return &leafSearch{d: d, l: l, target: max(r.bound, p.lb), big: big, core: big && !r.nested}
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
		r.boundAhead()
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
		if ls.best > target && !r.nested {
			// Above the peak: the window bound may say the search can
			// stop here, and otherwise what it should aim at.
			ls.target = max(target, r.proveBound())
			target = ls.target
		}
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
		var stop, rollStop atomic.Bool
		timer := time.AfterFunc(time.Until(until), func() { stop.Store(true); rollStop.Store(true) })
		stopCtx := context.AfterFunc(r.ctx, func() { stop.Store(true); rollStop.Store(true) })
		perBuffer := int64(rollNodes)
		near := !r.opt.FullBudget && (ls.best-target)*stopGap <= target
		if near {
			perBuffer = rollNear
		}
		type rolled struct {
			offs     []int64
			nodes    int64
			complete bool
		}
		roll := func() rolled {
			offs, n, complete := d.roll(target, r.p.times[ls.l.lo:], perBuffer, &rollStop)
			return rolled{offs, n, complete}
		}
		// Near the bound, dives first (rolling.go): one path of the
		// exact search costs less than the rolling search's windows.
		// On a spare core the rolling search runs beside them, and
		// counts only where they find nothing, as if it came after.
		var (
			offs     []int64
			nodes    int64
			complete = true
			parked   []*parkedDFS
			ahead    chan rolled
		)
		if near && r.opt.spare.borrow() {
			ahead = make(chan rolled, 1)
			go func() {
				rl := roll()
				r.opt.spare.give() // before the result, as in dive
				ahead <- rl
			}()
		}
		if near {
			offs, nodes, complete, parked = d.dive(target, &stop, r.opt.spare)
		}
		switch {
		case offs == nil && complete:
			var rl rolled
			if ahead != nil {
				rl = <-ahead
			} else {
				rl = roll()
			}
			offs, complete = rl.offs, rl.complete
			nodes += rl.nodes
		case ahead != nil:
			rollStop.Store(true)
			<-ahead
		}
		timer.Stop()
		stopCtx()
		if offs != nil {
			better(height(d, offs), offs)
		} else if complete {
			ls.stale += nodes
		}
		// The dives are the first lower-bound jobs' searches (the same
		// preorders at the same capacity), cut short: the exact search
		// goes on with them. A leaf cut off here runs its dives again.
		for _, pk := range parked {
			if complete && offs == nil {
				ls.parked = append(ls.parked, pk)
			} else {
				pk.drop()
			}
		}
		// Cut off by the clock: it runs again, from the start, next turn.
		ls.rolled = complete
	}
	if ls.rolled && !ls.hotTried && !r.nested && !ls.big && ls.best > target && !r.opt.FullBudget && (ls.best-target)*stopGap <= target {
		// Still above the bound, near it: the buffers live where it is
		// tight packed first, the others around them (hot.go). Once:
		// it reaches the bound or not.
		ls.hotTried = true
		if offs, h := r.hotStage(ls.l.items, ls.l.lo, ls.l.hi, ls.l.base, target, ls.best, until); offs != nil {
			better(h, offs)
		}
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
			for _, pk := range ls.parked {
				ls.ex.keep(pk)
			}
			ls.parked = nil
			// The stop rule counts the dives' and the rolling search's
			// nodes too: they searched below the same best, in vain.
			ls.ex.doneNodes = ls.stale
		}
		ls.best, ls.offs, ls.at, ls.done, ls.idle = r.exact(ls.ex, until)
	}
	ls.done = ls.done || ls.best <= target
	if ls.done || ls.idle {
		ls.close() // its search is over
	}
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
	workers := r.opt.Workers
	if workers == 1 && n > 1 && r.opt.spare.borrow() {
		// The result does not depend on the workers (see above).
		workers = 2
		defer r.opt.spare.give()
	}
	for w := 0; w < min(workers, n); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var scratch []span
			for {
				mu.Lock()
				i := next
				next++
				stop := i > last || (i >= must && time.Now().After(until)) || r.ctx.Err() != nil
				// A pass that reaches the height of an earlier one can
				// no longer be chosen (the earlier wins ties): it stops
				// there.
				cut := int64(math.MaxInt64)
				for _, q := range results[:min(i, len(results))] {
					if q.offs != nil {
						cut = min(cut, q.h)
					}
				}
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
					h = d.skyline(rank, offs, cut, quit)
				} else {
					h, scratch = d.greedy(rank, e.rule, offs, scratch, cut, quit)
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
		h, _ := d.greedy(d.rank("ZW"), firstFit, offs, nil, math.MaxInt64, nil)
		return h, offs
	}
	return results[bi].h, results[bi].offs
}

package planner

import (
	"time"

	"github.com/arenaplan/arenaplan/lifetime"
)

// The peak core: how the anytime planner packs traces too large for the
// conflict lists (iopddl/S_1: 28k buffers and 43M conflicting pairs).
//
// Only the times where the live bytes come near the lower bound are hard:
// elsewhere there is room to spare and a greedy pass fits the buffers in.
// So the core stage
//
//  1. takes the window of sections from the first to the last whose load
//     is at least a fraction θ of the lower bound (one interval, the hull),
//  2. cuts every buffer live in the window down to its part inside it:
//     the core, a problem of a few thousand buffers whose peak is the
//     trace's, which the ordinary search (leaves, portfolio, exact) packs,
//     usually at the lower bound, in milliseconds,
//  3. fixes the core buffers at those offsets and places the others with
//     the bysize baseline, which honours fixed buffers; outside the
//     window the load is below θ·LB, so there is room for its mistakes.
//
// Two buffers of the trace that overlap in time and both meet the window
// overlap inside it too (intervals on a line that meet pairwise have a
// point in common), so a core plan never lets two conflicting buffers
// share memory. The fill can still end above the core when the window is
// too narrow for bysize; the stage then widens it (θ lower) and tries
// again while time and the core's size allow.
//
// On the shared traces: S_1 at θ = 0.9 is at the lower bound in about
// 0.3 s (every skyline pass stops at 1.0018), Y_1 at θ = 0.9 in about
// 0.6 s (1.0003 before, in 2.3 s).

// coreThetas are the fractions of the lower bound that bound the window,
// widest last. 0.95 and up leave bysize too little room outside on the
// iopddl traces; 0.9 is enough on all of them.
var coreThetas = []float64{0.9, 0.8, 0.7, 0.5}

// fillCost is what the bysize fill costs per buffer, about (7–9 µs on
// the shared traces, measured; some room added).
const fillCost = 12 * time.Microsecond

// peakCore runs the core stage until deadline and returns its best plan
// (nil if it had no time for one or the trace has fixed buffers the core
// cannot honour). Offsets are in bytes; Arena is set.
func (r *anytimeRun) peakCore(t *lifetime.Trace, deadline time.Time) *Plan {
	p := r.p
	if p.lb == 0 {
		return nil
	}
	fill := time.Duration(len(p.items)) * fillCost
	var best *Plan
	prevLo, prevHi := -1, -1
	for _, theta := range coreThetas {
		left := time.Until(deadline) - fill
		if left <= 0 || r.ctx.Err() != nil {
			break
		}
		wlo, whi := p.window(theta)
		if wlo == prevLo && whi == prevHi {
			continue // the same core as the last try
		}
		prevLo, prevHi = wlo, whi
		sub, core := p.core(wlo, whi)
		if countCorePairs(sub) > maxPairs {
			break // wider windows only grow
		}
		// The core is planned in units with the ordinary search; nested,
		// so that a core too large for conflict lists is never split
		// again.
		cp, err := anytimeIn(r.ctx, sub, Options{Align: 1, Budget: left, Workers: r.opt.Workers}, true)
		if err != nil {
			continue
		}
		ft := &lifetime.Trace{Name: t.Name, Buffers: make([]lifetime.Buffer, len(t.Buffers))}
		copy(ft.Buffers, t.Buffers)
		for k, i := range core {
			b := &ft.Buffers[p.items[i].id]
			b.Fixed = cp.Offsets[k] * p.unit
			b.Gaps = nil // the core plan ignored them
		}
		q, err := planBySize(r.ctx, ft, r.opt)
		if err != nil {
			continue
		}
		q.Arena = ArenaSize(t, q.Offsets, r.opt.Align)
		if best == nil || q.Arena < best.Arena {
			q.Algo = "auto"
			q.ToBest = time.Since(r.start)
			best = q
		}
		if best.Arena <= p.lb*p.unit {
			break
		}
	}
	return best
}

// window returns the sections [lo, hi) from the first to the last whose
// load is at least theta times the lower bound.
func (p *problem) window(theta float64) (lo, hi int) {
	lo, hi = -1, -1
	min := theta * float64(p.lb)
	for s, l := range p.load {
		if float64(l) >= min {
			if lo < 0 {
				lo = s
			}
			hi = s + 1
		}
	}
	return lo, hi
}

// core returns the buffers live in sections [wlo, whi), cut to those
// sections, as a trace in units whose times are section numbers, and the
// problem items they stand for (core[k] is buffer k of the trace).
func (p *problem) core(wlo, whi int) (*lifetime.Trace, []int) {
	sub := &lifetime.Trace{Name: "core"}
	var core []int
	for i := range p.items {
		it := &p.items[i]
		if int(it.lo) >= whi || int(it.hi) <= wlo {
			continue
		}
		fixed := lifetime.NoOffset
		if it.fixed >= 0 {
			fixed = it.fixed
		}
		sub.Buffers = append(sub.Buffers, lifetime.Buffer{
			ID:    lifetime.ID(len(sub.Buffers)),
			Size:  it.size,
			Align: it.align,
			Start: int64(max(int(it.lo), wlo)),
			End:   int64(min(int(it.hi), whi)),
			Fixed: fixed,
		})
		core = append(core, i)
	}
	return sub, core
}

// countCorePairs counts the conflicting pairs of a core trace.
func countCorePairs(sub *lifetime.Trace) int64 {
	q, err := newProblem(sub, 1)
	if err != nil {
		return maxPairs + 1
	}
	all := make([]int32, len(q.items))
	for i := range all {
		all[i] = int32(i)
	}
	return countPairs(q, &leaf{items: all, lo: 0, hi: int32(q.nsec)})
}

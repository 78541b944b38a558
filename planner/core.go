package planner

import (
	"time"

	"github.com/arenaplan/arenaplan/lifetime"
)

// The peak core: how the anytime planner packs traces too large for the
// conflict lists (iopddl/S_1: 28k buffers and 43M conflicting pairs), and
// leaves above bigLeaf buffers that the greedy passes leave above the
// bound.
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
//  3. fixes the core buffers at those offsets and places the others
//     around them: by the sweep fill (sweep.go, O(n log n)), and where
//     that ends above the core and time allows, by the bysize baseline,
//     which honours fixed buffers and packs tighter; outside the window
//     the load is below θ·LB, so there is room for their mistakes.
//
// Two buffers of the trace that overlap in time and both meet the window
// overlap inside it too (intervals on a line that meet pairwise have a
// point in common), so a core plan never lets two conflicting buffers
// share memory. The fill can still end above the core when the window is
// too narrow for bysize; the stage then widens it (θ lower) and tries
// again while time and the core's size allow.
//
// On the shared traces: S_1 at θ = 0.9 is at the lower bound in about
// 0.1 s of search (every skyline pass stops at 1.0018), Y_1 in about
// 0.06 s (1.0003 before, in 2.3 s), the 1M-buffer scaling trace in about
// 0.75 s (a core of 563 buffers, 2 ms; the sweep fill the rest); as
// leaves, somas bert_base, bert_large and bert_nezha in 5-30 ms (the
// greedy passes end 196 to 2052 bytes over, after seconds). The sweep
// fill reaches the core's height on all of them. It does not help on
// pangu_2.6B, whose core ends above the greedy passes' plan.

// coreThetas are the fractions of the lower bound that bound the window,
// widest last. 0.95 and up leave bysize too little room outside on the
// iopddl traces; 0.9 is enough on all of them, for the sweep too.
var coreThetas = []float64{0.9, 0.8, 0.7, 0.5}

// fillCost is what the bysize fill costs per buffer, about (7–9 µs on
// the shared traces, measured; some room added): it runs only when there
// is that much time left.
const fillCost = 12 * time.Microsecond

// sweepCost is what the sweep fill (sweep.go) costs per buffer, about
// (0.46–0.63 µs on the 1M-buffer scaling trace, measured on one core):
// a core is searched only when the time left holds the fill. Kept close
// to the measure, as the gate decides whether 1M buffers get a core in
// the default budget at all (about 1.15 s are left for it there).
const sweepCost = 700 * time.Nanosecond

// coreStage packs the items ids of p, which live in sections [lo, hi)
// and sit at base or above (the whole problem, or a leaf), by the peak
// core until deadline. It returns their offsets in units, in the order of
// ids, and the height; nil when it had no time for a plan or the items
// do not suit it (a fixed offset below base, or an alignment that base
// breaks).
func (r *anytimeRun) coreStage(ids []int32, lo, hi int32, base int64, deadline time.Time) ([]int64, int64) {
	p := r.p
	for _, i := range ids {
		it := &p.items[i]
		if it.lo < lo || it.hi > hi {
			return nil, 0 // an item outside [lo, hi): not a part of p
		}
		if it.align > 1 && base%it.align != 0 || it.fixed >= 0 && (it.fixed < base || (it.fixed-base)%it.align != 0) {
			return nil, 0
		}
	}
	load, peak := p.sectionLoad(ids, lo, hi)
	fill := time.Duration(len(ids)) * sweepCost
	var (
		best   []int64
		bestH  int64
		prevLo = -1
		prevHi = -1
	)
	for _, theta := range coreThetas {
		left := time.Until(deadline) - fill
		if left <= 0 || r.ctx.Err() != nil {
			break
		}
		wlo, whi := window(load, peak, theta)
		if wlo == prevLo && whi == prevHi {
			continue // the same core as the last try
		}
		prevLo, prevHi = wlo, whi
		sub, core := p.cut(ids, lo, hi, base, lo+int32(wlo), lo+int32(whi))
		if countCorePairs(sub) > maxPairs {
			break // wider windows only grow
		}
		// The core, planned in units with the ordinary search; nested, so
		// that it does not look for a core of its own.
		cp, err := anytimeIn(r.ctx, sub, Options{Align: 1, Budget: left, Workers: r.opt.Workers}, true)
		if err != nil {
			continue
		}
		// The items outside the window around the core ones: the sweep
		// first (O(n log n)), then bysize, which looks ahead and packs
		// tighter, where the sweep ends above the core and there is time.
		offs := make([]int64, len(ids))
		inCore := make([]bool, len(ids))
		for k, j := range core {
			offs[j], inCore[j] = cp.Offsets[k], true
		}
		if h, ok := p.sweepFill(ids, lo+int32(wlo), lo+int32(whi), 0, offs, inCore); ok && (best == nil || base+h < bestH) {
			best, bestH = offs, base+h
		}
		if (best == nil || bestH > base+peak) && time.Until(deadline) >= time.Duration(len(ids))*fillCost {
			all, _ := p.cut(ids, lo, hi, base, lo, hi)
			for k, j := range core {
				all.Buffers[j].Fixed, all.Buffers[j].HasFixed = cp.Offsets[k], true
			}
			if q, err := planBySize(r.ctx, all, Options{Align: 1}); err == nil {
				if h := base + ArenaSize(all, q.Offsets, 1); best == nil || h < bestH {
					best, bestH = q.Offsets, h
				}
			}
		}
		if best != nil && bestH <= base+peak {
			break
		}
	}
	for k := range best {
		best[k] += base
	}
	return best, bestH
}

// sectionLoad returns the load of the items ids alone (units) in each
// of the sections [lo, hi), indexed from lo, and its largest.
func (p *problem) sectionLoad(ids []int32, lo, hi int32) ([]int64, int64) {
	load := make([]int64, hi-lo+1)
	for _, i := range ids {
		it := &p.items[i]
		load[max(it.lo, lo)-lo] += it.size
		load[min(it.hi, hi)-lo] -= it.size
	}
	var peak int64
	for s := range hi - lo {
		if s > 0 {
			load[s] += load[s-1]
		}
		peak = max(peak, load[s])
	}
	return load[:hi-lo], peak
}

// window returns the sections [lo, hi) from the first to the last whose
// load is at least theta times peak.
func window(load []int64, peak int64, theta float64) (lo, hi int) {
	lo, hi = -1, -1
	min := theta * float64(peak)
	for s, l := range load {
		if float64(l) >= min {
			if lo < 0 {
				lo = s
			}
			hi = s + 1
		}
	}
	return lo, hi
}

// cut returns the items ids (live in sections [lo, hi), placed from base
// up) that meet sections [wlo, whi), cut to them, as a trace in units
// whose times are section numbers and whose offsets count from base, and
// for each of its buffers the position in ids of the item it stands for.
func (p *problem) cut(ids []int32, lo, hi int32, base int64, wlo, whi int32) (*lifetime.Trace, []int) {
	sub := &lifetime.Trace{Name: "core"}
	var pos []int
	for k, i := range ids {
		it := &p.items[i]
		s, e := max(it.lo, lo, wlo), min(it.hi, hi, whi)
		if s >= e {
			continue
		}
		fixed, hasFixed := int64(0), it.fixed >= 0
		if hasFixed {
			fixed = it.fixed - base
		}
		sub.Buffers = append(sub.Buffers, lifetime.Buffer{
			ID:    lifetime.ID(len(sub.Buffers)),
			Size:  it.size,
			Align: it.align,
			Start: int64(s),
			End:   int64(e),
			Fixed: fixed, HasFixed: hasFixed,
		})
		pos = append(pos, k)
	}
	return sub, pos
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

package planner

import (
	"sync/atomic"

	"github.com/arenaplan/arenaplan/lifetime"
)

// The window bound: a lower bound on the arena at least the peak of live
// bytes, proven by packing small parts of the trace exactly.
//
// Soundness. Take any valid plan of the whole trace with arena H, and a
// range of sections W. Keep only the buffers live somewhere in W and cut
// each lifetime to W. Two cut buffers that are live together in W were
// live together in the trace, so the kept buffers at their plan's offsets
// are a valid plan of the cut trace (same sizes, alignments and fixed
// offsets), with arena at most H. So if the exact search (exact.go, which
// tries every canonical packing) proves that the cut trace fits under no
// capacity c, no plan of the whole trace fits under c either: H > c. The
// bound is the largest such c plus one, over the windows tried, and never
// less than the peak of live bytes. A search stopped by its node limit
// proves nothing and leaves the bound where it was.
//
// Why windows and not cliques: buffers live at one time are a clique of
// the conflict graph, and lifetimes are intervals, so the heaviest clique
// is the peak of live bytes itself, with every size rounded up to the
// plan's alignment as LowerBound rounds it. What the peak misses is the
// cost of buffers that must sit side by side across two peaks whose live
// sets differ: a window that spans both peaks and what lies between holds
// both, and its exact packing pays for them. Windows are the runs of
// sections whose load is within the gap of the peak (the best arena known
// less the peak), alone and in consecutive pairs, smallest first, within
// boundBudget nodes in all. Units: every plan can be pushed down until
// each buffer rests on another or on 0, which leaves its offsets sums of
// sizes, multiples of the problem's unit, so a capacity ruled out in
// units rules out every arena below the next unit.
//
// What it does not prove: on a decode step as PyTorch records it
// (lifetime/tracegen.TorchDecode, memory-efficient attention) the plans
// stay 12 × 256 bytes above the peak at batch 1 from 6 layers up, every
// window fits at the peak, and the whole trace is beyond the exact
// search. The peak is not the obstacle: the hot stage (hot.go) packs
// 3 to 5 layers at it, 6 with some 140k nodes of exact search on the
// hot set, past what the stop rule gives it, and the 8-layer step at
// batch 1 has a layout at the peak (testdata/*.peak.csv, found offline).

// boundWindow is a range of sections [lo, hi).
type boundWindow struct{ lo, hi int32 }

// Limits of the window bound: windows of at most boundItems buffers, at
// most boundNodes nodes a capacity tried, boundWindows windows, and
// boundBudget nodes in all.
const (
	boundItems   = 64
	boundNodes   = 2048
	boundWindows = 48
)

// boundBudget is the nodes the window bound may search on a trace of n
// buffers: as many as the stop rule gives a leaf (stopBase + stopNodes
// per buffer), so that proving costs no more than settling.
func boundBudget(n int) int64 { return stopBase + stopNodes*int64(n) }

// windowLeaf returns the items live in w, cut to it, as a leaf.
func (p *problem) windowLeaf(w boundWindow) *leafData {
	var ids []int32
	for i := range p.items {
		it := &p.items[i]
		if it.lo < w.hi && it.hi > w.lo {
			ids = append(ids, int32(i))
		}
	}
	if len(ids) > boundItems {
		return nil
	}
	var peak int64
	for s := w.lo; s < w.hi; s++ {
		peak = max(peak, p.load[s])
	}
	return newLeafData(p, &leaf{items: ids, lo: w.lo, hi: w.hi, lb: peak}, p.times)
}

// windowBound returns a lower bound on any arena of p (units), at least
// p.lb, proven below ceil (a height known to be feasible: the bound never
// exceeds it), and the nodes it searched. stop, if set, aborts it.
func (p *problem) windowBound(ceil, budget int64, stop *atomic.Bool) (int64, int64) {
	bound := p.lb
	if ceil <= bound {
		return bound, 0
	}
	gap := ceil - p.lb
	hot := func(s int) bool { return p.load[s]+gap > p.lb }
	var peaks []boundWindow
	for s := 0; s < p.nsec; s++ {
		if !hot(s) {
			continue
		}
		e := s
		for e < p.nsec && hot(e) {
			e++
		}
		peaks = append(peaks, boundWindow{int32(s), int32(e)})
		s = e
	}
	windows := make([]boundWindow, 0, 2*len(peaks))
	windows = append(windows, peaks...)
	for i := 0; i+1 < len(peaks); i++ {
		windows = append(windows, boundWindow{peaks[i].lo, peaks[i+1].hi})
	}
	windows = windows[:min(len(windows), boundWindows)]
	var nodes int64
	for _, w := range windows {
		if nodes >= budget {
			break
		}
		d := p.windowLeaf(w)
		if d == nil {
			continue
		}
		// First the capacity the bound stands at: most windows fit
		// there, and then cannot raise it. Past it, bisect [lo, hi): lo
		// is the lowest capacity not ruled out, hi one found feasible or
		// left undecided (an aborted search proves nothing).
		lo, hi := bound, ceil
		var s *dfs
		for first := true; lo < hi && (stop == nil || !stop.Load()); first = false {
			c := lo + (hi-lo)/2
			if first || hi-lo == 1 {
				c = lo
			}
			// Dives first (one path per order, as the leaves' dives):
			// where the window fits under c, one of them usually packs
			// it in as many nodes as it has buffers, where the search
			// in one order alone may spend all its nodes and prove
			// nothing (a decode step as PyTorch records it: 2048 nodes
			// of TWA, 47 of TAW). A packing, or a search that ends
			// within its dive, decides c as the full search would.
			res := aborted
			for _, o := range diveOrders {
				if nodes >= budget {
					break
				}
				if s == nil {
					s = newDFS(d, c, o, min(int64(d.k)+diveSlack, budget-nodes), stop)
				} else {
					s.reset(c, o, min(int64(d.k)+diveSlack, budget-nodes), stop)
				}
				res = s.solve()
				nodes += s.nodes
				if res != aborted {
					break
				}
			}
			if res == aborted && nodes < budget {
				s.reset(c, "TWA", min(boundNodes, budget-nodes), stop)
				res = s.solve()
				nodes += s.nodes
			}
			if res != notFound {
				hi = c
			} else {
				lo = c + 1
			}
		}
		bound = max(bound, lo)
		if bound >= ceil {
			break
		}
	}
	return bound, nodes
}

// windowBoundHolds reports whether the window bound is a bound on t's
// plans: not with gaps (the search treats a buffer as live through its
// gaps, so a bound on its problem is not one on the trace's plans), nor
// with fixed offsets (the exact search's canonical placements assume
// every buffer may move down; a fixed one may hold a hole open under a
// buffer that could have used it, and a proof could miss that plan),
// nor with an offset alignment beyond the plan's (the search's dominance
// rule takes the room under an aligned buffer for a hole that another
// could fill; a random trace of six buffers, some aligned to 2, has an
// arena of 10 that the search called impossible). Sizes rounded up to
// the plan's alignment are what every bound here counts.
func windowBoundHolds(t *lifetime.Trace, align int64) bool {
	for i := range t.Buffers {
		b := &t.Buffers[i]
		if len(b.Gaps) > 0 || b.HasFixed {
			return false
		}
		if _, a := Need(b, align); a != max(align, 1) {
			return false
		}
	}
	return true
}

// LowerBoundProven returns a lower bound on the arena of any plan of t at
// alignment align, at least t.LowerBound(align): the window bound proven
// below ceil bytes (a known arena; 0 tries every window up to the sum of
// all sizes). It takes milliseconds on traces of a few thousand buffers.
func LowerBoundProven(t *lifetime.Trace, align int64, ceil int64) (int64, error) {
	align = max(align, 1)
	p, err := newProblem(t, align)
	if err != nil {
		return 0, err
	}
	if !windowBoundHolds(t, align) {
		peak, _ := t.LowerBound(align)
		return peak, nil
	}
	c := ceil / p.unit
	if ceil <= 0 {
		for i := range p.items {
			c += p.items[i].size + p.items[i].align - 1
		}
	}
	b, _ := p.windowBound(c, boundBudget(len(p.items)), nil)
	return b * p.unit, nil
}

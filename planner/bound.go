package planner

import (
	"slices"
	"sync/atomic"
)

// Stronger lower bounds than the peak of live bytes.
//
// The peak of live bytes is the heaviest clique of the interval graph of
// lifetimes, and no bound from cliques alone can be stronger: interval
// graphs are perfect. What it ignores is that a buffer keeps one offset
// for its whole life, so buffers that cross a time where the largest
// buffers fill the arena must sit in the gaps those leave, and still
// there when the buffers around them change. That is found by search:
// any subset of a leaf's buffers, each clipped to a window of sections,
// is a relaxation of the leaf (a packing of the leaf, restricted, packs
// it), so a window that the exact search proves cannot be packed under
// a capacity proves the whole leaf cannot either. Windows are small (a
// few dozen buffers around the leaf's heaviest sections), so the proof
// is cheap where it exists; and the exact search (exact.go) is complete,
// so a window it reports notFound is infeasible.

// maxWindowItems bounds the buffers of one window: beyond it the exact
// search rarely proves anything within the node limits used here.
const maxWindowItems = 80

// windowProbes is how many of a leaf's heaviest sections windows are
// centred on.
const windowProbes = 6

// boundWindow is one window: the leaf's sections [lo, hi) (relative to
// the leaf) and the search data of the items live in them.
type boundWindow struct {
	lo, hi int32
	d      *leafData
}

// boundWindows builds the windows of a leaf, smallest first around each
// of its windowProbes heaviest sections (by load, then by position), each
// twice as wide as the one before until it would hold more than
// maxWindowItems buffers or the whole leaf. Deterministic.
func boundWindows(p *problem, l *leaf, d *leafData) []boundWindow {
	secs := make([]int32, d.nsec)
	for s := range secs {
		secs[s] = int32(s)
	}
	slices.SortStableFunc(secs, func(a, b int32) int {
		if d.secLoad[a] != d.secLoad[b] {
			if d.secLoad[a] > d.secLoad[b] {
				return -1
			}
			return 1
		}
		return int(a - b)
	})
	var out []boundWindow
	seen := map[[2]int32]bool{}
	for _, c := range secs[:min(windowProbes, len(secs))] {
		for w := int32(1); ; w *= 2 {
			lo, hi := max(c-w, 0), min(c+w+1, int32(d.nsec))
			if lo == 0 && hi == int32(d.nsec) {
				break // the whole leaf: that is the exact search's job
			}
			var items []int32
			for j := range d.k {
				if d.lo[j] < hi && lo < d.hi[j] {
					items = append(items, d.ids[j])
				}
			}
			if len(items) > maxWindowItems {
				break
			}
			if seen[[2]int32{lo, hi}] {
				continue
			}
			seen[[2]int32{lo, hi}] = true
			sub := leaf{items: items, base: l.base, lo: l.lo + lo, hi: l.lo + hi}
			var peak int64
			for s := lo; s < hi; s++ {
				peak = max(peak, d.secLoad[s])
			}
			sub.lb = l.base + peak
			out = append(out, boundWindow{lo: lo, hi: hi, d: newLeafData(p, &sub, p.times)})
		}
	}
	return out
}

// windowInfeasible reports whether some window is proven not to pack
// under capacity, trying each with the exact search under limit nodes;
// it returns the nodes spent as well. stop, when set, aborts.
func windowInfeasible(ws []boundWindow, capacity, limit int64, stop *atomic.Bool) (bool, int64) {
	var nodes int64
	for _, w := range ws {
		s := newDFS(w.d, capacity, "TWA", limit, stop)
		res := s.solve()
		nodes += s.nodes
		if res == notFound {
			return true, nodes
		}
	}
	return false, nodes
}

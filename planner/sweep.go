package planner

import (
	"cmp"
	"slices"
)

// The sweep fill: how the peak core (core.go) places the buffers outside
// its window when there are too many of them for bysize in the time left.
//
// Every buffer that meets the window is fixed by the core plan, so a
// buffer outside it lies wholly before the window or wholly after it, and
// the two sides are independent. After the window, the core buffers that
// cross its end are all live at its end: the sweep starts with them in
// place and walks forward in time, freeing each buffer at its end and
// giving each new one the smallest free gap that holds it (best fit, the
// way bestfit does). Before the window the same walk runs backwards from
// the window's start, a buffer's end being where it starts in that
// direction; the core buffers that cross the window's start are the ones
// in place at the outset. So the fixed buffers never get in the way of a
// gap search (they are either in place from the start or gone), and the
// whole fill costs O(n log n): a bucket sort by time and two btree
// operations per buffer.
//
// Unlike bysize it never looks ahead, so it packs worse; it is meant for
// the sides of a window, where the load stays below θ times the bound.

// sweepFill places the items ids (live in sections [lo, hi), from base up)
// that miss the window [wlo, whi), around those that meet it, whose
// offsets offs already holds (in the order of ids; inCore marks them). It
// writes the others' offsets into offs and returns the height (the
// highest top of all, at least base). It returns false when an item
// outside the window has a fixed offset of its own, which the sweep does
// not honour.
func (p *problem) sweepFill(ids []int32, wlo, whi int32, base int64, offs []int64, inCore []bool) (int64, bool) {
	h := base
	type side struct {
		fixed []int32 // positions in ids of core items live on this side
		free  []int32 // positions of the items wholly on this side
	}
	var before, after side
	for k, i := range ids {
		it := &p.items[i]
		if inCore[k] {
			h = max(h, offs[k]+it.size)
			if it.lo < wlo {
				before.fixed = append(before.fixed, int32(k))
			}
			if it.hi > whi {
				after.fixed = append(after.fixed, int32(k))
			}
			continue
		}
		if it.fixed >= 0 {
			return 0, false
		}
		if it.hi <= wlo {
			before.free = append(before.free, int32(k))
		} else {
			after.free = append(after.free, int32(k))
		}
	}
	// Sweep time: sections after the window count up from whi, those
	// before it down from wlo.
	at := func(back bool, s int32) int32 {
		if back {
			return wlo - s
		}
		return s - whi
	}
	for _, sd := range []struct {
		side
		back bool
	}{{before, true}, {after, false}} {
		h = max(h, p.sweepSide(ids, sd.fixed, sd.free, base, offs, func(i int32) (int32, int32) {
			it := &p.items[i]
			if sd.back {
				return at(true, it.hi), at(true, it.lo)
			}
			return at(false, it.lo), at(false, it.hi)
		}))
	}
	return h, true
}

// sweepSide runs one side's sweep: fixed (in place from time 0) and free
// items, positions in ids, with times from span (sweep time: allocated at
// the first, freed at the second; negative for fixed items that were live
// before the side began). It returns the highest top it placed.
func (p *problem) sweepSide(ids []int32, fixed, free []int32, base int64, offs []int64, span func(i int32) (int32, int32)) int64 {
	if len(free) == 0 {
		return base
	}
	// Buckets by sweep time: allocations (largest first, then longest
	// lived, then by position) and frees.
	var width int32
	for _, k := range free {
		_, e := span(ids[k])
		width = max(width, e)
	}
	allocAt := make([]int32, width+2)
	freeAt := make([]int32, width+2)
	for _, k := range free {
		s, e := span(ids[k])
		allocAt[s+1]++
		freeAt[e+1]++
	}
	for _, k := range fixed {
		if _, e := span(ids[k]); e <= width {
			freeAt[e+1]++
		}
	}
	for t := range width + 1 {
		allocAt[t+1] += allocAt[t]
		freeAt[t+1] += freeAt[t]
	}
	allocs := make([]int32, len(free))
	frees := make([]int32, freeAt[width+1])
	fa, ff := slices.Clone(allocAt), slices.Clone(freeAt)
	for _, k := range free {
		s, e := span(ids[k])
		allocs[fa[s]] = k
		fa[s]++
		frees[ff[e]] = k
		ff[e]++
	}
	for _, k := range fixed {
		if _, e := span(ids[k]); e <= width {
			frees[ff[e]] = k
			ff[e]++
		}
	}
	life := func(k int32) int32 { s, e := span(ids[k]); return e - s }
	// The fixed items in place: the gaps between them, from base up.
	fl := newFreeList()
	sort := slices.Clone(fixed)
	slices.SortFunc(sort, func(a, b int32) int { return cmp.Compare(offs[a], offs[b]) })
	free0 := base
	for _, k := range sort {
		if offs[k] > free0 {
			fl.insert(memRange{free0, offs[k]})
		}
		free0 = max(free0, offs[k]+p.items[ids[k]].size)
	}
	fl.top = free0
	top := base
	for t := range width + 1 {
		for _, k := range frees[freeAt[t]:freeAt[t+1]] {
			fl.free(offs[k], offs[k]+p.items[ids[k]].size)
		}
		bucket := allocs[allocAt[t]:allocAt[t+1]]
		slices.SortFunc(bucket, func(a, b int32) int {
			ia, ib := &p.items[ids[a]], &p.items[ids[b]]
			if c := cmp.Compare(ib.size, ia.size); c != 0 {
				return c
			}
			if c := cmp.Compare(life(b), life(a)); c != 0 {
				return c
			}
			return cmp.Compare(a, b)
		})
		for _, k := range bucket {
			it := &p.items[ids[k]]
			// Units never reach lifetime.MaxSize here: the items' sizes
			// and offsets came from a valid trace.
			off, _ := fl.alloc(it.size, func(from int64) int64 { return alignUp(from, it.align) })
			offs[k] = off
			top = max(top, off+it.size)
		}
	}
	return top
}

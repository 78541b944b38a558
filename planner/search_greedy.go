package planner

import (
	"cmp"
	"slices"
)

// Greedy placement over a leaf's conflict lists: buffers in a given order,
// each at the lowest offset where it fits (first fit) or in the smallest
// hole that holds it (best fit), among the already placed buffers it
// conflicts with. Fixed buffers are placed first.

type span struct{ lo, hi int64 }

type greedyRule int

const (
	firstFit greedyRule = iota
	bestFit
)

// greedy places the leaf in the order of rank (lowest rank first) and
// returns the offsets and the height (the highest top, at least base).
func (d *leafData) greedy(rank []int32, rule greedyRule, offs []int64, scratch []span) (int64, []span) {
	order := make([]int32, d.k)
	for j, r := range rank {
		order[r] = int32(j)
	}
	placed := make([]bool, d.k)
	top := d.base
	for j := range d.k {
		if d.fixed[j] >= 0 {
			offs[j] = d.fixed[j]
			placed[j] = true
			top = max(top, offs[j]+d.size[j])
		}
	}
	for _, j := range order {
		if placed[j] {
			continue
		}
		scratch = scratch[:0]
		for _, o := range d.adj[d.adjAt[j]:d.adjAt[j+1]] {
			if placed[o] {
				scratch = append(scratch, span{offs[o], offs[o] + d.size[o]})
			}
		}
		offs[j] = fitIn(scratch, d.base, d.size[j], d.align[j], rule)
		placed[j] = true
		top = max(top, offs[j]+d.size[j])
	}
	return top, scratch
}

// fitIn returns an offset >= base, aligned, for a block of size that
// overlaps none of used (sorted here).
func fitIn(used []span, base, size, align int64, rule greedyRule) int64 {
	slices.SortFunc(used, func(a, b span) int { return cmp.Compare(a.lo, b.lo) })
	free := base
	best, bestLen := int64(-1), int64(0)
	for _, u := range used {
		if u.lo > free {
			if p := alignUp(free, align); p+size <= u.lo {
				if rule == firstFit {
					return p
				}
				if l := u.lo - free; best < 0 || l < bestLen {
					best, bestLen = p, l
				}
			}
		}
		free = max(free, u.hi)
	}
	if best >= 0 {
		return best
	}
	return alignUp(free, align)
}

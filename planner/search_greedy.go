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
func (d *leafData) greedy(rank []int32, rule greedyRule, offs []int64, scratch []span, stop func() bool) (int64, []span) {
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
	for x, j := range order {
		if placed[j] {
			continue
		}
		if x&255 == 255 && stop != nil && stop() {
			return -1, scratch
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

// skyline is the exact search's first path without its pruning: again and
// again it places the unplaced buffer with the lowest feasible offset
// (ties: lowest rank) at that offset. Every unplaced buffer's lowest
// offset is above all placed buffers it conflicts with, so any choice is
// valid. It returns -1 for leaves with fixed buffers (which may float
// above others and break that invariant).
func (d *leafData) skyline(rank []int32, offs []int64, stop func() bool) int64 {
	for j := range d.k {
		if d.fixed[j] >= 0 {
			return -1
		}
	}
	minOff := make([]int64, d.k)
	placed := make([]bool, d.k)
	h := make(skyHeap, 0, 2*d.k)
	for j := range d.k {
		minOff[j] = alignUp(d.base, d.align[j])
		h = append(h, skyEntry{minOff[j], rank[j], int32(j)})
	}
	h.init()
	top := d.base
	for n := 0; len(h) > 0; n++ {
		if n&255 == 255 && stop != nil && stop() {
			return -1
		}
		e := h.pop()
		j := e.j
		if placed[j] || e.off != minOff[j] {
			continue
		}
		placed[j] = true
		offs[j] = e.off
		t := e.off + d.size[j]
		top = max(top, t)
		for _, u := range d.adj[d.adjAt[j]:d.adjAt[j+1]] {
			if !placed[u] && minOff[u] < t {
				minOff[u] = alignUp(t, d.align[u])
				h.push(skyEntry{minOff[u], rank[u], u})
			}
		}
	}
	return top
}

type skyEntry struct {
	off  int64
	rank int32
	j    int32
}

// skyHeap is a binary min-heap by (off, rank).
type skyHeap []skyEntry

func (h skyHeap) less(a, b int) bool {
	return h[a].off < h[b].off || h[a].off == h[b].off && h[a].rank < h[b].rank
}

func (h skyHeap) init() {
	for i := len(h)/2 - 1; i >= 0; i-- {
		h.down(i)
	}
}

func (h *skyHeap) push(e skyEntry) {
	*h = append(*h, e)
	s := *h
	i := len(s) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !s.less(i, p) {
			break
		}
		s[i], s[p] = s[p], s[i]
		i = p
	}
}

func (h *skyHeap) pop() skyEntry {
	s := *h
	e := s[0]
	n := len(s) - 1
	s[0] = s[n]
	*h = s[:n]
	if n > 0 {
		(*h).down(0)
	}
	return e
}

func (h skyHeap) down(i int) {
	n := len(h)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && h.less(r, l) {
			m = r
		}
		if !h.less(m, i) {
			return
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
}

package planner

import (
	"cmp"
	"math"
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
// returns the offsets and the height (the highest top, at least base);
// -1 once the height reaches cut (a plan at least that high loses to
// one found already) or stop says so.
func (d *leafData) greedy(rank []int32, rule greedyRule, offs []int64, scratch []span, cut int64, stop func() bool) (int64, []span) {
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
		if top = max(top, offs[j]+d.size[j]); top >= cut {
			return -1, scratch
		}
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
// above others and break that invariant), and as greedy does for cut
// and stop.
func (d *leafData) skyline(rank []int32, offs []int64, cut int64, stop func() bool) int64 {
	for j := range d.k {
		if d.fixed[j] >= 0 {
			return -1
		}
	}
	minOff := make([]int64, d.k)
	placed := make([]bool, d.k)
	// One entry per unplaced buffer, keyed by a lowest offset that may be
	// out of date (too low): raising a buffer does not touch the heap; a
	// stale entry that comes to the top is re-keyed in place. An entry
	// whose key is current is the least (offset, rank) of all, as every
	// true key is at least its entry's.
	h := make(skyHeap, d.k)
	for j := range d.k {
		minOff[j] = alignUp(d.base, d.align[j])
		h[j] = skyEntry{minOff[j], rank[j], int32(j)}
	}
	h.init()
	top := d.base
	// Buffers are placed at nondecreasing offsets, and those still to
	// place in a section are disjoint there: the height will be at least
	// the offset placed last plus the bytes left in any section.
	var left []int64
	if cut < math.MaxInt64 {
		left = slices.Clone(d.secLoad)
	}
	for n := 0; len(h) > 0; n++ {
		if n&255 == 255 && stop != nil && stop() {
			return -1
		}
		e := h[0]
		j := e.j
		if e.off != minOff[j] {
			h[0].off = minOff[j]
			h.down(0)
			continue
		}
		h.pop()
		placed[j] = true
		offs[j] = e.off
		t := e.off + d.size[j]
		if top = max(top, t); top >= cut {
			return -1
		}
		if left != nil {
			for s := d.lo[j]; s < d.hi[j]; s++ {
				left[s] -= d.size[j]
			}
			if len(h)&15 == 0 && len(left) > 0 && e.off+slices.Max(left) >= cut {
				return -1
			}
		}
		for _, u := range d.adj[d.adjAt[j]:d.adjAt[j+1]] {
			if !placed[u] && minOff[u] < t {
				minOff[u] = alignUp(t, d.align[u])
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

// wideSkyline is the skyline pass for problems too large for conflict
// lists. Placed in nondecreasing offset order, the buffers already placed
// in a section all lie below the last one's top, so a buffer's lowest
// offset is the highest such top over its sections: a range maximum.
// Lowest offsets only grow, so a heap with stale keys works: a popped
// buffer whose key is out of date goes back in with the true one. Long
// lived buffers go stale again and again (35M times for 62k buffers on
// iopddl/Y_1), which makes it slow on the largest traces; placing them
// early instead ruins the packing.
// Returns offsets in units (nil if quit, or if some buffer is fixed) and
// the height.
func (p *problem) wideSkyline(order preorder, slack int64, quit func() bool) ([]int64, int64) {
	n := len(p.items)
	for i := range p.items {
		if p.items[i].fixed >= 0 {
			return nil, 0
		}
	}
	rank := p.rankAll(order)
	floor := newChmaxTree(max(p.nsec, 1))
	offs := make([]int64, n)
	h := make(skyHeap, n)
	for i := range p.items {
		h[i] = skyEntry{0, rank[i], int32(i)}
	}
	h.init()
	var top int64
	for k := 0; len(h) > 0; k++ {
		if k&4095 == 4095 && quit != nil && quit() {
			return nil, 0
		}
		e := h.pop()
		it := &p.items[e.j]
		o := alignUp(floor.max(int(it.lo), int(it.hi)), it.align)
		if o > e.off {
			// Back in, slack later than its true key: a buffer
			// placed later than the strict order would is still placed
			// at its own lowest offset, so this costs little height and
			// saves most of the re-evaluations of long-lived buffers.
			h.push(skyEntry{o + slack, e.rank, e.j})
			continue
		}
		offs[e.j] = o
		floor.chmax(int(it.lo), int(it.hi), o+it.size)
		top = max(top, o+it.size)
	}
	return offs, top
}

// rankAll ranks every item of the problem by a preorder (see rankItems).
func (p *problem) rankAll(order preorder) []int32 {
	load := newMaxTree(p.load)
	type keyed struct {
		i int32
		k [4]int64
	}
	ks := make([]keyed, len(p.items))
	for i := range p.items {
		it := &p.items[i]
		ks[i].i = int32(i)
		w := p.times[it.hi] - p.times[it.lo]
		for x := 0; x < len(order) && x < 4; x++ {
			var v int64
			switch order[x] {
			case 'W':
				v = w
			case 'A':
				v = w * it.size
			case 'T':
				v = load.max(int(it.lo), int(it.hi))
			case 'Z':
				v = it.size
			case 'L':
				if 2*(it.hi-it.lo) >= int32(p.nsec) {
					v = 1
				}
			}
			ks[i].k[x] = v
		}
	}
	slices.SortFunc(ks, func(a, b keyed) int {
		for x := 0; x < len(order) && x < 4; x++ {
			if c := cmp.Compare(b.k[x], a.k[x]); c != 0 {
				return c
			}
		}
		return cmp.Compare(a.i, b.i)
	})
	rank := make([]int32, len(p.items))
	for r, k := range ks {
		rank[k.i] = int32(r)
	}
	return rank
}

// chmaxTree is a segment tree over sections: raise a range to at least a
// value, and read the maximum of a range. Bottom up, without recursion:
// tag[x] is a value raised over all of x's range, mx[x] the maximum of
// x's range; both only grow.
type chmaxTree struct {
	n       int // leaves, a power of two
	mx, tag []int64
}

func newChmaxTree(n int) *chmaxTree {
	size := 1
	for size < n {
		size *= 2
	}
	return &chmaxTree{n: size, mx: make([]int64, 2*size), tag: make([]int64, 2*size)}
}

func (t *chmaxTree) chmax(lo, hi int, v int64) {
	if lo >= hi {
		return
	}
	l, r := lo+t.n, hi+t.n
	for l < r {
		if l&1 == 1 {
			t.tag[l] = max(t.tag[l], v)
			t.mx[l] = max(t.mx[l], v)
			l++
		}
		if r&1 == 1 {
			r--
			t.tag[r] = max(t.tag[r], v)
			t.mx[r] = max(t.mx[r], v)
		}
		l >>= 1
		r >>= 1
	}
	// Every node above a raised one lies on the path from lo's or
	// (hi-1)'s leaf to the root.
	for x := (lo + t.n) >> 1; x > 0; x >>= 1 {
		t.mx[x] = max(t.mx[x], v)
	}
	for x := (hi - 1 + t.n) >> 1; x > 0; x >>= 1 {
		t.mx[x] = max(t.mx[x], v)
	}
}

// max returns the largest value in [lo, hi): the maxima of the nodes that
// tile the range, and the tags of their ancestors, which all lie on the
// paths from lo's and (hi-1)'s leaves to the root.
func (t *chmaxTree) max(lo, hi int) int64 {
	if lo >= hi {
		return 0
	}
	var res int64
	l, r := lo+t.n, hi+t.n
	for l < r {
		if l&1 == 1 {
			res = max(res, t.mx[l])
			l++
		}
		if r&1 == 1 {
			r--
			res = max(res, t.mx[r])
		}
		l >>= 1
		r >>= 1
	}
	for x := (lo + t.n) >> 1; x > 0; x >>= 1 {
		res = max(res, t.tag[x])
	}
	for x := (hi - 1 + t.n) >> 1; x > 0; x >>= 1 {
		res = max(res, t.tag[x])
	}
	return res
}

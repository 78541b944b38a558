package planner

import (
	"cmp"
	"slices"
	"sync/atomic"
)

// This file is the exact search: a depth-first search for a packing of one
// leaf under a given capacity, in the manner of MiniMalloc (Moffitt,
// ASPLOS 2023), written from the paper's ideas:
//
//   - Canonical placements only: every buffer goes to its lowest feasible
//     offset given the buffers already placed (on top of one of them, or at
//     the floor), and buffers are placed in nondecreasing (offset, rank)
//     order, so each packing is reached along one path only.
//   - Dominance: a buffer whose lowest offset is at or above the top of some
//     other unplaced buffer at its own lowest offset would leave a hole that
//     buffer fits in; skip it.
//   - Section inference: in every section (time interval between events)
//     the unplaced bytes must fit between the section's floor (the top of
//     what is placed there, and never below the current offset) and the
//     capacity.
//   - Hatless pruning: if a placed buffer conflicts with no unplaced one and
//     its subtree fails, its siblings fail too.
//   - Dynamic decomposition: when no unplaced buffer crosses a section
//     boundary any more, the two sides are solved independently.

// leafData is a leaf in the flat form the searches use: local indices
// 0..k-1, sections relative to the leaf, and conflict lists.
type leafData struct {
	k, nsec      int
	ids          []int32 // local index → problem item index
	lo, hi       []int32
	size, align  []int64
	fixed        []int64 // -1 if none
	start, end   []int64 // lifetimes in trace time, for orderings
	adjAt, adj   []int32 // conflicts of i: adj[adjAt[i]:adjAt[i+1]]
	base         int64
	lb           int64 // base + peak section load
	secLoad      []int64
	pairs        int64
	secAt, secIt []int32 // items live in section s: secIt[secAt[s]:secAt[s+1]]
	secPosAt     []int32 // the position of item j in section s is kept at secPosAt[j]+s-lo[j]
	align1       bool    // no item needs an offset alignment
	anyFixed     bool    // some item has a fixed offset
}

// maxPairs bounds the conflict lists a leaf may build (memory and time);
// larger leaves are left to the scalable greedy.
const maxPairs = 20_000_000

// countPairs returns the number of conflicting pairs of a leaf without
// building the lists.
func countPairs(p *problem, l *leaf) int64 {
	w := int(l.hi - l.lo)
	live := make([]int64, w+1)
	starts := make([]int64, w+1)
	for _, i := range l.items {
		it := &p.items[i]
		live[it.lo-l.lo]++
		live[it.hi-l.lo]--
		starts[it.lo-l.lo]++
	}
	var run, pairs int64
	for s := range w {
		run += live[s]
		k := starts[s]
		pairs += (run-k)*k + k*(k-1)/2
	}
	return pairs
}

func newLeafData(p *problem, l *leaf, times []int64) *leafData {
	k := len(l.items)
	d := &leafData{k: k, nsec: int(l.hi - l.lo), base: l.base, lb: l.lb}
	d.ids = l.items
	d.lo = make([]int32, k)
	d.hi = make([]int32, k)
	d.size = make([]int64, k)
	d.align = make([]int64, k)
	d.fixed = make([]int64, k)
	d.start = make([]int64, k)
	d.end = make([]int64, k)
	for j, i := range l.items {
		it := &p.items[i]
		d.lo[j] = max(it.lo, l.lo) - l.lo
		d.hi[j] = min(it.hi, l.hi) - l.lo
		d.size[j] = it.size
		d.align[j] = it.align
		d.fixed[j] = it.fixed
		d.start[j] = times[it.lo]
		d.end[j] = times[it.hi]
	}
	// Items per section (CSR), then conflicts by a sweep over sections:
	// an item conflicts with every item live in its first section.
	d.secAt = make([]int32, d.nsec+1)
	for j := range k {
		for s := d.lo[j]; s < d.hi[j]; s++ {
			d.secAt[s+1]++
		}
	}
	for s := range d.nsec {
		d.secAt[s+1] += d.secAt[s]
	}
	d.secIt = make([]int32, d.secAt[d.nsec])
	fill := slices.Clone(d.secAt[:d.nsec])
	for j := range k {
		for s := d.lo[j]; s < d.hi[j]; s++ {
			d.secIt[fill[s]] = int32(j)
			fill[s]++
		}
	}
	d.align1 = true
	for j := range k {
		d.align1 = d.align1 && d.align[j] == 1
		d.anyFixed = d.anyFixed || d.fixed[j] >= 0
	}
	d.secPosAt = make([]int32, k+1)
	for j := range k {
		d.secPosAt[j+1] = d.secPosAt[j] + d.hi[j] - d.lo[j]
	}
	d.secLoad = make([]int64, d.nsec)
	for s := range d.nsec {
		for _, j := range d.secIt[d.secAt[s]:d.secAt[s+1]] {
			d.secLoad[s] += d.size[j]
		}
	}
	// Degrees by counting, then one sweep to fill, so that no list of
	// pairs is held twice. Items i and j conflict when they share a
	// section: lo[i] < hi[j] and lo[j] < hi[i]. Of the items with
	// lo < hi[j], those that do not conflict with j are those with
	// hi <= lo[j], and j itself is one of the rest.
	deg := make([]int32, k+1)
	loBelow := make([]int32, d.nsec+1)  // loBelow[s]: items with lo < s
	hiAtMost := make([]int32, d.nsec+1) // hiAtMost[s]: items with hi <= s
	for j := range k {
		if d.lo[j] < d.hi[j] {
			loBelow[d.lo[j]+1]++
			hiAtMost[d.hi[j]]++
		}
	}
	for s := range d.nsec {
		loBelow[s+1] += loBelow[s]
		hiAtMost[s+1] += hiAtMost[s]
	}
	for j := range k {
		if d.lo[j] < d.hi[j] {
			deg[j+1] = loBelow[d.hi[j]] - hiAtMost[d.lo[j]] - 1
		}
	}
	sweep := func(emit func(a, b int32)) {
		for s := range d.nsec {
			live := d.secIt[d.secAt[s]:d.secAt[s+1]]
			for x, a := range live {
				if d.lo[a] != int32(s) {
					continue
				}
				for y, b := range live {
					if b == a || (d.lo[b] == int32(s) && y < x) {
						continue
					}
					emit(a, b)
				}
			}
		}
	}
	for j := range k {
		deg[j+1] += deg[j]
	}
	d.pairs = int64(deg[k]) / 2
	d.adjAt = deg
	d.adj = make([]int32, deg[k])
	fill = slices.Clone(deg[:k])
	sweep(func(a, b int32) {
		d.adj[fill[a]] = b
		fill[a]++
		d.adj[fill[b]] = a
		fill[b]++
	})
	return d
}

// Preorder keys, MiniMalloc's letters: W width (lifetime length), A area
// (size × width), T total (the largest section load the buffer sees),
// Z size, O overlaps (conflict count). Larger first; ties by index.
type preorder string

func (d *leafData) rank(order preorder) []int32 {
	all := make([]int32, d.k)
	for j := range all {
		all[j] = int32(j)
	}
	rank := make([]int32, d.k)
	d.rankItems(order, all, d.secLoad, rank)
	return rank
}

// rankItems sets rank[j] for the given items to their position (0, 1, ...)
// in the preorder, where 'T' reads the section loads tot. It reorders
// items.
func (d *leafData) rankItems(order preorder, items []int32, tot []int64, rank []int32) {
	d.rankItemsBuf(order, items, tot, rank, nil)
}

// rankKey is an item with its preorder keys.
type rankKey struct {
	j int32
	k [4]int64
}

// rankItemsBuf is rankItems sorting in buf (grown as needed), which it
// returns for the next call.
func (d *leafData) rankItemsBuf(order preorder, items []int32, tot []int64, rank []int32, buf []rankKey) []rankKey {
	ks := slices.Grow(buf[:0], len(items))[:len(items)]
	for x, j := range items {
		ks[x] = rankKey{j: j}
	}
	// Key by key, each a loop of its own: this runs at every partition
	// of the exact search. Keys past the preorder's stay 0 and tie.
	for i := 0; i < len(order) && i < 4; i++ {
		switch order[i] {
		case 'W':
			for x := range ks {
				j := ks[x].j
				ks[x].k[i] = d.end[j] - d.start[j]
			}
		case 'A':
			for x := range ks {
				j := ks[x].j
				ks[x].k[i] = (d.end[j] - d.start[j]) * d.size[j] // sizes and times here stay far below 2^63 for real traces
			}
		case 'T':
			for x := range ks {
				j := ks[x].j
				var t int64
				for _, v := range tot[d.lo[j]:d.hi[j]] {
					t = max(t, v)
				}
				ks[x].k[i] = t
			}
		case 'Z':
			for x := range ks {
				ks[x].k[i] = d.size[ks[x].j]
			}
		case 'O':
			for x := range ks {
				j := ks[x].j
				ks[x].k[i] = int64(d.adjAt[j+1] - d.adjAt[j])
			}
		case 'S':
			for x := range ks {
				ks[x].k[i] = -d.start[ks[x].j]
			}
		case 'L': // long-lived: half the leaf's time or more
			for x := range ks {
				j := ks[x].j
				if 2*(d.hi[j]-d.lo[j]) >= int32(d.nsec) {
					ks[x].k[i] = 1
				}
			}
		}
	}
	slices.SortFunc(ks, func(a, b rankKey) int {
		// Larger keys first, then the lower index.
		switch {
		case a.k[0] != b.k[0]:
			return cmp.Compare(b.k[0], a.k[0])
		case a.k[1] != b.k[1]:
			return cmp.Compare(b.k[1], a.k[1])
		case a.k[2] != b.k[2]:
			return cmp.Compare(b.k[2], a.k[2])
		case a.k[3] != b.k[3]:
			return cmp.Compare(b.k[3], a.k[3])
		}
		return cmp.Compare(a.j, b.j)
	})
	for r, x := range ks {
		items[r] = x.j
		rank[x.j] = int32(r)
	}
	return ks
}

// Search outcomes.
const (
	found = iota
	notFound
	aborted
)

// dfs is one exact search of one leaf at one capacity. Not safe for
// concurrent use; every worker has its own.
type dfs struct {
	d      *leafData
	cap    int64
	order  preorder
	static bool    // rank once, not afresh in every partition
	rank   []int32 // position in the preorder of the item's partition
	off    []int64 // -1: unplaced
	minOff []int64
	sol    []int64
	tot    []int64 // unplaced bytes per section
	floor  []int64 // per section: nothing unplaced can go below it
	// Per section, its unplaced items first: secList[secAt[s]:secAt[s]+secN[s]].
	secList []int32
	secN    []int32
	secPos  []int32 // see leafData.secPosAt
	cuts    []int32 // cuts[s]: unplaced items live in both s and s+1
	pos     []int32 // position of an item in its partition's list

	nodes, limit int64
	stop, stop2  *atomic.Bool // either set: abort
	// park, if set, is called where the node limit would abort the
	// search: true when it may go on (under a larger limit).
	park func() bool

	offUndo   []undo
	floorUndo []undo
	cand      []int32

	// Scratch kept across nodes: the preorder keys, the ranks a partition
	// restores (a stack), the items of the parts and the cut points of
	// searchParts (stacks too).
	keys    []rankKey
	saved   []undo
	partBuf []int32
	cutBuf  []int32
}

type undo struct {
	i int32
	v int64
}

// partition is a set of items over a section range that is solved
// independently; items[:n] are the unplaced ones.
type partition struct {
	lo, hi int32
	items  []int32
	n      int
}

func newDFS(d *leafData, capacity int64, order preorder, limit int64, stop *atomic.Bool) *dfs {
	s := &dfs{d: d}
	s.reset(capacity, order, limit, stop)
	s.rank = make([]int32, d.k)
	s.off = make([]int64, d.k)
	s.minOff = make([]int64, d.k)
	s.sol = make([]int64, d.k)
	s.pos = make([]int32, d.k)
	for j := range d.k {
		s.off[j] = -1
		s.minOff[j] = alignUp(d.base, d.align[j])
		if d.fixed[j] >= 0 {
			s.minOff[j] = max(s.minOff[j], d.fixed[j])
		}
	}
	s.tot = slices.Clone(d.secLoad)
	// Along one path the undo stacks grow by the sections and conflicts of
	// every placed item: size them once rather than by doubling.
	s.floorUndo = make([]undo, 0, int(d.secPosAt[d.k])+d.nsec)
	s.offUndo = make([]undo, 0, min(int64(8*d.k)+int64(len(d.adj))/4, 1<<26))
	s.secList = slices.Clone(d.secIt)
	s.secN = make([]int32, d.nsec)
	s.secPos = make([]int32, d.secPosAt[d.k])
	for sec := range d.nsec {
		s.secN[sec] = d.secAt[sec+1] - d.secAt[sec]
		for x := d.secAt[sec]; x < d.secAt[sec+1]; x++ {
			j := d.secIt[x]
			s.secPos[d.secPosAt[j]+int32(sec)-d.lo[j]] = x
		}
	}
	s.floor = make([]int64, d.nsec)
	for i := range s.floor {
		s.floor[i] = d.base
	}
	s.cuts = make([]int32, max(d.nsec-1, 0))
	diff := make([]int32, d.nsec+1)
	for j := range d.k {
		if d.hi[j]-d.lo[j] > 1 {
			diff[d.lo[j]]++
			diff[d.hi[j]-1]--
		}
	}
	var run int32
	for i := range s.cuts {
		run += diff[i]
		s.cuts[i] = run
	}
	return s
}

// reset readies s for another search of its leaf, as newDFS would make
// it, without allocating: a search undoes every change it makes (only the
// order of the items within secList's sections differs, which no outcome
// depends on) and s.sol is overwritten item by item.
func (s *dfs) reset(capacity int64, order preorder, limit int64, stop *atomic.Bool) {
	s.cap, s.order, s.limit, s.stop = capacity, order, limit, stop
	s.static, s.stop2, s.nodes = false, nil, 0
	if len(order) > 0 && order[0] == 's' {
		s.static, s.order = true, order[1:]
	}
}

func alignUp(v, a int64) int64 {
	if a <= 1 {
		return v
	}
	return (v + a - 1) / a * a
}

// solve searches the whole leaf; on found, s.sol holds the offsets.
func (s *dfs) solve() int {
	for j := range s.d.k {
		if s.d.fixed[j] >= 0 && s.minOff[j] > s.d.fixed[j] {
			return notFound
		}
		if s.minOff[j]+s.d.size[j] > s.cap {
			return notFound
		}
	}
	for sec := range s.d.nsec {
		if s.d.base+s.d.secLoad[sec] > s.cap {
			return notFound
		}
	}
	all := make([]int32, s.d.k)
	for j := range all {
		all[j] = int32(j)
	}
	return s.subSolve(all, 0, int32(s.d.nsec))
}

// subSolve searches a partition on its own. Like MiniMalloc it ranks the
// partition's items afresh, with 'T' reading the bytes still unplaced.
func (s *dfs) subSolve(items []int32, lo, hi int32) int {
	if s.static && s.nodes > 0 {
		p := &partition{lo: lo, hi: hi, items: items, n: len(items)}
		for x, j := range items {
			s.pos[j] = int32(x)
		}
		return s.search(p, -1, -1)
	}
	mark := len(s.saved)
	for _, j := range items {
		s.saved = append(s.saved, undo{j, int64(s.rank[j])})
	}
	s.keys = s.d.rankItemsBuf(s.order, items, s.tot, s.rank, s.keys)
	p := &partition{lo: lo, hi: hi, items: items, n: len(items)}
	for x, j := range items {
		s.pos[j] = int32(x)
	}
	st := s.search(p, -1, -1)
	for _, u := range s.saved[mark:] {
		s.rank[u.i] = int32(u.v)
	}
	s.saved = s.saved[:mark]
	return st
}

func (s *dfs) remove(p *partition, j int32) {
	x := s.pos[j]
	last := int32(p.n - 1)
	o := p.items[last]
	p.items[x], p.items[last] = o, j
	s.pos[o], s.pos[j] = x, last
	p.n--
}

// restore undoes the last remove on p: the item removed sits right
// behind the unplaced ones.
func (s *dfs) restore(p *partition) { p.n++ }

func (s *dfs) search(p *partition, lastOff int64, lastRank int32) int {
	s.nodes++
	if s.stop != nil && s.stop.Load() || s.stop2 != nil && s.stop2.Load() {
		return aborted
	}
	if s.nodes > s.limit && (s.park == nil || !s.park()) {
		return aborted
	}
	if p.n == 0 {
		return found
	}
	// The first candidate, the least by (lowest offset, rank), is found
	// in one scan and placed at once: usually it succeeds, and the other
	// candidates are listed only when it fails. Ranks are distinct within
	// a partition, so the order of the candidates is the one a full list
	// sorted by (offset, rank) would give.
	d := s.d
	minHeight := int64(1) << 62
	first := int32(-1)
	fo, fr := int64(1)<<62, int32(0)
	if !d.anyFixed {
		for _, j := range p.items[:p.n] {
			o := s.minOff[j]
			minHeight = min(minHeight, o+d.size[j])
			if o > fo || o < lastOff {
				continue
			}
			if r := s.rank[j]; (o > lastOff || r >= lastRank) && (o < fo || r < fr) {
				first, fo, fr = j, o, r
			}
		}
	} else {
		for _, j := range p.items[:p.n] {
			o := s.minOff[j]
			if d.fixed[j] < 0 {
				// Dominance counts only movable items: a fixed one
				// cannot drop into the hole below.
				minHeight = min(minHeight, o+d.size[j])
			} else if o != d.fixed[j] {
				continue
			}
			if o > fo || o < lastOff {
				continue
			}
			if r := s.rank[j]; (o > lastOff || r >= lastRank) && (o < fo || r < fr) {
				first, fo, fr = j, o, r
			}
		}
	}
	base := len(s.cand)
	switch {
	case first < 0:
		return notFound
	case fo >= minHeight && d.fixed[first] < 0:
		// Dominated: so is every movable candidate, all at or above it.
		if !d.anyFixed {
			return notFound
		}
		first = -1
	default:
		st, hatless := s.place(p, first, lastOff)
		if st != notFound || hatless {
			return st
		}
	}
	if !d.anyFixed {
		for _, j := range p.items[:p.n] {
			o := s.minOff[j]
			if o >= minHeight || o < lastOff || (o == lastOff && s.rank[j] < lastRank) || j == first {
				continue
			}
			s.cand = append(s.cand, j)
		}
		return s.tryCands(p, base, lastOff)
	}
	for _, j := range p.items[:p.n] {
		o := s.minOff[j]
		if o >= minHeight && d.fixed[j] < 0 {
			continue
		}
		if o < lastOff || (o == lastOff && s.rank[j] < lastRank) {
			continue
		}
		if d.fixed[j] >= 0 && o != d.fixed[j] || j == first {
			continue
		}
		s.cand = append(s.cand, j)
	}
	return s.tryCands(p, base, lastOff)
}

// tryCands places the candidates s.cand[base:] in (lowest offset, rank)
// order until one succeeds, and drops them.
func (s *dfs) tryCands(p *partition, base int, lastOff int64) int {
	n := len(s.cand) - base
	status := notFound
	for x := range n {
		// Selection by (lowest offset, rank), one at a time: usually the
		// first candidate succeeds, and the lists can be long.
		cands := s.cand[base+x : base+n]
		bi := 0
		for y := 1; y < len(cands); y++ {
			b, c := cands[bi], cands[y]
			if s.minOff[c] < s.minOff[b] || s.minOff[c] == s.minOff[b] && s.rank[c] < s.rank[b] {
				bi = y
			}
		}
		cands[0], cands[bi] = cands[bi], cands[0]
		st, hatless := s.place(p, s.cand[base+x], lastOff)
		if st != notFound {
			status = st
			break
		}
		if hatless {
			break
		}
	}
	s.cand = s.cand[:base]
	return status
}

// place puts c at its lowest offset, searches on, and undoes the change.
func (s *dfs) place(p *partition, c int32, lastOff int64) (status int, hatless bool) {
	d := s.d
	o := s.minOff[c]
	top := o + d.size[c]
	// Cheap refusals first, before anything changes: the bytes left in
	// c's sections must fit above it.
	for sec := d.lo[c]; sec < d.hi[c]; sec++ {
		if top+s.tot[sec]-d.size[c] > s.cap {
			return notFound, false
		}
	}
	s.off[c] = o
	s.sol[c] = o
	s.remove(p, c)
	offMark, floorMark := len(s.offUndo), len(s.floorUndo)
	ok := true
	hatless = true
	// Every item whose lowest offset rises conflicts with c, so the
	// sections they cover form one interval around c's.
	tlo, thi := d.lo[c], d.hi[c]
	for _, j := range d.adj[d.adjAt[c]:d.adjAt[c+1]] {
		if s.off[j] >= 0 {
			continue
		}
		hatless = false
		if s.minOff[j] >= top {
			continue
		}
		s.offUndo = append(s.offUndo, undo{j, s.minOff[j]})
		m := alignUp(top, d.align[j])
		s.minOff[j] = m
		tlo, thi = min(tlo, d.lo[j]), max(thi, d.hi[j])
		if (d.fixed[j] >= 0 && m > d.fixed[j]) || m+d.size[j] > s.cap {
			ok = false
			break
		}
	}
	lo, hi := d.lo[c], d.hi[c]
	pc := d.secPosAt[c] - lo
	for sec := lo; sec < hi; sec++ {
		// Move c behind the unplaced items of the section.
		x := s.secPos[pc+sec]
		last := d.secAt[sec] + s.secN[sec] - 1
		o := s.secList[last]
		s.secList[x], s.secList[last] = o, c
		s.secPos[d.secPosAt[o]+sec-d.lo[o]] = x
		s.secPos[pc+sec] = last
		s.secN[sec]--
		s.tot[sec] -= d.size[c]
		s.floorUndo = append(s.floorUndo, undo{sec, s.floor[sec]})
		s.floor[sec] = top
	}
	// Unallocated floors: below the lowest offset any unplaced item of a
	// section can take, that section's memory is lost.
	if ok {
		for sec := tlo; sec < thi; sec++ {
			// Outside c's sections, the lowest offset of a section's
			// unplaced items is either unchanged (no raised item lives
			// there) or at most top (a raised one does): if top fits
			// below what is left, the check cannot fail. floor only
			// serves to stop the scans early, so leaving it low is safe.
			if d.align1 && (sec < lo || sec >= hi) && top+s.tot[sec] <= s.cap {
				continue
			}
			m := int64(1) << 62
			f := s.floor[sec]
			for _, j := range s.secList[d.secAt[sec] : d.secAt[sec]+s.secN[sec]] {
				if mo := s.minOff[j]; mo < m {
					m = mo
					if m <= f {
						break
					}
				}
			}
			if m == 1<<62 || m <= f {
				continue
			}
			s.floorUndo = append(s.floorUndo, undo{sec, s.floor[sec]})
			s.floor[sec] = m
			if m+s.tot[sec] > s.cap {
				ok = false
				break
			}
		}
	}
	// The offset only grows along a path, so the bytes left anywhere in
	// the partition must fit above it; unchanged since the parent unless
	// the offset rose.
	if ok && o > lastOff {
		// A scan, not a range-maximum tree: the check runs at about one
		// node in three and stops at the first section that overflows,
		// while a tree costs two updates at every node.
		if p.lo >= p.hi {
			ok = o <= s.cap
		}
		for _, t := range s.tot[p.lo:p.hi] {
			if o+t > s.cap {
				ok = false
				break
			}
		}
	}
	status = notFound
	if ok {
		status = s.decompose(p, c, o)
	}
	for sec := lo; sec < hi; sec++ {
		s.tot[sec] += d.size[c]
		s.secN[sec]++ // c sits right behind the unplaced items still
	}
	for x := len(s.floorUndo) - 1; x >= floorMark; x-- {
		s.floor[s.floorUndo[x].i] = s.floorUndo[x].v
	}
	s.floorUndo = s.floorUndo[:floorMark]
	for x := len(s.offUndo) - 1; x >= offMark; x-- {
		s.minOff[s.offUndo[x].i] = s.offUndo[x].v
	}
	s.offUndo = s.offUndo[:offMark]
	s.restore(p)
	s.off[c] = -1
	return status, hatless
}

// decompose lowers the cut counts c crossed; where one reaches zero the
// partition falls apart and each part is searched on its own.
func (s *dfs) decompose(p *partition, c int32, o int64) int {
	d := s.d
	lo, hi := d.lo[c], d.hi[c]
	split := false
	for sec := lo; sec+1 < hi; sec++ {
		s.cuts[sec]--
		if s.cuts[sec] == 0 && sec >= p.lo && sec+1 < p.hi {
			split = true
		}
	}
	var status int
	if !split {
		status = s.search(p, o, s.rank[c])
	} else {
		status = s.searchParts(p)
	}
	for sec := lo; sec+1 < hi; sec++ {
		s.cuts[sec]++
	}
	return status
}

func (s *dfs) searchParts(p *partition) int {
	// Cut points inside the partition's range, then the parts' items in
	// the partition's order, both on stacks kept across nodes (nested
	// calls push above them and may move them: index, never hold).
	cm, pm := len(s.cutBuf), len(s.partBuf)
	s.cutBuf = append(s.cutBuf, p.lo)
	for sec := p.lo; sec+1 < p.hi; sec++ {
		if s.cuts[sec] == 0 {
			s.cutBuf = append(s.cutBuf, sec+1)
		}
	}
	s.cutBuf = append(s.cutBuf, p.hi)
	nc := len(s.cutBuf) - cm
	// Part k's items go to partBuf[pm+at[k] : pm+at[k+1]], at kept behind
	// the cuts.
	for range nc {
		s.cutBuf = append(s.cutBuf, 0)
	}
	cuts, at := s.cutBuf[cm:cm+nc], s.cutBuf[cm+nc:cm+2*nc]
	for _, j := range p.items[:p.n] {
		// An unplaced item crosses no zero cut: it lies in one part.
		k, _ := slices.BinarySearch(cuts, s.d.lo[j]+1)
		at[k]++
	}
	for k := 1; k < nc; k++ {
		at[k] += at[k-1]
	}
	s.partBuf = slices.Grow(s.partBuf, p.n)[:pm+p.n]
	for _, j := range p.items[:p.n] {
		k, _ := slices.BinarySearch(cuts, s.d.lo[j]+1)
		s.partBuf[pm+int(at[k-1])] = j
		at[k-1]++
	}
	// at[k-1] is now where part k ends.
	status := found
	for k := 1; k < nc; k++ {
		var from int32
		if k > 1 {
			from = s.cutBuf[cm+nc+k-2]
		}
		to := s.cutBuf[cm+nc+k-1]
		if from == to {
			continue
		}
		part := s.partBuf[pm+int(from) : pm+int(to)]
		if st := s.subSolve(part, s.cutBuf[cm+k-1], s.cutBuf[cm+k]); st != found {
			status = st
			break
		}
	}
	s.cutBuf, s.partBuf = s.cutBuf[:cm], s.partBuf[:pm]
	// Restore the positions of the parent's items.
	for x, j := range p.items {
		s.pos[j] = int32(x)
	}
	return status
}

// parkedDFS is a search that waits at its node limit instead of giving
// up, on a goroutine of its own, so that a later job of the same search
// (leaf, capacity and preorder) under a larger limit goes on from there
// rather than searching the same nodes again: a search cut off by its
// node limit has searched exactly the first nodes of the same search
// under a larger one. Its node count is the whole search's, as if it had
// started afresh. Every parkedDFS must end with resume or drop.
type parkedDFS struct {
	s    *dfs
	wake chan int64 // a larger limit, or 0: give up
	out  chan int   // the outcome, or paused
}

// paused is a parkedDFS's outcome when it reached its node limit: it
// waits, and its search went as far as an aborted one.
const paused = -1

// startParked runs the search of d at capacity c in the preorder under
// limit until it ends or reaches the limit, and returns it with its
// outcome (paused at the limit).
func startParked(d *leafData, c int64, order preorder, limit int64, stop, stop2 *atomic.Bool) (*parkedDFS, int) {
	pk := &parkedDFS{s: newDFS(d, c, order, limit, stop), wake: make(chan int64), out: make(chan int)}
	pk.s.stop2 = stop2
	pk.s.park = func() bool {
		pk.out <- paused
		l := <-pk.wake
		if l <= pk.s.limit {
			return false
		}
		pk.s.limit = l
		return true
	}
	go func() { pk.out <- pk.s.solve() }()
	return pk, <-pk.out
}

// resume goes on with a paused search under a larger limit and the
// given stop flags, and returns its outcome (paused again at the limit).
func (pk *parkedDFS) resume(limit int64, stop, stop2 *atomic.Bool) int {
	// Set before the channel hands the search back: its goroutine sees them.
	pk.s.stop, pk.s.stop2 = stop, stop2
	pk.wake <- limit
	return <-pk.out
}

// drop ends a paused search and frees its goroutine.
func (pk *parkedDFS) drop() {
	pk.wake <- 0
	<-pk.out
}

// maxTree is a segment tree over sections for range maxima.
type maxTree struct {
	n  int
	mx []int64 // max over the node's range
}

func newMaxTree(v []int64) maxTree {
	n := max(len(v), 1)
	t := maxTree{n: n, mx: make([]int64, 4*n)}
	t.build(1, 0, n, v)
	return t
}

func (t *maxTree) build(node, l, r int, v []int64) {
	if r-l == 1 {
		if l < len(v) {
			t.mx[node] = v[l]
		}
		return
	}
	m := (l + r) / 2
	t.build(2*node, l, m, v)
	t.build(2*node+1, m, r, v)
	t.mx[node] = max(t.mx[2*node], t.mx[2*node+1])
}

func (t *maxTree) max(lo, hi int) int64 {
	if lo >= hi {
		return 0
	}
	return t.qry(1, 0, t.n, lo, hi)
}

func (t *maxTree) qry(node, l, r, lo, hi int) int64 {
	if lo <= l && r <= hi {
		return t.mx[node]
	}
	m := (l + r) / 2
	res := int64(-1) << 62
	if lo < m {
		res = max(res, t.qry(2*node, l, m, lo, hi))
	}
	if hi > m {
		res = max(res, t.qry(2*node+1, m, r, lo, hi))
	}
	return res
}

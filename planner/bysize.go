package planner

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sort"

	"github.com/arenaplan/arenaplan/lifetime"
)

// bysize is the TFLite/XLA greedy-by-size baseline: fixed buffers first,
// then the others largest first (ties: longer lifetime first, then ID);
// each goes into the smallest free memory gap left by the already placed
// buffers whose lifetimes overlap its own (lowest offset among equals), or
// above them all. Gaps are ignored: a buffer occupies its memory for its
// whole lifetime, which is always safe.
//
// The textbook version lists the overlapping placed buffers for every new
// one, which is quadratic (Σk = 3.6e8 overlaps on iopddl/Y_1). Here a
// segment tree over the T compressed time slots keeps, per node, two sets
// of disjoint memory spans, merged as they are inserted: cover, the memory
// of buffers whose lifetime spans the node's whole time range, and sub, the
// memory of every buffer whose lifetime meets the node's range. The memory
// in use during [s, e) is then the union of sub over the O(log T) nodes
// that tile [s, e) and cover over their O(log T) ancestors. Placing a
// buffer adds one memRange to O(log T) sets.
//
// Cost: O(n log n) to sort, then per buffer O(log T) set insertions of
// O(log m + m) each (binary search, then a slice splice) and one query of
// O(M log log T), a heap merge of the O(log T) sorted sets, where m is a
// set's size and M the number of merged spans the query visits. Merging keeps M far below the number of overlapping
// buffers on real traces (spans of buffers packed side by side fuse), but
// an adversarial trace with many holes can still make M, and so the whole,
// quadratic.
func init() { register(BySize, planBySize) }

func planBySize(ctx context.Context, t *lifetime.Trace, opt Options) (*Plan, error) {
	n := len(t.Buffers)
	req, err := requirements(t, opt.Align)
	if err != nil {
		return nil, err
	}
	if _, err := newFixedSet(t, req, opt.Align); err != nil {
		return nil, err
	}
	offsets := make([]int64, n)
	if n == 0 {
		return &Plan{Offsets: offsets}, nil
	}
	order := make([]int, 0, n)
	for i := range t.Buffers {
		if b := &t.Buffers[i]; b.HasFixed {
			offsets[i] = b.Fixed
			continue
		}
		order = append(order, i)
	}
	slices.SortFunc(order, func(x, y int) int {
		a, b := &t.Buffers[x], &t.Buffers[y]
		if c := cmp.Compare(req[y].size, req[x].size); c != 0 {
			return c
		}
		if c := cmp.Compare(b.End-b.Start, a.End-a.Start); c != 0 {
			return c
		}
		return cmp.Compare(x, y)
	})
	if n <= bySizeListed && !bySizeTreeAlways {
		return bySizeList(ctx, t, req, order, offsets)
	}
	tr := newTimeTree(t)
	for i := range t.Buffers {
		if b := &t.Buffers[i]; b.HasFixed {
			tr.insert(b.Start, b.End, memRange{b.Fixed, b.Fixed + req[i].size})
		}
	}
	var scratch [][]memRange
	for k, i := range order {
		if k%1024 == 0 {
			if err := ctx.Err(); err != nil {
				return nil, fmt.Errorf("bysize: %w", err)
			}
		}
		b := &t.Buffers[i]
		r := req[i]
		scratch = tr.used(b.Start, b.End, scratch[:0])
		off := bestGap(scratch, r.size, r.align)
		if off > lifetime.MaxSize-r.size {
			return nil, fmt.Errorf("bysize: %s: arena would exceed %d bytes", lifetime.Label(i, b.Name), lifetime.MaxSize)
		}
		offsets[i] = off
		tr.insert(b.Start, b.End, memRange{off, off + r.size})
	}
	return &Plan{Offsets: offsets}, nil
}

// bySizeListed is the most buffers bySizeList plans: below it, listing
// the placed buffers live at the same time costs less than the time tree
// (a decode step of 323 buffers: half the time; at 710 to 1024 buffers
// both take about as long).
const bySizeListed = 512

// bySizeTreeAlways makes planBySize use the time tree on every trace
// (tests compare the two).
var bySizeTreeAlways bool

// bySizeList is planBySize's placement loop, the textbook way: for each
// buffer (fixed buffers placed already, then order), the spans of every
// placed buffer live at the same time, sorted, as one run for bestGap,
// which finds the same gap in them as in the time tree's merged sets.
// Quadratic; for small traces.
func bySizeList(ctx context.Context, t *lifetime.Trace, req []requirement, order []int, offsets []int64) (*Plan, error) {
	// The placed buffers' lifetimes and memory, packed for the scans.
	type placement struct {
		start, end int64
		m          memRange
	}
	placed := make([]placement, 0, len(t.Buffers))
	for i := range t.Buffers {
		if b := &t.Buffers[i]; b.HasFixed {
			placed = append(placed, placement{b.Start, b.End, memRange{b.Fixed, b.Fixed + req[i].size}})
		}
	}
	var spans []memRange
	runs := make([][]memRange, 1)
	for k, i := range order {
		if k%1024 == 0 {
			if err := ctx.Err(); err != nil {
				return nil, fmt.Errorf("bysize: %w", err)
			}
		}
		b := &t.Buffers[i]
		r := req[i]
		spans = spans[:0]
		for _, p := range placed {
			if b.Start < p.end && p.start < b.End {
				spans = append(spans, p.m)
			}
		}
		slices.SortFunc(spans, func(x, y memRange) int { return cmp.Compare(x.lo, y.lo) })
		runs[0] = spans
		off := bestGap(runs[:1], r.size, r.align)
		if off > lifetime.MaxSize-r.size {
			return nil, fmt.Errorf("bysize: %s: arena would exceed %d bytes", lifetime.Label(i, b.Name), lifetime.MaxSize)
		}
		offsets[i] = off
		placed = append(placed, placement{b.Start, b.End, memRange{off, off + r.size}})
	}
	return &Plan{Offsets: offsets}, nil
}

// bestGap returns the offset of the smallest gap between the used spans
// that holds size bytes at an offset aligned to align (the lowest among
// equals), or the first aligned offset above them all. Each run is sorted
// by offset; runs may overlap each other. It merges the runs through a
// heap: O(M log k) for M spans in k runs. It consumes runs.
func bestGap(runs [][]memRange, size, align int64) int64 {
	h := runs[:0]
	for _, r := range runs {
		if len(r) > 0 {
			h = append(h, r)
		}
	}
	for i := len(h)/2 - 1; i >= 0; i-- {
		siftDown(h, i)
	}
	var (
		free    int64 // memory from here up to the next used span is free
		best    = int64(-1)
		bestLen int64
	)
	for len(h) > 0 {
		u := h[0][0]
		if h[0] = h[0][1:]; len(h[0]) == 0 {
			h[0] = h[len(h)-1]
			h = h[:len(h)-1]
		}
		siftDown(h, 0)
		if u.lo > free {
			if p := lifetime.RoundUp(free, align); p <= u.lo-size {
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
	return lifetime.RoundUp(free, align)
}

// siftDown restores the heap order of runs by their first span's offset.
func siftDown(h [][]memRange, i int) {
	for {
		m, l, r := i, 2*i+1, 2*i+2
		if l < len(h) && h[l][0].lo < h[m][0].lo {
			m = l
		}
		if r < len(h) && h[r][0].lo < h[m][0].lo {
			m = r
		}
		if m == i {
			return
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
}

// timeTree is a segment tree over compressed time slots; slot i is
// [times[i], times[i+1]).
type timeTree struct {
	times      []int64
	slots      int
	cover, sub []spanSet
}

func newTimeTree(t *lifetime.Trace) *timeTree {
	times := make([]int64, 0, 2*len(t.Buffers))
	for i := range t.Buffers {
		times = append(times, t.Buffers[i].Start, t.Buffers[i].End)
	}
	slices.Sort(times)
	times = slices.Compact(times)
	slots := max(len(times)-1, 1)
	return &timeTree{
		times: times,
		slots: slots,
		cover: make([]spanSet, 4*slots),
		sub:   make([]spanSet, 4*slots),
	}
}

func (tt *timeTree) slot(time int64) int {
	i, _ := slices.BinarySearch(tt.times, time)
	return i
}

// insert records that s is in use during [start, end).
func (tt *timeTree) insert(start, end int64, s memRange) {
	tt.ins(1, 0, tt.slots, tt.slot(start), tt.slot(end), s)
}

func (tt *timeTree) ins(node, l, r, qs, qe int, s memRange) {
	tt.sub[node].add(s)
	if qs <= l && r <= qe {
		tt.cover[node].add(s)
		return
	}
	m := (l + r) / 2
	if qs < m {
		tt.ins(2*node, l, m, qs, qe, s)
	}
	if qe > m {
		tt.ins(2*node+1, m, r, qs, qe, s)
	}
}

// used appends to dst the sets whose union is the memory in use at some
// time in [start, end): sorted runs that may overlap each other. The runs
// alias the tree's sets and are valid until the next insert.
func (tt *timeTree) used(start, end int64, dst [][]memRange) [][]memRange {
	return tt.query(1, 0, tt.slots, tt.slot(start), tt.slot(end), dst)
}

func (tt *timeTree) query(node, l, r, qs, qe int, dst [][]memRange) [][]memRange {
	if qs <= l && r <= qe {
		return append(dst, tt.sub[node])
	}
	dst = append(dst, tt.cover[node])
	m := (l + r) / 2
	if qs < m {
		dst = tt.query(2*node, l, m, qs, qe, dst)
	}
	if qe > m {
		dst = tt.query(2*node+1, m, r, qs, qe, dst)
	}
	return dst
}

// spanSet is a sorted slice of disjoint, non-touching spans.
type spanSet []memRange

// add merges s into the set, fusing every memRange it overlaps or touches.
func (ss *spanSet) add(s memRange) {
	a := *ss
	i := sort.Search(len(a), func(k int) bool { return a[k].hi >= s.lo })
	j := i
	for j < len(a) && a[j].lo <= s.hi {
		s.lo, s.hi = min(s.lo, a[j].lo), max(s.hi, a[j].hi)
		j++
	}
	*ss = slices.Replace(a, i, j, s)
}

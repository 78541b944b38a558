package planner

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/google/btree"

	"github.com/arenaplan/arenaplan/lifetime"
)

// bestfit is the llama.cpp ggml-alloc baseline: an online allocator that
// walks the trace in time order (at equal times frees before allocations,
// lifetimes being half-open; allocations at one time in ID order), keeps
// the free gaps below the high-water mark in two btrees, one by (size,
// offset) for best fit and one by offset for merging neighbours on free,
// takes the smallest gap that fits after aligning its start, and otherwise
// grows the top (extending the top gap when it is free).
//
// Fixed buffers stay out of the free lists: every candidate placement is
// pushed past the fixed buffers whose lifetimes overlap the candidate's, so
// no buffer ever lands on one of them, now or later. Gaps are ignored: a
// buffer occupies its memory for its whole lifetime, which is always safe.
//
// Cost: O(n log n) for n buffers, plus O(F) per placement attempt for F
// fixed buffers, plus the gaps skipped because a buffer's own alignment or
// a fixed buffer spoils them (none when every buffer has the plan's
// alignment and nothing is fixed).
func init() { register(BestFit, planBestFit) }

func planBestFit(ctx context.Context, t *lifetime.Trace, opt Options) (*Plan, error) {
	n := len(t.Buffers)
	req, err := requirements(t, opt.Align)
	if err != nil {
		return nil, err
	}
	fx, err := newFixedSet(t, req, opt.Align)
	if err != nil {
		return nil, err
	}
	offsets := make([]int64, n)
	type event struct {
		time  int64
		alloc bool
		id    int
	}
	evs := make([]event, 0, 2*n)
	for i := range t.Buffers {
		b := &t.Buffers[i]
		if b.HasFixed {
			offsets[i] = b.Fixed
			continue
		}
		evs = append(evs, event{b.Start, true, i}, event{b.End, false, i})
	}
	slices.SortFunc(evs, func(a, b event) int {
		if c := cmp.Compare(a.time, b.time); c != 0 {
			return c
		}
		if a.alloc != b.alloc {
			if a.alloc {
				return 1
			}
			return -1
		}
		return cmp.Compare(a.id, b.id)
	})
	fl := newFreeList()
	for k, e := range evs {
		if k%4096 == 0 {
			if err := ctx.Err(); err != nil {
				return nil, fmt.Errorf("bestfit: %w", err)
			}
		}
		r := req[e.id]
		if !e.alloc {
			fl.free(offsets[e.id], offsets[e.id]+r.size)
			continue
		}
		b := &t.Buffers[e.id]
		fit := func(from int64) int64 { return fx.firstFit(from, r.size, r.align, b.Start, b.End) }
		off, err := fl.alloc(r.size, fit)
		if err != nil {
			return nil, fmt.Errorf("bestfit: %s: %w", lifetime.Label(int(e.id), b.Name), err)
		}
		offsets[e.id] = off
	}
	return &Plan{Offsets: offsets}, nil
}

// memRange is a memory range [lo, hi).
type memRange struct{ lo, hi int64 }

// freeList holds the free gaps below the high-water mark top.
type freeList struct {
	bySize *btree.BTreeG[memRange] // by (hi-lo, lo): best fit
	byOff  *btree.BTreeG[memRange] // by lo: neighbours
	top    int64
}

func newFreeList() *freeList {
	return &freeList{
		bySize: btree.NewG(32, func(a, b memRange) bool {
			if sa, sb := a.hi-a.lo, b.hi-b.lo; sa != sb {
				return sa < sb
			}
			return a.lo < b.lo
		}),
		byOff: btree.NewG(32, func(a, b memRange) bool { return a.lo < b.lo }),
	}
}

func (f *freeList) insert(g memRange) {
	if g.hi > g.lo {
		f.bySize.ReplaceOrInsert(g)
		f.byOff.ReplaceOrInsert(g)
	}
}

func (f *freeList) remove(g memRange) {
	f.bySize.Delete(g)
	f.byOff.Delete(g)
}

// alloc places size bytes in the smallest gap where fit(gap.lo) (the first
// acceptable offset at or after gap.lo) leaves room, else on top.
func (f *freeList) alloc(size int64, fit func(from int64) int64) (int64, error) {
	var (
		got   memRange
		at    int64
		found bool
	)
	f.bySize.AscendGreaterOrEqual(memRange{0, size}, func(g memRange) bool {
		if p := fit(g.lo); p <= g.hi-size {
			got, at, found = g, p, true
			return false
		}
		return true
	})
	if found {
		f.remove(got)
		f.insert(memRange{got.lo, at})
		f.insert(memRange{at + size, got.hi})
		return at, nil
	}
	from := f.top
	if g, ok := f.byOff.Max(); ok && g.hi == f.top {
		f.remove(g)
		from = g.lo
	}
	at = fit(from)
	if at > lifetime.MaxSize-size {
		return 0, fmt.Errorf("arena would exceed %d bytes", lifetime.MaxSize)
	}
	f.insert(memRange{from, at})
	f.top = at + size
	return at, nil
}

// free returns [lo, hi) and merges it with the gaps that touch it.
func (f *freeList) free(lo, hi int64) {
	f.byOff.DescendLessOrEqual(memRange{lo: lo}, func(g memRange) bool {
		if g.hi == lo {
			f.remove(g)
			lo = g.lo
		}
		return false
	})
	if g, ok := f.byOff.Get(memRange{lo: hi}); ok {
		f.remove(g)
		hi = g.hi
	}
	f.insert(memRange{lo, hi})
}

// requirement is what a buffer needs in a plan: its rounded size and the
// alignment of its offset.
type requirement struct{ size, align int64 }

// requirements computes Need for every buffer and refuses alignments whose
// least common multiple leaves the range offsets may take.
func requirements(t *lifetime.Trace, align int64) ([]requirement, error) {
	if align < 1 || align > lifetime.MaxSize {
		return nil, fmt.Errorf("plan alignment %d is out of range", align)
	}
	req := make([]requirement, len(t.Buffers))
	for i := range t.Buffers {
		b := &t.Buffers[i]
		if b.Align > 1 {
			// lcm(align, b.Align) = align/gcd * b.Align; bound it before
			// multiplying so that it cannot overflow.
			if f := align / gcd(align, b.Align); f > lifetime.MaxSize/b.Align {
				return nil, fmt.Errorf("%s: alignment %d with plan alignment %d exceeds %d bytes",
					lifetime.Label(i, b.Name), b.Align, align, lifetime.MaxSize)
			}
		}
		size, a := Need(b, align)
		req[i] = requirement{size, a}
	}
	return req, nil
}

// fixedSet holds the fixed buffers ordered by offset, so that placements
// can step over the ones that are live at the same time.
type fixedSet struct {
	spans []fixedSpan
}

type fixedSpan struct {
	lo, hi     int64 // memory
	start, end int64 // lifetime
}

// newFixedSet collects the fixed buffers and rejects fixed offsets that no
// plan can honour: misaligned ones, and fixed buffers that overlap each
// other (judged by Check itself, gaps included).
func newFixedSet(t *lifetime.Trace, req []requirement, align int64) (*fixedSet, error) {
	sub := &lifetime.Trace{Name: t.Name}
	var offs []int64
	var orig []int // orig[j]: the index in t of sub's buffer j
	fx := &fixedSet{}
	for i := range t.Buffers {
		b := t.Buffers[i]
		if !b.HasFixed {
			continue
		}
		r := req[i]
		if b.Fixed%r.align != 0 {
			return nil, fmt.Errorf("%s: fixed offset %d is not a multiple of its alignment %d", lifetime.Label(i, b.Name), b.Fixed, r.align)
		}
		fx.spans = append(fx.spans, fixedSpan{b.Fixed, b.Fixed + r.size, b.Start, b.End})
		orig = append(orig, i)
		b.ID = lifetime.ID(len(sub.Buffers))
		sub.Buffers = append(sub.Buffers, b)
		offs = append(offs, b.Fixed)
	}
	if len(offs) == 0 {
		return fx, nil
	}
	p := &Plan{Align: align, Offsets: offs, Arena: ArenaSize(sub, offs, align)}
	label := func(j int) string { return lifetime.Label(orig[j], sub.Buffers[j].Name) }
	if err := check(sub, p, label); err != nil {
		return nil, fmt.Errorf("fixed offsets conflict: %w", err)
	}
	slices.SortFunc(fx.spans, func(a, b fixedSpan) int { return cmp.Compare(a.lo, b.lo) })
	return fx, nil
}

// firstFit returns the first offset at or after from, aligned to align,
// where size bytes touch no fixed buffer live during [start, end). It scans
// the fixed buffers once in offset order: O(F).
func (fx *fixedSet) firstFit(from, size, align, start, end int64) int64 {
	p := lifetime.RoundUp(from, align)
	for _, f := range fx.spans {
		if f.lo >= p+size {
			break
		}
		if f.hi <= p || !lifetime.Overlaps(f.start, f.end, start, end) {
			continue
		}
		p = lifetime.RoundUp(f.hi, align)
	}
	return p
}

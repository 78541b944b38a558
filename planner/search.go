package planner

import (
	"errors"
	"fmt"
	"slices"
	"sort"

	"github.com/arenaplan/arenaplan/lifetime"
)

// This file turns a trace into the search problem the anytime planner
// works on: sizes and offsets in units of the plan alignment, time
// compressed into sections (the intervals between consecutive distinct
// event times), and the problem split into independent leaves.
//
// Gaps are ignored: a buffer is treated as live throughout its lifetime,
// which is always safe.

// item is one buffer of a search problem.
type item struct {
	id     int32 // index in the trace
	lo, hi int32 // the sections [lo, hi) the buffer is live in
	size   int64 // in units
	align  int64 // offset alignment in units, >= 1
	fixed  int64 // fixed offset in units, -1 if none
}

// problem is a whole trace in search form.
type problem struct {
	unit  int64 // bytes per unit: the plan alignment
	items []item
	nsec  int
	load  []int64 // per section: the sum of live sizes
	lb    int64   // max of load
	times []int64 // distinct event times; section s is [times[s], times[s+1])
}

// scale divides every size, alignment and fixed offset by their greatest
// common divisor (alignments of 1 impose nothing and are left out), so
// capacities step by meaningful amounts. Every offset a search produces
// is a sum of sizes and alignments, so nothing is lost.
func (p *problem) scale() {
	var g int64
	for i := range p.items {
		it := &p.items[i]
		g = gcd(g, it.size)
		if it.align > 1 {
			g = gcd(g, it.align)
		}
		if it.fixed > 0 {
			g = gcd(g, it.fixed)
		}
	}
	if g <= 1 {
		return
	}
	p.unit *= g
	for i := range p.items {
		it := &p.items[i]
		it.size /= g
		it.align = max(it.align/g, 1)
		if it.fixed > 0 {
			it.fixed /= g
		}
	}
}

// errFixedMisaligned is returned when a fixed offset cannot be honoured
// with the plan's alignment.
var errFixedMisaligned = errors.New("fixed offset is not a multiple of the required alignment")

func newProblem(t *lifetime.Trace, align int64) (*problem, error) {
	p := &problem{unit: max(align, 1)}
	n := len(t.Buffers)
	times := make([]int64, 0, 2*n)
	for i := range t.Buffers {
		times = append(times, t.Buffers[i].Start, t.Buffers[i].End)
	}
	slices.Sort(times)
	times = slices.Compact(times)
	p.nsec = max(len(times)-1, 0)
	p.items = make([]item, n)
	for i := range t.Buffers {
		b := &t.Buffers[i]
		size, oa := Need(b, p.unit)
		it := item{
			id:    int32(i),
			lo:    int32(sort.Search(len(times), func(k int) bool { return times[k] >= b.Start })),
			hi:    int32(sort.Search(len(times), func(k int) bool { return times[k] >= b.End })),
			size:  size / p.unit,
			align: oa / p.unit,
			fixed: -1,
		}
		if b.HasFixed {
			if b.Fixed%oa != 0 {
				return nil, fmt.Errorf("buffer %d (%s) fixed at %d: %w %d", i, b.Name, b.Fixed, errFixedMisaligned, oa)
			}
			it.fixed = b.Fixed / p.unit
		}
		p.items[i] = it
	}
	p.times = times
	p.scale()
	p.load = make([]int64, p.nsec+1)
	diff := make([]int64, p.nsec+1)
	for i := range p.items {
		diff[p.items[i].lo] += p.items[i].size
		diff[p.items[i].hi] -= p.items[i].size
	}
	var run int64
	for s := 0; s < p.nsec; s++ {
		run += diff[s]
		p.load[s] = run
		p.lb = max(p.lb, run)
	}
	p.load = p.load[:p.nsec]
	return p, nil
}

// leaf is an independent part of a problem: its items touch only each
// other (and fixed items shared with neighbouring leaves, which every
// leaf places at the same offset). Every offset in it is at least base.
type leaf struct {
	items  []int32 // indices into problem.items
	base   int64   // the lowest offset any item may take
	lo, hi int32   // its sections
	lb     int64   // base + the peak load of items over its sections
}

// decompose splits the items at section boundaries that no free buffer
// crosses, and stacks at the bottom of each part the buffers that span it
// entirely (which is optimal: such a buffer conflicts with every other
// one of its part, so moving it to the bottom and the ones below it up
// never raises the peak). It records the stacked offsets in offs (units)
// and returns the leaves that remain to be searched.
func (p *problem) decompose(offs []int64) []leaf {
	all := make([]int32, len(p.items))
	for i := range all {
		all[i] = int32(i)
	}
	var out []leaf
	p.split(all, 0, 0, int32(p.nsec), offs, &out)
	return out
}

func (p *problem) split(ids []int32, base int64, lo, hi int32, offs []int64, out *[]leaf) {
	// cross[s] counts free items live in both section s-1 and s.
	width := int(hi - lo)
	cross := make([]int32, width+1)
	hasFixed := false
	for _, i := range ids {
		it := &p.items[i]
		if it.fixed >= 0 {
			hasFixed = true
			continue
		}
		cross[it.lo-lo+1]++
		cross[it.hi-lo]--
	}
	var run int32
	cuts := []int32{lo}
	for s := 1; s < width; s++ {
		run += cross[s]
		if run == 0 {
			cuts = append(cuts, lo+int32(s))
		}
	}
	cuts = append(cuts, hi)
	if len(cuts) > 2 {
		// Items are bucketed by the part they start in; a free item lies in
		// one part, a fixed one in every part it touches.
		parts := make([][]int32, len(cuts)-1)
		for _, i := range ids {
			it := &p.items[i]
			k := sort.Search(len(cuts), func(k int) bool { return cuts[k] > it.lo }) - 1
			for ; k < len(parts) && cuts[k] < it.hi; k++ {
				parts[k] = append(parts[k], i)
				if it.fixed < 0 {
					break
				}
			}
		}
		for k, part := range parts {
			if len(part) > 0 {
				p.split(part, base, cuts[k], cuts[k+1], offs, out)
			}
		}
		return
	}
	// One part: narrow it to the sections its items cover, then stack the
	// items that span all of them.
	lo, hi = hi, lo
	for _, i := range ids {
		lo = min(lo, p.items[i].lo)
		hi = max(hi, p.items[i].hi)
	}
	if !hasFixed {
		rest := ids[:0:0]
		stacked := false
		for _, i := range ids {
			it := &p.items[i]
			if it.lo == lo && it.hi == hi && it.align == 1 {
				offs[i] = base
				base += it.size
				stacked = true
				continue
			}
			rest = append(rest, i)
		}
		if stacked {
			if len(rest) > 0 {
				p.split(rest, base, lo, hi, offs, out)
			}
			return
		}
	}
	var peak int64
	load := make([]int64, hi-lo+1)
	for _, i := range ids {
		load[p.items[i].lo-lo] += p.items[i].size
		load[p.items[i].hi-lo] -= p.items[i].size
	}
	var l int64
	for s := range int(hi - lo) {
		l += load[s]
		peak = max(peak, l)
	}
	*out = append(*out, leaf{items: ids, base: base, lo: lo, hi: hi, lb: base + peak})
}

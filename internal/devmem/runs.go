package devmem

import (
	"iter"
	"sort"
)

// Runs are the free runs of a range of addresses [0, size), as offsets:
// sorted, neighbours merged. The spill allocator keeps its reservation's
// unmapped parts in them, the PyTorch bridge its graph heap's free
// addresses. The zero value has nothing free.
type Runs struct{ r []run }

type run struct{ lo, hi uint64 }

// NewRuns returns Runs with all of [0, size) free.
func NewRuns(size uint64) Runs { return Runs{[]run{{0, size}}} }

// Take takes the lowest size bytes free that start at a multiple of
// align (a power of two; 0 or 1: any) and returns their offset; false
// where no run holds them.
func (rs *Runs) Take(size, align uint64) (uint64, bool) {
	align = max(align, 1)
	for i, r := range rs.r {
		lo := (r.lo + align - 1) &^ (align - 1)
		if lo < r.lo || lo > r.hi || r.hi-lo < size {
			continue
		}
		var rest []run
		if lo > r.lo {
			rest = append(rest, run{r.lo, lo})
		}
		if lo+size < r.hi {
			rest = append(rest, run{lo + size, r.hi})
		}
		rs.r = append(rs.r[:i], append(rest, rs.r[i+1:]...)...)
		return lo, true
	}
	return 0, false
}

// Put gives [off, off+size) back, merging it with its neighbours; false,
// and nothing changed, where part of it is free already.
func (rs *Runs) Put(off, size uint64) bool {
	hi := off + size
	i := sort.Search(len(rs.r), func(i int) bool { return rs.r[i].lo >= off })
	if (i > 0 && rs.r[i-1].hi > off) || (i < len(rs.r) && rs.r[i].lo < hi) {
		return false
	}
	rs.r = append(rs.r[:i], append([]run{{off, hi}}, rs.r[i:]...)...)
	if i+1 < len(rs.r) && rs.r[i].hi == rs.r[i+1].lo {
		rs.r[i].hi = rs.r[i+1].hi
		rs.r = append(rs.r[:i+1], rs.r[i+2:]...)
	}
	if i > 0 && rs.r[i-1].hi == rs.r[i].lo {
		rs.r[i-1].hi = rs.r[i].hi
		rs.r = append(rs.r[:i], rs.r[i+1:]...)
	}
	return true
}

// All yields every free run [lo, hi), lowest first.
func (rs *Runs) All() iter.Seq2[uint64, uint64] {
	return func(yield func(lo, hi uint64) bool) {
		for _, r := range rs.r {
			if !yield(r.lo, r.hi) {
				return
			}
		}
	}
}

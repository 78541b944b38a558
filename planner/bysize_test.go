package planner

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/arenaplan/arenaplan/lifetime"
)

// TestBestGapAgainstBitmap compares the heap-merged best-fit gap search
// with a bitmap of used bytes on small random layouts.
func TestBestGapAgainstBitmap(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for k := 0; k < 20000; k++ {
		var used [64]bool
		var runs [][]memRange
		for r := rng.IntN(5); r > 0; r-- {
			var set spanSet
			for s := rng.IntN(5); s > 0; s-- {
				lo := rng.Int64N(56)
				hi := lo + 1 + rng.Int64N(8)
				set.add(memRange{lo, hi})
				for x := lo; x < hi; x++ {
					used[x] = true
				}
			}
			runs = append(runs, set)
		}
		size, align := 1+rng.Int64N(10), []int64{1, 2, 3, 4, 8}[rng.IntN(5)]
		want := bitmapBestGap(used[:], size, align)
		if got := bestGap(slices.Clone(runs), size, align); got != want {
			t.Fatalf("runs %v, size %d, align %d: bestGap %d, want %d", runs, size, align, got, want)
		}
	}
}

func bitmapBestGap(used []bool, size, align int64) int64 {
	top := int64(0)
	for x := range used {
		if used[x] {
			top = int64(x) + 1
		}
	}
	best, bestLen := int64(-1), int64(0)
	for lo := int64(0); lo < top; {
		if used[lo] {
			lo++
			continue
		}
		hi := lo
		for hi < top && !used[hi] {
			hi++
		}
		if p := lifetime.RoundUp(lo, align); p+size <= hi && (best < 0 || hi-lo < bestLen) {
			best, bestLen = p, hi-lo
		}
		lo = hi
	}
	if best >= 0 {
		return best
	}
	return lifetime.RoundUp(top, align)
}

// TestTimeTreeAgainstScan checks that the segment tree reports exactly the
// memory of the inserted buffers whose lifetimes meet the query's.
func TestTimeTreeAgainstScan(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	for k := 0; k < 300; k++ {
		tr := genTrace(rng, genOptions{maxBuffers: 30, maxTime: 20, align: 1})
		if len(tr.Buffers) == 0 {
			continue
		}
		tt := newTimeTree(tr)
		type placed struct {
			start, end int64
			m          memRange
		}
		var in []placed
		for _, b := range tr.Buffers {
			lo := rng.Int64N(100)
			m := memRange{lo, lo + 1 + rng.Int64N(20)}
			tt.insert(b.Start, b.End, m)
			in = append(in, placed{b.Start, b.End, m})
			q := tr.Buffers[rng.IntN(len(tr.Buffers))]
			var want [128]bool
			for _, p := range in {
				if lifetime.Overlaps(p.start, p.end, q.Start, q.End) {
					for x := p.m.lo; x < p.m.hi; x++ {
						want[x] = true
					}
				}
			}
			var got [128]bool
			for _, run := range tt.used(q.Start, q.End, nil) {
				for _, m := range run {
					for x := m.lo; x < m.hi; x++ {
						got[x] = true
					}
				}
			}
			if got != want {
				t.Fatalf("trace %d: memory in use during [%d, %d) differs from a scan", k, q.Start, q.End)
			}
		}
	}
}

// TestBySizeListAgainstTree: the listing placement loop (small traces)
// and the time tree give the same plan, buffer for buffer.
func TestBySizeListAgainstTree(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for k := 0; k < 2000; k++ {
		align := []int64{1, 4, 256}[rng.IntN(3)]
		tr := genTrace(rng, genOptions{maxBuffers: 40, maxTime: 30, align: align})
		opt := Options{Align: align}
		list, err := planBySize(context.Background(), tr, opt)
		if err != nil {
			t.Fatal(err)
		}
		bySizeTreeAlways = true
		tree, err := planBySize(context.Background(), tr, opt)
		bySizeTreeAlways = false
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(list.Offsets, tree.Offsets) {
			t.Fatalf("trace %d (%d buffers, align %d): listed %v, tree %v", k, len(tr.Buffers), align, list.Offsets, tree.Offsets)
		}
	}
}

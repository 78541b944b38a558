package planner

import (
	"cmp"
	"math/rand/v2"
	"slices"
	"time"
)

// improve is a large-neighbourhood search on a packed leaf: again and
// again it takes the buffers around the peak (those live near a buffer
// that reaches the top and sitting high), lifts them out, and puts them
// back largest first, each at the lowest offset where it fits; it keeps
// the result when the height did not grow. It is how the planner fixes
// the few buffers that a greedy pass misplaces on large real traces,
// where the exact search costs too much per node.
//
// It is deterministic for a given seed: it stops when it reaches target
// (the same iteration every time) or when until passes.
func (d *leafData) improve(offs []int64, target int64, until time.Time, seed uint64, quit func() bool) int64 {
	for j := range d.k {
		if d.fixed[j] >= 0 {
			return height(d, offs) // fixed buffers may float; keep it simple
		}
	}
	rng := rand.New(rand.NewPCG(seed, 0x696d70726f7665))
	h := height(d, offs)
	inR := make([]bool, d.k)
	var ruin []int32
	var scratch []span
	for iter := 0; h > target; iter++ {
		if time.Now().After(until) || quit != nil && quit() {
			break
		}
		// A buffer at the top, and a window of sections around it.
		var peaks []int32
		for j := range d.k {
			if offs[j]+d.size[j] == h {
				peaks = append(peaks, int32(j))
			}
		}
		p := peaks[rng.IntN(len(peaks))]
		// Lift p and the buffers it conflicts with whose top is above a
		// random level, sometimes also those of a second buffer lifted.
		level := h - int64(float64(h-d.base)*(0.02+rng.Float64()*rng.Float64()))
		ruin = append(ruin[:0], p)
		inR[p] = true
		lift := func(q int32) {
			for _, j := range d.adj[d.adjAt[q]:d.adjAt[q+1]] {
				if !inR[j] && offs[j]+d.size[j] > level {
					inR[j] = true
					ruin = append(ruin, j)
				}
			}
		}
		lift(p)
		for range rng.IntN(3) {
			lift(ruin[rng.IntN(len(ruin))])
		}
		// Keep the neighbourhood small: the highest buffers only.
		if limit := 16 + rng.IntN(200); len(ruin) > limit {
			slices.SortFunc(ruin[1:], func(a, b int32) int {
				return cmp.Compare(offs[b]+d.size[b], offs[a]+d.size[a])
			})
			for _, j := range ruin[limit:] {
				inR[j] = false
			}
			ruin = ruin[:limit]
		}
		// Largest first (by size, lifetime or area, at random), ties broken
		// at random so that repeats differ.
		keys := make(map[int32]uint32, len(ruin))
		for _, j := range ruin {
			keys[j] = rng.Uint32()
		}
		by := rng.IntN(3)
		key := func(j int32) int64 {
			switch by {
			case 0:
				return d.size[j]
			case 1:
				return d.end[j] - d.start[j]
			}
			return d.size[j] * (d.end[j] - d.start[j])
		}
		slices.SortFunc(ruin, func(a, b int32) int {
			if c := cmp.Compare(key(b), key(a)); c != 0 {
				return c
			}
			return cmp.Compare(keys[a], keys[b])
		})
		old := make(map[int32]int64, len(ruin))
		for _, j := range ruin {
			old[j] = offs[j]
		}
		for _, j := range ruin {
			scratch = scratch[:0]
			for _, o := range d.adj[d.adjAt[j]:d.adjAt[j+1]] {
				if !inR[o] {
					scratch = append(scratch, span{offs[o], offs[o] + d.size[o]})
				}
			}
			offs[j] = fitIn(scratch, d.base, d.size[j], d.align[j], firstFit)
			inR[j] = false
		}
		nh := height(d, offs)
		if nh > h {
			for _, j := range ruin {
				offs[j] = old[j]
			}
			continue
		}
		h = nh
	}
	return h
}

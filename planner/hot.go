package planner

import (
	"context"
	"sync/atomic"
	"time"
)

// The hot set: where a leaf's greedy passes and rolling search end a
// little above its bound, only the times whose live bytes come within
// that gap of the bound are tight. The hot stage takes the buffers live
// at any such time, with their whole lifetimes (not cut to those times,
// as the peak core cuts its window), packs them alone at the bound with
// a short exact search, fixes them there and places the others around
// them with the bysize baseline. Leaving buffers out keeps every
// conflict between those taken, so every packing of the leaf at the
// bound holds one of the hot set; the others never live at a tight
// time, which usually leaves them room beside it. The stage tries one
// packing of the hot set: where the others do not fit around it, the
// leaf's search goes on as before.
//
// Decode steps as PyTorch records them with the memory-efficient
// attention (tracegen.TorchDecode): every layer's two 3 MiB key and
// value expansions meet the previous layer's at the peak with 14848
// bytes of small buffers beside them, and the search of the whole leaf
// stopped 10 to 12 × 256 bytes above the peak from 3 layers up. The hot
// set is about 12 buffers a layer; at 3 to 5 layers it packs at the peak
// within hotNodes nodes a buffer and the rest around it, in 3 to 6 ms
// in all. At 6 layers the hot set, and then the whole leaf, pack at the
// peak too, but the hot set only after some 140k nodes of exact search
// (0.3 s, past what the stop rule gives it); at 8, 20M nodes neither
// find one nor prove there is none, but layer by layer (the first k
// layers' hot set at the peak with the layers before the last two fixed
// where the search for k−1 put them) one was found offline in 44 s:
// testdata/torch-decode-efficient-b1.peak.csv.

// hotStage packs the items ids of p (a leaf: sections [lo, hi), placed
// from base up) by their hot set, the items live where the load comes
// within best − target of target (best: the leaf's best height so far),
// until deadline. It returns their offsets in units, in the order of
// ids, and the height; nil where the hot set is all of them or none, or
// where it does not pack at target, or the others do not fit around it
// (bysize refuses a fixed buffer left out that the packing meets).
func (r *anytimeRun) hotStage(ids []int32, lo, hi int32, base, target, best int64, deadline time.Time) ([]int64, int64) {
	p := r.p
	gap := best - target
	if gap <= 0 {
		return nil, 0
	}
	load, _ := p.sectionLoad(ids, lo, hi)
	var hot []int32 // positions in ids
	for k, i := range ids {
		it := &p.items[i]
		for s := max(it.lo, lo); s < min(it.hi, hi); s++ {
			if base+load[s-lo]+gap > target {
				hot = append(hot, int32(k))
				break
			}
		}
	}
	if len(hot) == 0 || len(hot) == len(ids) {
		return nil, 0
	}
	hotIDs := make([]int32, len(hot))
	for k, h := range hot {
		hotIDs[k] = ids[h]
	}
	_, peak := p.sectionLoad(hotIDs, lo, hi)
	hd := newLeafData(p, &leaf{items: hotIDs, lo: lo, hi: hi, base: base, lb: base + peak}, p.times)
	// The exact search of the hot set at target, in the dives' orders,
	// each within hotNodes nodes a buffer: where it packs, it does so
	// almost without backtracking (39 nodes for the 39 buffers of a
	// 4-layer decode step), and where it does not, it costs the leaf
	// little.
	var stop atomic.Bool
	quit := context.AfterFunc(r.ctx, func() { stop.Store(true) })
	defer quit()
	timer := time.AfterFunc(time.Until(deadline), func() { stop.Store(true) })
	defer timer.Stop()
	var sol []int64
	for _, o := range diveOrders {
		s := newDFS(hd, target, o, hotNodes*int64(hd.k)+diveSlack, &stop)
		if s.solve() == found {
			sol = s.sol
			break
		}
	}
	if sol == nil {
		return nil, 0
	}
	// The others around them, by the bysize baseline, which honours
	// fixed buffers: outside the hot times there is room for them.
	all, pos := p.cut(ids, lo, hi, base, lo, hi)
	if len(pos) != len(ids) {
		return nil, 0 // an item outside [lo, hi): not a part of p
	}
	for j, h := range hot {
		b := &all.Buffers[h]
		b.Fixed, b.HasFixed = sol[j]-base, true
	}
	q, err := planBySize(r.ctx, all, Options{Align: 1})
	if err != nil {
		return nil, 0
	}
	offs := q.Offsets
	for k := range offs {
		offs[k] += base
	}
	return offs, base + ArenaSize(all, q.Offsets, 1)
}

// hotNodes is the hot set's search's node limit per buffer and order.
// On memory-efficient decode steps of 3 to 5 layers at batches 1 to 64:
// 2 packs them all at the peak, 1 misses 5 layers at batch 8; where
// nothing packs (8 layers), it costs the whole search about 2 ms on one
// core (1.3 at 1, 4 at 4).
const hotNodes = 2

package planner

import (
	"cmp"
	"slices"
	"sync/atomic"
)

// The rolling search: the exact search (exact.go) on one window of a
// leaf at a time. The exact search places buffers from the lowest offset
// up over the whole leaf, so on a long leaf whose hard times repeat along
// it (a decode step's layers, a sliding window of buffers), a mistake at
// the start is found only when the top of the end is packed, and it gets
// lost in backtracking. The rolling search instead takes the buffers in
// order of their start, window buffers at a time: it packs the next
// window under the capacity, with every buffer of earlier windows that
// conflicts with one of it fixed where it was put, keeps the first half
// of the window, and moves on by half a window. It never goes back to an
// earlier window, so it can fail where a packing exists; it is complete
// only for one window. It is cheap: each window is a small exact search
// under a node limit.
//
// On the decode-step traces (internal/tracegen.Decode) every greedy pass
// and millions of nodes of the exact search stay 0.08–0.16% above the
// lower bound; windows of 32 buffers reach it in about 1000 nodes. On a
// sliding window of 1024 buffers of 0.5–1 MiB (internal/tracegen.Window)
// the greedy passes end 22% above; windows of 16 reach it in 15k nodes.

// rollThin: the rolling search runs on leaves with at least this many
// times as many buffers as are ever live at once (decode steps: 37 to 50,
// the sliding window: 256). On denser leaves its windows hold most of
// what is live, each costs nearly what the whole leaf does, and it takes
// the exact search's time for nothing (MiniMalloc's challenging set: 1.2
// to 18; C took 0.35 s instead of 0.01 s to its bound).
const rollThin = 24

// thin reports whether a leaf is long and thin enough for the rolling
// search (see rollThin).
func (d *leafData) thin() bool {
	var live int32
	for s := range d.nsec {
		live = max(live, d.secAt[s+1]-d.secAt[s])
	}
	return int64(d.k) >= rollThin*int64(live)
}

// rollWindows are the window sizes the rolling search tries, in order.
var rollWindows = []int{32, 16, 24, 48, 64, 8}

// rollLimit is the node limit of one rolling attempt (all its windows) in
// the first round; it doubles every round. rollNodes × buffers bounds the
// nodes of the whole stage (at least rollLimit): where the rolling search
// fails it leaves the rest of the leaf's time to the exact search.
const (
	rollLimit = 4096
	rollNodes = 256
)

// rollNear replaces rollNodes under the stop rule (Options.FullBudget)
// on a leaf already within 1/stopGap of its target: the rolling search
// reached the bound of the decode-step traces in 2 to 3 nodes a buffer
// (internal/tracegen.Decode), and where it cannot (a decode step as
// PyTorch records it, internal/tracegen.TorchDecode with the
// memory-efficient attention) 256 nodes a buffer took 250 to 450 ms of
// a plan found in 5, for nothing. No floor of rollLimit nodes here.
// Near the bound the dives come first.
const rollNear = 4

// diveOrders are the preorders of the dives: the exact search's first
// lower-bound jobs, each cut to one path down the tree.
var diveOrders = exactHeuristics[:2]

// dive runs the exact search at capacity c along about one path for
// each of diveOrders (k + diveSlack nodes): where the greedy passes end
// just above the bound, the exact search's pruning often finds a packing
// at it without backtracking (a decode step as PyTorch records it, math
// attention in bf16: TAW in as many nodes as buffers), while the rolling
// search, which packs the leaf window by window, fails there. It returns
// the plan (nil if none), the nodes searched, false when stop cut it
// short, and the searches that stopped at their node limit, parked, in
// the order of diveOrders: the exact search's first lower-bound jobs,
// the same searches under larger limits, go on with them. The caller
// drops those it does not use.
//
// Dives after the first run ahead, side by side with it, on the cores
// spare lends: what they find counts only where the dives before them
// found nothing, as if they had run one after the other.
func (d *leafData) dive(c int64, stop *atomic.Bool, spare *spareCores) ([]int64, int64, bool, []*parkedDFS) {
	var (
		used   int64
		parked []*parkedDFS
	)
	type dived struct {
		pk  *parkedDFS
		res int
	}
	ahead := make([]chan dived, len(diveOrders))
	for x := 1; x < len(diveOrders); x++ {
		if !spare.borrow() {
			break
		}
		ahead[x] = make(chan dived, 1)
		go func() {
			pk, res := startParked(d, c, diveOrders[x], int64(d.k)+diveSlack, stop, nil)
			spare.give() // before the result: the dives end with the core given back
			ahead[x] <- dived{pk, res}
		}()
	}
	// Dives run ahead that do not count: their searches end here.
	drop := func(from int) {
		for _, ch := range ahead[from:] {
			if ch != nil {
				if dv := <-ch; dv.res == paused {
					dv.pk.drop()
				}
			}
		}
	}
	for x, o := range diveOrders {
		var dv dived
		if ahead[x] != nil {
			dv = <-ahead[x]
		} else {
			dv.pk, dv.res = startParked(d, c, o, int64(d.k)+diveSlack, stop, nil)
		}
		pk, res := dv.pk, dv.res
		used += pk.s.nodes
		switch {
		case res == paused:
			parked = append(parked, pk)
		case res == found:
			drop(x + 1)
			return pk.s.sol, used, true, parked
		case stop.Load():
			drop(x + 1)
			return nil, used, false, parked
		}
	}
	return nil, used, true, parked
}

const diveSlack = 64

// roll runs the rolling search at capacity c: rounds of attempts, one per
// window size, until one packs the leaf or perBuffer nodes a buffer (at
// least rollLimit) are spent. A window size whose attempt ended in a
// window proven infeasible is not tried again: its earlier windows come
// out the same under any limit, so a larger one changes nothing. It
// returns the plan (nil if none), the nodes it searched, and false when
// stop cut it short: the outcome then depends on the clock, and the stage
// must run again from the start. times maps the leaf's sections to trace
// times (for the preorders).
func (d *leafData) roll(c int64, times []int64, perBuffer int64, stop *atomic.Bool) ([]int64, int64, bool) {
	budget := perBuffer * int64(d.k)
	if perBuffer >= rollNodes {
		budget = max(budget, rollLimit)
	}
	var used int64
	failed := make([]bool, len(rollWindows))
	for round := 0; used < budget; round++ {
		tried := false
		for x, w := range rollWindows {
			if failed[x] {
				continue
			}
			limit := min(int64(rollLimit)<<round, budget-used)
			if limit <= 0 {
				return nil, used, true
			}
			tried = true
			offs, nodes, res := d.rollOnce(c, w, limit, times, stop)
			used += nodes
			switch {
			case res == found:
				return offs, used, true
			case stop.Load():
				return nil, used, false
			case res == notFound:
				failed[x] = true
			}
		}
		if !tried {
			break
		}
	}
	return nil, used, true
}

// rollOnce packs the leaf under capacity c with windows of w buffers and
// at most limit nodes in all. It returns the offsets (local indices) when
// it found a packing, the nodes it searched and the outcome.
func (d *leafData) rollOnce(c int64, w int, limit int64, times []int64, stop *atomic.Bool) ([]int64, int64, int) {
	offs := make([]int64, d.k)
	var order []int32
	for j := range d.k {
		offs[j] = d.fixed[j] // fixed buffers are placed from the start
		if d.fixed[j] < 0 {
			order = append(order, int32(j))
		}
	}
	slices.SortFunc(order, func(a, b int32) int {
		if x := cmp.Compare(d.lo[a], d.lo[b]); x != 0 {
			return x
		}
		if x := cmp.Compare(d.hi[b], d.hi[a]); x != 0 {
			return x
		}
		return cmp.Compare(a, b)
	})
	var (
		nodes    int64
		seen     = make([]bool, d.k)
		all      []int32
		cuts     []int32
		subTimes []int64
	)
	for at := 0; at < len(order); {
		end := min(at+w, len(order))
		// The window's buffers, then those placed that conflict with one.
		all = append(all[:0], order[at:end]...)
		for _, j := range order[at:end] {
			for _, o := range d.adj[d.adjAt[j]:d.adjAt[j+1]] {
				if offs[o] >= 0 && !seen[o] {
					seen[o] = true
					all = append(all, o)
				}
			}
		}
		q := &problem{unit: 1, items: make([]item, len(all))}
		ids := make([]int32, len(all))
		// The window's sections: those of its own buffers. A placed buffer
		// matters only where it meets one of them, so it is cut to them;
		// a long-lived one would otherwise stretch every node's work over
		// the whole leaf.
		lo, hi := int32(d.nsec), int32(0)
		for _, j := range order[at:end] {
			lo, hi = min(lo, d.lo[j]), max(hi, d.hi[j])
		}
		// Sections where none of them starts or ends hold the same
		// buffers as their neighbours: they are merged, numbered anew.
		cuts = cuts[:0]
		for _, j := range all {
			cuts = append(cuts, max(d.lo[j], lo), min(d.hi[j], hi))
		}
		slices.Sort(cuts)
		cuts = slices.Compact(cuts)
		subTimes = subTimes[:0]
		for _, c := range cuts {
			subTimes = append(subTimes, times[c])
		}
		for x, j := range all {
			seen[j] = false
			l, _ := slices.BinarySearch(cuts, max(d.lo[j], lo))
			h, _ := slices.BinarySearch(cuts, min(d.hi[j], hi))
			q.items[x] = item{id: int32(x), lo: int32(l), hi: int32(h), size: d.size[j], align: d.align[j], fixed: offs[j]}
			ids[x] = int32(x)
		}
		sub := newLeafData(q, &leaf{items: ids, base: d.base, lo: 0, hi: int32(len(cuts) - 1)}, subTimes)
		s := newDFS(sub, c, "TWA", limit-nodes, stop)
		res := s.solve()
		nodes += s.nodes
		if res != found {
			return nil, nodes, res
		}
		keep := end
		if end < len(order) {
			keep = at + max(w/2, 1)
		}
		for x := range keep - at {
			offs[all[x]] = s.sol[x]
		}
		at = keep
	}
	return offs, nodes, found
}

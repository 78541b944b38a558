package bridge

// What one run of a step allocated and freed, and how it compares with a
// plan's trace.

import (
	"fmt"
	"slices"
	"strconv"

	"github.com/arenaplan/arenaplan/cuda"
	"github.com/arenaplan/arenaplan/lifetime"
	"github.com/arenaplan/arenaplan/planner"
)

// runLog is what one run of the step did, in the order it did it: every
// allocation on the step's stream, when it was freed, and whether another
// stream used it. Time advances by one per event.
type runLog struct {
	now   int64
	sizes []int64
	start []int64
	end   []int64 // -1 while live
	other []bool  // record_stream on another stream
	ids   map[cuda.DevicePtr]int
}

func (r *runLog) reset() {
	*r = runLog{ids: map[cuda.DevicePtr]int{}}
}

func (r *runLog) alloc(p cuda.DevicePtr, size uint64) {
	r.ids[p] = len(r.sizes)
	r.sizes = append(r.sizes, int64(size))
	r.start = append(r.start, r.now)
	r.end = append(r.end, -1)
	r.other = append(r.other, false)
	r.now++
}

func (r *runLog) free(p cuda.DevicePtr) {
	if i, ok := r.ids[p]; ok {
		delete(r.ids, p)
		r.end[i] = r.now + 1 // live through the free's tick
		r.now++
	}
}

// trace is the run as a lifetime.Trace: buffers never freed, or used on
// another stream, live to the end.
func (r *runLog) trace(name string) *lifetime.Trace {
	t := &lifetime.Trace{Name: name, Buffers: make([]lifetime.Buffer, len(r.sizes))}
	for i := range r.sizes {
		end := r.end[i]
		if end < 0 || r.other[i] {
			end = r.now + 1
		}
		t.Buffers[i] = lifetime.Buffer{ID: lifetime.ID(i), Name: "t" + strconv.Itoa(i), Size: r.sizes[i],
			Start: r.start[i], End: end}
	}
	return t
}

// subTrace is the trace of the run's allocations that keep selects, times
// renumbered as if the others had not happened.
func (r *runLog) subTrace(name string, keep []bool) *lifetime.Trace {
	var ticks []int64
	for i := range r.sizes {
		if keep[i] {
			ticks = append(ticks, r.start[i])
			if r.end[i] >= 0 {
				ticks = append(ticks, r.end[i]-1)
			}
		}
	}
	slices.Sort(ticks)
	rank := make(map[int64]int64, len(ticks))
	for _, t := range ticks {
		rank[t] = int64(len(rank))
	}
	now := int64(len(rank))
	t := &lifetime.Trace{Name: name}
	for i := range r.sizes {
		if !keep[i] {
			continue
		}
		end := now + 1
		if r.end[i] >= 0 && !r.other[i] {
			end = rank[r.end[i]-1] + 1
		}
		t.Buffers = append(t.Buffers, lifetime.Buffer{ID: lifetime.ID(len(t.Buffers)), Name: "t" + strconv.Itoa(len(t.Buffers)),
			Size: r.sizes[i], Start: rank[r.start[i]], End: end})
	}
	return t
}

// embeds says whether the run made the plan's step: the plan's buffers,
// matched in order by size to the run's allocations (skipping extra ones,
// such as a workspace PyTorch makes lazily in one capture), live as in the
// plan once the extras are taken out. nil: it did; else what differs.
func (r *runLog) embeds(name string, plan *lifetime.Trace) error {
	keep := make([]bool, len(r.sizes))
	j := 0
	for i := range plan.Buffers {
		for j < len(r.sizes) && r.sizes[j] != plan.Buffers[i].Size {
			j++
		}
		if j == len(r.sizes) {
			return fmt.Errorf("the plan's allocation %d (%d bytes) never came: the step made %d allocations", i, plan.Buffers[i].Size, len(r.sizes))
		}
		keep[j] = true
		j++
	}
	return planner.SameRun(plan, r.subTrace(name, keep), true)
}

package plans_test

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/arenaplan/arenaplan/lifetime"
	"github.com/arenaplan/arenaplan/planner"
	"github.com/arenaplan/arenaplan/plans"
)

func Example() {
	// Two buffers that live one after the other share offset 0.
	tr := &lifetime.Trace{Name: "step", Buffers: []lifetime.Buffer{
		{ID: 0, Name: "a", Size: 1000, Start: 0, End: 2},
		{ID: 1, Name: "b", Size: 300, Start: 1, End: 3},
		{ID: 2, Name: "c", Size: 500, Start: 2, End: 4},
	}}
	p := &planner.Plan{Algo: "by hand", Align: 256, Offsets: []int64{0, 1024, 0}}
	p.Arena = planner.ArenaSize(tr, p.Offsets, p.Align)
	p.LowerBound, _ = tr.LowerBound(p.Align)
	p.Optimal = p.Arena == p.LowerBound

	dir, _ := os.MkdirTemp("", "plans")
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "step.plan")
	w := &plans.Workload{Name: "toy", Shape: []plans.Dim{{Name: "batch", Value: 1}}}
	if err := plans.Save(path, &plans.File{Trace: tr, Plan: p, Workload: w}); err != nil {
		fmt.Println(err)
		return
	}
	f, err := plans.Load(path)
	if err != nil {
		fmt.Println(err)
		return
	}
	batch, _ := f.Workload.Dim("batch")
	fmt.Printf("%s: %d buffers, arena %d, lower bound %d, offsets %v, batch %d\n",
		f.Trace.Name, len(f.Trace.Buffers), f.Plan.Arena, f.Plan.LowerBound, f.Plan.Offsets, batch)
	// Output:
	// step: 3 buffers, arena 1536, lower bound 1536, offsets [0 1024 0], batch 1
}

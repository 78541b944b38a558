package planner_test

import (
	"context"
	"fmt"

	"github.com/arenaplan/arenaplan/lifetime"
	"github.com/arenaplan/arenaplan/planner"
)

// Three operations in a row: a 1 MiB input feeds an activation; the input
// dies, and the output can reuse its memory.
func ExampleRun() {
	rec := lifetime.NewRecorder("mlp")
	in := rec.Alloc(1<<20, lifetime.Name("input"))
	act := rec.Alloc(4<<20, lifetime.Name("act"))
	rec.Free(in)
	rec.Tick()
	out := rec.Alloc(1<<20, lifetime.Name("output"))
	rec.Free(act)
	rec.Tick()
	rec.Free(out)
	tr := rec.Trace()

	for _, algo := range planner.Baselines {
		p, err := planner.Run(context.Background(), algo, tr, planner.Options{})
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("%s: arena %d, lower bound %d, offsets %v\n", p.Algo, p.Arena, p.LowerBound, p.Offsets)
	}
	// Output:
	// bestfit: arena 5242880, lower bound 5242880, offsets [0 1048576 0]
	// bysize: arena 5242880, lower bound 5242880, offsets [4194304 0 4194304]
}

// The auto planner on a trace written as a literal: with Workers 1 the
// search is deterministic, and here it proves its arena optimal (equal to
// the lower bound), which the baselines miss.
func ExampleRun_auto() {
	tr := &lifetime.Trace{Name: "toy"}
	for i, b := range [][3]int64{ // size in 256-byte units, start, end
		{3, 4, 7}, {2, 2, 4}, {1, 0, 2}, {3, 1, 3}, {3, 3, 6}, {3, 2, 4},
	} {
		tr.Buffers = append(tr.Buffers, lifetime.Buffer{ID: lifetime.ID(i), Size: b[0] * 256, Start: b[1], End: b[2]})
	}
	p, err := planner.Run(context.Background(), planner.Auto, tr, planner.Options{Workers: 1})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("auto: arena %d, lower bound %d, optimal %v\n", p.Arena, p.LowerBound, p.Optimal)
	for _, algo := range planner.Baselines {
		b, err := planner.Run(context.Background(), algo, tr, planner.Options{})
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("%s: arena %d\n", algo, b.Arena)
	}
	// Output:
	// auto: arena 2048, lower bound 2048, optimal true
	// bestfit: arena 2304
	// bysize: arena 2816
}

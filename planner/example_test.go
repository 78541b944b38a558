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

package workloads_test

import (
	"fmt"

	"github.com/arenaplan/arenaplan/workloads"
)

// A built-in workload is a graph like any other: its shape, its dry run,
// and the fingerprint a plan file records so that a plan is only used for
// the workload it was made for.
func ExampleBuild() {
	g, err := workloads.Build("mlp", workloads.Shape{Layers: 8, Width: 128, Batch: 4})
	if err != nil {
		fmt.Println(err)
		return
	}
	d, err := g.DryRun()
	if err != nil {
		fmt.Println(err)
		return
	}
	peak, _ := d.Trace.LowerBound(256)
	fmt.Printf("%s: %d kernels, %d buffers, lower bound %d bytes\n", g.Label(), len(g.Ops), len(d.Trace.Buffers), peak)
	fmt.Println("workloads:", workloads.Workloads())
	// Output:
	// mlp(layers=8,width=128,batch=4): 8 kernels, 25 buffers, lower bound 536576 bytes
	// workloads: [gpt2-decode mlp spill-demo]
}

package graph_test

import (
	"context"
	"fmt"

	"github.com/arenaplan/arenaplan/graph"
	"github.com/arenaplan/arenaplan/launch"
)

const ptx = `.version 8.0
.target sm_80
.address_size 64
.visible .entry double_it(.param .u64 out, .param .u64 in, .param .u32 n)
{
	ret;
}
`

// Four ops in a row: the dry run gives the input and the output the whole
// step and each intermediate the ops from its writer to its last reader,
// and the plan puts h3 where h1 was once nothing reads h1 any more. No
// device is involved.
func ExampleBuilder() {
	b := graph.NewBuilder("chain")
	b.Dim("n", 1024)
	b.Module([]byte(ptx))
	x := b.Tensor("x", graph.F32, graph.Input, 1024)
	h1 := b.Tensor("h1", graph.F32, graph.Intermediate, 1024)
	h2 := b.Tensor("h2", graph.F32, graph.Intermediate, 1024)
	h3 := b.Tensor("h3", graph.F32, graph.Intermediate, 1024)
	y := b.Tensor("y", graph.F32, graph.Output, 1024)
	for _, io := range [][2]*graph.Tensor{{h1, x}, {h2, h1}, {h3, h2}, {y, h3}} {
		b.Launch(graph.Launch{Kernel: "double_it", Grid: launch.D1(4), Block: launch.D1(256),
			Args: []graph.Arg{graph.Out(io[0]), graph.In(io[1]), graph.Scalar(launch.U32(1024))}})
	}
	g, err := b.Build()
	if err != nil {
		fmt.Println(err)
		return
	}
	d, err := g.DryRun()
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, buf := range d.Trace.Buffers {
		fmt.Printf("%s (%s): %d bytes, [%d, %d)\n", buf.Name, buf.Tag, buf.Size, buf.Start, buf.End)
	}
	p, err := graph.Plan(context.Background(), d.Trace, graph.PlanOptions{Workers: 1})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%s: arena %d, lower bound %d; h1 at %d, h3 at %d\n", g.Label(), p.Arena, p.LowerBound,
		p.Offsets[d.Tensor[h1.Index()]], p.Offsets[d.Tensor[h3.Index()]])
	// Output:
	// x (input): 4096 bytes, [0, 4)
	// y (output): 4096 bytes, [0, 4)
	// h1 (intermediate): 4096 bytes, [0, 2)
	// h2 (intermediate): 4096 bytes, [1, 3)
	// h3 (intermediate): 4096 bytes, [2, 4)
	// chain(n=1024): arena 16384, lower bound 16384; h1 at 8192, h3 at 8192
}

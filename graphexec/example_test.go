package graphexec_test

import (
	"bytes"
	"fmt"

	"github.com/arenaplan/arenaplan/cuda"
	"github.com/arenaplan/arenaplan/graph"
	"github.com/arenaplan/arenaplan/graphexec"
	"github.com/arenaplan/arenaplan/workloads"
)

// A small built-in mlp on the simulated device: the executor plans its dry
// run, runs a step eagerly, captures the step once and replays it; the
// replay writes the same output bits.
func ExampleNew() {
	g, err := workloads.Build("mlp", workloads.Shape{Layers: 4, Width: 64, Batch: 2})
	if err != nil {
		fmt.Println(err)
		return
	}
	dev, err := cuda.OpenSim(cuda.SizedSimConfig(workloads.SimKernels()))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer dev.Close()
	e, err := graphexec.New(dev, g, nil, graphexec.Options{Plan: graph.PlanOptions{Workers: 1}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer e.Close()
	y := g.TensorsWith(graph.Output)[0]
	if err := e.Init(); err != nil {
		fmt.Println(err)
		return
	}
	if err := e.Eager(0); err != nil {
		fmt.Println(err)
		return
	}
	eager, _ := e.Read(y)
	if _, err := e.Capture(); err != nil {
		fmt.Println(err)
		return
	}
	if err := e.Replay(0); err != nil {
		fmt.Println(err)
		return
	}
	replayed, _ := e.Read(y)
	_, nodes := e.Captured()
	fmt.Printf("%s: arena %d bytes (lower bound %d), %d kernels captured\n", g.Label(), e.Plan().Arena, e.Plan().LowerBound, nodes)
	fmt.Println("replay equals eager:", bytes.Equal(eager, replayed))
	// Output:
	// mlp(layers=4,width=64,batch=2): arena 68608 bytes (lower bound 68608), 4 kernels captured
	// replay equals eager: true
}

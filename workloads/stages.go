package workloads

import (
	"fmt"
	"math"

	"github.com/arenaplan/arenaplan/graph"
	"github.com/arenaplan/arenaplan/kernels"
)

// MLPStages builds the mlp workload split at the given layer boundaries
// into consecutive stages: stage k runs layers [cuts[k-1], cuts[k]) (from
// 0, to the last layer), reading the previous stage's output h<from> as
// an input and writing h<to> (y for the last) as its output. The weights
// and the first input are the mlp's own (same names, same seed), so the
// last stage's y equals the whole mlp's.
func MLPStages(s Shape, cuts ...int) ([]*graph.Graph, error) {
	return MLPStagesWith(s, EmbeddedKernels(), cuts...)
}

// MLPStagesWith is MLPStages with other kernels.
func MLPStagesWith(s Shape, kern Kernels, cuts ...int) ([]*graph.Graph, error) {
	w, err := Lookup("mlp")
	if err != nil {
		return nil, err
	}
	s = w.Resolve(s)
	L, W, B := s.Layers, s.Width, s.Batch
	switch {
	case L < 1 || L > 1<<16 || W < 4 || W%4 != 0 || W > 1<<16 || B < 1 || B > 1<<16:
		return nil, fmt.Errorf("workloads: mlp stages: shape layers=%d width=%d batch=%d out of range", L, W, B)
	}
	bounds := append([]int{0}, cuts...)
	bounds = append(bounds, L)
	for i := 1; i < len(bounds); i++ {
		if bounds[i] <= bounds[i-1] {
			return nil, fmt.Errorf("workloads: mlp stages: cuts %v must increase strictly inside (0, %d)", cuts, L)
		}
	}
	a := float32(math.Sqrt(6.5 / float64(W)))
	wd, bb := int64(W), int64(B)
	var graphs []*graph.Graph
	for k := 1; k < len(bounds); k++ {
		from, to := bounds[k-1], bounds[k]
		b := graph.NewBuilder("mlp-stage")
		b.Dim("layers", int64(L))
		b.Dim("width", wd)
		b.Dim("batch", bb)
		b.Dim("from", int64(from))
		b.Dim("to", int64(to))
		kern.module(b)
		var x *graph.Tensor
		if from == 0 {
			x = b.Tensor("x", graph.F32, graph.Input, bb, wd).SetInit(uniform(s.Seed, "x", 0, 1))
		} else {
			x = b.Tensor(fmt.Sprintf("h%d", from), graph.F32, graph.Input, bb, wd)
		}
		for i := from; i < to; i++ {
			p := fmt.Sprintf("l%d.", i)
			wt := b.Tensor(p+"w", graph.F32, graph.Weight, wd, wd).SetInit(uniform(s.Seed, p+"w", 0, a))
			bias := b.Tensor(p+"b", graph.F32, graph.Weight, wd).SetInit(uniform(s.Seed, p+"b", 0, 0.1))
			role, name := graph.Intermediate, fmt.Sprintf("h%d", i+1)
			if i == to-1 {
				role = graph.Output
				if i == L-1 {
					name = "y"
				}
			}
			y := b.Tensor(name, graph.F32, role, bb, wd)
			b.Launch(kern.linearLaunch(p+"linear+gelu", y, x, wt, bias, nil, nil, nil, W, W, B, kernels.ModeGELU))
			x = y
		}
		g, err := b.Build()
		if err != nil {
			return nil, err
		}
		graphs = append(graphs, g)
	}
	return graphs, nil
}

package workloads

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/arenaplan/arenaplan/graph"
	"github.com/arenaplan/arenaplan/kernels"
	"github.com/arenaplan/arenaplan/launch"
)

func init() {
	register(&Workload{
		Name: "spill-demo",
		Doc: "capture-time reuse of spillover memory: --iters times, a block from the spillover allocator " +
			"is written on the executor's stream, read on a side stream forked from it, freed, and the side " +
			"stream joins back (every --join-every iterations); one block of --width floats",
		Defaults: Shape{Iters: 100, JoinEvery: 1, Width: 65536},
		Dims:     []string{"iters", "join_every", "width"},
		build:    buildSpillDemo,
	})
}

const spillDemoBlock = 256 // threads per block of the demo's kernels

// buildSpillDemo builds the cross-stream pattern of PyTorch PR #158352's
// examples, K times in one step. Iteration i:
//
//	S:  [wait S2 when i%J == 0]  blk_i = alloc(S)  fill(blk_i ← x)
//	S2: wait S                   acc (+)= blk_i    RecordStream(blk_i, S2)  free(blk_i)
//
// blk_i is an unplanned tensor, so the spillover allocator serves it; its
// last use is on S2, so its free waits for S2's work. With capture-time
// reuse, the join before iteration i+J's allocation proves the blocks of
// earlier iterations free on S, and the capture holds about J blocks;
// without it every block waits for the end of the capture: K blocks.
// acc, the output, sums every block, so a block reused too early would
// change it.
func buildSpillDemo(s Shape, k Kernels) (*graph.Graph, error) {
	K, J, W := s.Iters, s.JoinEvery, s.Width
	switch {
	case K < 1 || K > 1<<16:
		return nil, fmt.Errorf("workloads: spill-demo: --iters %d: want 1..65536", K)
	case J < 1 || J > K:
		return nil, fmt.Errorf("workloads: spill-demo: --join-every %d: want 1..--iters (%d)", J, K)
	case W < 1 || W > 1<<28:
		return nil, fmt.Errorf("workloads: spill-demo: --width %d: want 1..2^28", W)
	}
	seed := s.Seed
	b := graph.NewBuilder("spill-demo")
	b.Dim("iters", int64(K))
	b.Dim("join_every", int64(J))
	b.Dim("width", int64(W))
	b.Module(k.SpillPTX)
	w := int64(W)
	x := b.Tensor("x", graph.F32, graph.Input, w).SetFeed(func(step int, dst []byte) {
		for i := 0; i+4 <= len(dst); i += 4 {
			r := splitmix(seed ^ uint64(step)<<32 ^ uint64(i))
			binary.LittleEndian.PutUint32(dst[i:], math.Float32bits(float32(r>>40)/(1<<24)-0.5))
		}
	})
	acc := b.Tensor("acc", graph.F32, graph.Output, w)
	grid := launch.D1(uint32((W + spillDemoBlock - 1) / spillDemoBlock))
	for i := 0; i < K; i++ {
		blk := b.Tensor(fmt.Sprintf("blk%d", i), graph.F32, graph.Intermediate, w).SetUnplanned()
		var join []int
		if i > 0 && i%J == 0 {
			join = []int{1}
		}
		b.Launch(graph.Launch{
			Name: fmt.Sprintf("it%d.fill", i), Kernel: kernels.SpillFill,
			Grid: grid, Block: launch.D1(spillDemoBlock), Stream: 0, Wait: join,
			Args: []graph.Arg{graph.Out(blk), graph.In(x), graph.Scalar(launch.U32(uint32(W))),
				graph.Scalar(launch.F32(float32(i + 1))), graph.Scalar(launch.F32(float32(i)))},
		})
		out, first := graph.InOut(acc), uint32(0)
		if i == 0 {
			out, first = graph.Out(acc), 1
		}
		b.Launch(graph.Launch{
			Name: fmt.Sprintf("it%d.accumulate", i), Kernel: kernels.SpillAccumulate,
			Grid: grid, Block: launch.D1(spillDemoBlock), Stream: 1, Wait: []int{0},
			Args: []graph.Arg{out, graph.In(blk), graph.Scalar(launch.U32(uint32(W))), graph.Scalar(launch.U32(first))},
		})
	}
	return b.Build()
}

package kernels

import (
	_ "embed"
	"fmt"

	"github.com/arenaplan/arenaplan/launch"
)

// SpillPTX is nvcc's PTX of spill.cu (compute_80, CUDA 13.0), the kernels
// of graphexec's spill-demo workload. It is a module of its own, beside PTX, so that either can be
// rebuilt alone.
//
//go:embed spill.ptx
var SpillPTX []byte

// Entry names of the kernels in SpillPTX.
const (
	SpillFill       = "spill_fill"
	SpillAccumulate = "spill_accumulate"
)

// SpillReference returns the Go references of SpillPTX's entries, by
// entry name, for cuda.SimConfig.Kernels. Each call returns a new map.
// Unlike Reference's, they compute the CUDA kernels' bits exactly.
func SpillReference() map[string]launch.KernelFunc {
	return map[string]launch.KernelFunc{
		SpillFill:       spillFill,
		SpillAccumulate: spillAccumulate,
	}
}

// spillN is how many elements a one-dimensional launch covers, capped at n.
func spillN(grid, block launch.Dim3, n uint32) uint64 {
	return min(grid.Count()*block.Count(), uint64(n))
}

// spillFill: blk[i] = x[i]*a + b, product and sum rounded separately.
func spillFill(mem launch.SimMemory, grid, block launch.Dim3, args []launch.KernelArg) error {
	if err := want(args, ptr, ptr, u32, f32, f32); err != nil {
		return fmt.Errorf("spill_fill: %w", err)
	}
	n := spillN(grid, block, args[2].AsU32())
	blk, err := f32s(mem, args[0].AsPtr(), n)
	if err != nil {
		return fmt.Errorf("spill_fill: blk: %w", err)
	}
	x, err := f32s(mem, args[1].AsPtr(), n)
	if err != nil {
		return fmt.Errorf("spill_fill: x: %w", err)
	}
	a, b := args[3].AsF32(), args[4].AsF32()
	for i := range blk {
		p := float32(x[i] * a)
		blk[i] = float32(p + b)
	}
	return nil
}

// spillAccumulate: acc[i] = blk[i] if first, else acc[i] + blk[i].
func spillAccumulate(mem launch.SimMemory, grid, block launch.Dim3, args []launch.KernelArg) error {
	if err := want(args, ptr, ptr, u32, u32); err != nil {
		return fmt.Errorf("spill_accumulate: %w", err)
	}
	n := spillN(grid, block, args[2].AsU32())
	acc, err := f32s(mem, args[0].AsPtr(), n)
	if err != nil {
		return fmt.Errorf("spill_accumulate: acc: %w", err)
	}
	blk, err := f32s(mem, args[1].AsPtr(), n)
	if err != nil {
		return fmt.Errorf("spill_accumulate: blk: %w", err)
	}
	first := args[3].AsU32() != 0
	for i := range acc {
		if first {
			acc[i] = blk[i]
		} else {
			acc[i] = float32(acc[i] + blk[i])
		}
	}
	return nil
}

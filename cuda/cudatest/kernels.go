package cudatest

import (
	_ "embed"
	"encoding/binary"
	"math"

	"github.com/arenaplan/arenaplan/cuda"
)

// PTX is the suite's hand-written module: fill_u32 and saxpy, for sm_52
// and later, PTX ISA 7.0.
//
//go:embed kernels.ptx
var PTX []byte

// Kernels returns the Go references of the kernels in PTX, for
// cuda.SimConfig.Kernels.
func Kernels() map[string]cuda.KernelFunc {
	return map[string]cuda.KernelFunc{
		"fill_u32": fillU32,
		"saxpy":    saxpy,
	}
}

// threads is how many indices a one-dimensional launch covers, capped at n.
func threads(grid, block cuda.Dim3, n uint32) uint64 {
	return min(uint64(grid.X)*uint64(block.X), uint64(n))
}

func fillU32(mem cuda.SimMemory, grid, block cuda.Dim3, args []cuda.KernelArg) error {
	dst, value, n := args[0].AsPtr(), args[1].AsU32(), args[2].AsU32()
	count := threads(grid, block, n)
	b, err := mem.Bytes(dst, 4*count)
	if err != nil {
		return err
	}
	for i := uint64(0); i < count; i++ {
		binary.LittleEndian.PutUint32(b[4*i:], value)
	}
	return nil
}

func saxpy(mem cuda.SimMemory, grid, block cuda.Dim3, args []cuda.KernelArg) error {
	yp, xp, a, n := args[0].AsPtr(), args[1].AsPtr(), args[2].AsF32(), args[3].AsU32()
	count := threads(grid, block, n)
	y, err := mem.Bytes(yp, 4*count)
	if err != nil {
		return err
	}
	x, err := mem.Bytes(xp, 4*count)
	if err != nil {
		return err
	}
	for i := uint64(0); i < count; i++ {
		xv := math.Float32frombits(binary.LittleEndian.Uint32(x[4*i:]))
		yv := math.Float32frombits(binary.LittleEndian.Uint32(y[4*i:]))
		binary.LittleEndian.PutUint32(y[4*i:], math.Float32bits(SaxpyRef(a, xv, yv)))
	}
	return nil
}

// SaxpyRef is one element of saxpy: the product and the sum each rounded
// to float32, as mul.rn.f32 and add.rn.f32 do.
func SaxpyRef(a, x, y float32) float32 {
	p := float32(a * x)
	return float32(p + y)
}

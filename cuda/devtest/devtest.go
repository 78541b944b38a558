// Package devtest is the device that the tests of arena and spill run on:
// the simulated device, or the CUDA driver where cuda.Open(0) succeeds,
// with one hand-written kernel (arena_add_u32, kernels.ptx) and its Go
// reference for the simulation. It is for tests only.
package devtest

import (
	_ "embed"
	"encoding/binary"
	"testing"

	"github.com/arenaplan/arenaplan/cuda"
)

//go:embed kernels.ptx
var testPTX []byte

// addU32 is the Go reference of arena_add_u32: dst[i] = src[i] + add.
func addU32(mem cuda.SimMemory, grid, block cuda.Dim3, args []cuda.KernelArg) error {
	dst, src, add, n := args[0].AsPtr(), args[1].AsPtr(), args[2].AsU32(), args[3].AsU32()
	count := min(uint64(grid.X)*uint64(block.X), uint64(n))
	d, err := mem.Bytes(dst, 4*count)
	if err != nil {
		return err
	}
	s, err := mem.Bytes(src, 4*count)
	if err != nil {
		return err
	}
	for i := uint64(0); i < count; i++ {
		binary.LittleEndian.PutUint32(d[4*i:], binary.LittleEndian.Uint32(s[4*i:])+add)
	}
	return nil
}

// Env is one device under test: the simulation or the driver.
type Env struct {
	Dev cuda.Device
	Sim *cuda.Sim // nil on the driver
	Mod cuda.Module
	Add cuda.Function
}

// NewSim opens a simulated device of total bytes, closed when t ends.
func NewSim(t testing.TB, total uint64) *Env {
	t.Helper()
	sim, err := cuda.OpenSim(cuda.SimConfig{TotalMemory: total,
		Kernels: map[string]cuda.KernelFunc{"arena_add_u32": addU32}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	e := &Env{Dev: sim, Sim: sim}
	e.load(t)
	return e
}

func (e *Env) load(t testing.TB) {
	t.Helper()
	m, err := e.Dev.LoadModule(testPTX)
	if err != nil {
		t.Fatal(err)
	}
	f, err := m.Function("arena_add_u32")
	if err != nil {
		t.Fatal(err)
	}
	e.Mod, e.Add = m, f
}

// LaunchAdd enqueues dst[i] = src[i] + add for n words on s.
func (e *Env) LaunchAdd(s cuda.Stream, dst, src cuda.DevicePtr, add, n uint32) error {
	const block = 256
	grid := (n + block - 1) / block
	return e.Dev.Launch(e.Add, cuda.D1(grid), cuda.D1(block), 0, s,
		cuda.Ptr(dst), cuda.Ptr(src), cuda.U32(add), cuda.U32(n))
}

// Free returns the device's free memory.
func (e *Env) Free(t testing.TB) uint64 {
	t.Helper()
	free, _, err := e.Dev.MemGetInfo()
	if err != nil {
		t.Fatal(err)
	}
	return free
}

// Stream returns a new stream, closed when t ends.
func (e *Env) Stream(t testing.TB) cuda.Stream {
	t.Helper()
	s, err := e.Dev.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

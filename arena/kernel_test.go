package arena

import (
	_ "embed"
	"encoding/binary"
	"testing"

	"github.com/arenaplan/arenaplan/cuda"
)

//go:embed testdata/kernels.ptx
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

// env is one device under test: the simulation or the driver.
type env struct {
	dev cuda.Device
	sim *cuda.Sim // nil on the driver
	mod cuda.Module
	add cuda.Function
}

func newSimEnv(t testing.TB, total uint64) *env {
	t.Helper()
	sim, err := cuda.OpenSim(cuda.SimConfig{TotalMemory: total,
		Kernels: map[string]cuda.KernelFunc{"arena_add_u32": addU32}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	e := &env{dev: sim, sim: sim}
	e.load(t)
	return e
}

func (e *env) load(t testing.TB) {
	t.Helper()
	m, err := e.dev.LoadModule(testPTX)
	if err != nil {
		t.Fatal(err)
	}
	f, err := m.Function("arena_add_u32")
	if err != nil {
		t.Fatal(err)
	}
	e.mod, e.add = m, f
}

// launchAdd enqueues dst[i] = src[i] + add for n words on s.
func (e *env) launchAdd(s cuda.Stream, dst, src cuda.DevicePtr, add, n uint32) error {
	const block = 256
	grid := (n + block - 1) / block
	return e.dev.Launch(e.add, cuda.D1(grid), cuda.D1(block), 0, s,
		cuda.Ptr(dst), cuda.Ptr(src), cuda.U32(add), cuda.U32(n))
}

func (e *env) free(t testing.TB) uint64 {
	t.Helper()
	free, _, err := e.dev.MemGetInfo()
	if err != nil {
		t.Fatal(err)
	}
	return free
}

func (e *env) stream(t testing.TB) cuda.Stream {
	t.Helper()
	s, err := e.dev.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

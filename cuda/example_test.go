package cuda_test

import (
	"encoding/binary"
	"fmt"

	"github.com/arenaplan/arenaplan/cuda"
)

// scalePTX declares one entry; the simulated device runs its Go reference.
const scalePTX = `.version 8.0
.target sm_80
.address_size 64
.visible .entry scale(.param .u64 p, .param .u32 n, .param .u32 k)
{
	ret;
}
`

// scale multiplies n uint32s at p by k, as the PTX's kernel would.
func scale(mem cuda.SimMemory, grid, block cuda.Dim3, args []cuda.KernelArg) error {
	n := uint64(args[1].AsU32())
	b, err := mem.Bytes(args[0].AsPtr(), 4*n)
	if err != nil {
		return err
	}
	for i := uint64(0); i < n; i++ {
		binary.LittleEndian.PutUint32(b[4*i:], binary.LittleEndian.Uint32(b[4*i:])*args[2].AsU32())
	}
	return nil
}

// The simulated device, sized to this host: memory, a module whose kernel
// is a Go function, a launch, and the same launch captured into a graph
// and replayed twice.
func Example_sim() {
	dev, err := cuda.OpenSim(cuda.SizedSimConfig(map[string]cuda.KernelFunc{"scale": scale}))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer dev.Close()
	m, err := dev.LoadModule([]byte(scalePTX))
	if err != nil {
		fmt.Println(err)
		return
	}
	fn, _ := m.Function("scale")
	st, _ := dev.NewStream()
	p, _ := dev.Alloc(16)
	in := make([]byte, 16)
	for i := range 4 {
		binary.LittleEndian.PutUint32(in[4*i:], uint32(i+1))
	}
	_ = dev.CopyHtoD(p, in)
	if err := dev.Launch(fn, cuda.D1(1), cuda.D1(4), 0, st, cuda.Ptr(p), cuda.U32(4), cuda.U32(10)); err != nil {
		fmt.Println(err)
		return
	}
	if err := dev.BeginCapture(st, cuda.CaptureModeGlobal); err != nil {
		fmt.Println(err)
		return
	}
	_ = dev.Launch(fn, cuda.D1(1), cuda.D1(4), 0, st, cuda.Ptr(p), cuda.U32(4), cuda.U32(2))
	g, err := dev.EndCapture(st)
	if err != nil {
		fmt.Println(err)
		return
	}
	exec, err := g.Instantiate(0)
	if err != nil {
		fmt.Println(err)
		return
	}
	for range 2 {
		_ = exec.Launch(st)
	}
	_ = st.Synchronize()
	out := make([]byte, 16)
	_ = dev.CopyDtoH(out, p)
	for i := range 4 {
		fmt.Print(binary.LittleEndian.Uint32(out[4*i:]), " ")
	}
	fmt.Println()
	// Output:
	// 40 80 120 160
}

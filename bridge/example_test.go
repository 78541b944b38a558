package bridge_test

import (
	"fmt"

	"github.com/arenaplan/arenaplan/bridge"
)

// A step recorded once, planned at the lower bound and served from its
// arena: the second run gets the first served run's addresses.
func Example() {
	b := bridge.New(bridge.Config{Sim: true, SimMemory: 1 << 30, SpillAddressSpace: 64 << 20})
	defer b.Close()
	const stream = 0x10 // a CUstream handle, as PyTorch passes it
	run := func() []uint64 {
		var got []uint64
		x, _ := b.Alloc(1<<20, 0, stream)
		y, _ := b.Alloc(1<<20, 0, stream)
		b.Free(x, 0)
		z, _ := b.Alloc(1<<20, 0, stream) // may take x's place
		b.Free(y, 0)
		b.Free(z, 0)
		got = append(got, uint64(x), uint64(y), uint64(z))
		return got
	}
	s, _ := b.NewStep(0, "example")
	s.Record(stream)
	run()
	s.End(false)
	if err := s.Plan(0); err != nil {
		fmt.Println(err)
		return
	}
	var runs [][]uint64
	for range 2 {
		s.Serve(stream, true)
		runs = append(runs, run())
		s.End(false)
	}
	r := s.Report()
	fmt.Printf("arena %d B, lower bound %d B, divergences %d\n", r.Arena, r.LowerBound, r.Divergences)
	fmt.Println("same addresses:", fmt.Sprint(runs[0]) == fmt.Sprint(runs[1]), "z reuses x:", runs[0][2] == runs[0][0])
	// Output:
	// arena 2097152 B, lower bound 2097152 B, divergences 0
	// same addresses: true z reuses x: true
}

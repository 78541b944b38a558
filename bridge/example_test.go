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

// Two batch sizes of one step in one arena, then a pause and a resume:
// the family's arena is the larger member's; the pause gives back the
// weights region (backed up) and the graphs' arena, keeping their
// addresses for the resume.
func ExampleFamily() {
	b := bridge.New(bridge.Config{Sim: true, SimMemory: 1 << 30, SpillAddressSpace: 64 << 20,
		ThreadID: func() int { return 1 }})
	defer b.Close()
	const stream = 0x10
	b.BeginRegion(0, 1, "weights", true)
	b.Alloc(4<<20, 0, stream)
	b.EndRegion(0, 1)

	step := func(batch uint64) {
		x, _ := b.Alloc(batch<<20, 0, stream)
		y, _ := b.Alloc(batch<<20, 0, stream)
		b.Free(x, 0)
		b.Free(y, 0)
	}
	f, _ := b.NewFamily(0, "decode")
	for _, batch := range []uint64{4, 1} {
		m, _ := f.NewMember(fmt.Sprint(batch))
		m.Record(stream)
		step(batch)
		m.End(false)
	}
	if err := f.Plan(0); err != nil {
		fmt.Println(err)
		return
	}
	r := f.Report()
	fmt.Printf("family arena %d MiB for members needing %d and %d MiB\n", r.Arena>>20, r.Members[0].LowerBound>>20, r.Members[1].LowerBound>>20)

	if err := b.Pause(0); err != nil {
		fmt.Println(err)
		return
	}
	paused, _ := b.Paused(0)
	st, _ := b.Stats(0)
	fmt.Printf("paused %v: region memory released %d MiB, arena mapped %d MiB\n", paused, st.Spill.Paused>>20, st.ArenaMapped>>20)
	if err := b.Resume(0); err != nil {
		fmt.Println(err)
		return
	}
	st, _ = b.Stats(0)
	fmt.Printf("resumed: released %d MiB, arena mapped %d MiB\n", st.Spill.Paused>>20, st.ArenaMapped>>20)
	// Output:
	// family arena 8 MiB for members needing 8 and 2 MiB
	// paused [graphs weights]: region memory released 4 MiB, arena mapped 0 MiB
	// resumed: released 0 MiB, arena mapped 8 MiB
}

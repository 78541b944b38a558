package spill_test

import (
	"errors"
	"fmt"

	"github.com/arenaplan/arenaplan/cuda"
	"github.com/arenaplan/arenaplan/spill"
)

// Blocks on the simulated device (2 MiB chunks): a freed block is cached and serves the
// next request of its size on its stream without mapping more memory; a
// request the limit cannot serve fails with ErrOutOfMemory, and
// EmptyCache gives what is cached back to the device.
func ExampleNew() {
	dev, err := cuda.OpenSim(cuda.SizedSimConfig(nil))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer dev.Close()
	const MiB = 1 << 20
	s, err := spill.New(dev, spill.WithAddressSpace(1<<30), spill.WithLimit(64*MiB))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer s.Close()
	st, err := dev.NewStream()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer st.Close()

	a, _ := s.Alloc(3*MiB, st)
	fmt.Printf("3 MiB asked, %d MiB mapped (of a segment that requests of up to 10 MiB share)\n", s.Stats().Mapped/MiB)
	_ = s.Free(a)
	b, _ := s.Alloc(3*MiB, st)
	fmt.Printf("same block again: %v\n", a == b)
	_, err = s.Alloc(100*MiB, st)
	fmt.Printf("100 MiB under a 64 MiB limit: out of memory %v\n", errors.Is(err, spill.ErrOutOfMemory))
	_ = s.Free(b)
	stats := s.Stats()
	fmt.Printf("in use %d MiB, cached %d MiB, segments %d\n", stats.InUse/MiB, stats.Cached/MiB, stats.Segments)
	_ = s.EmptyCache()
	fmt.Printf("after EmptyCache: mapped %d MiB\n", s.Stats().Mapped/MiB)
	// Output:
	// 3 MiB asked, 4 MiB mapped (of a segment that requests of up to 10 MiB share)
	// same block again: true
	// 100 MiB under a 64 MiB limit: out of memory true
	// in use 0 MiB, cached 4 MiB, segments 1
	// after EmptyCache: mapped 0 MiB
}

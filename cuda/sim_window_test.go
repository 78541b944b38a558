package cuda

import "testing"

// TestSimDevicesHaveDisjointAddresses: two simulated devices open in one
// process never hand out the same address (unified addressing).
func TestSimDevicesHaveDisjointAddresses(t *testing.T) {
	open := func() *Sim {
		s, err := OpenSim(SimConfig{Guest: true, TotalMemory: 64 << 20})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	a, b := open(), open()
	defer b.Close()
	pa, err := a.Alloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	pb, err := b.Alloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	if lo, hi := min(pa, pb), max(pa, pb); hi-lo < 1<<40 {
		t.Fatalf("devices' allocations at %#x and %#x: want them in windows far apart", uint64(pa), uint64(pb))
	}
	a.Close()
}

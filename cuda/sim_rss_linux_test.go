//go:build linux

package cuda_test

import (
	"bytes"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"

	"github.com/arenaplan/arenaplan/cuda"
)

// rss returns the resident memory of this process (statm, in bytes).
func rss(t *testing.T) uint64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		t.Skip(err)
	}
	f := strings.Fields(string(b))
	pages, err := strconv.ParseUint(f[1], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return pages * uint64(os.Getpagesize())
}

// TestSimResidentMemory checks what the process really holds, not what the
// simulation says it holds: mapping 128 MiB in 64 handles one after
// another, writing each, costs about 128 MiB, and unmapping and releasing
// them gives it back. The old simulation reached several times the mapped
// bytes (a new backing for the whole reservation at each MemMap) and kept
// the backing after everything was unmapped.
func TestSimResidentMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("maps 128 MiB")
	}
	const g = 2 << 20
	const slots = 64
	sim, err := cuda.OpenSim(cuda.SimConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	page := bytes.Repeat([]byte{0x5a}, g)
	debug.FreeOSMemory()
	base := rss(t)
	const slack = 24 << 20 // the test's own garbage, the runtime
	va, err := sim.AddressReserve(slots*g, 0)
	if err != nil {
		t.Fatal(err)
	}
	v := simVMM{t, sim, g, va}
	hs := make([]cuda.MemHandle, slots)
	var peak uint64
	for i := range hs {
		hs[i] = v.create()
		v.mapAt(i, hs[i])
		v.write(i, page)
		peak = max(peak, rss(t))
	}
	mapped := uint64(slots * g)
	if grew := peak - min(peak, base); grew > mapped+mapped/5+slack {
		t.Errorf("mapping %d MiB: the process grew by %d MiB", mapped>>20, grew>>20)
	}
	for i := range hs {
		v.unmap(i)
		if err := sim.MemRelease(hs[i]); err != nil {
			t.Fatal(err)
		}
	}
	debug.FreeOSMemory()
	if now := rss(t); now > base+slack {
		t.Errorf("everything unmapped and released (the addresses still reserved): the process still holds %d MiB more than before", (now-base)>>20)
	}
	if err := sim.AddressFree(va, slots*g); err != nil {
		t.Fatal(err)
	}
}

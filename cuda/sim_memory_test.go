package cuda_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/arenaplan/arenaplan/cuda"
)

// simVMM maps handles of the granularity into one reservation.
type simVMM struct {
	t   *testing.T
	sim *cuda.Sim
	g   uint64
	va  cuda.DevicePtr
}

func (v simVMM) create() cuda.MemHandle {
	v.t.Helper()
	h, err := v.sim.MemCreate(v.g)
	if err != nil {
		v.t.Fatal(err)
	}
	return h
}

func (v simVMM) mapAt(slot int, h cuda.MemHandle) {
	v.t.Helper()
	p := v.va.Add(uint64(slot) * v.g)
	if err := v.sim.MemMap(p, v.g, h); err != nil {
		v.t.Fatalf("MemMap at slot %d: %v", slot, err)
	}
	if err := v.sim.MemSetAccess(p, v.g); err != nil {
		v.t.Fatal(err)
	}
}

func (v simVMM) unmap(slot int) {
	v.t.Helper()
	if err := v.sim.MemUnmap(v.va.Add(uint64(slot)*v.g), v.g); err != nil {
		v.t.Fatalf("MemUnmap at slot %d: %v", slot, err)
	}
}

func (v simVMM) write(slot int, b []byte) {
	v.t.Helper()
	if err := v.sim.CopyHtoD(v.va.Add(uint64(slot)*v.g), b); err != nil {
		v.t.Fatal(err)
	}
}

func (v simVMM) read(slot int, n int) []byte {
	v.t.Helper()
	b := make([]byte, n)
	if err := v.sim.CopyDtoH(b, v.va.Add(uint64(slot)*v.g)); err != nil {
		v.t.Fatal(err)
	}
	return b
}

// TestSimHostMemoryBounded maps, writes, unmaps and releases many handles
// in one reservation, in the order an arena and a spillover allocator do,
// and checks the simulation's own count of the host memory it holds stays
// within what is mapped (or held by handles not released) plus a little;
// the old simulation copied the whole reservation at each MemMap and kept
// unmapped memory.
func TestSimHostMemoryBounded(t *testing.T) {
	const g = 64 << 10
	sim, err := cuda.OpenSim(cuda.SimConfig{Granularity: g})
	if err != nil {
		t.Fatal(err)
	}
	const slots = 256
	va, err := sim.AddressReserve(slots*g, 0)
	if err != nil {
		t.Fatal(err)
	}
	v := simVMM{t, sim, g, va}
	check := func(when string, held uint64) {
		t.Helper()
		if got, max := sim.HostBytes(), held+held/5+64<<10; got > max {
			t.Fatalf("%s: the simulation holds %d bytes of host memory for %d bytes of memory, more than %d", when, got, held, max)
		}
	}
	page := bytes.Repeat([]byte{0xa5}, g)

	// Grow: one handle after another, each written in full.
	hs := make([]cuda.MemHandle, slots)
	for i := range hs {
		hs[i] = v.create()
		if i == 0 && sim.HostBytes() != 0 {
			t.Fatalf("a handle never mapped takes %d bytes of host memory", sim.HostBytes())
		}
		v.mapAt(i, hs[i])
		v.write(i, page)
		check("growing", uint64(i+1)*g)
	}
	// Pause: unmap and release each handle.
	for i := range hs {
		v.unmap(i)
		if err := sim.MemRelease(hs[i]); err != nil {
			t.Fatal(err)
		}
		check("releasing", uint64(slots-i-1)*g)
	}
	if n := sim.HostBytes(); n != 0 {
		t.Fatalf("everything released, %d bytes of host memory held", n)
	}
	// Churn: a spillover allocator's segments come and go at changing
	// places; at most 8 are mapped at once.
	live := map[int]cuda.MemHandle{}
	for i := 0; i < 4*slots; i++ {
		slot := (i * 37) % slots
		if h, ok := live[slot]; ok {
			v.unmap(slot)
			if err := sim.MemRelease(h); err != nil {
				t.Fatal(err)
			}
			delete(live, slot)
		} else if len(live) < 8 {
			live[slot] = v.create()
			v.mapAt(slot, live[slot])
			v.write(slot, page)
		}
		check("churning", uint64(len(live))*g)
	}
	for slot, h := range live {
		v.unmap(slot)
		sim.MemRelease(h)
	}
	if n := sim.HostBytes(); n != 0 {
		t.Fatalf("after churning, %d bytes of host memory held", n)
	}
	// Close gives back everything, mapped or not.
	h := v.create()
	v.mapAt(0, h)
	v.write(0, page)
	if _, err := sim.PinnedAlloc(g); err != nil {
		t.Fatal(err)
	}
	if _, err := sim.Alloc(g); err != nil {
		t.Fatal(err)
	}
	check("before closing", 3*g)
	if err := sim.Close(); err != nil {
		t.Fatal(err)
	}
	if n := sim.HostBytes(); n != 0 {
		t.Fatalf("closed, %d bytes of host memory held", n)
	}
}

// TestSimUnmappedHandlesKeepTheirBytes: a handle unmapped without release
// keeps its bytes wherever it is mapped next: in place, elsewhere, after
// another handle took its old place, after its reservation was freed.
func TestSimUnmappedHandlesKeepTheirBytes(t *testing.T) {
	const g = 64 << 10
	sim, err := cuda.OpenSim(cuda.SimConfig{Granularity: g})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	va, err := sim.AddressReserve(4*g, 0)
	if err != nil {
		t.Fatal(err)
	}
	v := simVMM{t, sim, g, va}
	pat := func(b byte) []byte { return bytes.Repeat([]byte{b}, g) }
	a, b, c := v.create(), v.create(), v.create()
	v.mapAt(0, a)
	v.write(0, pat(1))
	v.mapAt(1, b)
	v.write(1, pat(2))
	v.unmap(0)
	v.unmap(1)
	if got := sim.HostBytes(); got != 2*g {
		t.Errorf("two unmapped handles with bytes: %d bytes of host memory, want %d", got, 2*g)
	}
	// a back in place; b elsewhere.
	v.mapAt(0, a)
	v.mapAt(2, b)
	if !bytes.Equal(v.read(0, g), pat(1)) || !bytes.Equal(v.read(2, g), pat(2)) {
		t.Fatal("bytes lost across unmap and map")
	}
	// The old place of b reads zero to a new handle.
	v.mapAt(1, c)
	if !bytes.Equal(v.read(1, g), make([]byte, g)) {
		t.Fatal("a new handle does not read zero")
	}
	// c takes the place of a while a is unmapped.
	v.unmap(0)
	v.unmap(1)
	v.mapAt(0, c)
	if !bytes.Equal(v.read(0, g), make([]byte, g)) {
		t.Fatal("c mapped over a's old place does not read zero")
	}
	v.mapAt(1, a)
	if !bytes.Equal(v.read(1, g), pat(1)) {
		t.Fatal("a lost its bytes when c took its place")
	}
	// b outlives its reservation.
	v.unmap(0)
	v.unmap(1)
	v.unmap(2)
	if err := sim.AddressFree(va, 4*g); err != nil {
		t.Fatal(err)
	}
	va2, err := sim.AddressReserve(2*g, 0)
	if err != nil {
		t.Fatal(err)
	}
	v.va = va2
	v.mapAt(1, b)
	if !bytes.Equal(v.read(1, g), pat(2)) {
		t.Fatal("b lost its bytes when its reservation was freed")
	}
	v.unmap(1)
	for _, h := range []cuda.MemHandle{a, b, c} {
		if err := sim.MemRelease(h); err != nil {
			t.Fatal(err)
		}
	}
	if n := sim.HostBytes(); n != 0 {
		t.Fatalf("everything released, %d bytes of host memory held", n)
	}
}

// TestSimLimitCountsPinned: pinned memory is host memory the process uses,
// as is the simulated device memory, so pinning stays within the simulated
// device's limit (MemGetInfo reports device memory only, as the driver
// does, and device allocations draw from that).
func TestSimLimitCountsPinned(t *testing.T) {
	const g = 1 << 20
	sim, err := cuda.OpenSim(cuda.SimConfig{TotalMemory: 8 * g, Granularity: g})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	h, err := sim.MemCreate(4 * g)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sim.PinnedAlloc(5 * g); !errors.Is(err, cuda.ErrorOutOfMemory) {
		t.Errorf("PinnedAlloc of 5 MiB with 4 of 8 MiB taken by device memory: %v", err)
	}
	pin, err := sim.PinnedAlloc(3 * g)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sim.PinnedAlloc(2 * g); !errors.Is(err, cuda.ErrorOutOfMemory) {
		t.Errorf("PinnedAlloc of 2 MiB with 7 of 8 MiB taken: %v", err)
	}
	if free, _, _ := sim.MemGetInfo(); free != 4*g {
		t.Errorf("device memory free: %d, want 4 MiB (pinned memory is not device memory)", free)
	}
	if err := sim.PinnedFree(pin); err != nil {
		t.Fatal(err)
	}
	if err := sim.MemRelease(h); err != nil {
		t.Fatal(err)
	}
	pin, err = sim.PinnedAlloc(8 * g)
	if err != nil {
		t.Fatal(err)
	}
	sim.PinnedFree(pin)
}

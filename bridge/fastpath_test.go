package bridge

import (
	"errors"
	"testing"

	"github.com/arenaplan/arenaplan/spill"
)

// TestFastPathRules: a caller may keep a freed block and hand it out again
// (the C library's fast path) only for blocks of the spill allocator's
// default pool and 0-byte requests' tokens, and only while no capture is
// underway as the host counts them, no step runs and no region is open.
func TestFastPathRules(t *testing.T) {
	tid := 7
	b := New(Config{Sim: true, SimMemory: 1 << 30, SpillAddressSpace: 256 << 20, ThreadID: func() int { return tid }})
	t.Cleanup(func() { b.Close() })
	mustKeep := func(size uint64, stream uintptr, want bool, what string) {
		t.Helper()
		p, keep, err := b.AllocCacheable(size, 0, stream, true)
		if err != nil {
			t.Fatal(err)
		}
		if keep != want {
			t.Fatalf("%s: keepable %v, want %v", what, keep, want)
		}
		if err := b.Free(p, 0); err != nil {
			t.Fatal(err)
		}
	}
	allowed := func(want bool, what string) {
		t.Helper()
		if got := b.FastPathAllowed(); got != want {
			t.Fatalf("%s: FastPathAllowed %v, want %v", what, got, want)
		}
	}
	allowed(false, "before the host counts captures")
	b.CapturesUnderway(0)
	allowed(true, "no capture, step or region")
	mustKeep(4096, 0x10, true, "a default-pool block")
	mustKeep(0, 0x10, true, "a 0-byte request's token")

	s, err := b.NewStep(0, "fp")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Record(0x20); err != nil {
		t.Fatal(err)
	}
	allowed(false, "a step recording")
	mustKeep(4096, 0x20, false, "the step's allocation")
	mustKeep(4096, 0x21, true, "another stream's allocation while a step runs")
	mustKeep(0, 0x20, true, "a 0-byte request's token while a step runs")
	if err := s.End(false); err != nil {
		t.Fatal(err)
	}
	allowed(true, "after the step")

	if err := b.BeginRegion(0, tid, "weights", true); err != nil {
		t.Fatal(err)
	}
	allowed(false, "a region open")
	mustKeep(4096, 0x10, false, "a region's allocation")
	if err := b.EndRegion(0, tid); err != nil {
		t.Fatal(err)
	}
	allowed(true, "after the region")

	b.CapturesUnderway(1)
	allowed(false, "a capture underway")
	b.CapturesUnderway(0)
	allowed(true, "after the capture")
}

// TestAllocCacheableWithoutGrowing: told not to grow, AllocCacheable
// serves from mapped memory or says spill.ErrWouldGrow, counting no
// allocation and no out-of-memory.
func TestAllocCacheableWithoutGrowing(t *testing.T) {
	b := New(Config{Sim: true, SimMemory: 1 << 30, SpillAddressSpace: 256 << 20})
	t.Cleanup(func() { b.Close() })
	p, _, err := b.AllocCacheable(1<<20, 0, 0x10, true)
	if err != nil {
		t.Fatal(err)
	}
	before, err := b.Stats(0)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.AllocCacheable(1<<20, 0, 0x10, false); err != nil {
		t.Fatalf("1 MiB in the mapped segment's rest: %v", err)
	}
	if _, _, err := b.AllocCacheable(1<<20, 0, 0x10, false); !errors.Is(err, spill.ErrWouldGrow) || errors.Is(err, spill.ErrOutOfMemory) {
		t.Fatalf("a third 1 MiB without growing: %v, want spill.ErrWouldGrow", err)
	}
	after, err := b.Stats(0)
	if err != nil {
		t.Fatal(err)
	}
	if after.Allocs != before.Allocs+1 || after.Spill.Mapped != before.Spill.Mapped {
		t.Fatalf("allocations %d -> %d, mapped %d -> %d: want one more allocation and nothing mapped",
			before.Allocs, after.Allocs, before.Spill.Mapped, after.Spill.Mapped)
	}
	if err := b.Free(p, 0); err != nil {
		t.Fatal(err)
	}
}

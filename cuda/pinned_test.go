package cuda_test

import (
	"fmt"
	"os"
	"testing"
	"time"
)

// TestGPUPinnedCopy times 1 GiB copies between the device and pageable or
// page-locked host memory, and the cost of pinning itself, on GPU 0 (it
// skips without a driver), checking that a pattern written into pinned
// memory comes back through the device into both. It prints one PINNED
// line for docs/TESTING.md.
func TestGPUPinnedCopy(t *testing.T) {
	d := openDriver(t)
	defer d.Close()
	const size = 1 << 30
	p, err := d.Alloc(size)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free(p)
	ms := func(f func() error) float64 {
		t.Helper()
		start := time.Now()
		if err := f(); err != nil {
			t.Fatal(err)
		}
		return float64(time.Since(start).Microseconds()) / 1000
	}
	var pinned []byte
	alloc := ms(func() (err error) { pinned, err = d.PinnedAlloc(size); return })
	for i := 0; i < size; i += 4096 {
		pinned[i] = byte(i>>12) | 1
	}
	htodPinned := ms(func() error { return d.CopyHtoD(p, pinned) })
	dtohPinned := ms(func() error { return d.CopyDtoH(pinned, p) })
	var pageable []byte
	dtohFresh := ms(func() error { pageable = make([]byte, size); return d.CopyDtoH(pageable, p) })
	// Both copies of the device bytes hold the pattern written first.
	for i := 0; i < size; i += 4096 {
		if want := byte(i>>12) | 1; pinned[i] != want || pageable[i] != want {
			t.Fatalf("byte %d: pinned %d, pageable %d, want %d", i, pinned[i], pageable[i], want)
		}
	}
	free := ms(func() error { return d.PinnedFree(pinned) })
	dtohWarm := ms(func() error { return d.CopyDtoH(pageable, p) })
	htodPageable := ms(func() error { return d.CopyHtoD(p, pageable) })
	gbs := func(m float64) float64 { return size / m / 1e6 }
	line := fmt.Sprintf("PINNED size=1GiB pin_ms=%.1f unpin_ms=%.1f dtoh_pinned_ms=%.1f (%.1f GB/s) htod_pinned_ms=%.1f (%.1f GB/s) dtoh_pageable_fresh_ms=%.1f dtoh_pageable_ms=%.1f (%.1f GB/s) htod_pageable_ms=%.1f (%.1f GB/s)",
		alloc, free, dtohPinned, gbs(dtohPinned), htodPinned, gbs(htodPinned), dtohFresh, dtohWarm, gbs(dtohWarm), htodPageable, gbs(htodPageable))
	t.Log(line)
	fmt.Fprintln(os.Stderr, line)
}

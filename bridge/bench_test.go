package bridge

import (
	"testing"
)

// BenchmarkAllocFree is the allocator's cost in Go, the cgo call excluded:
// one alloc and one free of 4 KiB on the legacy stream, outside any step,
// with the host's capture count known (0), as arenaplan.torch reports it.
func BenchmarkAllocFree(b *testing.B) {
	for _, c := range []struct {
		name   string
		stream uintptr
		hinted bool
	}{{"legacy", 0, true}, {"stream-hinted", 0x5000_0000, true}, {"stream-unhinted", 0x5000_0000, false}} {
		b.Run(c.name, func(b *testing.B) {
			br := New(Config{Sim: true, SimMemory: 1 << 30, SpillAddressSpace: 256 << 20})
			defer br.Close()
			if c.hinted {
				br.CapturesUnderway(0)
			}
			st := c.stream
			if st != 0 {
				d, err := br.device(0)
				if err != nil {
					b.Fatal(err)
				}
				s, err := d.dev.NewStream()
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				st = s.Handle()
			}
			if p, err := br.Alloc(4096, 0, st); err != nil {
				b.Fatal(err)
			} else if err := br.Free(p, 0); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for range b.N {
				p, err := br.Alloc(4096, 0, st)
				if err != nil {
					b.Fatal(err)
				}
				if err := br.Free(p, 0); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

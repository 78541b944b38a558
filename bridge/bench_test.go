package bridge

import (
	"testing"
	"time"

	"github.com/arenaplan/arenaplan/cuda"
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

// BenchmarkServe is a planned step's cost in Go per allocation, the cgo
// call excluded: a step of 1024 buffers (each live for the next three
// allocations, sizes of a decode layer's) recorded once, planned, then
// served; one op is one allocation and its free, and a run's Serve and
// End are spread over its allocations.
func BenchmarkServe(b *testing.B) {
	const n = 1024
	br := New(Config{Sim: true, SimMemory: 1 << 30, SpillAddressSpace: 256 << 20})
	defer br.Close()
	br.CapturesUnderway(0)
	s, err := br.NewStep(0, "bench")
	if err != nil {
		b.Fatal(err)
	}
	const stream = 0
	run := func() {
		var live [4]uint64
		for i := range n {
			size := uint64(4096 + 512*(i%7))
			p, err := br.Alloc(size, 0, stream)
			if err != nil {
				b.Fatal(err)
			}
			if old := live[i%4]; old != 0 {
				if err := br.Free(cuda.DevicePtr(old), 0); err != nil {
					b.Fatal(err)
				}
			}
			live[i%4] = uint64(p)
		}
		for _, p := range live {
			if err := br.Free(cuda.DevicePtr(p), 0); err != nil {
				b.Fatal(err)
			}
		}
	}
	if err := s.Record(stream); err != nil {
		b.Fatal(err)
	}
	run()
	if err := s.End(false); err != nil {
		b.Fatal(err)
	}
	// Any plan serves; the search's budget is not what is measured.
	if err := s.Plan(50 * time.Millisecond); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for done := 0; done < b.N; done += n {
		if err := s.Serve(stream, true); err != nil {
			b.Fatal(err)
		}
		run()
		if err := s.End(false); err != nil {
			b.Fatal(err)
		}
	}
}

package spill

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/arenaplan/arenaplan/cuda"
)

// BenchmarkSpillAllocFree: random sizes up to 256 KiB on one stream, 64
// blocks live, outside any capture.
func BenchmarkSpillAllocFree(b *testing.B) {
	e := newSimEnv(b, 4*GiB)
	s := newSpill(b, e)
	st := e.Stream(b)
	rng := rand.New(rand.NewPCG(1, 2))
	live := make([]cuda.DevicePtr, 0, 64)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if len(live) == cap(live) {
			j := rng.IntN(len(live))
			if err := s.Free(live[j]); err != nil {
				b.Fatal(err)
			}
			live[j] = live[len(live)-1]
			live = live[:len(live)-1]
		}
		p, err := s.Alloc(1+rng.Uint64N(256*KiB), st)
		if err != nil {
			b.Fatal(err)
		}
		live = append(live, p)
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/alloc+free")
}

// captureSteps captures n steps on two streams: allocate x on s1, use it
// on s1, fork s2, use it on s2, RecordStream, join, free. mode is "off"
// (no capture-time reuse), "on" (ours: visited set cached per capture and
// stream) or "fresh" (a new visited set per allocation, as PyTorch's
// first design walked). It returns the time of the n Alloc calls.
func captureSteps(t testing.TB, e *env, n int, mode string) (time.Duration, Stats) {
	t.Helper()
	s, err := New(e.Dev, WithCaptureReuse(mode != "off"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.cfg.freshWalk = mode == "fresh"
	c := struct {
		s1, s2 cuda.Stream
		ev     cuda.Event
	}{s1: mustStream(t, e), s2: mustStream(t, e)}
	defer c.s1.Close()
	defer c.s2.Close()
	if c.ev, err = e.Dev.NewEvent(false); err != nil {
		t.Fatal(err)
	}
	defer c.ev.Close()
	capt, err := s.BeginCapture(c.s1, cuda.CaptureModeGlobal, nil)
	if err != nil {
		t.Fatal(err)
	}
	var spent time.Duration
	for i := 0; i < n; i++ {
		t0 := time.Now()
		x, err := s.Alloc(4096, c.s1)
		spent += time.Since(t0)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Dev.Memset32(x, 1, 1, c.s1); err != nil {
			t.Fatal(err)
		}
		if err := c.ev.Record(c.s1); err != nil {
			t.Fatal(err)
		}
		if err := c.s2.WaitEvent(c.ev); err != nil {
			t.Fatal(err)
		}
		if err := e.Dev.Memset32(x, 2, 1, c.s2); err != nil {
			t.Fatal(err)
		}
		if err := s.RecordStream(x, c.s2); err != nil {
			t.Fatal(err)
		}
		if err := s.Free(x); err != nil {
			t.Fatal(err)
		}
		if err := c.ev.Record(c.s2); err != nil {
			t.Fatal(err)
		}
		if err := c.s1.WaitEvent(c.ev); err != nil {
			t.Fatal(err)
		}
	}
	st := s.Stats()
	g, err := capt.End()
	if err != nil {
		t.Fatal(err)
	}
	g.Close()
	capt.Release()
	return spent, st
}

func mustStream(t testing.TB, e *env) cuda.Stream {
	t.Helper()
	s, err := e.Dev.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// BenchmarkCaptureAlloc reports the time per allocation during a capture
// of n steps: it stays flat in n with reuse on (each node is walked once
// per stream), and grows with n for a fresh walk per allocation.
func BenchmarkCaptureAlloc(b *testing.B) {
	for _, mode := range []string{"off", "on", "fresh"} {
		for _, n := range []int{256, 1024, 4096} {
			if mode == "fresh" && n > 1024 {
				continue // quadratic: too slow to be worth waiting for
			}
			b.Run(fmt.Sprintf("reuse=%s/n=%d", mode, n), func(b *testing.B) {
				e := newSimEnv(b, 4*GiB)
				var spent time.Duration
				var st Stats
				for i := 0; i < b.N; i++ {
					d, s := captureSteps(b, e, n, mode)
					spent += d
					st = s
				}
				b.ReportMetric(float64(spent.Nanoseconds())/float64(b.N*n), "ns/alloc")
				b.ReportMetric(float64(st.NodesVisited)/float64(n), "nodes/alloc")
				b.ReportMetric(float64(st.PeakMapped>>20), "MiB-mapped")
			})
		}
	}
}

// BenchmarkSpillManyStreams: one 4 KiB allocation and its free on each of
// b.N distinct streams, on devices of 1, 16 and 80 GiB (a server that
// makes a stream per request). Reports the segments mapped at the end:
// the cost per stream must not grow with the device.
func BenchmarkSpillManyStreams(b *testing.B) {
	for _, gib := range []uint64{1, 16, 80} {
		b.Run(fmt.Sprintf("device=%dGiB", gib), func(b *testing.B) {
			e := newSimEnv(b, gib*GiB)
			s := newSpill(b, e, WithAddressSpace(4*gib*GiB))
			streams := make([]cuda.Stream, 0, 4096)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if i%4096 == 0 {
					b.StopTimer()
					streams = streams[:0]
					for j := range 4096 {
						st, err := e.Dev.Foreign(uintptr(0x10000 + 16*(i+j)))
						if err != nil {
							b.Fatal(err)
						}
						streams = append(streams, st)
					}
					b.StartTimer()
				}
				p, err := s.Alloc(4096, streams[i%4096])
				if err != nil {
					b.Fatal(err)
				}
				if err := s.Free(p); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(s.Stats().Segments), "segments")
		})
	}
}

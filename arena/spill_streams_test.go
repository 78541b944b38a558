package arena

import (
	"testing"

	"github.com/arenaplan/arenaplan/cuda"
)

// handleStream is a stream known only by its handle, as a host program's
// stream is: a new value every time it is handed in.
type handleStream struct{ h uintptr }

func (s *handleStream) Handle() uintptr              { return s.h }
func (s *handleStream) Synchronize() error           { return nil }
func (s *handleStream) WaitEvent(e cuda.Event) error { return nil }
func (s *handleStream) Close() error                 { return nil }

func freeLists(s *Spill) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for p := range s.pools {
		n += len(p.free)
	}
	return n
}

// TestSpillManyStreams: per-stream state follows the segments, not the
// streams ever seen; a stream handed in again as a new value is the same
// stream.
func TestSpillManyStreams(t *testing.T) {
	e := newSimEnv(t, 64*MiB)
	s := newSpill(t, e, WithAddressSpace(64*MiB))
	a := mustAlloc(t, s, 4096, &handleStream{7})
	mustFree(t, s, a)
	if b := mustAlloc(t, s, 4096, &handleStream{7}); b != a || s.Stats().Segments != 1 {
		t.Fatalf("a new value for stream 7 got %#x and %d segments; want the block at %#x, one segment", b, s.Stats().Segments, a)
	} else {
		mustFree(t, s, b)
	}
	n := 20000
	if testing.Short() {
		n = 3000
	}
	most := 0
	for i := range n {
		st := &handleStream{uintptr(0x1000 + i)}
		p := mustAlloc(t, s, 4096, st)
		mustFree(t, s, p)
		if i%997 == 0 {
			mustValid(t, s)
		}
		most = max(most, freeLists(s))
	}
	// The device holds 32 segments of 2 MiB: the allocator unmaps cached
	// ones to grow, and their streams' lists go with them.
	if segs := s.Stats().Segments; most > 32 || freeLists(s) > segs {
		t.Errorf("%d streams: up to %d free lists, %d now for %d segments; want at most one per segment", n, most, freeLists(s), segs)
	}
	if err := s.EmptyCache(); err != nil {
		t.Fatal(err)
	}
	if got := freeLists(s); got != 0 {
		t.Errorf("%d free lists after EmptyCache unmapped every segment", got)
	}
	mustValid(t, s)
}

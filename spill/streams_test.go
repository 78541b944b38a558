package spill

import (
	"testing"

	"github.com/arenaplan/arenaplan/cuda"
	"github.com/arenaplan/arenaplan/internal/devmem"
)

// handleStream is a stream known only by its handle, as a host program's
// stream is: a new value every time it is handed in.
type handleStream struct{ h uintptr }

func (s *handleStream) Handle() uintptr              { return s.h }
func (s *handleStream) Synchronize() error           { return nil }
func (s *handleStream) WaitEvent(e cuda.Event) error { return nil }
func (s *handleStream) Close() error                 { return nil }

func freeLists(s *Allocator) int {
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

// waitCounting is a stream that counts the events it was made to wait
// for.
type waitCounting struct {
	cuda.Stream
	waits int
}

func (s *waitCounting) WaitEvent(e cuda.Event) error {
	s.waits++
	return s.Stream.WaitEvent(e)
}

// TestSpillStreamsTakeOverIdleSegments: on a large device, a stream per
// allocation takes over the segment that other streams left wholly free
// instead of mapping one each: what is mapped, and so what each
// allocation costs, does not grow with the streams or the device.
func TestSpillStreamsTakeOverIdleSegments(t *testing.T) {
	e := newSimEnv(t, 80*GiB)
	s := newSpill(t, e, WithAddressSpace(320*GiB))
	n := 20000
	if testing.Short() {
		n = 4000
	}
	for i := range n {
		st, err := e.Dev.Foreign(uintptr(0x10000 + 16*i))
		if err != nil {
			t.Fatal(err)
		}
		p := mustAlloc(t, s, 4096, st)
		mustFree(t, s, p)
	}
	st := s.Stats()
	if st.Segments > 2 || st.Mapped > 4*MiB || st.Adopted < uint64(n-2) {
		t.Errorf("%d streams: %d segments, %s mapped, %d taken over; want at most 2 segments", n, st.Segments, devmem.Bytes(st.Mapped), st.Adopted)
	}
	mustValid(t, s)
}

// TestSpillTakeOverOrders: a segment taken over from a stream whose work
// may still run is ordered after it by an event; one idle since the
// allocator waited for the device is taken without; a stream whose
// allocator has memory to spare (more in use than idle) maps its own.
func TestSpillTakeOverOrders(t *testing.T) {
	e := newSimEnv(t, 1*GiB)
	s := newSpill(t, e)
	s1 := e.Stream(t)
	s2 := &waitCounting{Stream: e.Stream(t)}
	s3 := &waitCounting{Stream: e.Stream(t)}
	a := mustAlloc(t, s, 4096, s1)
	mustFree(t, s, a)
	if b := mustAlloc(t, s, 4096, s2); b != a || s2.waits != 1 {
		t.Errorf("s2 got %#x after %d waits; want s1's idle block %#x after one wait", b, s2.waits, a)
	} else {
		mustFree(t, s, b)
	}
	if err := s.EmptyCache(); err != nil { // waits for the device, unmaps the idle segment
		t.Fatal(err)
	}
	a = mustAlloc(t, s, 4096, s1)
	mustFree(t, s, a)
	s.mu.Lock()
	s.syncGen++ // as if the allocator had waited for the device since
	s.mu.Unlock()
	if b := mustAlloc(t, s, 4096, s3); b != a || s3.waits != 0 {
		t.Errorf("s3 got %#x after %d waits; want the block idle since a device wait (%#x) without one", b, s3.waits, a)
	} else {
		mustFree(t, s, b)
	}
	// Memory to spare: 8 MiB in use on s1, a 2 MiB segment idle.
	big := mustAlloc(t, s, 8*MiB, s1)
	a = mustAlloc(t, s, 4096, s1)
	mustFree(t, s, a)
	s2.waits = 0
	if b := mustAlloc(t, s, 4096, s2); b == a || s2.waits != 0 {
		t.Errorf("with 8 MiB in use s2 took s1's idle segment (%#x, %d waits); want a segment of its own", b, s2.waits)
	} else {
		mustFree(t, s, b)
	}
	mustFree(t, s, big)
	mustValid(t, s)
}

// TestSpillTakeOverDeadStream: when the old stream cannot take an event
// (the host destroyed it), the allocator waits for the device instead.
func TestSpillTakeOverDeadStream(t *testing.T) {
	e := newSimEnv(t, 1*GiB)
	s := newSpill(t, e)
	s1, err := e.Dev.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	a := mustAlloc(t, s, 4096, s1)
	mustFree(t, s, a)
	if err := s1.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := &waitCounting{Stream: e.Stream(t)}
	if b := mustAlloc(t, s, 4096, s2); b != a || s2.waits != 0 || s.Stats().AdoptWaits != 1 {
		t.Errorf("got %#x after %d event waits (%+v); want %#x after a device wait", b, s2.waits, s.Stats(), a)
	}
	mustValid(t, s)
}

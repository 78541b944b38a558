package spill

import (
	"testing"

	"github.com/arenaplan/arenaplan/cuda"
)

// TestSpillForeignCapture: a capture that another part of the process
// began (PyTorch's torch.cuda.graph) gets a private pool of its own, so
// memory the graph used is never handed to eager code while the graph
// lives; the allocator notices the capture's end by itself.
func TestSpillForeignCapture(t *testing.T) {
	e := newSimEnv(t, 1<<30)
	s, err := New(e.Dev, WithAddressSpace(256<<20), WithForeignCaptures(true))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	st := e.Stream(t)
	legacy, err := e.Dev.Foreign(0)
	if err != nil {
		t.Fatal(err)
	}
	eager, err := s.Alloc(4096, st)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Free(eager); err != nil {
		t.Fatal(err)
	}
	if err := e.Dev.BeginCapture(st, cuda.CaptureModeGlobal); err != nil {
		t.Fatal(err)
	}
	in, err := s.Alloc(4096, st)
	if err != nil {
		t.Fatalf("allocation in a foreign capture: %v", err)
	}
	if in == eager {
		t.Fatal("the foreign capture got a block of the default pool")
	}
	// Other streams (the legacy one here) still use the default pool.
	out, err := s.Alloc(4096, legacy)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Free(in); err != nil {
		t.Fatal(err)
	}
	again, err := s.Alloc(4096, st)
	if err != nil || again != in {
		t.Fatalf("reuse inside the capture on its stream: got %#x, %v; want %#x", again, err, in)
	}
	if err := s.Free(again); err != nil {
		t.Fatal(err)
	}
	g, err := e.Dev.EndCapture(st)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	// After the capture, neither eager stream may get the graph's block.
	for _, str := range []cuda.Stream{st, legacy} {
		p, err := s.Alloc(4096, str)
		if err != nil {
			t.Fatal(err)
		}
		if p == in {
			t.Fatalf("eager allocation after the capture got the graph's block %#x", in)
		}
	}
	if err := s.Free(out); err != nil {
		t.Fatal(err)
	}
	if err := s.EmptyCache(); err != nil {
		t.Fatalf("EmptyCache after the foreign capture ended: %v", err)
	}
}

// TestSpillJoinCapture: JoinCapture routes an owner's capture to a chosen
// pool; Ended finishes it; misuse is an error.
func TestSpillJoinCapture(t *testing.T) {
	e := newSimEnv(t, 1<<30)
	s, err := New(e.Dev, WithAddressSpace(256<<20))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	st := e.Stream(t)
	if _, err := s.JoinCapture(st, nil); err == nil {
		t.Fatal("JoinCapture of a stream that is not capturing succeeded")
	}
	pool, err := s.NewSharedPool()
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Dev.BeginCapture(st, cuda.CaptureModeGlobal); err != nil {
		t.Fatal(err)
	}
	c, err := s.JoinCapture(st, pool)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.JoinCapture(st, nil); err == nil {
		t.Fatal("a second JoinCapture of the same capture succeeded")
	}
	if _, err := c.End(); err == nil {
		t.Fatal("End of a joined capture succeeded; its owner ends it")
	}
	p, err := s.Alloc(512, st)
	if err != nil {
		t.Fatal(err)
	}
	g, err := e.Dev.EndCapture(st)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if err := c.Ended(false); err != nil {
		t.Fatal(err)
	}
	if err := c.Ended(false); err == nil {
		t.Fatal("Ended twice succeeded")
	}
	if err := s.Free(p); err != nil {
		t.Fatal(err)
	}
	// The pool holds the block until the graph is released.
	if err := s.EmptyCache(); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Mapped == 0 {
		t.Fatal("EmptyCache unmapped the pool of a live graph")
	}
	if err := c.Release(); err != nil {
		t.Fatal(err)
	}
	if err := pool.Release(); err != nil {
		t.Fatal(err)
	}
	if err := s.EmptyCache(); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Mapped != 0 {
		t.Fatalf("after Release and EmptyCache %d bytes stay mapped", st.Mapped)
	}
}

// TestSpillPlainSegments: with WithPlainSegments the allocator grows with
// cuMemAlloc outside captures and by VMM mapping inside them (cuMemAlloc
// would invalidate the capture), and gives both kinds back.
func TestSpillPlainSegments(t *testing.T) {
	e := newSimEnv(t, 1<<30)
	s, err := New(e.Dev, WithAddressSpace(256<<20), WithPlainSegments(true))
	if err != nil {
		t.Fatal(err)
	}
	st := e.Stream(t)
	free0 := e.Free(t)
	p, err := s.Alloc(3<<20, st)
	if err != nil {
		t.Fatal(err)
	}
	c, err := s.BeginCapture(st, cuda.CaptureModeGlobal, nil)
	if err != nil {
		t.Fatal(err)
	}
	q, err := s.Alloc(3<<20, st)
	if err != nil {
		t.Fatalf("growth inside a capture: %v", err)
	}
	g, err := c.End()
	if err != nil {
		t.Fatalf("the capture was invalidated: %v", err)
	}
	g.Close()
	c.Release()
	if p >= s.base && p < s.base.Add(256<<20) {
		t.Errorf("outside a capture the segment came from the VMM reservation (%#x)", uint64(p))
	}
	if q < s.base || q >= s.base.Add(256<<20) {
		t.Errorf("inside a capture the segment did not come from the VMM reservation (%#x)", uint64(q))
	}
	s.Free(p)
	s.Free(q)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if e.Free(t) != free0 {
		t.Fatalf("after Close %d bytes are still allocated", free0-e.Free(t))
	}
}

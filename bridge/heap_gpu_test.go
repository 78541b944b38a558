package bridge

import (
	"encoding/binary"
	"testing"

	"github.com/arenaplan/arenaplan/arena"
	"github.com/arenaplan/arenaplan/cuda"
	"github.com/arenaplan/arenaplan/cuda/devtest"
	"github.com/arenaplan/arenaplan/lifetime"
	"github.com/arenaplan/arenaplan/planner"
)

// The GPU test in this file runs on the CUDA driver when cuda.Open(0)
// succeeds and skips with a message otherwise; its twin runs on the
// simulated device everywhere. Build it here and run it on a GPU machine
// (scripts/gpu-check.sh runs it under compute-sanitizer too):
//
//	CGO_ENABLED=0 go test -c -o .dev/bridge.test ./bridge
//	.dev/bridge.test -test.run 'HeapKernels' -test.v

func TestMain(m *testing.M) { devtest.Main(m) }

func TestHeapKernelsSim(t *testing.T) { testHeapKernels(t, devtest.NewSim(t, 1<<30)) }

func TestGPUHeapKernels(t *testing.T) { testHeapKernels(t, devtest.GPU(t)) }

// testHeapKernels: a workspace-like segment and two arenas laid out in
// one granule of the graph heap, written by kernels: each keeps its
// bytes whatever the others' kernels write, an arena paused and resumed
// leaves the segment's bytes as they were (its granule stays mapped), and
// everything given back leaves nothing mapped.
func testHeapKernels(t *testing.T, e *devtest.Env) {
	h := newGraphHeap(e.Dev)
	t.Cleanup(func() { h.close() })
	s, err := e.Dev.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const segBytes = 256 << 10
	seg, err := h.AllocSegment(segBytes, s)
	if err != nil {
		t.Fatal(err)
	}
	words := func(n int, f func(i int) uint32) []byte {
		b := make([]byte, 4*n)
		for i := range n {
			binary.LittleEndian.PutUint32(b[4*i:], f(i))
		}
		return b
	}
	if err := e.Dev.CopyHtoD(seg, words(segBytes/4, func(i int) uint32 { return uint32(i) })); err != nil {
		t.Fatal(err)
	}
	// Two steps of two buffers each, live together: 96 + 64 KiB.
	mk := func(name string) *arena.Layout {
		tr := &lifetime.Trace{Name: name, Buffers: []lifetime.Buffer{
			{ID: 0, Name: "a", Size: 96 << 10, Start: 0, End: 2},
			{ID: 1, Name: "b", Size: 64 << 10, Start: 1, End: 3},
		}}
		p := &planner.Plan{Algo: "manual", Align: planner.DefaultAlign, Arena: 160 << 10, LowerBound: 160 << 10,
			Offsets: []int64{0, 96 << 10}}
		l, err := arena.NewLayout(heapDevice{e.Dev, h}, tr, p)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	l1, l2 := mk("one"), mk("two")
	if h.mapped != h.gran {
		t.Fatalf("a 256 KiB segment and two 160 KiB arenas: %d bytes mapped, want one granule (%d)", h.mapped, h.gran)
	}
	addr := func(l *arena.Layout, id lifetime.ID) cuda.DevicePtr {
		p, err := l.Addr(id)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	// Each buffer = the segment's first words + k, k its own.
	bufs := []struct {
		p     cuda.DevicePtr
		words uint32
		add   uint32
	}{
		{addr(l1, 0), 24 << 10, 1}, {addr(l1, 1), 16 << 10, 2},
		{addr(l2, 0), 24 << 10, 3}, {addr(l2, 1), 16 << 10, 4},
	}
	for _, b := range bufs {
		if err := e.LaunchAdd(s, b.p, seg, b.add, b.words); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	read := func(p cuda.DevicePtr, n uint32) []byte {
		b := make([]byte, 4*n)
		if err := e.Dev.CopyDtoH(b, p); err != nil {
			t.Fatal(err)
		}
		return b
	}
	for k, b := range bufs {
		got := read(b.p, b.words)
		for i := range b.words {
			if v := binary.LittleEndian.Uint32(got[4*i:]); v != i+b.add {
				t.Fatalf("buffer %d word %d: %d, want %d", k, i, v, i+b.add)
			}
		}
	}
	checkSeg := func(when string) {
		t.Helper()
		got := read(seg, segBytes/4)
		for i := range uint32(segBytes / 4) {
			if v := binary.LittleEndian.Uint32(got[4*i:]); v != i {
				t.Fatalf("%s: segment word %d: %d, want %d", when, i, v, i)
			}
		}
	}
	checkSeg("after the arenas' kernels")
	if err := l1.Arena().Pause(); err != nil {
		t.Fatal(err)
	}
	if h.mapped != h.gran {
		t.Fatalf("one arena paused: %d bytes mapped, want the granule the others use", h.mapped)
	}
	checkSeg("one arena paused")
	if err := l1.Arena().Resume(); err != nil {
		t.Fatal(err)
	}
	if err := e.LaunchAdd(s, bufs[0].p, seg, 7, bufs[0].words); err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if v := binary.LittleEndian.Uint32(read(bufs[0].p, 1)); v != 7 {
		t.Fatalf("resumed: first word %d, want 7", v)
	}
	checkSeg("resumed and written")
	for _, l := range []*arena.Layout{l1, l2} {
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
	}
	checkSeg("both arenas closed")
	if err := h.FreeSegment(seg, segBytes, s); err != nil {
		t.Fatal(err)
	}
	if err := h.trim(); err != nil {
		t.Fatal(err)
	}
	if h.mapped != 0 {
		t.Fatalf("everything given back and trimmed: %d bytes mapped", h.mapped)
	}
}

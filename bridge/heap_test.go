package bridge

import (
	"errors"
	"testing"

	"github.com/arenaplan/arenaplan/arena"
	"github.com/arenaplan/arenaplan/cuda"
)

// testHeap returns a bridge on the simulated device and device 0's graph
// heap.
func testHeap(t *testing.T) (*Bridge, *graphHeap) {
	t.Helper()
	b := newTestBridge(t)
	d, err := b.device(0)
	if err != nil {
		t.Fatal(err)
	}
	return b, d.heap
}

// TestGraphHeapGranules: what the heap lays out shares granules, a
// granule is mapped while anything touches it, and given-back addresses
// are laid out again.
func TestGraphHeapGranules(t *testing.T) {
	_, h := testHeap(t)
	p1, err := h.AllocSegment(1<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	gran := h.gran
	if h.mapped != gran {
		t.Fatalf("a 1 MiB segment: %d bytes mapped, want one granule (%d)", h.mapped, gran)
	}
	p2, err := h.reserve(gran/2+4096, 256)
	if err != nil {
		t.Fatal(err)
	}
	if uint64(p2)%heapAlign != 0 || p2 != p1.Add(1<<20) {
		t.Fatalf("laid out at %#x, want right after the segment at %#x", uint64(p2), uint64(p1.Add(1<<20)))
	}
	if err := h.use(p2, gran/2+4096); err != nil {
		t.Fatal(err)
	}
	if h.mapped != 2*gran {
		t.Fatalf("1 MiB + %d bytes side by side: %d mapped, want two granules", gran/2+4096, h.mapped)
	}
	if h.extra() != 2*gran-1<<20 {
		t.Fatalf("extra %d, want the mapped bytes less the segment's", h.extra())
	}
	if err := h.FreeSegment(p1, 1<<20, nil); err != nil {
		t.Fatal(err)
	}
	if h.mapped != 2*gran {
		t.Fatalf("the segment given back: %d mapped, want both granules (the other range touches them)", h.mapped)
	}
	if err := h.unuse(p2, gran/2+4096, true); err != nil {
		t.Fatal(err)
	}
	if h.mapped != 0 || len(h.pieces) != 0 {
		t.Fatalf("nothing used: %d mapped in %d granules", h.mapped, len(h.pieces))
	}
	if err := h.release(p2, gran/2+4096); err != nil {
		t.Fatal(err)
	}
	if err := h.release(p2, gran/2+4096); err == nil {
		t.Fatal("a second release: no error")
	}
	runs := 0
	for range h.free.All() {
		runs++
	}
	if runs != 1 {
		t.Fatalf("%d free runs, want one (coalesced)", runs)
	}
	if p, err := h.reserve(4096, 0); err != nil || p != p1 {
		t.Fatalf("laid out again at %#x (%v), want the first address %#x", uint64(p), err, uint64(p1))
	}
}

// TestSmallArenasShareGranules: steps planned into small arenas are laid
// out in the graph heap side by side: two of them map one granule where
// arenas of their own mapped two, their buffers never overlap, a pause
// of the graphs unmaps the granule and a resume serves the same
// addresses; a workspace made in a graph memory pool shares it too.
func TestSmallArenasShareGranules(t *testing.T) {
	b := New(Config{Sim: true, SimMemory: 1 << 30, SpillAddressSpace: 256 << 20, ThreadID: func() int { return 1 }})
	t.Cleanup(func() { b.Close() })
	p1 := &program{t: t, b: b, stream: 0x10, layers: 6}
	p2 := &program{t: t, b: b, stream: 0x20, layers: 4, scale: 2}
	s1 := recordAndPlan(t, b, p1)
	s2 := recordAndPlan(t, b, p2)
	d := b.devices[0]
	gran := d.heap.gran
	st, _ := b.Stats(0)
	if st.Arenas != 2 || st.ArenaMapped != gran {
		t.Fatalf("two small arenas (%d bytes in all): %d arenas map %d bytes, want one granule (%d)", st.ArenaBytes, st.Arenas, st.ArenaMapped, gran)
	}
	serve := func(s *Step, p *program) map[cuda.DevicePtr]uint64 {
		t.Helper()
		addrs, out := serveRun(t, s, p)
		p.free(out)
		got := map[cuda.DevicePtr]uint64{}
		for i, a := range addrs {
			if p.sizes[i] > 0 {
				if !d.heap.owns(a) {
					t.Fatalf("planned buffer at %#x: not in the graph heap", uint64(a))
				}
				got[a] = p.sizes[i]
			}
		}
		return got
	}
	a1, a2 := serve(s1, p1), serve(s2, p2)
	// Every buffer of one arena against every buffer of the other: the
	// two arenas' memory is disjoint, whatever runs when.
	lo1, hi1 := extentOf(a1)
	lo2, hi2 := extentOf(a2)
	if lo1 < hi2 && lo2 < hi1 {
		t.Fatalf("arenas overlap: [%#x, %#x) and [%#x, %#x)", lo1, hi1, lo2, hi2)
	}
	if r := s1.Report(); r.Divergences != 0 {
		t.Fatalf("served from the heap: %d divergences", r.Divergences)
	}

	if err := b.Pause(0, GraphsTag); err != nil {
		t.Fatal(err)
	}
	if st, _ := b.Stats(0); st.ArenaMapped != 0 || d.heap.mapped != 0 {
		t.Fatalf("paused: arenas map %d, heap %d bytes; want 0", st.ArenaMapped, d.heap.mapped)
	}
	if err := b.Resume(0, GraphsTag); err != nil {
		t.Fatal(err)
	}
	if again := serve(s1, p1); len(again) != len(a1) {
		t.Fatalf("after resume: %d buffers, want %d", len(again), len(a1))
	} else {
		for a := range again {
			if _, ok := a1[a]; !ok {
				t.Fatalf("after resume: a buffer at %#x, not an address of the first run", uint64(a))
			}
		}
	}

	// A 1 MiB workspace in a graph memory pool: laid out after the
	// arenas, in the granule they map (rather than a segment of its own),
	// and it stays when the graphs pause.
	st, _ = b.Stats(0)
	before := st.Spill.Mapped + st.ArenaMapped
	if st.ArenaBytes+1<<20 > gran {
		t.Fatalf("arenas of %d bytes: too large for the test's granule", st.ArenaBytes)
	}
	id, err := b.NewGraphMemPool()
	if err != nil {
		t.Fatal(err)
	}
	if err := b.BeginMemPool(0, 1, id); err != nil {
		t.Fatal(err)
	}
	ws, err := b.Alloc(1<<20, 0, 0x10)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.EndMemPool(0, 1, id); err != nil {
		t.Fatal(err)
	}
	if !d.heap.owns(ws) {
		t.Fatalf("the pool's block at %#x: not in the graph heap", uint64(ws))
	}
	st, _ = b.Stats(0)
	if after := st.Spill.Mapped + st.ArenaMapped; after != before || d.heap.mapped != gran {
		t.Fatalf("a 1 MiB block beside arenas of %d bytes: %d bytes held (were %d), the heap maps %d; want no more, one granule",
			st.ArenaBytes, after, before, d.heap.mapped)
	}
	if err := b.Pause(0, GraphsTag); err != nil {
		t.Fatal(err)
	}
	if d.heap.mapped == 0 {
		t.Fatal("paused: the workspace's granule was unmapped")
	}
	if err := b.Resume(0, GraphsTag); err != nil {
		t.Fatal(err)
	}
	if err := b.Free(ws, 0); err != nil {
		t.Fatal(err)
	}
	if err := b.ReleaseMemPool(id); err != nil {
		t.Fatal(err)
	}
	if err := s1.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s2.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.EmptyCache(); err != nil {
		t.Fatal(err)
	}
	if d.heap.mapped != 0 {
		t.Fatalf("every arena closed and the pool released: the heap maps %d bytes", d.heap.mapped)
	}
}

// extentOf returns the lowest and highest address of the buffers in m.
func extentOf(m map[cuda.DevicePtr]uint64) (lo, hi uint64) {
	first := true
	for a, n := range m {
		if first || uint64(a) < lo {
			lo = uint64(a)
		}
		if first || uint64(a)+n > hi {
			hi = uint64(a) + n
		}
		first = false
	}
	return lo, hi
}

// TestGraphPoolKeptToClose: a graph memory pool kept for the process's
// life (as the capture streams' workspace pools are) is no error when the
// bridge closes: its granules go with the heap.
func TestGraphPoolKeptToClose(t *testing.T) {
	b := New(Config{Sim: true, SimMemory: 1 << 30, SpillAddressSpace: 256 << 20, ThreadID: func() int { return 1 }})
	id, err := b.NewGraphMemPool()
	if err != nil {
		t.Fatal(err)
	}
	if err := b.BeginMemPool(0, 1, id); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Alloc(32<<20, 0, 0x10); err != nil {
		t.Fatal(err)
	}
	if err := b.EndMemPool(0, 1, id); err != nil {
		t.Fatal(err)
	}
	d := b.devices[0]
	if d.heap.mapped != 32<<20 {
		t.Fatalf("a 32 MiB block: the heap maps %d bytes", d.heap.mapped)
	}
	if err := b.Close(); err != nil {
		t.Fatalf("Close with the pool held: %v", err)
	}
	if d.heap.mapped != 0 || d.heap.base != 0 {
		t.Fatalf("after Close: the heap maps %d bytes, reservation %#x", d.heap.mapped, uint64(d.heap.base))
	}
}

// TestWorkspacesAndStepInOnePool: a capture stream's workspaces (32 MiB
// and 1 MiB, made first) and a training step planned at 2.26 MiB take 36
// MiB, the pool CUDA graphs on PyTorch's allocator hold them in, where
// granules of their own took 38.
func TestWorkspacesAndStepInOnePool(t *testing.T) {
	b := New(Config{Sim: true, SimMemory: 1 << 30, SpillAddressSpace: 256 << 20, ThreadID: func() int { return 1 }})
	t.Cleanup(func() { b.Close() })
	const st = 0x30
	id, err := b.NewGraphMemPool()
	if err != nil {
		t.Fatal(err)
	}
	if err := b.BeginMemPool(0, 1, id); err != nil {
		t.Fatal(err)
	}
	for _, n := range []uint64{32 << 20, 1 << 20} {
		if _, err := b.Alloc(n, 0, st); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.EndMemPool(0, 1, id); err != nil {
		t.Fatal(err)
	}
	s, err := b.NewStep(0, "train")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Record(st); err != nil {
		t.Fatal(err)
	}
	x := mustAlloc(t, b, 1<<20, st)
	y := mustAlloc(t, b, 1<<20+1<<18+10<<10, st) // 2.26 MiB live with x
	for _, p := range []cuda.DevicePtr{x, y} {
		if err := b.Free(p, 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.End(false); err != nil {
		t.Fatal(err)
	}
	if err := s.Plan(0); err != nil {
		t.Fatal(err)
	}
	d := b.devices[0]
	stats, _ := b.Stats(0)
	if d.heap.mapped != 36<<20 || stats.ArenaBytes < 2<<20 {
		t.Fatalf("workspaces of 33 MiB and an arena of %d bytes: the heap maps %d bytes, want 36 MiB", stats.ArenaBytes, d.heap.mapped)
	}
}

// TestFamilyInHeapGrows: a small family's arena is laid out in the heap
// with room to grow in place up to heapArenaMax more (the room a family
// keeps for members planned around held memory): it grows there, its
// buffers where they were, and is refused past its room, left as it was.
func TestFamilyInHeapGrows(t *testing.T) {
	b := newTestBridge(t)
	f, _ := recordFamily(t, b, []uint64{8, 4})
	if err := f.Plan(0); err != nil {
		t.Fatal(err)
	}
	d := b.devices[0]
	a := f.ar
	rs := a.Regions()
	if len(rs) == 0 || !d.heap.owns(rs[0].VA) {
		t.Fatal("a small family's arena: not in the graph heap")
	}
	if a.Room() == 0 || a.Room() > heapArenaMax {
		t.Fatalf("room %d, want some, at most %d", a.Room(), heapArenaMax)
	}
	size, mapped := a.Size(), d.heap.mapped
	d.mu.Lock()
	err := f.growLocked(size + 3<<20)
	d.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if a.Size() != size+3<<20 || d.heap.mapped <= mapped || a.Regions()[0].VA != rs[0].VA {
		t.Fatalf("grown: size %d (was %d), heap maps %d (was %d), first region at %#x (was %#x)",
			a.Size(), size, d.heap.mapped, mapped, uint64(a.Regions()[0].VA), uint64(rs[0].VA))
	}
	d.mu.Lock()
	err = f.growLocked(a.Size() + int64(a.Room()) + 1<<20)
	d.mu.Unlock()
	if !errors.Is(err, arena.ErrOutOfMemory) || a.Size() != size+3<<20 {
		t.Fatalf("grown past its room: %v (size %d); want ErrOutOfMemory and the size as it was", err, a.Size())
	}
}

// TestGraphHeapKeepsGivenBackSegmentsMapped: a pool's segment given back
// leaves its granules mapped (work queued on it may still run) until a
// trim, which waits for the device; laid out again before, it reuses them.
func TestGraphHeapKeepsGivenBackSegmentsMapped(t *testing.T) {
	b, h := testHeap(t)
	p, err := h.AllocSegment(1<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.FreeSegment(p, 1<<20, nil); err != nil {
		t.Fatal(err)
	}
	if h.mapped != h.gran {
		t.Fatalf("given back: %d bytes mapped, want its granule kept", h.mapped)
	}
	q, err := h.AllocSegment(512<<10, nil)
	if err != nil {
		t.Fatal(err)
	}
	if q != p || h.mapped != h.gran {
		t.Fatalf("laid out again at %#x (was %#x), %d mapped; want the same place and granule", uint64(q), uint64(p), h.mapped)
	}
	if err := h.FreeSegment(q, 512<<10, nil); err != nil {
		t.Fatal(err)
	}
	if err := b.EmptyCache(); err != nil {
		t.Fatal(err)
	}
	if h.mapped != 0 || len(h.pieces) != 0 {
		t.Fatalf("after EmptyCache: %d bytes in %d granules mapped, want none", h.mapped, len(h.pieces))
	}
}

// TestGraphHeapRandom: random layouts, uses and releases against a model:
// what is laid out never overlaps, and the granules mapped are exactly
// those a used range touches plus those a given-back segment left idle
// (none after a trim).
func TestGraphHeapRandom(t *testing.T) {
	_, h := testHeap(t)
	type laid struct {
		p       cuda.DevicePtr
		size    uint64
		used    bool
		segment bool // AllocSegment's: used from the start, given back with FreeSegment
	}
	var live []*laid
	idle := map[uint64]bool{} // granules a given-back segment left mapped
	rng := uint64(12345)
	next := func(n uint64) uint64 {
		rng ^= rng << 13
		rng ^= rng >> 7
		rng ^= rng << 17
		return rng % n
	}
	check := func(step int) {
		t.Helper()
		want := map[uint64]bool{}
		for g := range idle {
			want[g] = true
		}
		for i, a := range live {
			for _, c := range live[:i] {
				if a.p < c.p.Add(heapRound(c.size, heapAlign)) && c.p < a.p.Add(heapRound(a.size, heapAlign)) {
					t.Fatalf("step %d: [%#x, +%d) and [%#x, +%d) overlap", step, uint64(a.p), a.size, uint64(c.p), c.size)
				}
			}
			if a.used {
				lo := uint64(a.p - h.base)
				for g := lo / h.gran; g <= (lo+a.size-1)/h.gran; g++ {
					want[g] = true
				}
			}
		}
		if len(want) != len(h.pieces) || h.mapped != uint64(len(want))*h.gran {
			t.Fatalf("step %d: %d granules mapped (%d bytes), want %d", step, len(h.pieces), h.mapped, len(want))
		}
		for g := range want {
			if h.pieces[g] == nil {
				t.Fatalf("step %d: granule %d not mapped", step, g)
			}
		}
	}
	for step := range 3000 {
		switch op := next(10); {
		case op < 4 || len(live) == 0:
			size := 1 + next(5<<20)
			if next(2) == 0 {
				p, err := h.AllocSegment(size, nil)
				if err != nil {
					t.Fatal(err)
				}
				live = append(live, &laid{p, size, true, true})
			} else {
				p, err := h.reserve(size, heapAlign)
				if err != nil {
					t.Fatal(err)
				}
				live = append(live, &laid{p: p, size: size})
			}
		case op < 6:
			a := live[next(uint64(len(live)))]
			if a.segment {
				continue
			}
			if a.used {
				if err := h.unuse(a.p, a.size, true); err != nil {
					t.Fatal(err)
				}
			} else if err := h.use(a.p, a.size); err != nil {
				t.Fatal(err)
			}
			a.used = !a.used
		case op < 9:
			i := next(uint64(len(live)))
			a := live[i]
			if a.segment {
				lo := uint64(a.p - h.base)
				if err := h.FreeSegment(a.p, a.size, nil); err != nil {
					t.Fatal(err)
				}
				for g := lo / h.gran; g <= (lo+a.size-1)/h.gran; g++ {
					if h.pieces[g] != nil && h.pieces[g].uses == 0 {
						idle[g] = true
					}
				}
			} else {
				if a.used {
					if err := h.unuse(a.p, a.size, true); err != nil {
						t.Fatal(err)
					}
				}
				if err := h.release(a.p, a.size); err != nil {
					t.Fatal(err)
				}
			}
			live = append(live[:i], live[i+1:]...)
		default:
			if err := h.trim(); err != nil {
				t.Fatal(err)
			}
			clear(idle)
		}
		// A granule used again is no longer idle; one unmapped is gone.
		for g := range idle {
			if pc := h.pieces[g]; pc == nil || pc.uses > 0 {
				delete(idle, g)
			}
		}
		check(step)
	}
}

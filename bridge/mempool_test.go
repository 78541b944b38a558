package bridge

import (
	"fmt"
	"runtime"
	"sync"
	"testing"

	"github.com/arenaplan/arenaplan/cuda"
)

// goAlloc is a memory pool's own allocator written in Go for the tests:
// it takes device memory with cuMemAlloc and records what it was asked.
type goAlloc struct {
	dev *cuda.Device // set once the bridge opened the device

	mu     sync.Mutex
	live   map[cuda.DevicePtr]uint64
	sizes  []uint64
	frees  int
	badArg string // the first wrong argument seen
}

func newGoAlloc(dev *cuda.Device) *goAlloc {
	return &goAlloc{dev: dev, live: map[cuda.DevicePtr]uint64{}}
}

func (g *goAlloc) pool() *PoolAllocator {
	return &PoolAllocator{
		Alloc: func(size uint64, ordinal int, stream uintptr) (cuda.DevicePtr, error) {
			p, err := (*g.dev).Alloc(size)
			if err != nil {
				return 0, err
			}
			g.mu.Lock()
			defer g.mu.Unlock()
			if ordinal != 0 && g.badArg == "" {
				g.badArg = fmt.Sprintf("alloc on device %d", ordinal)
			}
			g.live[p] = size
			g.sizes = append(g.sizes, size)
			return p, nil
		},
		Free: func(p cuda.DevicePtr, size uint64, ordinal int, stream uintptr) error {
			g.mu.Lock()
			if g.live[p] != size && g.badArg == "" {
				g.badArg = fmt.Sprintf("free of %#x with %d bytes", uint64(p), size)
			}
			delete(g.live, p)
			g.frees++
			g.mu.Unlock()
			return (*g.dev).Free(p)
		},
	}
}

// holds says whether [p, p+n) lies in one of g's live segments.
func (g *goAlloc) holds(p cuda.DevicePtr, n uint64) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	for s, size := range g.live {
		if p >= s && uint64(p)+n <= uint64(s)+size {
			return true
		}
	}
	return false
}

func (g *goAlloc) counts() (live, frees int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.live), g.frees
}

// newPoolBridge returns a bridge on a simulated device that dev is set
// to once opened (for the pools' own allocators).
func newPoolBridge(t *testing.T, thread func() int) (*Bridge, *cuda.Device) {
	t.Helper()
	dev := new(cuda.Device)
	b := New(Config{ThreadID: thread, SpillAddressSpace: 512 << 20, Open: func(ordinal int) (cuda.Device, error) {
		d, err := cuda.OpenSim(cuda.SimConfig{Name: "sim:pool", TotalMemory: 1 << 30, Guest: true})
		*dev = d
		return d, err
	}})
	t.Cleanup(func() { b.Close() })
	if _, err := b.Stats(0); err != nil { // opens the device
		t.Fatal(err)
	}
	return b, dev
}

// TestMemPoolOwnAllocator: a pool made with its own allocator receives the
// memory of the routed thread's allocations as segments in PyTorch's
// sizes, sub-allocated; other threads' allocations stay out; frees
// return to the pool; release gives back the free segments at once and
// the others at their last free; misuse is refused.
func TestMemPoolOwnAllocator(t *testing.T) {
	tid := 1
	b, dev := newPoolBridge(t, func() int { return tid })
	g := newGoAlloc(dev)
	id, err := b.NewMemPool(g.pool())
	if err != nil {
		t.Fatal(err)
	}
	const st = 0x70
	if err := b.BeginMemPool(0, 1, id); err != nil {
		t.Fatal(err)
	}
	var small []cuda.DevicePtr
	for range 16 {
		small = append(small, mustAlloc(t, b, 64<<10, st))
	}
	mid := mustAlloc(t, b, 5<<20, st)
	tid = 2
	outsider := mustAlloc(t, b, 64<<10, st)
	tid = 1
	if err := b.EndMemPool(0, 1, id); err != nil {
		t.Fatal(err)
	}
	after := mustAlloc(t, b, 64<<10, st) // routing ended: not the pool's

	if fmt.Sprint(g.sizes) != fmt.Sprint([]uint64{2 << 20, 20 << 20}) {
		t.Fatalf("the pool's allocator was asked for %v, want [2 MiB 20 MiB]", g.sizes)
	}
	for _, p := range append(small, mid) {
		if !g.holds(p, 64<<10) {
			t.Fatalf("routed allocation %#x is not in the pool allocator's memory", uint64(p))
		}
	}
	for _, p := range []cuda.DevicePtr{outsider, after} {
		if g.holds(p, 1) {
			t.Fatalf("unrouted allocation %#x landed in the pool", uint64(p))
		}
	}
	st0, err := b.MemPoolStats(id)
	if err != nil {
		t.Fatal(err)
	}
	if u := st0.Devices[0]; u.Live != 17 || u.Segments != 2 || !st0.OwnAlloc || st0.Routing != 0 {
		t.Fatalf("MemPoolStats = %+v, want 17 live blocks in 2 segments", st0)
	}
	// A free returns the block to the pool: the next routed allocation of
	// that size reuses it, with no new segment.
	if err := b.Free(small[0], 0); err != nil {
		t.Fatal(err)
	}
	if err := b.BeginMemPool(0, 1, id); err != nil {
		t.Fatal(err)
	}
	if err := b.ReleaseMemPool(id); err == nil {
		t.Fatal("ReleaseMemPool while a thread routes to it succeeded")
	}
	again := mustAlloc(t, b, 64<<10, st)
	if err := b.EndRegion(0, 1); err == nil {
		t.Fatal("EndRegion ended a memory pool's routing")
	}
	if err := b.EndMemPool(0, 1, id+1); err == nil {
		t.Fatal("EndMemPool of another pool succeeded")
	}
	if err := b.EndMemPool(0, 1, id); err != nil {
		t.Fatal(err)
	}
	if err := b.EndMemPool(0, 1, id); err == nil {
		t.Fatal("EndMemPool with no routing succeeded")
	}
	if again != small[0] || len(g.sizes) != 2 {
		t.Fatalf("after a free the pool served %#x (freed %#x) with %d segments asked for", uint64(again), uint64(small[0]), len(g.sizes))
	}
	if err := b.EmptyCache(); err != nil {
		t.Fatal(err)
	}
	if _, frees := g.counts(); frees != 0 {
		t.Fatalf("EmptyCache gave %d segments of a live pool back", frees)
	}

	// Release: the 20 MiB segment is busy (mid), the 2 MiB one too.
	if err := b.Free(mid, 0); err != nil {
		t.Fatal(err)
	}
	if err := b.ReleaseMemPool(id); err != nil {
		t.Fatal(err)
	}
	if live, frees := g.counts(); live != 1 || frees != 1 {
		t.Fatalf("after release: %d segments live, %d given back; want 1 and 1", live, frees)
	}
	if err := b.BeginMemPool(0, 1, id); err == nil {
		t.Fatal("BeginMemPool of a released pool succeeded")
	}
	if err := b.ReleaseMemPool(id); err == nil {
		t.Fatal("a second ReleaseMemPool succeeded")
	}
	for _, p := range append(small[1:], again) {
		if err := b.Free(p, 0); err != nil {
			t.Fatal(err)
		}
	}
	if live, frees := g.counts(); live != 0 || frees != 2 {
		t.Fatalf("after the last free: %d segments live, %d given back; want 0 and 2", live, frees)
	}
	if g.badArg != "" {
		t.Fatalf("the pool's allocator got a wrong argument: %s", g.badArg)
	}
	for _, p := range []cuda.DevicePtr{outsider, after} {
		if err := b.Free(p, 0); err != nil {
			t.Fatal(err)
		}
	}
}

// TestMemPoolNesting: a pool without an allocator is served from the
// spill allocator; routings nest innermost first, over a region too, and
// ending one restores the one below.
func TestMemPoolNesting(t *testing.T) {
	tid := 3
	b, dev := newPoolBridge(t, func() int { return tid })
	g := newGoAlloc(dev)
	own, err := b.NewMemPool(nil)
	if err != nil {
		t.Fatal(err)
	}
	ext, err := b.NewMemPool(g.pool())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.NewMemPool(&PoolAllocator{}); err == nil {
		t.Fatal("NewMemPool with an allocator lacking functions succeeded")
	}
	const st = 0x71
	owner := func(p cuda.DevicePtr) string {
		t.Helper()
		snap, err := b.Snapshot(0)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range snap.Segments {
			if uint64(p) >= s.Address && uint64(p) < s.Address+s.TotalSize {
				return s.Owner
			}
		}
		if g.holds(p, 1) {
			return "ext"
		}
		return "?"
	}
	if err := b.BeginRegion(0, tid, "weights", false); err != nil {
		t.Fatal(err)
	}
	if err := b.BeginMemPool(0, tid, own); err != nil {
		t.Fatal(err)
	}
	a1 := mustAlloc(t, b, 4096, st)
	if err := b.BeginMemPool(0, tid, ext); err != nil {
		t.Fatal(err)
	}
	a2 := mustAlloc(t, b, 4096, st)
	if err := b.BeginRegion(0, tid, "kv", false); err == nil {
		t.Fatal("BeginRegion inside a memory pool's routing succeeded")
	}
	if err := b.EndMemPool(0, tid, own); err == nil {
		t.Fatal("EndMemPool of the outer pool before the inner one succeeded")
	}
	if err := b.EndMemPool(0, tid, ext); err != nil {
		t.Fatal(err)
	}
	a3 := mustAlloc(t, b, 4096, st)
	if err := b.EndMemPool(0, tid, own); err != nil {
		t.Fatal(err)
	}
	a4 := mustAlloc(t, b, 4096, st)
	if err := b.EndRegion(0, tid); err != nil {
		t.Fatal(err)
	}
	a5 := mustAlloc(t, b, 4096, st)
	ownName := fmt.Sprintf("MemPool %d", own)
	for _, c := range []struct {
		p    cuda.DevicePtr
		want string
	}{{a1, ownName}, {a2, fmt.Sprintf("MemPool %d", ext)}, {a3, ownName}, {a4, "weights"}, {a5, ""}} {
		got := owner(c.p)
		if got == "ext" && g.holds(c.p, 1) {
			got = fmt.Sprintf("MemPool %d", ext)
		}
		if got != c.want {
			t.Errorf("allocation %#x is in %q, want %q", uint64(c.p), got, c.want)
		}
	}
	if n := b.regionsOpen.Load(); n != 0 {
		t.Fatalf("regionsOpen = %d after every routing ended", n)
	}
	if err := b.ReleaseMemPool(own); err != nil {
		t.Fatal(err)
	}
	mapped := b.devices[0].spill.Stats().Mapped
	if err := b.Free(a1, 0); err != nil {
		t.Fatal(err)
	}
	if err := b.Free(a3, 0); err != nil {
		t.Fatal(err)
	}
	mustAlloc(t, b, 4096, st) // sees the work queued on its segments done: unmapped
	if got := b.devices[0].spill.Stats().Mapped; got >= mapped {
		t.Fatalf("the released pool's memory stayed mapped: %d bytes, was %d", got, mapped)
	}
}

// TestMemPoolShutsFastPath: while any thread routes to a pool, the C fast
// path stays shut, and pool blocks are never keepable.
func TestMemPoolShutsFastPath(t *testing.T) {
	tid := 4
	b, _ := newPoolBridge(t, func() int { return tid })
	b.CapturesUnderway(0)
	id, err := b.NewMemPool(nil)
	if err != nil {
		t.Fatal(err)
	}
	if !b.FastPathAllowed() {
		t.Fatal("fast path shut before any routing")
	}
	if err := b.BeginMemPool(0, tid, id); err != nil {
		t.Fatal(err)
	}
	if b.FastPathAllowed() {
		t.Fatal("fast path allowed while a thread routes to a memory pool")
	}
	p, keep, err := b.AllocCacheable(4096, 0, 0x72, true)
	if err != nil {
		t.Fatal(err)
	}
	if keep {
		t.Fatal("a memory pool's block was keepable")
	}
	if err := b.EndMemPool(0, tid, id); err != nil {
		t.Fatal(err)
	}
	if !b.FastPathAllowed() {
		t.Fatal("fast path shut after the routing ended")
	}
	if err := b.Free(p, 0); err != nil {
		t.Fatal(err)
	}
}

// TestMemPoolConcurrentThreads: OS threads route to their own pools at
// once (two with allocators of their own, two without) while another
// allocates unrouted; every allocation lands in its own thread's pool.
func TestMemPoolConcurrentThreads(t *testing.T) {
	b, dev := newPoolBridge(t, nil) // the OS thread id
	const workers, rounds = 4, 200
	allocs := make([]*goAlloc, workers)
	ids := make([]int, workers)
	for i := range ids {
		var pa *PoolAllocator
		if i%2 == 0 {
			allocs[i] = newGoAlloc(dev)
			pa = allocs[i].pool()
		}
		id, err := b.NewMemPool(pa)
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = id
	}
	errs := make(chan error, workers+1)
	var wg sync.WaitGroup
	for w := 0; w <= workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			tid := gettid()
			routed := w < workers
			if routed {
				if err := b.BeginMemPool(0, tid, ids[w]); err != nil {
					errs <- err
					return
				}
			}
			var mine []cuda.DevicePtr
			for r := range rounds {
				size := uint64(512 * (1 + (r*7+w)%300))
				p, err := b.Alloc(size, 0, uintptr(0x100+w))
				if err != nil {
					errs <- err
					return
				}
				mine = append(mine, p)
				if r%3 == 2 {
					if err := b.Free(mine[0], 0); err != nil {
						errs <- err
						return
					}
					mine = mine[1:]
				}
			}
			want := "unrouted"
			if routed {
				want = fmt.Sprintf("MemPool %d", ids[w])
			}
			snap, err := b.Snapshot(0)
			if err != nil {
				errs <- err
				return
			}
			for _, p := range mine {
				got := "unrouted"
				for i, g := range allocs {
					if g != nil && g.holds(p, 1) {
						got = fmt.Sprintf("MemPool %d", ids[i])
					}
				}
				for _, s := range snap.Segments {
					if uint64(p) >= s.Address && uint64(p) < s.Address+s.TotalSize && s.Owner != "" {
						got = s.Owner
					}
				}
				if got != want {
					errs <- fmt.Errorf("worker %d: allocation %#x is %s's, want %s's", w, uint64(p), got, want)
					return
				}
			}
			if routed {
				if err := b.EndMemPool(0, tid, ids[w]); err != nil {
					errs <- err
					return
				}
			}
			for _, p := range mine {
				if err := b.Free(p, 0); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for i, id := range ids {
		if err := b.ReleaseMemPool(id); err != nil {
			t.Fatal(err)
		}
		if g := allocs[i]; g != nil {
			if live, _ := g.counts(); live != 0 {
				t.Errorf("pool %d: %d segments not given back after release", id, live)
			}
		}
	}
}

package bridge

import (
	"errors"
	"fmt"
	"sort"
	"sync"

	"github.com/arenaplan/arenaplan/cuda"
	"github.com/arenaplan/arenaplan/spill"
)

// Memory pools a program makes and routes a thread's allocations to
// (PyTorch's torch.cuda.MemPool and use_mem_pool). Routing reuses the
// regions' mechanism: while a thread routes to a pool, the pool's region
// on that device is the thread's region (Device.threadRegion), and the C
// fast path stays shut. A pool without an allocator of its own is served
// from the spill allocator's memory; a pool with one (a PoolAllocator:
// the functions of a CUDAPluggableAllocator, as torch_memory_saver and
// vLLM's sleep mode make them) gets whole segments from it, which the
// spill allocator sub-allocates, and gives them back once the pool is
// released and nothing in them is allocated.

// PoolAllocator is a memory pool's own allocator, with PyTorch's
// CUDAPluggableAllocator signature: Alloc returns size bytes on device
// ordinal for use on stream (a CUstream handle), Free takes them back
// with the size, device and stream they were allocated with. They are
// called with the device's locks held, on the thread that allocates or
// frees (or releases the pool): they must not allocate through this
// bridge.
type PoolAllocator struct {
	Alloc func(size uint64, ordinal int, stream uintptr) (cuda.DevicePtr, error)
	Free  func(p cuda.DevicePtr, size uint64, ordinal int, stream uintptr) error
}

// memPool is a pool made with NewMemPool.
type memPool struct {
	id       int
	alloc    *PoolAllocator // nil: the spill allocator's memory (or the graph heap's)
	graphs   bool           // segments laid out in the device's graph heap (NewGraphMemPool)
	devices  map[int]*region
	routing  int // threads routing to it now, on any device
	released bool
}

// memPools are a bridge's pools, by id.
type memPools struct {
	mu   sync.Mutex
	next int
	byID map[int]*memPool
}

// poolSource adapts a PoolAllocator to the spill allocator's
// SegmentSource for one device.
type poolSource struct {
	a       *PoolAllocator
	ordinal int
}

func (s poolSource) AllocSegment(size uint64, st cuda.Stream) (cuda.DevicePtr, error) {
	return s.a.Alloc(size, s.ordinal, st.Handle())
}

func (s poolSource) FreeSegment(p cuda.DevicePtr, size uint64, st cuda.Stream) error {
	return s.a.Free(p, size, s.ordinal, st.Handle())
}

// NewMemPool makes a memory pool and returns its id (from 1 up). alloc,
// when not nil, is the pool's own allocator: both its functions must be
// set. The pool holds no memory until a thread routes to it
// (BeginMemPool) and allocates.
func (b *Bridge) NewMemPool(alloc *PoolAllocator) (int, error) {
	if alloc != nil && (alloc.Alloc == nil || alloc.Free == nil) {
		return 0, errors.New("bridge: NewMemPool: the pool's allocator needs both Alloc and Free")
	}
	return b.newMemPool(&memPool{alloc: alloc})
}

// NewGraphMemPool makes a memory pool for what CUDA graphs keep beside
// their arenas (the math libraries' workspaces of a capture stream, what
// a training graph's plain calls before its capture leave alive): its
// segments are laid out in the device's graph heap, each of the size its
// block needs, sharing granules of physical memory with each other and
// with the small arenas (heap.go), as CUDA graphs on PyTorch's allocator
// keep their workspaces and tensors in one pool. Like any pool, freed
// blocks go only to the pool's next allocations.
func (b *Bridge) NewGraphMemPool() (int, error) {
	return b.newMemPool(&memPool{graphs: true})
}

func (b *Bridge) newMemPool(p *memPool) (int, error) {
	b.mu.Lock()
	closed := b.closed
	b.mu.Unlock()
	if closed {
		return 0, ErrClosed
	}
	ps := &b.mempools
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.byID == nil {
		ps.byID = map[int]*memPool{}
	}
	ps.next++
	p.id, p.devices = ps.next, map[int]*region{}
	ps.byID[p.id] = p
	return p.id, nil
}

// pool returns pool id; ps.mu is held.
func (ps *memPools) pool(op string, id int) (*memPool, error) {
	p := ps.byID[id]
	if p == nil {
		return nil, fmt.Errorf("bridge: %s: no memory pool %d (never made, or released)", op, id)
	}
	return p, nil
}

// BeginMemPool routes the allocations thread makes on device ordinal
// (outside steps) to pool id until the matching EndMemPool. Routings nest:
// the innermost wins, and ending it restores what was routed before (a
// pool, a region, or nothing). While a thread routes to a pool it cannot
// begin or end a region (BeginRegion, EndRegion).
func (b *Bridge) BeginMemPool(ordinal, thread, id int) error {
	op := fmt.Sprintf("BeginMemPool(device %d, pool %d)", ordinal, id)
	return b.onPoolDevice(op, ordinal, id, func(p *memPool, d *Device) error {
		return b.beginMemPool(op, p, d, thread, id)
	})
}

// onPoolDevice runs f on pool id and device ordinal, with the pools' and
// the device's locks held.
func (b *Bridge) onPoolDevice(op string, ordinal, id int, f func(*memPool, *Device) error) error {
	ps := &b.mempools
	ps.mu.Lock()
	defer ps.mu.Unlock()
	p, err := ps.pool(op, id)
	if err != nil {
		return err
	}
	d, err := b.device(ordinal)
	if err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return f(p, d)
}

// beginMemPool is BeginMemPool with the locks held.
func (b *Bridge) beginMemPool(op string, p *memPool, d *Device, thread, id int) error {
	ordinal := d.ordinal
	r := p.devices[ordinal]
	if r == nil {
		var src spill.SegmentSource
		switch {
		case p.alloc != nil:
			src = poolSource{a: p.alloc, ordinal: ordinal}
		case p.graphs:
			src = d.heap
		}
		name := fmt.Sprintf("MemPool %d", id)
		ap, err := d.spill.NewUserPool(name, src)
		if err != nil {
			return fmt.Errorf("bridge: %s: %w", op, err)
		}
		r = &region{tag: name, pool: ap, mem: p}
		p.devices[ordinal] = r
	}
	if d.poolStack == nil {
		d.poolStack = map[int][]*region{}
	}
	d.poolStack[thread] = append(d.poolStack[thread], d.threadRegion[thread])
	d.threadRegion[thread] = r
	b.regionsOpen.Add(1)
	p.routing++
	return nil
}

// EndMemPool ends thread's innermost routing on device ordinal, which
// must be to pool id.
func (b *Bridge) EndMemPool(ordinal, thread, id int) error {
	op := fmt.Sprintf("EndMemPool(device %d, pool %d)", ordinal, id)
	return b.onPoolDevice(op, ordinal, id, func(p *memPool, d *Device) error {
		return b.endMemPool(op, p, d, thread)
	})
}

// endMemPool is EndMemPool with the locks held.
func (b *Bridge) endMemPool(op string, p *memPool, d *Device, thread int) error {
	top := d.threadRegion[thread]
	stack := d.poolStack[thread]
	if top == nil || top.mem != p || len(stack) == 0 {
		what := "nothing"
		if top != nil {
			what = top.tag
		}
		return fmt.Errorf("bridge: %s: thread %d routes to %s on this device (pool routings end innermost first)", op, thread, what)
	}
	prev := stack[len(stack)-1]
	if len(stack) == 1 {
		delete(d.poolStack, thread)
	} else {
		d.poolStack[thread] = stack[:len(stack)-1]
	}
	if prev == nil {
		delete(d.threadRegion, thread)
	} else {
		d.threadRegion[thread] = prev
	}
	b.regionsOpen.Add(-1)
	p.routing--
	return nil
}

// ReleaseMemPool releases pool id (PyTorch deletes a MemPool): nothing
// more is allocated in it, and its memory goes back, to its allocator
// where it has one, as soon as nothing in it is allocated (tensors still
// alive keep their memory until they are freed). A pool some thread
// routes to cannot be released.
func (b *Bridge) ReleaseMemPool(id int) error {
	op := fmt.Sprintf("ReleaseMemPool(%d)", id)
	ps := &b.mempools
	ps.mu.Lock()
	defer ps.mu.Unlock()
	p, err := ps.pool(op, id)
	if err != nil {
		return err
	}
	if p.routing > 0 {
		return fmt.Errorf("bridge: %s: %d thread(s) still route to it (end use_mem_pool first)", op, p.routing)
	}
	delete(ps.byID, id)
	p.released = true
	var errs []error
	for _, ord := range sortedKeys(p.devices) {
		d, err := b.device(ord)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		restore, err := makeCurrent(d.dev)
		if err != nil {
			errs = append(errs, fmt.Errorf("bridge: %s: device %d: %w", op, ord, err))
			continue
		}
		if err := d.spill.ReleaseUserPool(p.devices[ord].pool); err != nil {
			errs = append(errs, fmt.Errorf("bridge: %s: device %d: %w", op, ord, err))
		}
		restore()
	}
	return errors.Join(errs...)
}

// MemPoolStats is what a memory pool holds now.
type MemPoolStats struct {
	ID       int
	OwnAlloc bool // the pool has an allocator of its own
	Routing  int  // threads routing to it now
	// Devices is, per device ordinal it was used on, its segments and
	// live blocks.
	Devices map[int]spill.UserPoolStats
}

// MemPoolStats returns pool id's state.
func (b *Bridge) MemPoolStats(id int) (MemPoolStats, error) {
	ps := &b.mempools
	ps.mu.Lock()
	defer ps.mu.Unlock()
	p, err := ps.pool("MemPoolStats", id)
	if err != nil {
		return MemPoolStats{}, err
	}
	st := MemPoolStats{ID: id, OwnAlloc: p.alloc != nil, Routing: p.routing, Devices: map[int]spill.UserPoolStats{}}
	for ord, r := range p.devices {
		d, err := b.device(ord)
		if err != nil {
			return st, err
		}
		us, err := d.spill.UserPoolStats(r.pool)
		if err != nil {
			return st, fmt.Errorf("bridge: MemPoolStats(%d): device %d: %w", id, ord, err)
		}
		st.Devices[ord] = us
	}
	return st, nil
}

func sortedKeys(m map[int]*region) []int {
	out := make([]int, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Ints(out)
	return out
}

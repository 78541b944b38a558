package bridge

import (
	"errors"
	"fmt"
	"sync"

	"github.com/arenaplan/arenaplan/cuda"
	"github.com/arenaplan/arenaplan/internal/devmem"
)

// The graph heap: one device's small pieces of graph memory packed side
// by side in one range of addresses, sharing physical memory.
//
// Physical memory is mapped in granules (2 MiB on an H100 or H200). An
// arena of its own rounds up to them, and so does a memory pool's
// segment: a training step of a small model, planned at 2.26 MiB, mapped
// 4, and the cuBLASLt workspace its capture keeps (1 MiB) took a 2 MiB
// segment of its own, where CUDA graphs on PyTorch's allocator hold both
// in one pool. Arenas of at most heapArenaMax bytes, and the segments of
// the pools made for graph memory (NewGraphMemPool: the graphs'
// workspaces, a training graph's plain calls before its capture), are instead
// laid out in the heap at 512-byte boundaries, and a granule is mapped
// while anything laid out there touches it (a count per granule).
//
// An arena in the heap is an ordinary arena.Arena over a cuda.Device
// whose address reservations and mappings the heap serves (heapDevice):
// its addresses, checks, pauses and closes are the arena package's. A
// pause unmaps the granules that only its regions touched; those it
// shares with a workspace or a live arena stay mapped (at most one at
// each end of each region). A pool's segment given back leaves its
// granules mapped until trim, which waits for the device. The heap never
// moves what is laid out in it.
type graphHeap struct {
	mu   sync.Mutex
	dev  cuda.Device
	gran uint64

	base cuda.DevicePtr // the reservation, made on first use
	size uint64
	free devmem.Runs // the reservation's free addresses

	pieces  map[uint64]*heapPiece // mapped granules by index
	mapped  uint64                // physical bytes mapped
	sourced uint64                // bytes handed out as memory pools' segments (AllocSegment)

	handles map[cuda.MemHandle]bool // the handles heapDevice made (they hold nothing)
	nextH   cuda.MemHandle
}

type heapPiece struct {
	h    cuda.MemHandle
	uses int
}

const (
	// heapAlign is where the heap lays things out: the spill allocator's
	// block size, which PyTorch's allocator aligns tensors to as well.
	heapAlign = 512
	// heapArenaMax is the largest arena laid out in the heap; larger
	// ones get granules of their own, whose rounding costs them less
	// than a granule in eight (it cost a small step half its size), and
	// which a pause gives back whole.
	heapArenaMax = 16 << 20
	// heapReserve is the fewest addresses the heap reserves (no memory);
	// it reserves twice the device's memory where that is more, so that
	// its addresses run out long after the device's memory does (a
	// family's arena keeps at most heapArenaMax of room).
	heapReserve = 4 << 30
)

func newGraphHeap(dev cuda.Device) *graphHeap {
	return &graphHeap{dev: dev, pieces: map[uint64]*heapPiece{}, handles: map[cuda.MemHandle]bool{}}
}

// reserve lays out size bytes aligned to align (at most the granularity)
// and returns their address.
func (h *graphHeap) reserve(size, align uint64) (cuda.DevicePtr, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.open(); err != nil {
		return 0, err
	}
	align = max(align, heapAlign)
	if align > h.gran || align&(align-1) != 0 {
		return 0, fmt.Errorf("bridge: graph heap: alignment %d (granularity %d)", align, h.gran)
	}
	size = heapRound(size, heapAlign)
	if off, ok := h.free.Take(size, align); ok {
		return h.base.Add(off), nil
	}
	return 0, fmt.Errorf("bridge: graph heap: no run of %s left among %s of addresses", devmem.Bytes(size), devmem.Bytes(h.size))
}

// release gives back addresses reserve laid out.
func (h *graphHeap) release(p cuda.DevicePtr, size uint64) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	lo, err := h.offset(p, size)
	if err != nil {
		return err
	}
	if !h.free.Put(lo, heapRound(size, heapAlign)) {
		return fmt.Errorf("bridge: graph heap: release of %#x (%s): not laid out", uint64(p), devmem.Bytes(size))
	}
	return nil
}

// use maps the granules [p, p+size) touches that are not mapped yet and
// counts a use of each; on error nothing more stays counted.
func (h *graphHeap) use(p cuda.DevicePtr, size uint64) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	lo, err := h.offset(p, size)
	if err != nil {
		return err
	}
	first, last := h.granules(lo, size)
	for i := first; i <= last; i++ {
		pc := h.pieces[i]
		if pc == nil {
			if pc, err = h.mapPiece(i); err != nil {
				for j := first; j < i; j++ {
					h.drop(j, false)
				}
				return err
			}
		}
		pc.uses++
	}
	return nil
}

// unuse takes back a use of the granules [p, p+size) touches, unmapping
// those no longer used (now: an arena unmaps after waiting for the
// device) or keeping them mapped, idle, until trim (a pool's segment
// given back: work queued on it may still run); it tries every granule
// and returns the first failure.
func (h *graphHeap) unuse(p cuda.DevicePtr, size uint64, now bool) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	lo, err := h.offset(p, size)
	if err != nil {
		return err
	}
	var first error
	g0, g1 := h.granules(lo, size)
	for i := g0; i <= g1; i++ {
		if h.pieces[i] == nil {
			if first == nil {
				first = fmt.Errorf("bridge: graph heap: unmap of %#x (%s): granule %d not mapped", uint64(p), devmem.Bytes(size), i)
			}
			continue
		}
		if err := h.drop(i, now); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// granules returns the first and last granule that size bytes at
// offset lo touch (an empty piece touches the one at lo).
func (h *graphHeap) granules(lo, size uint64) (first, last uint64) {
	return lo / h.gran, (lo + max(size, 1) - 1) / h.gran
}

// drop takes back a use of granule i, unmapping it when it is no longer
// used and now; h.mu is held.
func (h *graphHeap) drop(i uint64, now bool) error {
	pc := h.pieces[i]
	pc.uses = max(pc.uses-1, 0)
	if pc.uses > 0 || !now {
		return nil
	}
	return h.unmapPiece(i)
}

// trim unmaps the granules nothing uses (kept mapped since a pool's
// segment was given back), after waiting for the device (the work queued
// on them). Not while a capture may be underway.
func (h *graphHeap) trim() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	idle := false
	for _, pc := range h.pieces {
		idle = idle || pc.uses == 0
	}
	if !idle {
		return nil
	}
	if err := h.dev.Synchronize(); err != nil {
		return fmt.Errorf("bridge: graph heap: %w", err) // better mapped than unmapped under running work
	}
	var errs []error
	for i, pc := range h.pieces {
		if pc.uses == 0 {
			errs = append(errs, h.unmapPiece(i))
		}
	}
	return errors.Join(errs...)
}

// unmapPiece unmaps granule i; h.mu is held.
func (h *graphHeap) unmapPiece(i uint64) error {
	pc := h.pieces[i]
	delete(h.pieces, i)
	h.mapped -= h.gran
	at := h.base.Add(i * h.gran)
	err := h.dev.MemUnmap(at, h.gran)
	if rerr := h.dev.MemRelease(pc.h); err == nil {
		err = rerr
	}
	if err != nil {
		return fmt.Errorf("bridge: graph heap: unmapping granule %d: %w", i, err)
	}
	return nil
}

// mapPiece maps granule i; h.mu is held.
func (h *graphHeap) mapPiece(i uint64) (*heapPiece, error) {
	at := h.base.Add(i * h.gran)
	mh, err := h.dev.MemCreate(h.gran)
	if err != nil {
		return nil, err
	}
	if err := h.dev.MemMap(at, h.gran, mh); err != nil {
		h.dev.MemRelease(mh)
		return nil, err
	}
	if err := h.dev.MemSetAccess(at, h.gran); err != nil {
		h.dev.MemUnmap(at, h.gran)
		h.dev.MemRelease(mh)
		return nil, err
	}
	pc := &heapPiece{h: mh}
	h.pieces[i] = pc
	h.mapped += h.gran
	return pc, nil
}

// open reserves the heap's addresses on first use; h.mu is held.
func (h *graphHeap) open() error {
	if h.base != 0 {
		return nil
	}
	gran, err := h.dev.Granularity(false)
	if err != nil {
		return fmt.Errorf("bridge: graph heap: %w", err)
	}
	if gran == 0 || gran&(gran-1) != 0 || gran < heapAlign {
		return fmt.Errorf("bridge: graph heap: granularity %d", gran)
	}
	size := uint64(heapReserve)
	if _, total, err := h.dev.MemGetInfo(); err == nil {
		size = max(size, 2*total)
	}
	size = heapRound(size, gran)
	base, err := h.dev.AddressReserve(size, gran)
	if err != nil {
		return fmt.Errorf("bridge: graph heap: reserving %s of addresses: %w", devmem.Bytes(size), err)
	}
	h.base, h.size, h.gran = base, size, gran
	h.free = devmem.NewRuns(size)
	return nil
}

// offset returns p's offset in the heap, where [p, p+size) lies in it;
// h.mu is held.
func (h *graphHeap) offset(p cuda.DevicePtr, size uint64) (uint64, error) {
	if h.base == 0 || p < h.base || uint64(p-h.base) > h.size || size > h.size-uint64(p-h.base) {
		return 0, fmt.Errorf("bridge: graph heap: %#x (%s) is not in it", uint64(p), devmem.Bytes(size))
	}
	return uint64(p - h.base), nil
}

// owns says whether p lies in the heap's addresses.
func (h *graphHeap) owns(p cuda.DevicePtr) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.base != 0 && p >= h.base && uint64(p-h.base) < h.size
}

// extra returns the physical bytes mapped beyond those handed out as
// memory pools' segments (the spill allocator counts those): the arenas
// laid out here, and the rest of the granules they and the segments touch.
func (h *graphHeap) extra() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.mapped < h.sourced {
		return 0
	}
	return h.mapped - h.sourced
}

// close unmaps what is still mapped (the segments of the pools kept for
// the process's life: the spill allocator, closed first, forgot them) and
// gives back the reservation.
func (h *graphHeap) close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.base == 0 {
		return nil
	}
	var errs []error
	for i := range h.pieces {
		errs = append(errs, h.unmapPiece(i))
	}
	errs = append(errs, h.dev.AddressFree(h.base, h.size))
	h.base = 0
	return errors.Join(errs...)
}

// AllocSegment lays out a memory pool's segment of exactly size bytes and
// maps its granules (spill.SegmentSource; spill.PackingSource).
func (h *graphHeap) AllocSegment(size uint64, _ cuda.Stream) (cuda.DevicePtr, error) {
	p, err := h.reserve(size, heapAlign)
	if err != nil {
		return 0, err
	}
	if err := h.use(p, size); err != nil {
		h.release(p, size)
		return 0, err
	}
	h.mu.Lock()
	h.sourced += heapRound(size, heapAlign)
	h.mu.Unlock()
	return p, nil
}

// FreeSegment takes back a segment AllocSegment laid out. Its addresses
// may be laid out again at once; its granules stay mapped until trim
// (the spill allocator gives a source's segment back as soon as its last
// block is freed, with work on it maybe still queued, and a capture maybe
// underway, which forbids waiting).
func (h *graphHeap) FreeSegment(p cuda.DevicePtr, size uint64, _ cuda.Stream) error {
	err := h.unuse(p, size, false)
	if rerr := h.release(p, size); err == nil {
		err = rerr
	}
	h.mu.Lock()
	h.sourced -= min(h.sourced, heapRound(size, heapAlign))
	h.mu.Unlock()
	return err
}

// Packs tells the spill allocator to ask for segments of the request's
// size, not of its size class: the heap shares granules between them.
func (h *graphHeap) Packs() bool { return true }

// heapDevice is the device an arena laid out in the heap sees: its
// address reservations and mappings are the heap's, at 512-byte
// granularity; everything else is the device's.
type heapDevice struct {
	cuda.Device
	h *graphHeap
}

func (d heapDevice) Granularity(bool) (uint64, error) { return heapAlign, nil }

func (d heapDevice) AddressReserve(size, alignment uint64) (cuda.DevicePtr, error) {
	return d.h.reserve(size, alignment)
}

func (d heapDevice) AddressFree(p cuda.DevicePtr, size uint64) error { return d.h.release(p, size) }

// MemCreate makes a handle that holds nothing: the heap maps granules
// when the arena maps the handle.
func (d heapDevice) MemCreate(size uint64) (cuda.MemHandle, error) {
	d.h.mu.Lock()
	defer d.h.mu.Unlock()
	d.h.nextH++
	d.h.handles[d.h.nextH] = true
	return d.h.nextH, nil
}

func (d heapDevice) MemRelease(mh cuda.MemHandle) error {
	d.h.mu.Lock()
	defer d.h.mu.Unlock()
	if !d.h.handles[mh] {
		return fmt.Errorf("bridge: graph heap: release of unknown handle %d", mh)
	}
	delete(d.h.handles, mh)
	return nil
}

func (d heapDevice) MemMap(p cuda.DevicePtr, size uint64, _ cuda.MemHandle) error {
	return d.h.use(p, size)
}

// MemUnmap: an arena unmaps after waiting for the device (Close) or
// while its graphs cannot run (Pause), as with memory of its own.
func (d heapDevice) MemUnmap(p cuda.DevicePtr, size uint64) error { return d.h.unuse(p, size, true) }

// MaxRoom is what a family's arena laid out in the heap may grow to in
// place (arena.RoomLimiter): the heap's addresses must stay few.
func (d heapDevice) MaxRoom() uint64 { return heapArenaMax }

// MemSetAccess: the heap's granules are made accessible when mapped.
func (d heapDevice) MemSetAccess(cuda.DevicePtr, uint64) error { return nil }

// heapRound rounds n up to a multiple of a (a power of two).
func heapRound(n, a uint64) uint64 { return (n + a - 1) &^ (a - 1) }

// arenaOn builds an arena of size bytes with build: laid out in the
// device's graph heap where it is at most heapArenaMax (an empty one too:
// it shares a granule rather than map one of its own; and where the heap
// can hold it: its buffers' alignments, its addresses), else on the device.
func arenaOn[T any](d *Device, size int64, build func(cuda.Device) (T, error)) (T, error) {
	if d.heap != nil && size <= heapArenaMax {
		if v, err := build(heapDevice{d.dev, d.heap}); err == nil {
			return v, nil
		}
	}
	return build(d.dev)
}

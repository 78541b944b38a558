package bridge

// Allocations and frees from the host: served by a planned step, else by
// the spill allocator.

import (
	"errors"
	"fmt"

	"github.com/arenaplan/arenaplan/cuda"
	"github.com/arenaplan/arenaplan/spill"
)

// AllocCacheable is Alloc that also says whether the block came from the
// spill allocator's default pool outside any step, region or capture, or
// is a 0-byte request's token: a block the caller may keep when it is
// freed and hand out again for the next request of its size class (the
// spill allocator rounds requests up to 512-byte multiples; tokens are a
// class of their own), device and stream without calling Alloc (the C
// library's fast path), while FastPathAllowed holds. With grow
// false, an allocation the spill allocator could serve only by mapping
// more memory fails with spill.ErrWouldGrow (counted nowhere): a caller
// keeping blocks gives them back (Free) and asks again with grow true, so
// that what it keeps never makes the process hold more memory.
func (b *Bridge) AllocCacheable(size uint64, ordinal int, stream uintptr, grow bool) (cuda.DevicePtr, bool, error) {
	p, keep, _, err := b.AllocSeq(size, ordinal, stream, grow)
	return p, keep, err
}

// AllocSeq is AllocCacheable that also returns the Seq of the
// allocation's history entry (TraceEntry.Seq) while history is recorded,
// else 0: a caller that notes where each allocation was asked for (the
// Python stack, for PyTorch's snapshots) keeps it under that number.
func (b *Bridge) AllocSeq(size uint64, ordinal int, stream uintptr, grow bool) (cuda.DevicePtr, bool, uint64, error) {
	d, err := b.device(ordinal)
	if err != nil {
		return 0, false, 0, err
	}
	if b.hist.on.Load() {
		p, seq, err := d.allocRecorded(size, stream)
		return p, false, seq, err
	}
	p, keep, err := d.alloc(size, stream, true, grow)
	return p, keep, 0, err
}

// FastPathAllowed says whether a caller may serve allocations from blocks
// it kept (AllocCacheable) without calling Alloc and Free: no capture is
// underway as the host counts them (CapturesUnderway was called, and the
// count is 0), no step runs on any device, no region is open and no
// history is recorded (RecordHistory: it must see every call). Ask it
// again after every call that changes those; with frees kept by the caller
// given back (Free) before such a call.
func (b *Bridge) FastPathAllowed() bool {
	if b.Recording() {
		return false
	}
	b.mu.Lock()
	if b.closed || b.captures != 0 {
		b.mu.Unlock()
		return false
	}
	devs := make([]*Device, 0, len(b.devices))
	for _, d := range b.devices {
		devs = append(devs, d)
	}
	b.mu.Unlock()
	if b.regionsOpen.Load() > 0 {
		return false
	}
	for _, d := range devs {
		d.mu.Lock()
		n := len(d.active)
		d.mu.Unlock()
		if n > 0 {
			return false
		}
	}
	return true
}

// Alloc serves one allocation of size bytes on the given device, for use on
// stream (a CUstream handle, 0 for the legacy default stream).
func (b *Bridge) Alloc(size uint64, ordinal int, stream uintptr) (cuda.DevicePtr, error) {
	d, err := b.device(ordinal)
	if err != nil {
		return 0, err
	}
	if b.hist.on.Load() {
		p, _, err := d.allocRecorded(size, stream)
		return p, err
	}
	p, _, err := d.alloc(size, stream, false, true)
	return p, err
}

// Free gives back the allocation at p. size and stream are what the
// allocation was made with (PyTorch passes them back); they are checked
// against nothing the bridge relies on.
func (b *Bridge) Free(p cuda.DevicePtr, ordinal int) error {
	d, err := b.device(ordinal)
	if err != nil {
		return err
	}
	if b.hist.on.Load() {
		return d.freeRecorded(p)
	}
	return d.free(p)
}

// RecordStream says that work on stream uses the allocation at p
// (Tensor.record_stream).
func (b *Bridge) RecordStream(p cuda.DevicePtr, ordinal int, stream uintptr) error {
	d, err := b.device(ordinal)
	if err != nil {
		return err
	}
	return d.recordStream(p, stream)
}

// EmptyCache gives the spill allocators' unused memory back to the driver
// (torch.cuda.empty_cache). Devices never used are left alone.
func (b *Bridge) EmptyCache() error {
	var errs []error
	for _, d := range b.deviceList() {
		restore, err := makeCurrent(d.dev)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		err = d.spill.EmptyCache()
		if err == nil {
			err = d.heap.trim()
		}
		if err != nil && !errors.Is(err, spill.ErrCapturing) {
			errs = append(errs, fmt.Errorf("bridge: device %d: %w", d.ordinal, err))
		}
		restore()
	}
	return errors.Join(errs...)
}

func (d *Device) alloc(size uint64, stream uintptr, cacheable, grow bool) (cuda.DevicePtr, bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.st.Allocs++
	if size == 0 {
		// A token, whichever step or region is open: the caller may keep
		// it for the next 0-byte request (it is an address, never memory).
		d.st.ZeroAllocs++
		p, err := d.zero.take()
		return p, cacheable && err == nil, err
	}
	if len(d.active) > 0 {
		if s := d.active[stream]; s != nil {
			p, err := s.alloc(size)
			return p, false, err
		}
	}
	if d.b.regionsOpen.Load() > 0 && len(d.threadRegion) > 0 {
		if r := d.threadRegion[d.b.threadID()]; r != nil {
			p, err := d.regionAlloc(r, size, stream)
			return p, false, err
		}
	}
	if !cacheable {
		p, err := d.spillAllocLocked(size, stream)
		return p, false, err
	}
	st, err := d.stream(stream)
	if err != nil {
		return 0, false, err
	}
	p, def, err := d.spill.AllocDefault(size, st, grow)
	if errors.Is(err, spill.ErrWouldGrow) {
		d.st.Allocs--
		return 0, false, err
	}
	if err != nil {
		return 0, false, d.oom(size, err)
	}
	d.st.Spilled++
	return p, def, nil
}

// spillAllocLocked serves size bytes from the spill allocator; d.mu is
// held.
func (d *Device) spillAllocLocked(size uint64, stream uintptr) (cuda.DevicePtr, error) {
	st, err := d.stream(stream)
	if err != nil {
		return 0, err
	}
	p, err := d.spill.Alloc(size, st)
	if err != nil {
		return 0, d.oom(size, err)
	}
	d.st.Spilled++
	return p, nil
}

// oom adds what the device holds to an allocation failure; d.mu is held.
func (d *Device) oom(size uint64, err error) error {
	arenas, _, _ := d.arenas()
	sp := d.spill.Stats()
	return fmt.Errorf("bridge: device %d: allocating %d bytes (planned arenas %s, spill %s mapped, %s in use): %w",
		d.ordinal, size, fmtBytes(arenas), fmtBytes(sp.Mapped), fmtBytes(sp.InUse), err)
}

func (d *Device) free(p cuda.DevicePtr) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.st.Frees++
	if d.zero.owns(p) {
		return d.zero.give(p)
	}
	if sl, ok := d.planned[p]; ok {
		delete(d.planned, p)
		if sl.k == orphan {
			if err := sl.step.releaseOrphan(p, sl.old); err != nil {
				return fmt.Errorf("bridge: device %d: %w", d.ordinal, err)
			}
		} else {
			sl.step.freePlanned(sl.k)
		}
		return nil
	}
	for _, s := range d.active {
		s.freeRecorded(p)
	}
	if err := d.spill.Free(p); err != nil {
		return fmt.Errorf("bridge: device %d: %w", d.ordinal, err)
	}
	return nil
}

func (d *Device) recordStream(p cuda.DevicePtr, stream uintptr) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.zero.owns(p) {
		return nil
	}
	if sl, ok := d.planned[p]; ok {
		if sl.k != orphan {
			sl.step.usedElsewhere(sl.k)
		}
		return nil
	}
	for _, s := range d.active {
		s.recordStreamRecorded(p)
	}
	st, err := d.stream(stream)
	if err != nil {
		return err
	}
	return d.spill.RecordStream(p, st)
}

// RecordStreamAny is RecordStream for callers that do not know the device
// (PyTorch's record_stream hook passes only the pointer and the stream).
func (b *Bridge) RecordStreamAny(p cuda.DevicePtr, stream uintptr) error {
	for _, d := range b.deviceList() {
		if d.owns(p) {
			return d.recordStream(p, stream)
		}
	}
	return fmt.Errorf("bridge: record_stream of %#x: not an allocation of this allocator", uint64(p))
}

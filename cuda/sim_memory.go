package cuda

import (
	"sort"
	"time"
	"unsafe"
)

// simRegion is an Alloc block or a VMM reservation at [base, base+size).
type simRegion struct {
	base, size uint64
	reserved   bool
	data       []byte       // Alloc: the block (hostAlloc); reservation: backing (hostGrow), nil or up to the last mapped or parked byte at least, zero outside those
	maps       []simMapping // reservation only, sorted by off
	parked     []*simPhys   // reservation only: unmapped handles whose bytes stay in data
}

type simMapping struct {
	off, size uint64
	h         *simPhys
	access    bool
}

// simPhys is physical memory from MemCreate. While mapped its bytes live
// in the reservation's backing. Unmapped, they stay parked there, where
// they were mapped (no copy: unmapping is mostly followed by a release),
// until a mapping needs that place or the addresses are freed; then they
// move to data (hostAlloc). Neither parked nor data: zeros, which take no
// host memory.
type simPhys struct {
	id       MemHandle
	size     uint64
	data     []byte
	mapped   bool
	released bool

	home    *simRegion // parked in home.data[homeOff : homeOff+parkLen]
	homeOff uint64
	parkLen uint64
}

const simAllocAlign = 256

func alignUp(v, a uint64) uint64 { return (v + a - 1) &^ (a - 1) }

// place picks the address of a new region; a gap after each keeps
// overruns from landing in the next region.
func (s *Sim) place(size, align uint64) uint64 {
	base := alignUp(s.nextAddr, align)
	s.nextAddr = alignUp(base+size, simAllocAlign) + 64<<10
	return base
}

func (s *Sim) insert(r *simRegion) {
	i := sort.Search(len(s.regions), func(i int) bool { return s.regions[i].base > r.base })
	s.regions = append(s.regions, nil)
	copy(s.regions[i+1:], s.regions[i:])
	s.regions[i] = r
}

func (s *Sim) remove(r *simRegion) {
	for i, x := range s.regions {
		if x == r {
			s.regions = append(s.regions[:i], s.regions[i+1:]...)
			return
		}
	}
}

// find returns the region that holds p.
func (s *Sim) find(p uint64) *simRegion {
	i := sort.Search(len(s.regions), func(i int) bool { return s.regions[i].base > p })
	if i == 0 {
		return nil
	}
	r := s.regions[i-1]
	if p >= r.base+r.size {
		return nil
	}
	return r
}

// bytes returns the device bytes [p, p+n) or ErrorIllegalAddress.
func (s *Sim) bytes(p DevicePtr, n uint64) ([]byte, error) {
	bad := &Error{Op: "sim memory access", Code: ErrorIllegalAddress}
	r := s.find(uint64(p))
	if r == nil || n > r.base+r.size-uint64(p) {
		return nil, bad
	}
	off := uint64(p) - r.base
	if !r.reserved {
		return r.data[off : off+n : off+n], nil
	}
	if !r.covered(off, n, true) {
		return nil, bad
	}
	return r.data[off : off+n : off+n], nil
}

// addressable reports whether [p, p+n) is allocated or mapped (access is
// checked when the work runs).
func (s *Sim) addressable(p DevicePtr, n uint64) bool {
	r := s.find(uint64(p))
	if r == nil || n > r.base+r.size-uint64(p) {
		return false
	}
	return !r.reserved || r.covered(uint64(p)-r.base, n, false)
}

// covered reports whether mappings (with access, if asked) cover
// [off, off+n) of a reservation without holes.
func (r *simRegion) covered(off, n uint64, needAccess bool) bool {
	end := off + n
	for _, m := range r.maps {
		if m.off+m.size <= off {
			continue
		}
		if m.off > off || (needAccess && !m.access) {
			return false
		}
		off = m.off + m.size
		if off >= end {
			return true
		}
	}
	return n == 0
}

func (s *Sim) Alloc(size uint64) (DevicePtr, error) {
	const op = "cuMemAlloc_v2"
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.live(op); err != nil {
		return 0, err
	}
	if err := s.unsafeDuringCapture(op); err != nil {
		return 0, err
	}
	if size == 0 {
		return 0, &Error{Op: op, Code: ErrorInvalidValue}
	}
	rounded := alignUp(size, simAllocAlign)
	if s.used+rounded > s.cfg.TotalMemory {
		return 0, &Error{Op: op, Code: ErrorOutOfMemory}
	}
	data, err := hostAlloc(size)
	if err != nil {
		return 0, &Error{Op: op, Code: ErrorOutOfMemory}
	}
	r := &simRegion{base: s.place(rounded, simAllocAlign), size: size, data: data}
	s.insert(r)
	s.used += rounded
	s.host += size
	return DevicePtr(r.base), nil
}

func (s *Sim) Free(p DevicePtr) error {
	const op = "cuMemFree_v2"
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.live(op); err != nil {
		return err
	}
	if err := s.unsafeDuringCapture(op); err != nil {
		return err
	}
	r := s.find(uint64(p))
	if r == nil || r.reserved || r.base != uint64(p) {
		return &Error{Op: op, Code: ErrorInvalidValue}
	}
	s.remove(r)
	s.used -= alignUp(r.size, simAllocAlign)
	s.host -= r.size
	hostFree(r.data)
	r.data = nil
	return nil
}

// MemGetInfo reports device memory, as the driver does: pinned memory is
// not in it (see SimConfig.TotalMemory).
func (s *Sim) MemGetInfo() (free, total uint64, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.live("cuMemGetInfo_v2"); err != nil {
		return 0, 0, err
	}
	return s.cfg.TotalMemory - s.used, s.cfg.TotalMemory, nil
}

func (s *Sim) CopyHtoD(dst DevicePtr, src []byte) error {
	return s.hostCopy("cuMemcpyHtoD_v2", dst, len(src), func(dev []byte) { copyChunked(dev, src) })
}

func (s *Sim) CopyDtoH(dst []byte, src DevicePtr) error {
	return s.hostCopy("cuMemcpyDtoH_v2", src, len(dst), func(dev []byte) { copyChunked(dst, dev) })
}

// CopyHtoDAsync copies at once (the simulation runs every stream's work
// as it is enqueued); during a capture it fails and invalidates it, as a
// host copy the graph could not replay would.
func (s *Sim) CopyHtoDAsync(dst DevicePtr, src []byte, st Stream) error {
	return s.hostCopyAsync("cuMemcpyHtoDAsync_v2", st, dst, len(src), func(dev []byte) { copyChunked(dev, src) })
}

// CopyDtoHAsync: as CopyHtoDAsync.
func (s *Sim) CopyDtoHAsync(dst []byte, src DevicePtr, st Stream) error {
	return s.hostCopyAsync("cuMemcpyDtoHAsync_v2", st, src, len(dst), func(dev []byte) { copyChunked(dst, dev) })
}

func (s *Sim) hostCopyAsync(op string, st Stream, p DevicePtr, n int, do func(dev []byte)) error {
	s.mu.Lock()
	ss, err := s.stream(op, st)
	if err == nil && ss.capture != nil {
		ss.capture.status = CaptureInvalidated
		err = &Error{Op: op, Code: ErrorStreamCaptureUnsupported}
	}
	s.mu.Unlock()
	if err != nil {
		return err
	}
	return s.hostCopy(op, p, n, do)
}

func (s *Sim) PinnedAlloc(size uint64) ([]byte, error) {
	const op = "cuMemAllocHost_v2"
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.live(op); err != nil {
		return nil, err
	}
	if size == 0 {
		return nil, &Error{Op: op, Code: ErrorInvalidValue}
	}
	// Pinned memory is host memory the process really uses, as is the
	// simulated device's: pinning stays within one limit for both.
	if s.used+s.pinnedBytes > s.cfg.TotalMemory || size > s.cfg.TotalMemory-s.used-s.pinnedBytes {
		return nil, &Error{Op: op, Code: ErrorOutOfMemory}
	}
	b, err := hostAlloc(size)
	if err != nil {
		return nil, &Error{Op: op, Code: ErrorOutOfMemory}
	}
	if s.pinned == nil {
		s.pinned = map[*byte][]byte{}
	}
	s.pinned[unsafe.SliceData(b)] = b
	s.pinnedBytes += size
	s.host += size
	return b, nil
}

// PinnedBytes returns the bytes of PinnedAlloc memory not yet freed (for
// tests that check nothing is left behind).
func (s *Sim) PinnedBytes() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var n uint64
	for _, b := range s.pinned {
		n += uint64(len(b))
	}
	return n
}

func (s *Sim) PinnedFree(b []byte) error {
	const op = "cuMemFreeHost"
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.live(op); err != nil {
		return err
	}
	p := unsafe.SliceData(b)
	whole, ok := s.pinned[p]
	if len(b) == 0 || !ok || len(whole) != len(b) {
		return &Error{Op: op, Code: ErrorInvalidValue}
	}
	delete(s.pinned, p)
	s.pinnedBytes -= uint64(len(whole))
	s.host -= uint64(len(whole))
	hostFree(whole)
	return nil
}

// hostCopy runs a synchronous copy between host memory and the n device
// bytes at p; do gets those bytes.
func (s *Sim) hostCopy(op string, p DevicePtr, n int, do func(dev []byte)) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.live(op); err != nil {
		return err
	}
	if n == 0 {
		return nil
	}
	b, err := s.bytes(p, uint64(n))
	if err != nil {
		return &Error{Op: op, Code: ErrorInvalidValue}
	}
	do(b)
	s.clock += time.Microsecond
	return nil
}

// ---- virtual memory ----

func (s *Sim) Granularity(recommended bool) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.live("cuMemGetAllocationGranularity"); err != nil {
		return 0, err
	}
	return s.cfg.Granularity, nil
}

func (s *Sim) granular(v uint64) bool { return v != 0 && v%s.cfg.Granularity == 0 }

func (s *Sim) AddressReserve(size, alignment uint64) (DevicePtr, error) {
	const op = "cuMemAddressReserve"
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.live(op); err != nil {
		return 0, err
	}
	if !s.granular(size) || (alignment != 0 && alignment&(alignment-1) != 0) {
		return 0, &Error{Op: op, Code: ErrorInvalidValue}
	}
	if alignment < s.cfg.Granularity {
		alignment = s.cfg.Granularity
	}
	r := &simRegion{base: s.place(size, alignment), size: size, reserved: true}
	s.insert(r)
	return DevicePtr(r.base), nil
}

func (s *Sim) AddressFree(p DevicePtr, size uint64) error {
	const op = "cuMemAddressFree"
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.live(op); err != nil {
		return err
	}
	r := s.find(uint64(p))
	if r == nil || !r.reserved || r.base != uint64(p) || r.size != size || len(r.maps) > 0 {
		return &Error{Op: op, Code: ErrorInvalidValue}
	}
	for len(r.parked) > 0 {
		if err := s.evict(r.parked[0]); err != nil {
			return &Error{Op: op, Code: ErrorOutOfMemory}
		}
	}
	s.remove(r)
	hostUnmap(r.data)
	r.data = nil
	return nil
}

func (s *Sim) MemCreate(size uint64) (MemHandle, error) {
	const op = "cuMemCreate"
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.live(op); err != nil {
		return 0, err
	}
	if !s.granular(size) {
		return 0, &Error{Op: op, Code: ErrorInvalidValue}
	}
	if s.used+size > s.cfg.TotalMemory {
		return 0, &Error{Op: op, Code: ErrorOutOfMemory}
	}
	h := &simPhys{id: s.nextHandle, size: size}
	s.nextHandle++
	s.handles[h.id] = h
	s.used += size
	return h.id, nil
}

func (s *Sim) MemRelease(id MemHandle) error {
	const op = "cuMemRelease"
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.live(op); err != nil {
		return err
	}
	h, ok := s.handles[id]
	if !ok || h.released {
		return &Error{Op: op, Code: ErrorInvalidValue}
	}
	h.released = true
	if !h.mapped {
		s.dropPhys(h)
	}
	return nil
}

// unpark forgets where h's bytes were parked.
func (s *Sim) unpark(h *simPhys) {
	r := h.home
	for i, x := range r.parked {
		if x == h {
			r.parked = append(r.parked[:i], r.parked[i+1:]...)
			break
		}
	}
	h.home, h.homeOff, h.parkLen = nil, 0, 0
	s.trimBacking(r)
}

// dropParked gives back the parked bytes of h.
func (s *Sim) dropParked(h *simPhys) {
	hostDiscard(h.home.data[h.homeOff : h.homeOff+h.parkLen])
	s.host -= h.parkLen
	s.unpark(h)
}

// evict moves the parked bytes of h into memory of its own.
func (s *Sim) evict(h *simPhys) error {
	data, err := hostAlloc(h.parkLen)
	if err != nil {
		return err
	}
	copyChunked(data, h.home.data[h.homeOff:h.homeOff+h.parkLen])
	s.host += h.parkLen
	s.dropParked(h)
	h.data = data
	return nil
}

// trimBacking gives back the backing of a reservation with nothing in it.
func (s *Sim) trimBacking(r *simRegion) {
	if len(r.maps) == 0 && len(r.parked) == 0 && r.data != nil {
		hostUnmap(r.data)
		r.data = nil
	}
}

func (s *Sim) dropPhys(h *simPhys) {
	if h.home != nil {
		s.dropParked(h)
	}
	delete(s.handles, h.id)
	s.used -= h.size
	if h.data != nil {
		s.host -= uint64(len(h.data))
		hostFree(h.data)
		h.data = nil
	}
}

// reservation returns the reservation holding [p, p+size) and the offset.
func (s *Sim) reservation(p DevicePtr, size uint64) (*simRegion, uint64, bool) {
	r := s.find(uint64(p))
	if r == nil || !r.reserved || size > r.base+r.size-uint64(p) {
		return nil, 0, false
	}
	return r, uint64(p) - r.base, true
}

// mappedRange checks the range [p, p+size) that op (cuMemSetAccess,
// cuMemUnmap) acts on: granular, within one reservation and covered by
// its mappings. It returns the reservation and the offset; s.mu is held.
func (s *Sim) mappedRange(op string, p DevicePtr, size uint64) (*simRegion, uint64, error) {
	if err := s.live(op); err != nil {
		return nil, 0, err
	}
	r, off, ok := s.reservation(p, size)
	if !ok || !s.granular(size) || !r.covered(off, size, false) {
		return nil, 0, &Error{Op: op, Code: ErrorInvalidValue}
	}
	return r, off, nil
}

func (s *Sim) MemMap(p DevicePtr, size uint64, id MemHandle) error {
	const op = "cuMemMap"
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.live(op); err != nil {
		return err
	}
	h, ok := s.handles[id]
	if !ok || h.released || !s.granular(size) || size > h.size {
		return &Error{Op: op, Code: ErrorInvalidValue}
	}
	if h.mapped {
		return &Error{Op: op, Code: ErrorNotSupported} // the simulation maps a handle once
	}
	r, off, ok := s.reservation(p, size)
	if !ok || off%s.cfg.Granularity != 0 {
		return &Error{Op: op, Code: ErrorInvalidValue}
	}
	for _, m := range r.maps {
		if m.off < off+size && off < m.off+m.size {
			return &Error{Op: op, Code: ErrorInvalidValue}
		}
	}
	// Parked bytes where h goes move out first (unless they are h's own,
	// in place).
	for i := 0; i < len(r.parked); {
		q := r.parked[i]
		inPlace := q == h && q.homeOff == off && q.parkLen == size
		if inPlace || q.homeOff >= off+size || off >= q.homeOff+q.parkLen {
			i++
			continue
		}
		if err := s.evict(q); err != nil {
			return &Error{Op: op, Code: ErrorOutOfMemory}
		}
	}
	if need := off + size; uint64(len(r.data)) < need {
		// Grow the backing (a quarter at least, within the
		// reservation) without copying it: hostGrow remaps.
		n := uint64(len(r.data))
		grown, err := hostGrow(r.data, min(max(need, n+n/4), r.size))
		if err != nil {
			return &Error{Op: op, Code: ErrorOutOfMemory}
		}
		r.data = grown
	}
	// The mapping goes in first: the backing stays while it is there.
	i := sort.Search(len(r.maps), func(i int) bool { return r.maps[i].off > off })
	r.maps = append(r.maps, simMapping{})
	copy(r.maps[i+1:], r.maps[i:])
	r.maps[i] = simMapping{off: off, size: size, h: h}
	// Outside mappings and parked bytes the backing is zero: a handle
	// without bytes maps as it is, touching nothing.
	switch dst := r.data[off : off+size]; {
	case h.home == r && h.homeOff == off && h.parkLen == size:
		s.host -= size
		s.unpark(h) // its bytes are already there
	case h.home != nil:
		copyChunked(dst, h.home.data[h.homeOff:h.homeOff+h.parkLen])
		s.dropParked(h)
	case h.data != nil:
		copyChunked(dst, h.data)
		s.host -= uint64(len(h.data))
		hostFree(h.data)
		h.data = nil
	}
	h.mapped = true
	s.host += size
	return nil
}

func (s *Sim) MemSetAccess(p DevicePtr, size uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, off, err := s.mappedRange("cuMemSetAccess", p, size)
	if err != nil {
		return err
	}
	for i := range r.maps {
		m := &r.maps[i]
		if m.off < off+size && off < m.off+m.size {
			m.access = true
		}
	}
	return nil
}

func (s *Sim) MemUnmap(p DevicePtr, size uint64) error {
	const op = "cuMemUnmap"
	s.mu.Lock()
	defer s.mu.Unlock()
	r, off, err := s.mappedRange(op, p, size)
	if err != nil {
		return err
	}
	var keep, gone []simMapping
	for _, m := range r.maps {
		if m.off+m.size <= off || m.off >= off+size {
			keep = append(keep, m)
			continue
		}
		if m.off < off || m.off+m.size > off+size {
			return &Error{Op: op, Code: ErrorInvalidValue} // would split a mapping
		}
		gone = append(gone, m)
	}
	r.maps = keep
	for _, m := range gone {
		m.h.mapped = false
		if m.h.released {
			hostDiscard(r.data[m.off : m.off+m.size])
			s.host -= m.size
			s.dropPhys(m.h)
			continue
		}
		// Parked: the bytes stay where they are, still host memory.
		m.h.home, m.h.homeOff, m.h.parkLen = r, m.off, m.size
		r.parked = append(r.parked, m.h)
	}
	s.trimBacking(r)
	return nil
}

// hostChunk bounds one copy or clear of simulated memory: a long memmove
// cannot be preempted, and would hold up the runtime (a collection, a
// Ctrl-C handler) for as long as it runs.
const hostChunk = 4 << 20

func copyChunked(dst, src []byte) {
	n := min(len(dst), len(src))
	for i := 0; i < n; i += hostChunk {
		j := min(i+hostChunk, n)
		copy(dst[i:j], src[i:j])
	}
}

func clearChunked(b []byte) {
	for i := 0; i < len(b); i += hostChunk {
		clear(b[i:min(i+hostChunk, len(b))])
	}
}

// HostBytes returns the host memory the simulated device holds for what
// it simulates: allocations, mapped physical memory, the bytes of
// unmapped handles not yet released, pinned memory. Reserved addresses
// and physical memory never written cost nothing. (For tests that check
// the simulation's memory stays bounded by what it maps.)
func (s *Sim) HostBytes() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.host
}

package spill

import (
	"errors"
	"fmt"
	"sort"

	"github.com/arenaplan/arenaplan/cuda"
	"github.com/arenaplan/arenaplan/internal/devmem"
)

// segment is physical memory mapped at one place, owned by one pool and
// one stream.
type segment struct {
	addr cuda.DevicePtr
	size uint64         // mapped bytes
	h    cuda.MemHandle // the first mapping's
	// va: the addresses reserved for it (0: size), of which a mid segment
	// (MidSegment) maps only what its blocks need, extending in place
	// with more mappings (tail) as requests of its size class come.
	va     uint64
	tail   []piece
	plain  bool // from cuMemAlloc (WithPlainSegments), not mapped
	paused bool // its physical memory is released (PausePools); h is stale
	host   []byte
	pinned bool // host is page-locked (kept from one pause to the next)
	pool   *Pool
	stream cuda.Stream
	handle uintptr // stream.Handle()
	small  bool    // holds only blocks of at most SmallBlock bytes
	key    uintptr // its free list in the pool: freeKey(handle, small)
	first  *block
	doomed bool // in Allocator.doomed: out of its pool's free lists, to be unmapped
	// idle: wholly free in the default pool, in Allocator.idle since the
	// idleSeq-th such change, when the allocator had waited for the device
	// idleGen times (adopt.go).
	idle             bool
	idleSeq, idleGen uint64
}

// wholeFree says whether no block of seg is allocated or waiting.
func (seg *segment) wholeFree() bool {
	return seg.first.next == nil && seg.first.state == stFree
}

// piece is a mapping that extended a segment in place: size bytes after
// the segment's earlier mappings.
type piece struct {
	size uint64
	h    cuda.MemHandle
}

// reserved is the bytes of addresses seg holds.
func (seg *segment) reserved() uint64 { return max(seg.va, seg.size) }

// grow maps memory for a block of at least rsize bytes for (pool, st)
// and returns that free block, out of the tree. A small request (see
// SmallBlock) gets a segment of one chunk that serves small requests only.
// In the default pool, a request of at most MidBlock extends a segment of
// its stream and size class in place where one has the addresses left
// (MidSegment's worth), or else starts one: it reserves MidSegment of
// addresses and maps what the request needs, so that later requests of
// those sizes share it, as PyTorch's 20 MiB segments are shared, without
// mapping the rest before it is used. Others get a segment of their own
// size.
func (s *Allocator) grow(pool *Pool, st cuda.Stream, rsize uint64) (*block, error) {
	size := roundUp(rsize, s.cfg.chunk)
	if pool.user != nil && pool.user.src != nil {
		size = pool.user.segmentSize(rsize)
	}
	small := pool.small(rsize)
	va := s.reserveSize(pool, rsize)
	if va > size {
		if b := s.extend(pool, st, rsize); b != nil {
			return b, nil
		}
	}
	b, err := s.mapSegment(pool, st, size, va, small)
	if err != nil && va > size {
		b, err = s.mapSegment(pool, st, size, size, small) // addresses short
	}
	if err != nil && len(s.captures) == 0 && s.trim(false) > 0 {
		b, err = s.mapSegment(pool, st, size, size, small)
	}
	if err == nil && pool.backup {
		s.pinBackup(b.seg)
	}
	return b, err
}

// extend maps more memory at the end of one of (pool, st)'s mid segments
// for a block of rsize bytes, and returns that free block out of the tree
// (the segment's free last block grown, or a new one after it); nil if no
// segment has the addresses left or the mapping fails. Of the segments
// that can, it takes the one that maps least. s.mu is held.
func (s *Allocator) extend(pool *Pool, st cuda.Stream, rsize uint64) *block {
	var best *segment
	var bestNeed uint64
	var bestLast *block
	for seg := range s.mids {
		if seg.pool != pool || seg.handle != st.Handle() || seg.small || seg.va <= seg.size || seg.doomed {
			continue
		}
		last := seg.first
		for last.next != nil {
			last = last.next
		}
		need := roundUp(rsize, s.cfg.chunk)
		if last.state == stFree {
			need = roundUp(rsize-min(rsize, last.size), s.cfg.chunk)
		}
		if seg.size+need > seg.va || s.st.Mapped+need > s.cfg.limit {
			continue
		}
		if best == nil || need < bestNeed || need == bestNeed && seg.addr < best.addr {
			best, bestNeed, bestLast = seg, need, last
		}
	}
	if best == nil {
		return nil
	}
	seg, at := best, best.addr.Add(best.size)
	h, err := s.dev.MemCreate(bestNeed)
	if err != nil {
		return nil
	}
	if err := s.dev.MemMap(at, bestNeed, h); err != nil {
		s.dev.MemRelease(h)
		return nil
	}
	if err := s.dev.MemSetAccess(at, bestNeed); err != nil {
		s.dev.MemUnmap(at, bestNeed)
		s.dev.MemRelease(h)
		return nil
	}
	s.unmarkIdle(seg)
	seg.tail = append(seg.tail, piece{size: bestNeed, h: h})
	seg.size += bestNeed
	s.mapped(bestNeed)
	b := bestLast
	if b.state == stFree {
		seg.pool.tree(seg.key).Delete(b)
		b.size += bestNeed
		return b
	}
	nb := s.newBlock()
	*nb = block{addr: uint64(at), size: bestNeed, seg: seg, prev: b, state: stFree}
	b.next = nb
	return nb
}

// reserveSize is the addresses a new segment for rsize bytes in pool
// reserves: MidSegment for a request of at most MidBlock in the default
// pool, else the request rounded up to the chunk (a user pool's source:
// see userSegmentSize), which is also what it maps.
func (s *Allocator) reserveSize(pool *Pool, rsize uint64) uint64 {
	if pool.user != nil && pool.user.src != nil {
		return pool.user.segmentSize(rsize)
	}
	size := roundUp(rsize, s.cfg.chunk)
	if pool == s.def && !pool.small(rsize) && rsize <= MidBlock {
		size = max(size, roundUp(MidSegment, s.cfg.chunk))
	}
	return size
}

// mapSegment maps a new segment of size bytes at va bytes of reserved
// addresses (va > size: a mid segment, see grow).
func (s *Allocator) mapSegment(pool *Pool, st cuda.Stream, size, va uint64, small bool) (*block, error) {
	state := func() string {
		return fmt.Sprintf("%s mapped (limit %s), %s in use, %s cached, of %s reserved addresses",
			devmem.Bytes(s.st.Mapped), devmem.Bytes(s.cfg.limit), devmem.Bytes(s.st.InUse),
			devmem.Bytes(s.st.Mapped-s.st.InUse), devmem.Bytes(s.cfg.addressSpace))
	}
	if s.st.Mapped+size > s.cfg.limit {
		return nil, fmt.Errorf("%w: a new %s segment would pass the limit: %s", ErrOutOfMemory, devmem.Bytes(size), state())
	}
	if pool.user != nil && pool.user.src != nil {
		return s.externalSegment(pool, st, size)
	}
	// deviceErr words a device call's failure; out of memory is the
	// allocator's ErrOutOfMemory with its state.
	deviceErr := func(doing string, err error) error {
		if errors.Is(err, cuda.ErrorOutOfMemory) {
			return fmt.Errorf("%w: device has no %s for a new segment: %s: %w", ErrOutOfMemory, devmem.Bytes(size), state(), err)
		}
		return fmt.Errorf("%s a %s segment: %w", doing, devmem.Bytes(size), err)
	}
	if s.plainNow() && pool.region == "" {
		addr, err := s.dev.Alloc(size)
		if err != nil {
			return nil, deviceErr("allocating", err)
		}
		return s.addSegment(&segment{addr: addr, size: size, plain: true, pool: pool, stream: st, handle: st.Handle(), small: small}), nil
	}
	off, ok := s.vaFree.Take(va, 1)
	if !ok {
		return nil, fmt.Errorf("%w: no %s run of free reserved addresses left: %s", ErrOutOfMemory, devmem.Bytes(va), state())
	}
	addr := s.base.Add(off)
	fail := func(err error) (*block, error) {
		s.vaFree.Put(off, va)
		return nil, deviceErr("mapping", err)
	}
	h, err := s.dev.MemCreate(size)
	if err != nil {
		return fail(err)
	}
	if err := s.dev.MemMap(addr, size, h); err != nil {
		s.dev.MemRelease(h)
		return fail(err)
	}
	if err := s.dev.MemSetAccess(addr, size); err != nil {
		s.dev.MemUnmap(addr, size)
		s.dev.MemRelease(h)
		return fail(err)
	}
	seg := &segment{addr: addr, size: size, h: h, pool: pool, stream: st, handle: st.Handle(), small: small}
	if va > size {
		seg.va = va
		s.mids[seg] = true
	}
	return s.addSegment(seg), nil
}

// plainNow says whether a new segment may come from cuMemAlloc: plain
// segments are asked for, and no capture can be underway (cuMemAlloc
// invalidates a global-mode capture).
func (s *Allocator) plainNow() bool {
	return s.cfg.plain && len(s.captures) == 0 && (!s.cfg.foreign || (s.hinted && s.foreignN == 0))
}

func (s *Allocator) addSegment(seg *segment) *block {
	size := seg.size
	seg.key = freeKey(seg.handle, seg.small)
	seg.first = &block{addr: uint64(seg.addr), size: size, seg: seg, state: stFree}
	s.segments[seg] = true
	s.st.Segments++
	s.mapped(size)
	return seg.first
}

// mapped counts size bytes newly mapped.
func (s *Allocator) mapped(size uint64) {
	s.st.Mapped += size
	s.st.Grows++
	s.st.GrownBytes += size
	s.st.PeakMapped = max(s.st.PeakMapped, s.st.Mapped)
	s.mappedHigh = max(s.mappedHigh, s.st.Mapped)
	s.intervalPeak = max(s.intervalPeak, s.st.Mapped)
}

// EmptyCache unmaps every segment that is wholly free and that no graph
// needs (the default pool's, and those of private pools whose graphs and
// owner released them), giving the memory back to the driver. It refuses
// during a capture (ErrCapturing).
func (s *Allocator) EmptyCache() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("spill: EmptyCache: %w", ErrClosed)
	}
	if len(s.captures) > 0 {
		return fmt.Errorf("spill: EmptyCache: %w", ErrCapturing)
	}
	if err := s.processPending(); err != nil {
		return fmt.Errorf("spill: EmptyCache: %w", err)
	}
	s.trim(false)
	s.mappedHigh = s.st.Mapped // given back on request: not to be mapped again unasked
	return nil
}

// makeRoom gives the wholly free segments back to the driver before a
// grow for rsize bytes that would map more than this allocator ever held
// at once (mappedHigh), where they hold at least the new segment's bytes
// and the request is not small (a small one adds one chunk).
// The free memory an earlier phase of a step left in segments too small
// for this request then goes back instead of staying mapped beside the new
// segment, so that a new peak is what is in use plus the slack of
// partly used segments, not everything cached. (PyTorch's allocator gives
// its cache back only once the device is out of memory: a training step's
// first backward, or a recorded run before a capture, held up to 30%
// more than it used at its peak.) It waits for the device, as trim does:
// a process reaches a new peak a few times, never in a steady step, and
// only where no capture is underway (as plainNow). s.mu is held.
func (s *Allocator) makeRoom(pool *Pool, rsize uint64) {
	size := roundUp(rsize, s.cfg.chunk)
	if pool.small(rsize) || s.st.Mapped+size <= s.mappedHigh || len(s.captures) > 0 || (pool.user != nil && pool.user.src != nil) ||
		(s.cfg.foreign && (!s.hinted || s.foreignN > 0)) {
		return
	}
	var free uint64
	for seg := range s.segments {
		if s.trimmable(seg) {
			free += seg.size
		}
	}
	if free >= size {
		s.trim(false)
	}
}

// trimmable says whether trim(false) unmaps seg: wholly free, not paused,
// not doomed already, and in a pool no graph holds.
func (s *Allocator) trimmable(seg *segment) bool {
	kept := seg.pool.private && seg.pool.refs > 0 && seg.pool.region == ""
	return !seg.doomed && seg.wholeFree() && !kept && !seg.paused
}

// trim unmaps free segments of pools no graph holds (all when closing)
// and the doomed ones, and returns the bytes unmapped. Work queued on a
// segment must finish before it is unmapped (cuMemUnmap does not wait
// for it): trim waits for the device first (Close has), and unmaps
// nothing if that fails.
func (s *Allocator) trim(all bool) uint64 {
	var freed uint64
	var segs []*segment
	for seg := range s.segments {
		if all && !seg.doomed || s.trimmable(seg) {
			segs = append(segs, seg)
		}
	}
	if len(segs)+len(s.doomed) == 0 {
		return 0
	}
	if !all {
		s.st.Syncs++
		if err := s.dev.Synchronize(); err != nil {
			return 0 // better cached than unmapped under running work
		}
		s.syncGen++
	}
	for _, d := range s.doomed {
		if d.ev != nil {
			s.events = append(s.events, d.ev)
		}
		freed += d.seg.size
		s.unmapReleased(d.seg)
	}
	clear(s.doomed)
	s.doomed = s.doomed[:0]
	sort.Slice(segs, func(i, j int) bool { return segs[i].addr < segs[j].addr })
	for _, seg := range segs {
		if b := seg.first; seg.wholeFree() {
			s.unmarkIdle(seg)
			seg.pool.tree(seg.key).Delete(b)
			seg.pool.dropTree(seg.key)
		}
		if seg.host != nil {
			s.dropHost(seg)
		}
		if seg.paused {
			// Nothing is mapped: only the addresses go back.
			s.vaFree.Put(uint64(seg.addr-s.base), seg.reserved())
			delete(s.segments, seg)
			delete(s.mids, seg)
			s.st.Paused -= seg.size
			s.st.Segments--
			continue
		}
		s.unmapSegment(seg)
		freed += seg.size
	}
	for p := range s.pools {
		if p.private && p.region == "" && p.refs == 0 && p.capturing == nil && !s.poolHasSegments(p) {
			delete(s.pools, p)
		}
	}
	return freed
}

// unmapSegment gives seg's memory back (to the pool's own allocator, the
// driver, or the reserved addresses) and forgets it; its blocks are out of
// every free list already; s.mu is held.
func (s *Allocator) unmapSegment(seg *segment) {
	s.unmarkIdle(seg)
	switch {
	case seg.external():
		s.freeExternal(seg)
	case seg.plain:
		s.dev.Free(seg.addr)
	default:
		// Each mapping apart: cuMemUnmap takes whole mappings.
		first := seg.size
		for _, p := range seg.tail {
			first -= p.size
		}
		s.dev.MemUnmap(seg.addr, first)
		s.dev.MemRelease(seg.h)
		at := seg.addr.Add(first)
		for _, p := range seg.tail {
			s.dev.MemUnmap(at, p.size)
			s.dev.MemRelease(p.h)
			at = at.Add(p.size)
		}
		s.vaFree.Put(uint64(seg.addr-s.base), seg.reserved())
	}
	delete(s.segments, seg)
	delete(s.mids, seg)
	s.st.Mapped -= seg.size
	s.st.Segments--
	s.st.Unmaps++
	s.st.UnmappedBytes += seg.size
}

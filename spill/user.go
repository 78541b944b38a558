package spill

import (
	"errors"
	"fmt"
	"slices"

	"github.com/arenaplan/arenaplan/cuda"
	"github.com/arenaplan/arenaplan/internal/devmem"
)

// User pools: pools a program makes and routes allocations to by itself
// (PyTorch's MemPool). A user pool's segments come from the allocator's
// own device memory, or, when it has a SegmentSource, from that source:
// another allocator that hands out whole segments, which this one
// sub-allocates (as PyTorch's caching allocator does with a MemPool's
// allocator). AllocIn serves a user pool; Alloc never picks one. Its
// cached segments stay while the pool is held and go back once the owner
// releases it (ReleaseUserPool) and no block in them is allocated.

// SegmentSource hands out and takes back whole segments for a user pool.
// Its calls are made under the allocator's lock, on the thread that
// allocates or frees: they must not call back into this allocator.
type SegmentSource interface {
	// AllocSegment returns size bytes of device memory for blocks used on
	// st, aligned to at least 256 bytes, or an error.
	AllocSegment(size uint64, st cuda.Stream) (cuda.DevicePtr, error)
	// FreeSegment takes back a segment AllocSegment returned, with the
	// size and stream it was made with.
	FreeSegment(p cuda.DevicePtr, size uint64, st cuda.Stream) error
}

// PackingSource is a SegmentSource that lays its segments out side by
// side, sharing the granules of physical memory they touch: a user pool
// with one asks it for segments of the request's size (rounded up to
// MinBlock) rather than of the request's size class.
type PackingSource interface {
	SegmentSource
	Packs() bool
}

// userPool is what a user pool adds to a Pool.
type userPool struct {
	name string
	src  SegmentSource // nil: the allocator's own memory
	// freeErr is the last failure of src.FreeSegment (the segment is
	// dropped from the allocator all the same).
	freeErr error
}

// The segment sizes asked of a SegmentSource, as PyTorch's caching
// allocator asks a MemPool's allocator: 2 MiB for requests of up to
// 1 MiB, 20 MiB for requests of up to 10 MiB, larger ones rounded up to
// 2 MiB.
const (
	userSmallSegment = 2 << 20
	userLargeSegment = 20 << 20
	userRound        = 2 << 20
)

// segmentSize is the segment u's source is asked for to serve rsize
// bytes.
func (u *userPool) segmentSize(rsize uint64) uint64 {
	if ps, ok := u.src.(PackingSource); ok && ps.Packs() {
		return roundUp(rsize, MinBlock)
	}
	return userSegmentSize(rsize)
}

// userSegmentSize is the segment a SegmentSource is asked for to serve
// rsize bytes.
func userSegmentSize(rsize uint64) uint64 {
	switch {
	case rsize <= 1<<20:
		return userSmallSegment
	case rsize <= 10<<20:
		return userLargeSegment
	}
	return roundUp(rsize, userRound)
}

// NewUserPool returns a pool that only AllocIn serves, named name in
// errors and snapshots. src, when not nil, supplies its segments (see
// SegmentSource); otherwise they are the allocator's own. Release it with
// ReleaseUserPool.
func (s *Allocator) NewUserPool(name string, src SegmentSource) (*Pool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, fmt.Errorf("spill: NewUserPool(%q): %w", name, ErrClosed)
	}
	if name == "" {
		return nil, errors.New("spill: NewUserPool: empty name")
	}
	p := s.newPool(true)
	p.user, p.refs = &userPool{name: name, src: src}, 1
	return p, nil
}

// ReleaseUserPool drops the owner's hold on a user pool: nothing more is
// allocated in it, and each of its segments goes back as soon as no block
// in it is allocated: to its SegmentSource then; the allocator's own
// memory once the work queued on the segment by then is done. Those
// wholly free go back now (it waits for their streams first; during a
// capture, at the next EmptyCache); the others at the free of their last
// block (unmapped once an event recorded then has completed, seen at a
// later Alloc, or at EmptyCache, which waits for the device); blocks whose
// free waited on other streams, at the next EmptyCache. It returns the
// last failure of the source's FreeSegment.
func (s *Allocator) ReleaseUserPool(p *Pool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p == nil || p.user == nil || p.s != s {
		return fmt.Errorf("spill: ReleaseUserPool: %v is not a user pool of this allocator", p)
	}
	if s.closed {
		return fmt.Errorf("spill: ReleaseUserPool(%s): %w", p, ErrClosed)
	}
	if p.refs <= 0 {
		return fmt.Errorf("spill: ReleaseUserPool(%s): %w (released already)", p, ErrUnknown)
	}
	p.refs--
	segs := s.poolSegments(p)
	// The wholly free segments' work is waited for here, once per stream,
	// so that they are unmapped now (outside captures; else doomed).
	done := false
	if len(s.captures) == 0 {
		done = true
		var waited []uintptr
		for _, seg := range segs {
			if seg.external() || seg.paused || !seg.wholeFree() || slices.Contains(waited, seg.handle) {
				continue
			}
			if seg.stream.Synchronize() != nil {
				done = false
				break
			}
			waited = append(waited, seg.handle)
		}
	}
	for _, seg := range segs {
		s.dropReleased(seg, done)
	}
	if !s.poolHasSegments(p) {
		delete(s.pools, p)
	}
	if err := p.user.freeErr; err != nil {
		return fmt.Errorf("spill: ReleaseUserPool(%s): %w", p, err)
	}
	return nil
}

// external says whether seg came from a user pool's SegmentSource.
func (seg *segment) external() bool {
	return seg.pool != nil && seg.pool.user != nil && seg.pool.user.src != nil
}

// externalSegment asks pool's source for a segment of size bytes; s.mu is
// held.
func (s *Allocator) externalSegment(pool *Pool, st cuda.Stream, size uint64) (*block, error) {
	if s.st.Mapped+size > s.cfg.limit {
		return nil, fmt.Errorf("%w: a new %s segment of %s would pass the limit of %s", ErrOutOfMemory, devmem.Bytes(size), pool, devmem.Bytes(s.cfg.limit))
	}
	addr, err := pool.user.src.AllocSegment(size, st)
	if err != nil {
		return nil, fmt.Errorf("%s's allocator, asked for a %s segment: %w", pool, devmem.Bytes(size), err)
	}
	if addr == 0 || uint64(addr)%256 != 0 {
		if addr != 0 {
			if ferr := pool.user.src.FreeSegment(addr, size, st); ferr != nil {
				pool.user.freeErr = ferr
			}
		}
		return nil, fmt.Errorf("%s's allocator, asked for a %s segment, returned %#x (want a non-zero address aligned to 256 bytes)",
			pool, devmem.Bytes(size), uint64(addr))
	}
	return s.addSegment(&segment{addr: addr, size: size, pool: pool, stream: st, handle: st.Handle()}), nil
}

// freeExternal gives seg back to its source; the caller drops it from the
// allocator's books.
func (s *Allocator) freeExternal(seg *segment) {
	if err := seg.pool.user.src.FreeSegment(seg.addr, seg.size, seg.stream); err != nil {
		seg.pool.user.freeErr = fmt.Errorf("giving back %s at %#x: %w", devmem.Bytes(seg.size), uint64(seg.addr), err)
	}
}

// doomed is a released user pool's segment with nothing allocated, to be
// unmapped once the work queued on its stream before that is done (ev
// completed; ev nil: at the next trim, which waits for the device).
type doomed struct {
	seg *segment
	ev  cuda.Event
}

// dropReleased gives back seg, a segment of a released user pool, if no
// block in it is allocated or waiting: to its SegmentSource now; mapped
// memory now if done (the work queued on it was waited for), else it is
// doomed: out of its pool's free lists, unmapped once the work queued on
// it is done (processDoomed), since a block is freed as soon as its last
// kernel is queued and cuMemUnmap does not wait for them; s.mu is held.
func (s *Allocator) dropReleased(seg *segment, done bool) {
	if seg.paused || seg.doomed || !seg.wholeFree() || seg.pool.refs > 0 {
		return
	}
	seg.pool.tree(seg.key).Delete(seg.first)
	seg.pool.dropTree(seg.key)
	if seg.external() || done {
		// done: its work was waited for. An allocator's free takes the
		// stream and orders itself, as a CUDAPluggableAllocator's does.
		s.unmapReleased(seg)
		return
	}
	seg.doomed = true
	d := doomed{seg: seg}
	if len(s.captures) == 0 { // else: at the next trim
		if n := len(s.events); n > 0 {
			d.ev, s.events = s.events[n-1], s.events[:n-1]
		} else if ev, err := s.dev.NewEvent(false); err == nil {
			d.ev = ev
		}
		if d.ev != nil && d.ev.Record(seg.stream) != nil {
			s.events = append(s.events, d.ev)
			d.ev = nil
		}
	}
	s.doomed = append(s.doomed, d)
}

// processDoomed unmaps the doomed segments whose work is done; outside
// captures (event queries are among the calls a global-mode capture
// forbids); s.mu is held.
func (s *Allocator) processDoomed() {
	keep := s.doomed[:0]
	for _, d := range s.doomed {
		if d.ev == nil || d.ev.Query() != nil {
			keep = append(keep, d)
			continue
		}
		s.events = append(s.events, d.ev)
		s.unmapReleased(d.seg)
	}
	clear(s.doomed[len(keep):])
	s.doomed = keep
}

// unmapReleased unmaps a doomed segment (its work done) and forgets its
// pool once that has no segments left; s.mu is held.
func (s *Allocator) unmapReleased(seg *segment) {
	if seg.host != nil {
		s.dropHost(seg)
	}
	s.unmapSegment(seg)
	if !s.poolHasSegments(seg.pool) {
		delete(s.pools, seg.pool)
	}
}

// UserPoolStats are a user pool's bytes and blocks now.
type UserPoolStats struct {
	Segments  int    // segments held
	Bytes     uint64 // their bytes
	Live      int    // allocated blocks
	LiveBytes uint64 // their (rounded) bytes
	Released  bool   // ReleaseUserPool was called
}

// UserPoolStats returns what pool holds now.
func (s *Allocator) UserPoolStats(p *Pool) (UserPoolStats, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p == nil || p.user == nil || p.s != s {
		return UserPoolStats{}, fmt.Errorf("spill: UserPoolStats: %v is not a user pool of this allocator", p)
	}
	st := UserPoolStats{Released: p.refs <= 0}
	for _, seg := range s.poolSegments(p) {
		st.Segments++
		st.Bytes += seg.size
		for b := seg.first; b != nil; b = b.next {
			if b.state == stAllocated {
				st.Live++
				st.LiveBytes += b.size
			}
		}
	}
	return st, nil
}

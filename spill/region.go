package spill

import (
	"errors"
	"fmt"
	"sort"

	"github.com/arenaplan/arenaplan/cuda"
	"github.com/arenaplan/arenaplan/internal/devmem"
)

// Region pools: memory a program sets apart by purpose (weights, a KV
// cache, a graph's pool) so that it can give the physical memory back
// while idle and take it again at the same addresses, as
// torch_memory_saver does for PyTorch. Alloc never picks a region pool;
// AllocIn does.

// NewRegionPool returns a pool of its own for allocations made with
// AllocIn, named name in errors. backup says whether PausePools keeps its
// contents (in page-locked host memory, kept from one pause to the next)
// or drops them. Its segments are always mapped (never cuMemAlloc), so
// that they can be paused.
func (s *Allocator) NewRegionPool(name string, backup bool) (*Pool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, fmt.Errorf("spill: NewRegionPool(%q): %w", name, ErrClosed)
	}
	if name == "" {
		return nil, errors.New("spill: NewRegionPool: empty name")
	}
	p := s.newPool(true)
	p.region, p.backup, p.refs = name, backup, 1
	return p, nil
}

// AllocIn serves size bytes for use on st from pool, a region pool or the
// pool of a step's graphs (NewSharedPool), whatever the stream's capture
// status. It fails with ErrPaused while the pool is paused.
func (s *Allocator) AllocIn(pool *Pool, size uint64, st cuda.Stream) (cuda.DevicePtr, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if pool == nil {
		return 0, fmt.Errorf("spill: AllocIn(%d): nil pool", size)
	}
	if err := s.checkPool("AllocIn", pool); err != nil {
		return 0, err
	}
	return s.alloc(pool, size, st)
}

// Paused says whether PausePools released the pool's memory.
func (p *Pool) Paused() bool {
	p.s.mu.Lock()
	defer p.s.mu.Unlock()
	return p.paused
}

// poolSegments returns pool's segments in address order; s.mu is held.
func (s *Allocator) poolSegments(p *Pool) []*segment {
	var segs []*segment
	for seg := range s.segments {
		if seg.pool == p {
			segs = append(segs, seg)
		}
	}
	sort.Slice(segs, func(i, j int) bool { return segs[i].addr < segs[j].addr })
	return segs
}

// PausePools releases the physical memory of pools (region pools, or the
// private pools of graphs) and keeps their addresses reserved, so that
// their tensors and the graphs that read them stay valid across
// ResumePools. It waits for the device first, copies the segments of
// backup pools to host memory, then unmaps and releases them. While a
// pool is paused, allocating from it fails (ErrPaused); freeing its blocks
// is bookkeeping only (no memory is touched or released twice).
//
// Errors, with nothing changed: a pool already paused (ErrPaused), the
// default pool or a pool a capture routes to, plain segments, a closed
// allocator. A driver error while unmapping leaves the pool paused.
func (s *Allocator) PausePools(pools ...*Pool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("spill: PausePools: %w", ErrClosed)
	}
	for _, p := range pools {
		if p == nil {
			return fmt.Errorf("spill: PausePools: nil pool")
		}
		if err := s.checkPool("PausePools", p); err != nil {
			return err
		}
		switch {
		case !p.private:
			return fmt.Errorf("spill: PausePools: %s cannot pause (its segments serve everything else)", p)
		case p.paused:
			return fmt.Errorf("spill: PausePools: %s: %w", p, ErrPaused)
		case p.capturing != nil:
			return fmt.Errorf("spill: PausePools: %s: %w", p, ErrCapturing)
		}
		for _, seg := range s.poolSegments(p) {
			if seg.plain || seg.external() {
				return fmt.Errorf("spill: PausePools: %s holds a cuMemAlloc or user allocator's segment, which cannot be paused", p)
			}
		}
	}
	if err := s.dev.Synchronize(); err != nil {
		return fmt.Errorf("spill: PausePools: %w", err)
	}
	// Back up: copies into page-locked memory are enqueued back to back
	// on one stream and waited for once; others are synchronous.
	var cp cuda.Stream
	for _, p := range pools {
		if !p.backup {
			continue
		}
		for _, seg := range s.poolSegments(p) {
			if seg.host == nil {
				b, err := s.dev.PinnedAlloc(seg.size)
				seg.host, seg.pinned = b, err == nil
				if err != nil {
					seg.host = make([]byte, seg.size)
				}
				s.st.Backup += seg.size
			}
			var err error
			if seg.pinned && s.copier(&cp) {
				err = s.dev.CopyDtoHAsync(seg.host, seg.addr, cp)
			} else {
				err = s.dev.CopyDtoH(seg.host, seg.addr)
			}
			if err != nil {
				if cp != nil {
					cp.Synchronize()
				}
				return fmt.Errorf("spill: PausePools: backing up %s (%s at %#x): %w", p, devmem.Bytes(seg.size), uint64(seg.addr), err)
			}
		}
	}
	if cp != nil {
		if err := cp.Synchronize(); err != nil {
			return fmt.Errorf("spill: PausePools: backing up: %w", err)
		}
	}
	var errs []error
	for _, p := range pools {
		p.paused = true
		for _, seg := range s.poolSegments(p) {
			seg.paused = true
			s.st.Mapped -= seg.size
			s.st.Paused += seg.size
			if err := s.dev.MemUnmap(seg.addr, seg.size); err != nil {
				errs = append(errs, fmt.Errorf("spill: PausePools: %s: %w", p, err))
			}
			if err := s.dev.MemRelease(seg.h); err != nil {
				errs = append(errs, fmt.Errorf("spill: PausePools: %s: %w", p, err))
			}
			seg.h = 0
		}
	}
	return errors.Join(errs...)
}

// ResumePools maps new physical memory for paused pools at their old
// addresses and restores the contents of backup pools; other pools hold
// whatever the new memory holds. Errors: a pool not paused
// (ErrNotPaused); device memory exhausted (ErrOutOfMemory), which leaves
// the segments not yet mapped paused (call again when memory is free).
func (s *Allocator) ResumePools(pools ...*Pool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("spill: ResumePools: %w", ErrClosed)
	}
	for _, p := range pools {
		if p == nil {
			return fmt.Errorf("spill: ResumePools: nil pool")
		}
		// A pool released while paused (its graph destroyed) still
		// resumes: tensors made in it may be alive.
		if p.s != s || !p.private || !s.pools[p] {
			return fmt.Errorf("spill: ResumePools: %s is not a live pool of this allocator", p)
		}
		if !p.paused {
			return fmt.Errorf("spill: ResumePools: %s: %w", p, ErrNotPaused)
		}
	}
	// Restores from page-locked memory are enqueued on one stream while
	// the next segments are mapped, and waited for once at the end.
	var cp cuda.Stream
	var err error
resume:
	for _, p := range pools {
		for _, seg := range s.poolSegments(p) {
			if !seg.paused {
				continue // mapped by an earlier call that stopped half way
			}
			if err = s.remap(seg, &cp); err != nil {
				err = fmt.Errorf("spill: ResumePools: %s: %w", p, err)
				break resume
			}
		}
		p.paused = false
	}
	if cp != nil {
		if serr := cp.Synchronize(); serr != nil && err == nil {
			err = fmt.Errorf("spill: ResumePools: restoring: %w", serr)
		}
	}
	return err
}

// copier sets *cp to the allocator's stream for host copies, made on first
// use; false if it cannot be made (then copies are synchronous).
func (s *Allocator) copier(cp *cuda.Stream) bool {
	if *cp != nil {
		return true
	}
	if s.copyStream == nil {
		st, err := s.dev.NewStream()
		if err != nil {
			return false
		}
		s.copyStream = st
	}
	*cp = s.copyStream
	return true
}

// remap maps new memory under a paused segment and restores its backup:
// from page-locked memory enqueued on *cp (see copier), else at once.
func (s *Allocator) remap(seg *segment, cp *cuda.Stream) error {
	h, err := s.dev.MemCreate(seg.size)
	if err != nil {
		if errors.Is(err, cuda.ErrorOutOfMemory) {
			return fmt.Errorf("%w: no %s for a segment: %w", ErrOutOfMemory, devmem.Bytes(seg.size), err)
		}
		return err
	}
	if err := s.dev.MemMap(seg.addr, seg.size, h); err != nil {
		s.dev.MemRelease(h)
		return err
	}
	if err := s.dev.MemSetAccess(seg.addr, seg.size); err != nil {
		s.dev.MemUnmap(seg.addr, seg.size)
		s.dev.MemRelease(h)
		return err
	}
	if seg.host != nil {
		var err error
		if seg.pinned && s.copier(cp) {
			err = s.dev.CopyHtoDAsync(seg.addr, seg.host, *cp)
		} else {
			err = s.dev.CopyHtoD(seg.addr, seg.host)
		}
		if err != nil {
			s.dev.MemUnmap(seg.addr, seg.size)
			s.dev.MemRelease(h)
			return fmt.Errorf("restoring %s at %#x: %w", devmem.Bytes(seg.size), uint64(seg.addr), err)
		}
		if !seg.pinned {
			s.dropHost(seg) // Go memory: let the collector have it
		}
	}
	seg.h, seg.paused = h, false
	s.st.Paused -= seg.size
	s.st.Mapped += seg.size
	return nil
}

// dropHost lets go of a segment's backup.
func (s *Allocator) dropHost(seg *segment) {
	if seg.pinned {
		s.dev.PinnedFree(seg.host)
	}
	s.st.Backup -= seg.size
	seg.host, seg.pinned = nil, false
}

// GraphPools returns the private pools that hold graphs' memory now:
// those of NewSharedPool and of captures (joined or begun here) that map
// segments, region pools excepted.
func (s *Allocator) GraphPools() []*Pool {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*Pool
	for p := range s.pools {
		if p.private && p.region == "" && p.user == nil && p.refs > 0 && s.poolHasSegments(p) {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].id < out[j].id })
	return out
}

// pinBackup makes the page-locked host copy of seg, a segment of a pool
// whose contents survive a pause, when the segment is mapped: the first
// pause then only copies (page-locking at the first pause made it back up
// at 2.4-2.7 GiB/s, where later pauses ran at 25 GiB/s and more). It costs
// host memory, no device memory. If page-locking fails, the first pause
// tries again.
func (s *Allocator) pinBackup(seg *segment) {
	if seg.host != nil {
		return
	}
	if b, err := s.dev.PinnedAlloc(seg.size); err == nil {
		seg.host, seg.pinned = b, true
		s.st.Backup += seg.size
	}
}

package bridge

// Serving a step's allocations from its plan while it runs.

import (
	"fmt"

	"github.com/google/btree"

	"github.com/arenaplan/arenaplan/cuda"
)

// span is a live planned range [lo, hi) of device addresses.
type span struct{ lo, hi uint64 }

func lessSpan(a, b span) bool { return a.lo < b.lo }

// alloc serves an allocation on the step's stream; d.mu is held.
func (s *Step) alloc(size uint64) (cuda.DevicePtr, error) {
	d := s.d
	if s.state == stepRecording {
		p, err := d.spillAllocLocked(size, s.stream)
		if err != nil {
			return 0, err
		}
		s.run.alloc(p, size)
		if s.fam != nil && s.fam.chained {
			delete(s.fam.handed, p) // its address is reused: an earlier output was freed
		}
		return p, nil
	}
	if d.graphs != nil {
		// Serve and Pause refuse each other; this keeps an unmapped
		// address from ever being handed out should that change.
		return 0, s.errorf("allocating %d bytes: the graphs' memory is paused: Resume it first", size)
	}
	n := len(s.run.sizes)
	if k, ok := s.match(size); ok {
		p := s.addrs[k]
		s.live.ReplaceOrInsert(span{uint64(p), uint64(p) + s.need[k]})
		s.isLive[k] = true
		s.taken[k] = true
		s.cursor = max(s.cursor, k+1)
		d.planned[p] = slot{s, k, nil}
		d.st.Planned++
		s.served++
		s.run.alloc(p, size)
		return p, nil
	}
	why := s.divergence(n, size)
	d.st.Divergences++
	s.divergences++
	s.runDivergences++
	if s.firstDivergence == "" {
		s.firstDivergence = why
	}
	if s.strict {
		s.run.alloc(0, size) // keep the count: the next allocation is n+1
		delete(s.run.ids, 0)
		return 0, s.errorf("strict: %s", why)
	}
	p, err := d.spillAllocLocked(size, s.stream)
	if err != nil {
		return 0, err
	}
	s.run.alloc(p, size)
	return p, nil
}

// lookahead is how far from the cursor an allocation may find its planned
// buffer: forward, past recorded allocations this run lacks; backward, to
// buffers skipped when an extra allocation (a workspace PyTorch makes
// lazily in one capture, say) took a buffer ahead of its turn.
const lookahead = 8

// match finds the planned buffer for an allocation of size: the one at the
// cursor; else the first untaken one of that size among the few behind it;
// else among the few ahead. It must be untaken in this run, not live, and
// its range clear of every live buffer.
func (s *Step) match(size uint64) (int, bool) {
	fits := func(k int) bool {
		return uint64(s.trace.Buffers[k].Size) == size && !s.taken[k] && !s.isLive[k] && !s.overlaps(k)
	}
	if s.cursor < len(s.addrs) && fits(s.cursor) {
		return s.cursor, true
	}
	for k := max(0, s.cursor-lookahead); k < s.cursor; k++ {
		if fits(k) {
			return k, true
		}
	}
	for k := s.cursor + 1; k < len(s.addrs) && k <= s.cursor+lookahead; k++ {
		if fits(k) {
			return k, true
		}
	}
	return 0, false
}

func (s *Step) divergence(n int, size uint64) string {
	k := s.cursor
	switch {
	case k >= len(s.addrs):
		return fmt.Sprintf("allocation %d (%d bytes) is beyond the plan's %d", n, size, len(s.addrs))
	case uint64(s.trace.Buffers[k].Size) != size:
		return fmt.Sprintf("allocation %d is %d bytes, the plan has %d next", n, size, s.trace.Buffers[k].Size)
	}
	return fmt.Sprintf("allocation %d: its planned range is still taken (a buffer freed later than recorded, kept from an earlier run, or another member's)", n)
}

// overlaps says whether a live planned buffer overlaps buffer k's range:
// one of this step's, or one another member of its family or chain left
// live there that must not be written. In a chain, that is every live
// buffer of another member: members run in turn, and an earlier member's
// output lives until a later one frees it. In a family, members may
// overwrite each other's outputs (one runs at a time), but not a buffer
// held longer than its plan says: an allocation the program keeps for good
// that took a planned buffer out of its turn (a library's workspace made
// lazily in a capture, used by every later capture on that stream).
func (s *Step) overlaps(k int) bool {
	lo := uint64(s.addrs[k])
	hi := lo + s.need[k]
	if liveOverlaps(s.live, lo, hi) {
		return true
	}
	if s.fam == nil {
		return false
	}
	for _, m := range s.fam.members {
		if m == s || m.live == nil {
			continue
		}
		if s.fam.chained {
			if liveOverlaps(m.live, lo, hi) {
				return true
			}
			continue
		}
		hit := false
		end := int64(-1) // m's outputs' end, read only when a span overlaps
		m.live.DescendLessOrEqual(span{lo: hi - 1}, func(o span) bool {
			if o.hi <= lo {
				return false // live spans are disjoint: the ones below end lower still
			}
			// A span whose address another member's buffer took since
			// (a family's outputs the program holds alias the next
			// member's buffers) or a replaced plan's is no such buffer.
			sl, ok := s.d.planned[cuda.DevicePtr(o.lo)]
			if ok && sl.step == m && sl.k != orphan {
				if end < 0 {
					end = m.outputEnd()
				}
				hit = m.trace.Buffers[sl.k].End < end
			}
			return !hit
		})
		if hit {
			return true
		}
	}
	return false
}

// outputEnd is the end of the recorded run's outputs in the step's trace:
// a buffer that ends earlier was freed within that run.
func (s *Step) outputEnd() int64 {
	var end int64
	for _, b := range s.trace.Buffers {
		end = max(end, b.End)
	}
	return end
}

// liveOverlaps says whether a span of live overlaps [lo, hi). Live ranges
// never overlap each other, so only the last one starting below hi can.
func liveOverlaps(live *btree.BTreeG[span], lo, hi uint64) bool {
	if live == nil {
		return false
	}
	hit := false
	live.DescendLessOrEqual(span{lo: hi - 1}, func(o span) bool {
		hit = o.hi > lo
		return false
	})
	return hit
}

// freePlanned: planned buffer k was freed; d.mu is held.
func (s *Step) freePlanned(k int) {
	p := s.addrs[k]
	if s.state == stepServing {
		if i, ok := s.run.ids[p]; ok && s.run.other[i] {
			s.run.free(p)
			s.held = append(s.held, k)
			return
		}
		s.run.free(p)
	}
	s.release(k)
}

// release takes buffer k out of the live set.
func (s *Step) release(k int) {
	p := uint64(s.addrs[k])
	s.live.Delete(span{lo: p})
	s.isLive[k] = false
	if s.closing && s.live.Len() == 0 {
		s.closeArena()
	}
}

// freeRecorded logs the free of p if this run allocated it; d.mu is held.
func (s *Step) freeRecorded(p cuda.DevicePtr) {
	if _, ok := s.run.ids[p]; !ok && s.state == stepRecording && s.fam != nil && s.fam.chained && s.fam.handedFree(s, p) {
		return
	}
	s.run.free(p)
}

// usedElsewhere: planned buffer k is used on another stream.
func (s *Step) usedElsewhere(k int) {
	if s.state == stepServing {
		if i, ok := s.run.ids[s.addrs[k]]; ok {
			s.run.other[i] = true
		}
	}
}

// recordStreamRecorded marks p, if this run allocated it, as used on
// another stream; d.mu is held.
func (s *Step) recordStreamRecorded(p cuda.DevicePtr) {
	if i, ok := s.run.ids[p]; ok {
		s.run.other[i] = true
	}
}

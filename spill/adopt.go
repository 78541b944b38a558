package spill

// Other streams' wholly free segments, taken over rather than mapping
// more.
//
// A block is reused only on its own stream, so a program that makes a
// stream per request would leave a segment behind per stream and map a
// new one for each: the allocator's memory, and what each mapping costs,
// would grow with the streams ever seen. Instead, a stream that finds no
// free block of its own takes over the default pool's wholly free segment
// that has been idle longest, when that costs no concurrency or the
// memory is needed:
//
//   - a segment idle since before the allocator last waited for the
//     device is taken as it is: every use of it has completed;
//   - otherwise it is taken only while wholly free segments hold more
//     than the blocks in use (the memory would otherwise pile up), and
//     the taking stream waits for an event recorded on the segment's old
//     stream, as PyTorch's allocator orders a block freed after use on
//     other streams: nothing the old stream queued can touch it after the
//     new owner's work begins. The new stream then starts after work
//     queued on the old one before now, which is why a stream with
//     memory to spare maps its own instead, as PyTorch's allocator does.
//
// If the event cannot be recorded or waited for (a stream the host
// destroyed), the allocator waits for the device, which orders every
// stream. Taking over happens only where no capture can be underway
// (events on a capturing stream would join its graph).

import (
	"github.com/google/btree"

	"github.com/arenaplan/arenaplan/cuda"
)

// lessIdle orders idle segments by size class, size, then how long they
// have been idle (oldest first).
func lessIdle(a, b *segment) bool {
	if a.small != b.small {
		return a.small
	}
	if a.size != b.size {
		return a.size < b.size
	}
	return a.idleSeq < b.idleSeq
}

// markIdle notes that seg, a default-pool segment, is wholly free now.
func (s *Allocator) markIdle(seg *segment) {
	if seg.idle || seg.doomed || seg.pool != s.def {
		return
	}
	if s.idle == nil {
		s.idle = btree.NewG[*segment](16, lessIdle)
	}
	s.idleSeq++
	seg.idle, seg.idleSeq, seg.idleGen = true, s.idleSeq, s.syncGen
	s.idle.ReplaceOrInsert(seg)
	s.idleBytes += seg.size
}

// unmarkIdle notes that seg is no longer wholly free (a block of it was
// taken) or is going away.
func (s *Allocator) unmarkIdle(seg *segment) {
	if !seg.idle {
		return
	}
	s.idle.Delete(seg)
	seg.idle = false
	s.idleBytes -= seg.size
}

// adoptable says whether another stream's idle segment may be taken now:
// the default pool, and no capture can be underway.
func (s *Allocator) adoptable(pool *Pool) bool {
	return pool == s.def && s.idle != nil && s.idle.Len() > 0 &&
		len(s.captures) == 0 && (!s.cfg.foreign || (s.hinted && s.foreignN == 0))
}

// adopt takes over for st the longest idle segment of another stream of
// the size class small that holds rsize bytes, under the rules above, and
// returns its single free block, out of every free list; nil if none may
// be taken.
func (s *Allocator) adopt(pool *Pool, st cuda.Stream, rsize uint64, small bool) *block {
	if !s.adoptable(pool) {
		return nil
	}
	var seg *segment
	s.idle.AscendGreaterOrEqual(&segment{small: small, size: rsize}, func(c *segment) bool {
		if c.small == small && c.handle != st.Handle() {
			seg = c
		}
		return false
	})
	if seg == nil {
		return nil
	}
	clean := seg.idleGen < s.syncGen
	if !clean && s.idleBytes <= s.st.InUse {
		return nil // memory to spare: map, and keep the streams independent
	}
	if !clean {
		if !s.orderAfter(seg.stream, st) {
			s.st.Syncs++
			if err := s.dev.Synchronize(); err != nil {
				return nil // the segment stays with its stream
			}
			s.syncGen++
		}
		s.st.AdoptWaits++
	}
	s.unmarkIdle(seg)
	b := seg.first
	seg.pool.tree(seg.key).Delete(b)
	seg.pool.dropTree(seg.key)
	seg.stream, seg.handle = st, st.Handle()
	seg.key = freeKey(seg.handle, seg.small)
	s.st.Adopted++
	return b
}

// orderAfter makes later work on to wait for the work queued on from
// until now, with an event; it says whether that worked.
func (s *Allocator) orderAfter(from, to cuda.Stream) bool {
	if s.adoptEv == nil {
		ev, err := s.dev.NewEvent(false)
		if err != nil {
			return false
		}
		s.adoptEv = ev
	}
	// A wait takes the event's latest record at the time of the call, so
	// one event serves every take-over.
	return s.adoptEv.Record(from) == nil && to.WaitEvent(s.adoptEv) == nil
}

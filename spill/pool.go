package spill

import (
	"fmt"

	"github.com/google/btree"
)

// Pool is a set of segments whose blocks are handed out only to the
// allocations routed to it: the default pool (outside captures) or a
// private pool (captures into it). Every method of Pool is safe for
// concurrent use.
type Pool struct {
	s         *Allocator
	id        uint64
	private   bool
	refs      int      // the owner's reference plus one per graph
	capturing *Capture // the capture routing to it now, if any
	// free holds the free blocks by the handle of their segment's stream
	// (a Stream the host hands in again for one handle may be a new
	// value) and their size class (freeKey). A list exists only while it
	// holds a block or a segment of its stream is mapped: per-stream state
	// is bounded by the segments, whatever the number of streams seen.
	free   map[uintptr]*btree.BTreeG[*block]
	region string    // a region pool's name (NewRegionPool)
	user   *userPool // a user pool's name and source (NewUserPool)
	backup bool      // a region pool's contents survive PausePools
	paused bool
	// lastH and lastT cache the latest lookup in free (lastT nil: none);
	// dropTree clears them.
	lastH uintptr
	lastT *btree.BTreeG[*block]
}

func (s *Allocator) newPool(private bool) *Pool {
	s.nextPool++
	p := &Pool{s: s, id: s.nextPool, private: private, free: map[uintptr]*btree.BTreeG[*block]{}}
	s.pools[p] = true
	return p
}

// freeKey is the key of the free list of stream handle h and a size
// class (a handle is an address or a small number: its top bit is free).
func freeKey(h uintptr, small bool) uintptr {
	k := h << 1
	if small {
		k |= 1
	}
	return k
}

// small says whether a request of rsize bytes takes its block from small
// segments (SmallBlock).
func (p *Pool) small(rsize uint64) bool { return rsize <= SmallBlock && p.user == nil }

// tree returns the free list of key h (freeKey), made if need be (to
// insert a block).
func (p *Pool) tree(h uintptr) *btree.BTreeG[*block] {
	if p.lastT != nil && p.lastH == h {
		return p.lastT
	}
	t := p.free[h]
	if t == nil {
		t = btree.NewG[*block](16, lessBlock)
		p.free[h] = t
	}
	p.lastH, p.lastT = h, t
	return t
}

// lookTree returns the free list of h, or nil: a lookup makes none, so
// that a stream that never gets a segment leaves nothing behind.
func (p *Pool) lookTree(h uintptr) *btree.BTreeG[*block] {
	if p.lastT != nil && p.lastH == h {
		return p.lastT
	}
	t := p.free[h]
	if t != nil {
		p.lastH, p.lastT = h, t
	}
	return t
}

// dropTree forgets h's free list once it is empty.
func (p *Pool) dropTree(h uintptr) {
	t := p.free[h]
	if t == nil || t.Len() > 0 {
		return
	}
	delete(p.free, h)
	if p.lastT == t {
		p.lastT = nil
	}
}

func (p *Pool) String() string {
	if !p.private {
		return "the default pool"
	}
	if p.region != "" {
		return fmt.Sprintf("region pool %q", p.region)
	}
	if p.user != nil {
		return fmt.Sprintf("user pool %q", p.user.name)
	}
	return fmt.Sprintf("private pool %d", p.id)
}

func (s *Allocator) poolHasSegments(p *Pool) bool {
	for seg := range s.segments {
		if seg.pool == p {
			return true
		}
	}
	return false
}

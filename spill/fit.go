package spill

import "github.com/arenaplan/arenaplan/cuda"

// MinBlock is the rounding of every request and the smallest block split
// off.
const MinBlock = 512

// SmallBlock is the largest request served from small segments: as in
// PyTorch's caching allocator, requests of at most 1 MiB take their blocks
// from segments of one chunk that hold only such requests, and larger ones
// from segments that hold only larger ones, so that small long-lived
// blocks never split the free space that large requests need (which makes
// the allocator map more). A user pool's segments (NewUserPool) serve
// both.
const SmallBlock = 1 << 20

// MidBlock and MidSegment: in the default pool, as in PyTorch's caching
// allocator, requests larger than SmallBlock and at most MidBlock share
// segments of MidSegment of addresses, whose rest no other size class can
// use. Unlike PyTorch's, such a segment maps only what its blocks need: a
// request that no free block serves extends a segment of its stream in
// place (its free last block, and a chunk more at a time) while the
// addresses last, and starts another only then. Sharing packs the
// weights, gradients and optimizer moments of a training step (each a
// segment of its own, its rest idle, before); mapping as they come keeps
// a first call's peak at what it uses. Replaying the recorded steps of
// ../shared/data/torch, the allocator maps at its peak 0.95–1.05× what
// PyTorch's reserved.
const (
	MidBlock   = 10 << 20
	MidSegment = 20 << 20
)

type blockState uint8

const (
	stFree      blockState = iota
	stAllocated            // handed out
	stDeferred             // freed during a capture, waiting (Capture.deferred or Allocator.untilNone)
	stPending              // waiting for events on other streams
)

// block is a piece of a segment.
type block struct {
	addr, size uint64
	req        uint64 // requested bytes while allocated
	seg        *segment
	prev, next *block // address neighbours within the segment
	state      blockState
	uses       []cuda.Stream    // other streams that used it (RecordStream)
	markers    []cuda.GraphNode // terminals of its streams at its free, during a capture
	events     []cuda.Event
}

func lessBlock(a, b *block) bool {
	if a.size != b.size {
		return a.size < b.size
	}
	return a.addr < b.addr
}

// maxSpare bounds the recycled block structs an Allocator keeps.
const maxSpare = 4096

// newBlock returns a zeroed block, recycled where one is spare: the
// allocator's hot path then allocates nothing on the Go heap.
func (s *Allocator) newBlock() *block {
	if n := len(s.spare); n > 0 {
		b := s.spare[n-1]
		s.spare = s.spare[:n-1]
		return b
	}
	return &block{}
}

// recycle keeps b, which nothing references any more, for newBlock.
func (s *Allocator) recycle(b *block) {
	if len(s.spare) < maxSpare {
		*b = block{}
		s.spare = append(s.spare, b)
	}
}

// bestFit removes and returns the smallest free block of (pool, st) and
// the size class small (SmallBlock) that holds rsize bytes.
func (s *Allocator) bestFit(pool *Pool, st cuda.Stream, rsize uint64, small bool) *block {
	t := pool.lookTree(freeKey(st.Handle(), small))
	if t == nil {
		return nil
	}
	var found *block
	s.key = block{size: rsize}
	t.AscendGreaterOrEqual(&s.key, func(b *block) bool {
		found = b
		return false
	})
	if found != nil {
		t.Delete(found)
		s.unmarkIdle(found.seg)
	}
	return found
}

// split cuts b (out of the tree) to rsize and frees the remainder.
func (s *Allocator) split(b *block, rsize uint64) {
	if b.size-rsize < MinBlock {
		return
	}
	rest := s.newBlock()
	*rest = block{addr: b.addr + rsize, size: b.size - rsize, seg: b.seg, prev: b, next: b.next, state: stFree}
	if b.next != nil {
		b.next.prev = rest
	}
	b.next = rest
	b.size = rsize
	b.seg.pool.tree(b.seg.key).ReplaceOrInsert(rest)
}

// release makes b free: coalesce with free neighbours, put in its tree.
func (s *Allocator) release(b *block) {
	t := b.seg.pool.tree(b.seg.key)
	b.state, b.req, b.uses, b.markers, b.events = stFree, 0, nil, nil, nil
	if p := b.prev; p != nil && p.state == stFree {
		t.Delete(p)
		p.size += b.size
		p.next = b.next
		if b.next != nil {
			b.next.prev = p
		}
		s.recycle(b)
		b = p
	}
	if n := b.next; n != nil && n.state == stFree {
		t.Delete(n)
		b.size += n.size
		b.next = n.next
		if n.next != nil {
			n.next.prev = b
		}
		s.recycle(n)
	}
	t.ReplaceOrInsert(b)
	if b.prev == nil && b.next == nil {
		s.markIdle(b.seg)
	}
}

package spill

import "sort"

// SegmentInfo describes one segment of an Allocator, as Segments reports it.
type SegmentInfo struct {
	Addr   uint64
	Size   uint64
	Stream uintptr // the CUstream handle its blocks are allocated on
	// Pool is the pool's id (unique within the Allocator; the default pool's
	// is DefaultPoolID); Private says it is a capture's or a region's pool,
	// Region the region pool's name ("" otherwise).
	Pool    uint64
	Private bool
	Region  string
	Plain   bool // cuMemAlloc'd (WithPlainSegments), not mapped
	Paused  bool // its physical memory is released (PausePools)
	Small   bool // serves only requests of at most SmallBlock bytes (one chunk)
	Blocks  []BlockInfo
}

// BlockState is what a block of a segment is used for now.
type BlockState uint8

const (
	// BlockFree is reusable now.
	BlockFree BlockState = iota
	// BlockAllocated is handed out and not freed.
	BlockAllocated
	// BlockFreeing was freed but waits: for a capture to end, or for
	// work on other streams that used it.
	BlockFreeing
)

// BlockInfo is one block of a segment.
type BlockInfo struct {
	Addr, Size uint64
	Requested  uint64 // bytes the allocation asked for (0 unless allocated)
	State      BlockState
}

// DefaultPoolID is the id of the pool that serves allocations outside
// captures and regions.
const DefaultPoolID = 1

// Segments returns the allocator's segments in address order, each with
// its blocks in address order, read under the allocator's lock (a copy:
// later calls change nothing in it).
func (s *Allocator) Segments() []SegmentInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]SegmentInfo, 0, len(s.segments))
	for seg := range s.segments {
		si := SegmentInfo{Addr: uint64(seg.addr), Size: seg.size, Plain: seg.plain, Paused: seg.paused, Small: seg.small}
		if seg.stream != nil {
			si.Stream = seg.stream.Handle()
		}
		if p := seg.pool; p != nil {
			si.Pool, si.Private, si.Region = p.id, p.private, p.region
			if p.user != nil {
				si.Region = p.user.name // shown as a region: a pool its owner routes to
			}
		}
		for b := seg.first; b != nil; b = b.next {
			bi := BlockInfo{Addr: b.addr, Size: b.size}
			switch b.state {
			case stFree:
				bi.State = BlockFree
			case stAllocated:
				bi.State, bi.Requested = BlockAllocated, b.req
			default:
				bi.State, bi.Requested = BlockFreeing, b.req
			}
			si.Blocks = append(si.Blocks, bi)
		}
		out = append(out, si)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Addr < out[j].Addr })
	return out
}

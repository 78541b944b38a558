package arena

import (
	"errors"
	"fmt"
	"sort"
	"sync"

	"github.com/google/btree"

	"github.com/arenaplan/arenaplan/cuda"
)

// Spill is the spillover caching allocator: it serves the allocations a
// plan does not cover, on the same device, without ever calling
// cuMemAlloc or cuMemFree (both fail and invalidate a global-mode
// capture).
//
// Memory. NewSpill reserves one range of virtual addresses up front
// (WithAddressSpace, default 64 GiB). Memory grows in segments: a run of
// whole chunks (WithChunk, default the device granularity, 2 MiB on an
// H100 or H200) mapped with one cuMemCreate + cuMemMap + cuMemSetAccess
// into the lowest free part of that range. VMM calls are legal inside a
// global-mode capture, so a capture can grow the allocator.
//
// Blocks. Requests are rounded up to 512 bytes. Free blocks live in a
// github.com/google/btree per (pool, stream) ordered by (size, address);
// an allocation takes the best fit on its own stream and splits off the
// rest (when at least 512 bytes); a free block coalesces with free
// neighbours of its segment. A block is only ever reused on the stream it
// was allocated on; RecordStream says that other streams used it, and then
// its free waits until that work is ordered before the reuse: outside a
// capture through events recorded on those streams, inside a capture
// through the capture graph (see BeginCapture).
//
// Pools. Allocations outside any capture come from the default pool.
// Allocations on a stream that is capturing come from the private pool of
// that capture; a private pool's memory is never unmapped while a graph
// that used it exists (see NewSharedPool, BeginCapture, Capture.Release).
//
// Failure. A request that the reserved addresses, the limit (WithLimit) or
// the device cannot serve fails with an error naming the request and what
// is reserved, mapped and in use (ErrOutOfMemory); the allocator's state
// is unchanged. Before failing outside a capture it unmaps cached segments
// that no graph needs and tries once more.
//
// A Spill is safe for concurrent use; device calls happen under its lock.
// It has no finalizers: Close it.
type Spill struct {
	mu     sync.Mutex
	dev    cuda.Device
	cfg    spillConfig
	gran   uint64
	base   cuda.DevicePtr
	closed bool

	vaFree []vaRange // unmapped parts of the reservation, by address

	def      *Pool
	pools    map[*Pool]bool
	live     map[cuda.DevicePtr]*block // allocated blocks by address
	segments map[*segment]bool

	captures  map[uint64]*Capture // underway, by capture id
	nextPool  uint64
	untilNone []*block // freed during a capture; wait until none is underway
	spare     []*block // recycled block structs (newBlock)
	key       block    // the best-fit search's pivot, reused
	pending   []*block // wait for events on other streams
	events    []cuda.Event

	st SpillStats

	hinted   bool // ForeignCaptures was called: trust its count
	foreignN int

	copyStream cuda.Stream // backups and restores of paused pools (copier)
}

// ForeignCaptures tells the allocator how many captures that it did not
// begin are underway in the process, as their owner counts them (PyTorch's
// CUDAGraph.capture_begin and capture_end, as PyTorch's own allocator
// learns of captures). From the first call on, WithForeignCaptures skips
// its per-allocation capture query while the count is 0.
func (s *Spill) ForeignCaptures(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hinted, s.foreignN = true, max(n, 0)
}

// SpillStats are the allocator's counters. Mapped = InUse + Cached, and
// Waiting is the part of Cached not yet reusable.
type SpillStats struct {
	AddressSpace  uint64 // virtual addresses reserved up front
	Mapped        uint64 // physical bytes mapped in segments
	InUse         uint64 // bytes of allocated blocks (rounded sizes)
	Requested     uint64 // bytes the live allocations asked for
	Cached        uint64 // Mapped - InUse: free blocks and blocks waiting
	Waiting       uint64 // freed blocks not reusable yet (other streams)
	PeakInUse     uint64
	PeakMapped    uint64
	Segments      int
	Live          int    // allocated blocks
	Allocs        uint64 // successful Alloc calls
	Frees         uint64
	Grows         uint64 // segments mapped
	Unmaps        uint64 // segments unmapped
	GrownBytes    uint64 // bytes of the segments mapped, in all
	UnmappedBytes uint64 // bytes of the segments unmapped, in all
	// CaptureReuses counts blocks made reusable during a capture by the
	// marker walk; NodesVisited what the walk cost in graph nodes.
	CaptureReuses uint64
	NodesVisited  uint64
	// Paused is the bytes of segments whose physical memory PausePools
	// released (not in Mapped); Backup the host bytes kept for them.
	Paused uint64
	Backup uint64
	// FreeLists counts the per-pool, per-stream lists of free blocks: at
	// most one per segment, whatever the number of streams seen.
	FreeLists int
}

type spillConfig struct {
	addressSpace uint64
	limit        uint64
	chunk        uint64
	noReuse      bool
	foreign      bool // WithForeignCaptures
	plain        bool // WithPlainSegments
	freshWalk    bool // tests only: a new visited set per walk (PyTorch's first design)
}

// SpillOption configures NewSpill; a bad value makes NewSpill fail.
type SpillOption func(*spillConfig) error

// WithAddressSpace sets the virtual addresses reserved up front (default
// 64 GiB): the most the allocator can ever map. Rounded up to the chunk.
func WithAddressSpace(n uint64) SpillOption {
	return func(c *spillConfig) error {
		if n == 0 {
			return errors.New("WithAddressSpace(0): must be positive")
		}
		c.addressSpace = n
		return nil
	}
}

// WithLimit caps the physical bytes mapped (default: the address space).
func WithLimit(n uint64) SpillOption {
	return func(c *spillConfig) error {
		if n == 0 {
			return errors.New("WithLimit(0): must be positive")
		}
		c.limit = n
		return nil
	}
}

// WithChunk sets the unit in which memory grows (default the device
// granularity); it must be a multiple of the granularity.
func WithChunk(n uint64) SpillOption {
	return func(c *spillConfig) error {
		if n == 0 {
			return errors.New("WithChunk(0): must be positive")
		}
		c.chunk = n
		return nil
	}
}

// WithCaptureReuse turns capture-time reuse of blocks that other streams
// used on or off (default on). Off, such blocks wait for the end of the
// capture, as PyTorch does without graph_capture_record_stream_reuse.
func WithCaptureReuse(on bool) SpillOption {
	return func(c *spillConfig) error {
		c.noReuse = !on
		return nil
	}
}

// WithForeignCaptures makes the allocator look at every allocation's
// stream: an allocation on a stream that someone else is capturing (a
// capture neither BeginCapture nor JoinCapture registered) joins that
// capture with a new private pool, as PyTorch's allocator does for
// torch.cuda.graph. Nothing says when the owner destroys such a graph, so
// the pool's memory is kept until Close; the capture's end is noticed at
// the next allocation. It costs one capture query per allocation (none on
// the legacy default stream, handle 0).
func WithForeignCaptures(on bool) SpillOption {
	return func(c *spillConfig) error {
		c.foreign = on
		return nil
	}
}

// WithPlainSegments makes the allocator grow with cuMemAlloc while no
// capture can be underway (VMM mapping still serves growth inside
// captures). Plain device memory was measured faster to read than
// VMM-mapped memory for latency-bound steps (see BENCHMARKS.md), at the
// price of memory that cannot be paused at a fixed address. With
// WithForeignCaptures it applies only once ForeignCaptures has been told
// that none is underway.
func WithPlainSegments(on bool) SpillOption {
	return func(c *spillConfig) error {
		c.plain = on
		return nil
	}
}

// MinBlock is the rounding of every request and the smallest block split
// off.
const MinBlock = 512

const defaultAddressSpace = 64 << 30

type blockState uint8

const (
	stFree      blockState = iota
	stAllocated            // handed out
	stDeferred             // freed during a capture, waiting (Capture.deferred or Spill.untilNone)
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

// segment is physical memory mapped at one place, owned by one pool and
// one stream.
type segment struct {
	addr   cuda.DevicePtr
	size   uint64
	h      cuda.MemHandle
	plain  bool // from cuMemAlloc (WithPlainSegments), not mapped
	paused bool // its physical memory is released (PausePools); h is stale
	host   []byte
	pinned bool // host is page-locked (kept from one pause to the next)
	pool   *Pool
	stream cuda.Stream
	handle uintptr // stream.Handle(): what the pool's free lists are keyed by
	first  *block
}

type vaRange struct{ lo, hi uint64 } // offsets into the reservation

// Pool is a set of segments whose blocks are handed out only to the
// allocations routed to it: the default pool (outside captures) or a
// private pool (captures into it). Every method of Pool is safe for
// concurrent use.
type Pool struct {
	s         *Spill
	id        uint64
	private   bool
	refs      int      // the owner's reference plus one per graph
	capturing *Capture // the capture routing to it now, if any
	// free holds the free blocks by the handle of their segment's stream
	// (a Stream the host hands in again for one handle may be a new
	// value). A list exists only while it holds a block or a segment of
	// its stream is mapped: per-stream state is bounded by the segments,
	// whatever the number of streams seen.
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

func lessBlock(a, b *block) bool {
	if a.size != b.size {
		return a.size < b.size
	}
	return a.addr < b.addr
}

// NewSpill reserves the address space. It maps nothing until the first
// Alloc.
func NewSpill(dev cuda.Device, opts ...SpillOption) (*Spill, error) {
	if dev == nil {
		return nil, errors.New("arena: NewSpill: nil device")
	}
	var cfg spillConfig
	for _, o := range opts {
		if err := o(&cfg); err != nil {
			return nil, fmt.Errorf("arena: NewSpill: %w", err)
		}
	}
	gran, err := dev.Granularity(false)
	if err != nil {
		return nil, fmt.Errorf("arena: NewSpill: %w", err)
	}
	if cfg.chunk == 0 {
		cfg.chunk = gran
	}
	if cfg.chunk%gran != 0 {
		return nil, fmt.Errorf("arena: NewSpill: WithChunk(%d) is not a multiple of the granularity %d", cfg.chunk, gran)
	}
	if cfg.addressSpace == 0 {
		cfg.addressSpace = defaultAddressSpace
	}
	cfg.addressSpace = roundUp(cfg.addressSpace, cfg.chunk)
	if cfg.limit == 0 || cfg.limit > cfg.addressSpace {
		cfg.limit = cfg.addressSpace
	}
	base, err := dev.AddressReserve(cfg.addressSpace, gran)
	if err != nil {
		return nil, fmt.Errorf("arena: NewSpill: reserving %s of addresses: %w", fmtBytes(cfg.addressSpace), err)
	}
	s := &Spill{
		dev: dev, cfg: cfg, gran: gran, base: base,
		vaFree:   []vaRange{{0, cfg.addressSpace}},
		pools:    map[*Pool]bool{},
		live:     map[cuda.DevicePtr]*block{},
		segments: map[*segment]bool{},
		captures: map[uint64]*Capture{},
	}
	s.def = s.newPool(false)
	s.def.refs = 1
	s.st.AddressSpace = cfg.addressSpace
	return s, nil
}

func roundUp(n, a uint64) uint64 { return (n + a - 1) / a * a }

func (s *Spill) newPool(private bool) *Pool {
	s.nextPool++
	p := &Pool{s: s, id: s.nextPool, private: private, free: map[uintptr]*btree.BTreeG[*block]{}}
	s.pools[p] = true
	return p
}

// tree returns the free list of stream handle h, made if need be (to
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

// maxSpare bounds the recycled block structs a Spill keeps.
const maxSpare = 4096

// newBlock returns a zeroed block, recycled where one is spare: the
// allocator's hot path then allocates nothing on the Go heap.
func (s *Spill) newBlock() *block {
	if n := len(s.spare); n > 0 {
		b := s.spare[n-1]
		s.spare = s.spare[:n-1]
		return b
	}
	return &block{}
}

// recycle keeps b, which nothing references any more, for newBlock.
func (s *Spill) recycle(b *block) {
	if len(s.spare) < maxSpare {
		*b = block{}
		s.spare = append(s.spare, b)
	}
}

// Alloc returns size bytes of device memory for use on stream st, 256-byte
// aligned (512-byte in fact). During a capture begun with BeginCapture, an
// allocation on a stream of that capture comes from its pool; the
// allocator may then grow by mapping memory, which the capture allows.
func (s *Spill) Alloc(size uint64, st cuda.Stream) (cuda.DevicePtr, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.alloc(nil, size, st)
}

// AllocDefault is Alloc that also says whether the default pool served
// the block (not a capture's): a block its owner may hand out again for
// another request of the same size on the same stream without asking
// (the PyTorch bridge's C-side cache of freed blocks).
func (s *Spill) AllocDefault(size uint64, st cuda.Stream) (cuda.DevicePtr, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, err := s.allocBlock(nil, size, st)
	if err != nil {
		return 0, false, err
	}
	return cuda.DevicePtr(b.addr), b.seg.pool == s.def, nil
}

// alloc serves Alloc (in == nil: the default pool or the capture's) and
// AllocIn (a region pool); s.mu is held.
func (s *Spill) alloc(in *Pool, size uint64, st cuda.Stream) (cuda.DevicePtr, error) {
	b, err := s.allocBlock(in, size, st)
	if err != nil {
		return 0, err
	}
	return cuda.DevicePtr(b.addr), nil
}

// allocBlock is alloc, returning the block; s.mu is held.
func (s *Spill) allocBlock(in *Pool, size uint64, st cuda.Stream) (*block, error) {
	if s.closed {
		return nil, fmt.Errorf("arena: Spill.Alloc(%d): %w", size, ErrClosed)
	}
	if st == nil {
		return nil, fmt.Errorf("arena: Spill.Alloc(%d): nil stream", size)
	}
	if size == 0 {
		return nil, fmt.Errorf("arena: Spill.Alloc(0): size must be positive")
	}
	if size > s.cfg.addressSpace {
		return nil, fmt.Errorf("arena: Spill.Alloc(%d): %w: more than the %s of addresses reserved", size, ErrOutOfMemory, fmtBytes(s.cfg.addressSpace))
	}
	if len(s.captures) == 0 {
		// Event queries are among the calls a global-mode capture forbids.
		if err := s.processPending(); err != nil {
			return nil, fmt.Errorf("arena: Spill.Alloc(%d): %w", size, err)
		}
	}
	pool := in
	if pool == nil {
		var err error
		if pool, err = s.routePool(size, st); err != nil {
			return nil, err
		}
	}
	if pool.paused {
		return nil, fmt.Errorf("arena: Spill.Alloc(%d) in %s: %w", size, pool, ErrPaused)
	}
	rsize := roundUp(size, MinBlock)
	b := s.bestFit(pool, st, rsize)
	if b == nil {
		var err error
		if b, err = s.grow(pool, st, rsize); err != nil {
			return nil, fmt.Errorf("arena: Spill.Alloc(%d) on %s: %w", size, pool, err)
		}
	}
	s.split(b, rsize)
	b.state, b.req = stAllocated, size
	s.live[cuda.DevicePtr(b.addr)] = b
	s.st.InUse += b.size
	s.st.Requested += size
	s.st.Live++
	s.st.Allocs++
	s.st.PeakInUse = max(s.st.PeakInUse, s.st.InUse)
	return b, nil
}

// routePool picks the pool for an Alloc on st: the default one, or the
// pool of the capture underway on st (joining a foreign capture when the
// allocator was told to), after the capture-time reuse walk; s.mu is held.
func (s *Spill) routePool(size uint64, st cuda.Stream) (*Pool, error) {
	pool := s.def
	if s.cfg.foreign && len(s.captures) > 0 {
		if err := s.sweepJoined(); err != nil {
			return nil, fmt.Errorf("arena: Spill.Alloc(%d): %w", size, err)
		}
	}
	if len(s.captures) > 0 || (s.cfg.foreign && (!s.hinted || s.foreignN > 0)) {
		info, err := s.dev.CaptureInfo(st)
		if err != nil {
			return nil, fmt.Errorf("arena: Spill.Alloc(%d): %w", size, err)
		}
		switch info.Status {
		case cuda.CaptureActive:
			c := s.captures[info.ID]
			if c == nil && s.cfg.foreign {
				// Kept until Close: nothing tells the allocator when the
				// owner destroys the graph.
				c = s.register(st, info.ID, nil)
				c.joined, c.auto = true, true
			}
			if c == nil {
				return nil, fmt.Errorf("arena: Spill.Alloc(%d): stream is capturing (capture %d) but the capture was not begun with Spill.BeginCapture or JoinCapture", size, info.ID)
			}
			pool = c.pool
			if !s.cfg.noReuse {
				if err := s.reclaim(c, st, info); err != nil {
					return nil, fmt.Errorf("arena: Spill.Alloc(%d): capture-time reuse: %w", size, err)
				}
			}
		case cuda.CaptureInvalidated:
			return nil, fmt.Errorf("arena: Spill.Alloc(%d): the stream's capture %d was invalidated: %w", size, info.ID,
				&cuda.Error{Op: "cuStreamGetCaptureInfo_v3", Code: cuda.ErrorStreamCaptureInvalidated})
		}
	}
	return pool, nil
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

// bestFit removes and returns the smallest free block of (pool, st) that
// holds rsize bytes.
func (s *Spill) bestFit(pool *Pool, st cuda.Stream, rsize uint64) *block {
	t := pool.lookTree(st.Handle())
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
	}
	return found
}

// split cuts b (out of the tree) to rsize and frees the remainder.
func (s *Spill) split(b *block, rsize uint64) {
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
	b.seg.pool.tree(b.seg.handle).ReplaceOrInsert(rest)
}

// release makes b free: coalesce with free neighbours, put in its tree.
func (s *Spill) release(b *block) {
	t := b.seg.pool.tree(b.seg.handle)
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
}

// grow maps a new segment of at least rsize bytes for (pool, st) and
// returns its single free block, out of the tree.
func (s *Spill) grow(pool *Pool, st cuda.Stream, rsize uint64) (*block, error) {
	size := roundUp(rsize, s.cfg.chunk)
	if pool.user != nil && pool.user.src != nil {
		size = userSegmentSize(rsize)
	}
	b, err := s.mapSegment(pool, st, size)
	if err != nil && len(s.captures) == 0 && s.trim(false) > 0 {
		b, err = s.mapSegment(pool, st, size)
	}
	if err == nil && pool.backup {
		s.pinBackup(b.seg)
	}
	return b, err
}

func (s *Spill) mapSegment(pool *Pool, st cuda.Stream, size uint64) (*block, error) {
	state := func() string {
		return fmt.Sprintf("%s mapped (limit %s), %s in use, %s cached, of %s reserved addresses",
			fmtBytes(s.st.Mapped), fmtBytes(s.cfg.limit), fmtBytes(s.st.InUse),
			fmtBytes(s.st.Mapped-s.st.InUse), fmtBytes(s.cfg.addressSpace))
	}
	if s.st.Mapped+size > s.cfg.limit {
		return nil, fmt.Errorf("%w: a new %s segment would pass the limit: %s", ErrOutOfMemory, fmtBytes(size), state())
	}
	if pool.user != nil && pool.user.src != nil {
		return s.externalSegment(pool, st, size)
	}
	if s.plainNow() && pool.region == "" {
		addr, err := s.dev.Alloc(size)
		if err != nil {
			if errors.Is(err, cuda.ErrorOutOfMemory) {
				return nil, fmt.Errorf("%w: device has no %s for a new segment: %s: %w", ErrOutOfMemory, fmtBytes(size), state(), err)
			}
			return nil, fmt.Errorf("allocating a %s segment: %w", fmtBytes(size), err)
		}
		return s.addSegment(&segment{addr: addr, size: size, plain: true, pool: pool, stream: st, handle: st.Handle()}), nil
	}
	off, ok := s.takeVA(size)
	if !ok {
		return nil, fmt.Errorf("%w: no %s run of free reserved addresses left: %s", ErrOutOfMemory, fmtBytes(size), state())
	}
	addr := s.base.Add(off)
	fail := func(err error) (*block, error) {
		s.putVA(off, size)
		if errors.Is(err, cuda.ErrorOutOfMemory) {
			return nil, fmt.Errorf("%w: device has no %s for a new segment: %s: %w", ErrOutOfMemory, fmtBytes(size), state(), err)
		}
		return nil, fmt.Errorf("mapping a %s segment: %w", fmtBytes(size), err)
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
	return s.addSegment(&segment{addr: addr, size: size, h: h, pool: pool, stream: st, handle: st.Handle()}), nil
}

// plainNow says whether a new segment may come from cuMemAlloc: plain
// segments are asked for, and no capture can be underway (cuMemAlloc
// invalidates a global-mode capture).
func (s *Spill) plainNow() bool {
	return s.cfg.plain && len(s.captures) == 0 && (!s.cfg.foreign || (s.hinted && s.foreignN == 0))
}

func (s *Spill) addSegment(seg *segment) *block {
	size := seg.size
	seg.first = &block{addr: uint64(seg.addr), size: size, seg: seg, state: stFree}
	s.segments[seg] = true
	s.st.Mapped += size
	s.st.Segments++
	s.st.Grows++
	s.st.GrownBytes += size
	s.st.PeakMapped = max(s.st.PeakMapped, s.st.Mapped)
	return seg.first
}

// takeVA takes the lowest free run of size bytes of the reservation.
func (s *Spill) takeVA(size uint64) (uint64, bool) {
	for i, r := range s.vaFree {
		if r.hi-r.lo >= size {
			off := r.lo
			if r.hi-r.lo == size {
				s.vaFree = append(s.vaFree[:i], s.vaFree[i+1:]...)
			} else {
				s.vaFree[i].lo += size
			}
			return off, true
		}
	}
	return 0, false
}

// putVA returns [off, off+size) to the free runs, merging neighbours.
func (s *Spill) putVA(off, size uint64) {
	i := sort.Search(len(s.vaFree), func(i int) bool { return s.vaFree[i].lo > off })
	s.vaFree = append(s.vaFree, vaRange{})
	copy(s.vaFree[i+1:], s.vaFree[i:])
	s.vaFree[i] = vaRange{off, off + size}
	if i+1 < len(s.vaFree) && s.vaFree[i].hi == s.vaFree[i+1].lo {
		s.vaFree[i].hi = s.vaFree[i+1].hi
		s.vaFree = append(s.vaFree[:i+1], s.vaFree[i+2:]...)
	}
	if i > 0 && s.vaFree[i-1].hi == s.vaFree[i].lo {
		s.vaFree[i-1].hi = s.vaFree[i].hi
		s.vaFree = append(s.vaFree[:i], s.vaFree[i+1:]...)
	}
}

// Free returns the block at p. If other streams used it (RecordStream), it
// becomes reusable once their work is ordered before its next use: see
// the type's documentation. Freeing an address that is not allocated is an
// error and changes nothing.
func (s *Spill) Free(p cuda.DevicePtr) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("arena: Spill.Free(%#x): %w", p, ErrClosed)
	}
	b := s.live[p]
	if b == nil {
		return fmt.Errorf("arena: Spill.Free(%#x): %w allocation (never allocated, or freed already)", p, ErrUnknown)
	}
	delete(s.live, p)
	s.st.InUse -= b.size
	s.st.Requested -= b.req
	s.st.Live--
	s.st.Frees++
	switch {
	case len(b.uses) == 0:
		// Later work on its own stream is ordered after every use.
		seg := b.seg
		s.release(b)
		if seg.pool.refs <= 0 && seg.pool.user != nil {
			s.dropReleased(seg) // a released user pool's segment goes back once free
		}
	case len(s.captures) > 0:
		return s.deferFree(b)
	default:
		return s.recordEvents(b)
	}
	return nil
}

// RecordStream says that work on st uses the block at p (PyTorch's
// record_stream): its free then waits for that work.
func (s *Spill) RecordStream(p cuda.DevicePtr, st cuda.Stream) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("arena: Spill.RecordStream(%#x): %w", p, ErrClosed)
	}
	b := s.live[p]
	if b == nil {
		return fmt.Errorf("arena: Spill.RecordStream(%#x): %w allocation", p, ErrUnknown)
	}
	if st == nil || st.Handle() == b.seg.handle {
		return nil
	}
	for _, u := range b.uses {
		if u.Handle() == st.Handle() {
			return nil
		}
	}
	b.uses = append(b.uses, st)
	return nil
}

// recordEvents records an event on every stream that used b, outside any
// capture; b is reusable once they all completed.
func (s *Spill) recordEvents(b *block) error {
	b.state = stPending
	s.st.Waiting += b.size
	for _, u := range b.uses {
		var ev cuda.Event
		if n := len(s.events); n > 0 {
			ev, s.events = s.events[n-1], s.events[:n-1]
		} else {
			var err error
			if ev, err = s.dev.NewEvent(false); err != nil {
				return s.syncFallback(b, err)
			}
		}
		if err := ev.Record(u); err != nil {
			ev.Close()
			return s.syncFallback(b, err)
		}
		b.events = append(b.events, ev)
	}
	s.pending = append(s.pending, b)
	return nil
}

// syncFallback waits for b's streams when an event could not be used.
func (s *Spill) syncFallback(b *block, cause error) error {
	for _, u := range b.uses {
		if err := u.Synchronize(); err != nil {
			// The block stays out of use: better leaked than reused early.
			return fmt.Errorf("arena: Spill.Free(%#x): recording an event failed (%v) and so did waiting: %w", b.addr, cause, err)
		}
	}
	s.events = append(s.events, b.events...)
	s.st.Waiting -= b.size
	s.release(b)
	return nil
}

// processPending releases the pending blocks whose events completed.
func (s *Spill) processPending() error {
	keep := s.pending[:0]
	var first error
	for _, b := range s.pending {
		done := true
		for _, ev := range b.events {
			if err := ev.Query(); err != nil {
				done = false
				if !errors.Is(err, cuda.ErrorNotReady) && first == nil {
					first = err
				}
				break
			}
		}
		if !done {
			keep = append(keep, b)
			continue
		}
		s.events = append(s.events, b.events...)
		s.st.Waiting -= b.size
		s.release(b)
	}
	clear(s.pending[len(keep):])
	s.pending = keep
	return first
}

// EmptyCache unmaps every segment that is wholly free and that no graph
// needs (the default pool's, and those of private pools whose graphs and
// owner released them), giving the memory back to the driver. It refuses
// during a capture (ErrCapturing).
func (s *Spill) EmptyCache() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("arena: Spill.EmptyCache: %w", ErrClosed)
	}
	if len(s.captures) > 0 {
		return fmt.Errorf("arena: Spill.EmptyCache: %w", ErrCapturing)
	}
	if err := s.processPending(); err != nil {
		return fmt.Errorf("arena: Spill.EmptyCache: %w", err)
	}
	s.trim(false)
	return nil
}

// trim unmaps free segments of pools no graph holds (all when closing)
// and returns the bytes unmapped.
func (s *Spill) trim(all bool) uint64 {
	var freed uint64
	var segs []*segment
	for seg := range s.segments {
		segs = append(segs, seg)
	}
	sort.Slice(segs, func(i, j int) bool { return segs[i].addr < segs[j].addr })
	for _, seg := range segs {
		b := seg.first
		whole := b.next == nil && b.state == stFree
		kept := seg.pool.private && seg.pool.refs > 0 && seg.pool.region == ""
		if !all && (!whole || kept || seg.paused) {
			continue
		}
		if whole {
			seg.pool.tree(seg.handle).Delete(b)
			seg.pool.dropTree(seg.handle)
		}
		if seg.host != nil {
			s.dropHost(seg)
		}
		if seg.paused {
			// Nothing is mapped: only the addresses go back.
			s.putVA(uint64(seg.addr-s.base), seg.size)
			delete(s.segments, seg)
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
func (s *Spill) unmapSegment(seg *segment) {
	switch {
	case seg.external():
		s.freeExternal(seg)
	case seg.plain:
		s.dev.Free(seg.addr)
	default:
		s.dev.MemUnmap(seg.addr, seg.size)
		s.dev.MemRelease(seg.h)
		s.putVA(uint64(seg.addr-s.base), seg.size)
	}
	delete(s.segments, seg)
	s.st.Mapped -= seg.size
	s.st.Segments--
	s.st.Unmaps++
	s.st.UnmappedBytes += seg.size
}

func (s *Spill) poolHasSegments(p *Pool) bool {
	for seg := range s.segments {
		if seg.pool == p {
			return true
		}
	}
	return false
}

// Stats returns the counters.
func (s *Spill) Stats() SpillStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.st
	st.Cached = st.Mapped - st.InUse
	for p := range s.pools {
		st.FreeLists += len(p.free)
	}
	return st
}

// Close unmaps everything and frees the address range. Blocks still
// allocated are lost with it. It refuses during a capture.
func (s *Spill) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("arena: Spill.Close: %w", ErrClosed)
	}
	if len(s.captures) > 0 {
		return fmt.Errorf("arena: Spill.Close: %w", ErrCapturing)
	}
	s.closed = true
	var first error
	if err := s.dev.Synchronize(); err != nil {
		first = err
	}
	s.trim(true)
	for _, b := range s.pending {
		s.events = append(s.events, b.events...)
	}
	for _, ev := range s.events {
		ev.Close()
	}
	s.events, s.pending, s.untilNone, s.live = nil, nil, nil, nil
	if s.copyStream != nil {
		if err := s.copyStream.Close(); err != nil && first == nil {
			first = err
		}
		s.copyStream = nil
	}
	if err := s.dev.AddressFree(s.base, s.cfg.addressSpace); err != nil && first == nil {
		first = err
	}
	if first != nil {
		return fmt.Errorf("arena: Spill.Close: %w", first)
	}
	return nil
}

// Owns says whether p is a live allocation of this allocator.
func (s *Spill) Owns(p cuda.DevicePtr) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.live[p] != nil
}

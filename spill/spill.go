package spill

import (
	"errors"
	"fmt"
	"sync"

	"github.com/google/btree"

	"github.com/arenaplan/arenaplan/cuda"
	"github.com/arenaplan/arenaplan/internal/devmem"
)

// Allocator is the spillover caching allocator: it serves the allocations a
// plan does not cover, on the same device, without ever calling
// cuMemAlloc or cuMemFree (both fail and invalidate a global-mode
// capture).
//
// Memory. New reserves one range of virtual addresses up front
// (WithAddressSpace, default 64 GiB). Memory grows in segments: a run of
// whole chunks (WithChunk, default the device granularity, 2 MiB on an
// H100 or H200) mapped with one cuMemCreate + cuMemMap + cuMemSetAccess
// into the lowest free part of that range. VMM calls are legal inside a
// global-mode capture, so a capture can grow the allocator.
//
// Blocks. Requests are rounded up to 512 bytes; those of at most 1 MiB
// (SmallBlock) take blocks from segments of one chunk that serve only
// them, larger ones from segments that serve only larger ones, as in
// PyTorch's caching allocator; in the default pool, a larger request of
// at most 10 MiB (MidBlock) that finds no free block extends a segment of
// its stream in place (up to 20 MiB of addresses, MidSegment) or starts
// one, mapping only what its blocks need, and later ones share it; a
// still larger one gets a segment of its own size. Free blocks live in a
// github.com/google/btree per (pool, stream, size class) ordered by (size, address);
// an allocation takes the best fit on its own stream and splits off the
// rest (when at least 512 bytes); a free block coalesces with free
// neighbours of its segment. A block is only ever reused on the stream it
// was allocated on; RecordStream says that other streams used it, and then
// its free waits until that work is ordered before the reuse: outside a
// capture through events recorded on those streams, inside a capture
// through the capture graph (see BeginCapture). A stream without a free
// block of its own may take over a wholly free segment of another stream
// of the default pool, ordered after that stream's work, rather than map
// more (adopt.go): what is mapped does not grow with the streams a
// program makes and drops.
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
// that no graph needs and tries once more; then a free block of the other
// size class serves, if one holds the request.
//
// An Allocator is safe for concurrent use; device calls happen under its
// lock. It has no finalizers: Close it.
type Allocator struct {
	mu     sync.Mutex
	dev    cuda.Device
	cfg    config
	gran   uint64
	base   cuda.DevicePtr
	closed bool

	vaFree devmem.Runs // unmapped parts of the reservation, as offsets

	def      *Pool
	pools    map[*Pool]bool
	live     map[cuda.DevicePtr]*block // allocated blocks by address
	segments map[*segment]bool
	mids     map[*segment]bool // the mid segments (segment.va set), which extend searches

	captures  map[uint64]*Capture // underway, by capture id
	nextPool  uint64
	untilNone []*block // freed during a capture; wait until none is underway
	spare     []*block // recycled block structs (newBlock)
	key       block    // the best-fit search's pivot, reused
	pending   []*block // wait for events on other streams
	events    []cuda.Event
	doomed    []doomed // released user pools' free segments, unmapped once the work queued on them is done

	// The default pool's wholly free segments, taken over by streams
	// without a free block of their own (adopt.go).
	idle      *btree.BTreeG[*segment]
	idleSeq   uint64
	idleBytes uint64
	syncGen   uint64     // times the allocator waited for the whole device
	adoptEv   cuda.Event // orders a taking stream after the segment's old one

	st Stats
	// mappedHigh is the most bytes mapped at once since the last
	// EmptyCache (never reset by ResetPeaks): what an allocation told not
	// to grow may still map back to (see regrow).
	mappedHigh uint64
	// intervalPeak is the most bytes mapped at once since MappedPeak last
	// restarted its interval.
	intervalPeak uint64

	hinted   bool // ForeignCaptures was called: trust its count
	foreignN int

	copyStream cuda.Stream // backups and restores of paused pools (copier)
}

// ForeignCaptures tells the allocator how many captures that it did not
// begin are underway in the process, as their owner counts them (PyTorch's
// CUDAGraph.capture_begin and capture_end, as PyTorch's own allocator
// learns of captures). From the first call on, WithForeignCaptures skips
// its per-allocation capture query while the count is 0.
func (s *Allocator) ForeignCaptures(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hinted, s.foreignN = true, max(n, 0)
}

// New reserves the address space. It maps nothing until the first
// Alloc.
func New(dev cuda.Device, opts ...Option) (*Allocator, error) {
	if dev == nil {
		return nil, errors.New("spill: New: nil device")
	}
	var cfg config
	for _, o := range opts {
		if err := o(&cfg); err != nil {
			return nil, fmt.Errorf("spill: New: %w", err)
		}
	}
	gran, err := dev.Granularity(false)
	if err != nil {
		return nil, fmt.Errorf("spill: New: %w", err)
	}
	if cfg.chunk == 0 {
		cfg.chunk = gran
	}
	if cfg.chunk%gran != 0 {
		return nil, fmt.Errorf("spill: New: WithChunk(%d) is not a multiple of the granularity %d", cfg.chunk, gran)
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
		return nil, fmt.Errorf("spill: New: reserving %s of addresses: %w", devmem.Bytes(cfg.addressSpace), err)
	}
	s := &Allocator{
		dev: dev, cfg: cfg, gran: gran, base: base,
		vaFree:   devmem.NewRuns(cfg.addressSpace),
		pools:    map[*Pool]bool{},
		live:     map[cuda.DevicePtr]*block{},
		segments: map[*segment]bool{},
		mids:     map[*segment]bool{},
		captures: map[uint64]*Capture{},
	}
	s.def = s.newPool(false)
	s.def.refs = 1
	s.st.AddressSpace = cfg.addressSpace
	return s, nil
}

func roundUp(n, a uint64) uint64 { return (n + a - 1) / a * a }

// Alloc returns size bytes of device memory for use on stream st, 256-byte
// aligned (512-byte in fact). During a capture begun with BeginCapture, an
// allocation on a stream of that capture comes from its pool; the
// allocator may then grow by mapping memory, which the capture allows.
func (s *Allocator) Alloc(size uint64, st cuda.Stream) (cuda.DevicePtr, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.alloc(nil, size, st)
}

// AllocDefault is Alloc that also says whether the default pool served
// the block (not a capture's): a block its owner may hand out again for
// another request of the same size on the same stream without asking
// (the PyTorch bridge's C-side cache of freed blocks). With grow false it
// maps no memory: where no free block fits it returns ErrWouldGrow, so
// that an owner keeping freed blocks gives them back before the
// allocator grows (what it keeps never adds to what is mapped).
func (s *Allocator) AllocDefault(size uint64, st cuda.Stream, grow bool) (cuda.DevicePtr, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, err := s.allocBlock(nil, size, st, grow)
	if err != nil {
		return 0, false, err
	}
	return cuda.DevicePtr(b.addr), b.seg.pool == s.def, nil
}

// regrow says whether an allocation told not to grow may map a segment
// for rsize all the same: the default pool's, and the bytes mapped after
// it no more than this allocator held at once before (mappedHigh). Told
// not to grow means its owner keeps freed blocks that it would rather give
// back than have the allocator map more; mapping back to a level already
// held adds nothing to the process's peak, and giving every kept block
// back costs the owner a step of calls into the allocator (a steady eager
// step whose blocks kept in C of one size leave no free block of another
// would otherwise do so every step). s.mu is held.
func (s *Allocator) regrow(pool *Pool, rsize uint64) bool {
	if pool != s.def {
		return false
	}
	return s.st.Mapped+roundUp(rsize, s.cfg.chunk) <= s.mappedHigh
}

// alloc serves Alloc (in == nil: the default pool or the capture's) and
// AllocIn (a region pool); s.mu is held.
func (s *Allocator) alloc(in *Pool, size uint64, st cuda.Stream) (cuda.DevicePtr, error) {
	b, err := s.allocBlock(in, size, st, true)
	if err != nil {
		return 0, err
	}
	return cuda.DevicePtr(b.addr), nil
}

// allocBlock is alloc, returning the block; it maps memory only if grow;
// s.mu is held.
func (s *Allocator) allocBlock(in *Pool, size uint64, st cuda.Stream, grow bool) (*block, error) {
	if s.closed {
		return nil, fmt.Errorf("spill: Alloc(%d): %w", size, ErrClosed)
	}
	if st == nil {
		return nil, fmt.Errorf("spill: Alloc(%d): nil stream", size)
	}
	if size == 0 {
		return nil, fmt.Errorf("spill: Alloc(0): size must be positive")
	}
	if size > s.cfg.addressSpace {
		return nil, fmt.Errorf("spill: Alloc(%d): %w: more than the %s of addresses reserved", size, ErrOutOfMemory, devmem.Bytes(s.cfg.addressSpace))
	}
	if len(s.captures) == 0 {
		// Event queries are among the calls a global-mode capture forbids.
		s.processDoomed()
		if err := s.processPending(); err != nil {
			return nil, fmt.Errorf("spill: Alloc(%d): %w", size, err)
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
		return nil, fmt.Errorf("spill: Alloc(%d) in %s: %w", size, pool, ErrPaused)
	}
	rsize := roundUp(size, MinBlock)
	small := pool.small(rsize)
	b := s.bestFit(pool, st, rsize, small)
	if b == nil {
		b = s.adopt(pool, st, rsize, small) // maps nothing: allowed without grow
	}
	if b == nil && !grow && !s.regrow(pool, rsize) {
		return nil, fmt.Errorf("spill: Alloc(%d) on %s: %w", size, pool, ErrWouldGrow)
	}
	if b == nil {
		s.makeRoom(pool, rsize)
		var err error
		if b, err = s.grow(pool, st, rsize); err != nil {
			// Out of memory: a free block of the other size class serves
			// rather than fail a request that fits in what is mapped.
			if !errors.Is(err, ErrOutOfMemory) {
				return nil, fmt.Errorf("spill: Alloc(%d) on %s: %w", size, pool, err)
			}
			if b = s.bestFit(pool, st, rsize, !small); b == nil {
				return nil, fmt.Errorf("spill: Alloc(%d) on %s: %w", size, pool, err)
			}
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
func (s *Allocator) routePool(size uint64, st cuda.Stream) (*Pool, error) {
	pool := s.def
	if s.cfg.foreign && len(s.captures) > 0 {
		if err := s.sweepJoined(); err != nil {
			return nil, fmt.Errorf("spill: Alloc(%d): %w", size, err)
		}
	}
	if len(s.captures) > 0 || (s.cfg.foreign && (!s.hinted || s.foreignN > 0)) {
		info, err := s.dev.CaptureInfo(st)
		if err != nil {
			return nil, fmt.Errorf("spill: Alloc(%d): %w", size, err)
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
				return nil, fmt.Errorf("spill: Alloc(%d): stream is capturing (capture %d) but the capture was not begun with BeginCapture or JoinCapture", size, info.ID)
			}
			pool = c.pool
			if !s.cfg.noReuse {
				if err := s.reclaim(c, st, info); err != nil {
					return nil, fmt.Errorf("spill: Alloc(%d): capture-time reuse: %w", size, err)
				}
			}
		case cuda.CaptureInvalidated:
			return nil, fmt.Errorf("spill: Alloc(%d): the stream's capture %d was invalidated: %w", size, info.ID,
				&cuda.Error{Op: "cuStreamGetCaptureInfo_v3", Code: cuda.ErrorStreamCaptureInvalidated})
		}
	}
	return pool, nil
}

// Close unmaps everything and frees the address range. Blocks still
// allocated are lost with it. It refuses during a capture.
func (s *Allocator) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("spill: Close: %w", ErrClosed)
	}
	if len(s.captures) > 0 {
		return fmt.Errorf("spill: Close: %w", ErrCapturing)
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
	if s.adoptEv != nil {
		s.events = append(s.events, s.adoptEv)
		s.adoptEv = nil
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
		return fmt.Errorf("spill: Close: %w", first)
	}
	return nil
}

// Owns says whether p is a live allocation of this allocator.
func (s *Allocator) Owns(p cuda.DevicePtr) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.live[p] != nil
}

// Package spill is the spillover caching allocator: it serves the device
// memory that a plan does not cover (weights, inputs, what a step
// allocates outside the planned arena), on the same device, without ever
// calling cuMemAlloc or cuMemFree inside a capture (both fail and
// invalidate a global-mode capture).
//
// It is not a planner and not the planned arena (package arena): it knows
// no plan, no trace and no fixed offsets, only requests as they come. Its
// errors are arena's (ErrOutOfMemory, ErrPaused, ErrCapturing, ...: the
// same values), so that a caller of both branches once; ErrWouldGrow is
// its own.
//
// # Allocator
//
// New reserves address space up front; an Allocator grows by mapping
// physical chunks (legal inside a global-mode capture, unlike cuMemAlloc),
// with free blocks per (pool, stream, size class) in a btree ordered by
// (size, address), best fit, splitting and coalescing; requests of at
// most 1 MiB (SmallBlock) use segments of their own, as in PyTorch's
// caching allocator, and those of at most 10 MiB (MidBlock) share
// segments that map only what their blocks need and grow in place (see
// MidSegment). AllocDefault can be told not to grow (ErrWouldGrow),
// so that a cache of freed blocks in front of it (the PyTorch bridge's C
// fast path) gives them back before more memory is mapped. Freed memory
// stays cached until EmptyCache, with one exception: a large request that
// would map more than the allocator ever held at once first gives the
// wholly free segments back (after waiting for the device), where they
// hold at least its segment, so that a new peak is not the old cache plus
// the new segment (a training step's first backward, after its forward's
// small segments). Steady work, which maps nothing new, never waits.
//
// # Captures
//
// Captures begun with Allocator.BeginCapture allocate from a private pool
// that stays mapped while its graph lives; pools can be shared by graphs
// replayed one after another in capture order (NewSharedPool). Blocks
// that other streams used (RecordStream) and that are freed during a
// capture are reused within it once the capture graph proves their last
// uses precede the allocating stream's frontier (free markers and a
// reverse walk cached per capture and stream, after PyTorch PR #162186);
// see Capture.
//
// # Pools
//
// Region pools (NewRegionPool) are paused and resumed at the same
// addresses (PausePools, ResumePools), their contents kept in host
// memory or dropped. User pools (NewUserPool) are pools a program routes
// its allocations to by itself (AllocIn, PyTorch's MemPool), their
// segments the allocator's own or a SegmentSource's.
//
// Costs: an allocation is a best-fit lookup in a btree under the
// allocator's lock; growth is one cuMemCreate, cuMemMap and
// cuMemSetAccess per segment; a capture's reuse walk visits each node of
// the capture graph at most once per stream (Stats.NodesVisited).
//
// Nothing is freed by finalizers: call Close.
package spill

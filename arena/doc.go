// Package arena is the imported arena API: device memory laid out by a
// verified plan, every planned buffer at its fixed address for as long as
// the arena lives, pause and resume of physical memory at the same
// addresses.
//
// It is not a planner: it takes plans as they are (after planner.Check)
// and never moves a buffer. It knows nothing of graphs beyond what
// cuda.Device reports about captures. It is not the allocator for what a
// plan does not cover: that is package spill, which returns the same
// errors (ErrOutOfMemory, ErrPaused, ...) so that a caller of both
// branches once.
//
// # Arena
//
// New groups the plan's buffers by tag into regions (tags whose plan
// ranges overlap share one), reserves one range of virtual addresses with
// a granularity-aligned window per region, and maps physical memory into
// each window in few large handles (cuMemCreate, cuMemMap, cuMemSetAccess).
// Ptr(id) is then window + (offset − window's plan offset): fixed, so a
// graph captured over the arena replays forever.
//
// Pause releases a region's physical handles (the memory really goes back
// to the driver) and keeps its addresses; Resume maps new memory there.
// A tag's Policy says whether its bytes survive: Backup regions are copied
// to page-locked host memory (cuda.Device.PinnedAlloc; Go memory when the
// driver has none) on Pause and back on Resume; Drop regions come back
// with whatever the new memory holds. A Backup region keeps its
// page-locked memory from one Pause to the next (pinning costs far more
// than the copy) until ReleaseHost or Close. NCCL or RDMA registrations of arena
// memory must not outlive a Pause: they hold the old physical pages.
//
// # Layout
//
// A Layout is the planned-step core that Go's executor (graphexec) and
// the PyTorch bridge both build on, so that the path from a plan to the
// addresses a step runs at is one:
//
//	plan ──► NewLayout: planner.Check ─► New (regions; keep: Backup, rest Drop) ─► addresses
//	            │  Fit(run): planner.Fits, the same addresses for a later run
//	            │  Arena.Place(t, p): another checked plan inside the arena's regions
//	group  ──► NewGroupLayout(planner.GroupPlan): the group arena, each member's plan placed in it
//	             family (NewFamilyLayout: CheckFamily first): shared regions (Backup) + one private (Drop)
//	             chain (a joint plan): NewLayout of the joint plan
//
// graphexec resolves its kernels' arguments from a layout's addresses and
// backs up weights, KV caches and constant inputs; the bridge hands the
// addresses out to PyTorch's allocations and keeps nothing (a replay
// rewrites a step's arena).
//
// Costs: New and Resume pay one cuMemCreate and cuMemMap per handle (1 GiB
// by default) plus one cuMemSetAccess per region; Pause one cuMemUnmap and
// cuMemRelease per handle, after a device synchronisation; Backup regions
// add a device-to-host copy on Pause and a host-to-device copy on Resume.
// Ptr is a lookup under a mutex.
//
// Misuse is an error, never a crash: Ptr of a paused buffer (ErrPaused),
// pausing what is paused or resuming what is not, an unknown id or tag
// (ErrUnknown), naming one tag of a shared region without the others
// (ErrSharedRegion), Pause, Resume or Close while a capture is underway
// (ErrCapturing, when the caller told the arena how to see captures with
// SetCaptureGuard or WatchStreams), anything after Close (ErrClosed).
// Errors wrap context and keep *cuda.Error causes for errors.As.
//
// Nothing is freed by finalizers: call Close.
package arena

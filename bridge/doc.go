// Package bridge is arenaplan's memory behind PyTorch's allocator hook: the
// logic of the shared library that torch.cuda.memory.change_current_allocator
// loads (cmd/libarenaplan holds its exported C functions and nothing else).
// It is ordinary Go with no cgo, so everything here runs and is tested on the
// simulated device.
//
// A Bridge serves every allocation of the process, per device:
//
//   - Spill (spill.Allocator) serves what no step plan covers: weights, inputs,
//     KV caches, cuBLAS workspaces, and everything before a step is planned.
//     It grows by VMM mapping, so it works inside a CUDA graph capture, and
//     a capture that PyTorch begins gets a private pool of its own
//     (spill.WithForeignCaptures), as PyTorch's own allocator does.
//   - Zero-byte requests get distinct addresses from a reserved range that
//     is never mapped (PyTorch aborts when two live allocations share one).
//   - A Step records one step of a model (the allocations made on its stream
//     between Begin and End: sizes, order, frees, record_stream), plans them
//     at the lower bound (planner "auto", proved by planner.Check) into one
//     arena.Layout (the checked plan, its arena and every buffer's address:
//     the core Go's executor builds on too), and then serves later runs of
//     that step from the plan.
//   - A Family is several steps (one model's step at several batch sizes)
//     planned jointly into one arena as large as its largest member needs
//     (arena.NewFamilyLayout); members run one at a time and overlap by
//     design.
//   - A chain (NewChain) is a family whose members run in turn and hand
//     buffers on (a forward and its backward): planned on one timeline, a
//     buffer a later member frees lives to that free at one address
//     (arena.NewGroupLayout of the joint plan).
//   - Small arenas (at most 16 MiB) and the segments of graph memory
//     pools (NewGraphMemPool: the capture streams' workspaces) are laid
//     out side by side in one range of addresses per device, the graph
//     heap, and share its granules of physical memory (heap.go), as CUDA
//     graphs on PyTorch's allocator keep workspaces and tensors in one
//     pool; larger arenas map granules of their own. Pausing the graphs
//     unmaps the heap's granules that only paused arenas touch (one a
//     workspace shares stays mapped).
//   - Regions (BeginRegion, per thread) set memory apart by tag; Pause
//     releases the physical memory of tags and of the graphs (GraphsTag:
//     every arena and graph pool) keeping every address, backing up the
//     regions that asked for it, and Resume maps it back.
//
// # Serving a plan
//
// While a step serves on stream S, the k-th allocation on S gets the k-th
// buffer's planned address when its size equals the recorded one and no live
// buffer of the arena overlaps the planned range (an ordered set of live
// ranges: one lookup); a run that lacks a recorded allocation, or makes an
// extra one, finds its buffers within 8 of that position, ahead or behind.
// Anything else spills to the spillover allocator and
// counts as a divergence; with Strict it is an error instead. So an address
// is never wrong and two live allocations never share memory, whatever the
// program does (frees later than recorded, tensors kept across steps, other
// threads). Allocations on other streams are not the step's and take no
// slot. Frees of planned buffers are bookkeeping. Buffers alive at the end
// of the step are its outputs: they keep their addresses, and the next run
// of the step (a graph replay) overwrites them.
//
// Members of a family or chain share one arena. A chain's member is not
// served over any live buffer of another member (an earlier stage's output
// a later one has not freed yet). A family's member may be served over
// another member's outputs (one member runs at a time), but not over a
// buffer held past its plan: an allocation kept for good that took a
// planned buffer out of its turn, such as a library's workspace made
// lazily in a capture (the PyTorch package makes those on each capture
// stream before its first capture).
//
// A plan recorded from one run and served to a run that allocates
// differently (an eager warm-up, then a capture whose code asks whether it
// is being captured) diverges; Replan plans that served run instead, keeping
// any of the old plan's buffers still live where they are (orphans: their
// frees are bookkeeping) and, when the new plan needs more room, a new
// arena while the old one retires until its last orphan is freed. An arena
// is never closed while a capture is underway (closing synchronizes the
// device): it closes when the captures end.
//
// The C library may keep freed blocks of the spill's default pool and hand
// them out again itself (AllocCacheable) while FastPathAllowed: no capture
// underway as the host counts them, no step running, no region open. While
// it keeps blocks it asks AllocCacheable not to grow, and gives them back
// where serving would map more memory (spill.ErrWouldGrow): what it keeps
// never makes the process hold more.
//
// A buffer that record_stream marks as used on another stream keeps its
// range to the end of the step: in the recorded trace its lifetime is
// extended to the step's end, and while serving its range stays taken
// until the step ends.
//
// # Several devices and ranks
//
// Each device ordinal has its own spill allocator, zero-byte tokens, steps,
// families, regions and pause state: a step on device 1 never touches device
// 0's memory, and a pointer names its device (the driver's unified
// addresses; the simulated devices of one process get disjoint windows).
// A tensor-parallel job runs one process per rank (torchrun): Config.Rank
// and WorldSize (RANK and WORLD_SIZE) are written into every plan file, and
// Load refuses a plan made by another rank or world size (rank.go).
//
// # Concurrency and errors
//
// A Bridge is safe for concurrent use (PyTorch calls its allocator from
// several threads, outside its own lock). Nothing here panics on bad input;
// errors wrap their context and keep *cuda.Error causes.
//
// It is not a PyTorch binding: it knows nothing about tensors or Python;
// and it is not an allocator of its own: the memory is arena's.
package bridge

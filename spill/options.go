package spill

import "fmt"

type config struct {
	addressSpace uint64
	limit        uint64
	chunk        uint64
	noReuse      bool
	foreign      bool // WithForeignCaptures
	plain        bool // WithPlainSegments
	freshWalk    bool // tests only: a new visited set per walk (PyTorch's first design)
}

// Option configures New; a bad value makes New fail.
type Option func(*config) error

// WithAddressSpace sets the virtual addresses reserved up front (default
// 64 GiB): the most the allocator can ever map. Rounded up to the chunk.
func WithAddressSpace(n uint64) Option {
	return positive("WithAddressSpace", n, func(c *config) { c.addressSpace = n })
}

// WithLimit caps the physical bytes mapped (default: the address space).
func WithLimit(n uint64) Option {
	return positive("WithLimit", n, func(c *config) { c.limit = n })
}

// WithChunk sets the unit in which memory grows (default the device
// granularity); it must be a multiple of the granularity.
func WithChunk(n uint64) Option {
	return positive("WithChunk", n, func(c *config) { c.chunk = n })
}

// positive is a Option that sets a size, refusing 0.
func positive(name string, n uint64, set func(*config)) Option {
	return func(c *config) error {
		if n == 0 {
			return fmt.Errorf("%s(0): must be positive", name)
		}
		set(c)
		return nil
	}
}

// WithCaptureReuse turns capture-time reuse of blocks that other streams
// used on or off (default on). Off, such blocks wait for the end of the
// capture, as PyTorch does without graph_capture_record_stream_reuse.
func WithCaptureReuse(on bool) Option {
	return func(c *config) error {
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
func WithForeignCaptures(on bool) Option {
	return func(c *config) error {
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
func WithPlainSegments(on bool) Option {
	return func(c *config) error {
		c.plain = on
		return nil
	}
}

// defaultAddressSpace is what WithAddressSpace reserves unless told.
const defaultAddressSpace = 64 << 30

package arena

import "errors"

// Errors that callers may branch on with errors.Is. Every error the
// package returns wraps context around them (and around *cuda.Error where
// the driver failed).
var (
	// ErrClosed: the arena (or allocator) was closed.
	ErrClosed = errors.New("closed")
	// ErrPaused: the buffer's region is paused; Resume it first.
	ErrPaused = errors.New("region is paused")
	// ErrNotPaused: Resume of a region that is not paused.
	ErrNotPaused = errors.New("region is not paused")
	// ErrUnknown: an id or tag the arena does not hold.
	ErrUnknown = errors.New("unknown")
	// ErrCapturing: a stream capture is underway, during which memory
	// must not be unmapped (captured nodes may point at it) and
	// synchronous copies would invalidate the capture.
	ErrCapturing = errors.New("stream capture underway")
	// ErrSharedRegion: a tag was named without the tags whose plan ranges
	// overlap its own; they share one region and pause together.
	ErrSharedRegion = errors.New("tag shares its region")
	// ErrOutOfMemory: the device (or the reserved address space) cannot
	// serve the request.
	ErrOutOfMemory = errors.New("out of memory")
	// ErrWouldGrow: Spill.AllocDefault was told not to map memory, and no
	// free block fits. Not a failure: the caller frees what it keeps and
	// asks again.
	ErrWouldGrow = errors.New("no free block fits without mapping more memory")
)

package arena

import (
	"errors"

	"github.com/arenaplan/arenaplan/internal/devmem"
)

// Errors that callers may branch on with errors.Is. Every error the
// package returns wraps context around them (and around *cuda.Error where
// the driver failed). Those that package spill returns too are the same
// values there (spill.ErrOutOfMemory is ErrOutOfMemory).
var (
	// ErrClosed: the arena was closed.
	ErrClosed = devmem.ErrClosed
	// ErrPaused: the buffer's region is paused; Resume it first.
	ErrPaused = devmem.ErrPaused
	// ErrNotPaused: Resume of a region that is not paused.
	ErrNotPaused = devmem.ErrNotPaused
	// ErrUnknown: an id or tag the arena does not hold.
	ErrUnknown = devmem.ErrUnknown
	// ErrCapturing: a stream capture is underway, during which memory
	// must not be unmapped (captured nodes may point at it) and
	// synchronous copies would invalidate the capture.
	ErrCapturing = devmem.ErrCapturing
	// ErrSharedRegion: a tag was named without the tags whose plan ranges
	// overlap its own; they share one region and pause together.
	ErrSharedRegion = errors.New("tag shares its region")
	// ErrOutOfMemory: the device (or the reserved address space) cannot
	// serve the request.
	ErrOutOfMemory = devmem.ErrOutOfMemory
)

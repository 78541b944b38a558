package spill

import (
	"errors"

	"github.com/arenaplan/arenaplan/internal/devmem"
)

// Errors that callers may branch on with errors.Is. Every error the
// package returns wraps context around them (and around *cuda.Error where
// the driver failed). All but ErrWouldGrow are package arena's too, the
// same values (ErrOutOfMemory is arena.ErrOutOfMemory), so that a caller
// of both branches once.
var (
	// ErrClosed: the allocator was closed.
	ErrClosed = devmem.ErrClosed
	// ErrPaused: the pool is paused (PausePools); ResumePools it first.
	ErrPaused = devmem.ErrPaused
	// ErrNotPaused: ResumePools of a pool that is not paused.
	ErrNotPaused = devmem.ErrNotPaused
	// ErrUnknown: an allocation or pool the allocator does not hold.
	ErrUnknown = devmem.ErrUnknown
	// ErrCapturing: a stream capture is underway, during which memory
	// must not be unmapped (captured nodes may point at it).
	ErrCapturing = devmem.ErrCapturing
	// ErrOutOfMemory: the device, the limit (WithLimit) or the reserved
	// address space cannot serve the request.
	ErrOutOfMemory = devmem.ErrOutOfMemory
	// ErrWouldGrow: AllocDefault was told not to map memory, and no free
	// block fits. Not a failure: the caller frees what it keeps and asks
	// again.
	ErrWouldGrow = errors.New("no free block fits without mapping more memory")
)

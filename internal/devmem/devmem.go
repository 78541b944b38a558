// Package devmem holds what the two device memory packages share, arena
// (memory at a plan's fixed offsets) and spill (the spillover caching
// allocator): the errors callers branch on, one value per condition
// whichever of the two failed, the way their messages write sizes, and
// the free runs of a range of addresses (Runs). It maps no memory.
package devmem

import (
	"errors"
	"fmt"
	"strings"
)

// Errors that arena and spill both return, wrapped in context; each
// package names them again as its own (arena.ErrClosed is spill.ErrClosed),
// so that a caller holding both branches once.
var (
	ErrClosed      = errors.New("closed")
	ErrPaused      = errors.New("region is paused")
	ErrNotPaused   = errors.New("region is not paused")
	ErrUnknown     = errors.New("unknown")
	ErrCapturing   = errors.New("stream capture underway")
	ErrOutOfMemory = errors.New("out of memory")
)

// Bytes prints n in the largest binary unit that keeps it >= 1.
func Bytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	v, u := float64(n), 0
	for v >= unit && u < 4 {
		v /= unit
		u++
	}
	s := fmt.Sprintf("%.2f", v)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	return s + " " + [...]string{"B", "KiB", "MiB", "GiB", "TiB"}[u]
}

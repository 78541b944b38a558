package arena

import (
	"fmt"
	"strings"

	"github.com/arenaplan/arenaplan/internal/devmem"
	"github.com/arenaplan/arenaplan/lifetime"
)

// Grow makes the arena size bytes long in place: its last region, which
// must reach the arena's end and be dropped on Pause (a family's private
// memory), extends into the addresses reserved with WithRoom and is backed
// by new physical memory (mapped at once, or at Resume while paused).
// Every address the arena had stays valid, so graphs captured on it keep
// working. A size not above Size does nothing. It refuses while a
// watched capture is underway, and when the room or the device's free
// memory is short (ErrOutOfMemory); the arena is then as it was.
func (a *Arena) Grow(size int64) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return fmt.Errorf("arena: Grow: %w", ErrClosed)
	}
	if size <= a.size {
		return nil
	}
	if err := a.checkCapture("Grow"); err != nil {
		return err
	}
	if len(a.regions) == 0 {
		return fmt.Errorf("arena: Grow: trace %q: the arena has no region to grow", a.name)
	}
	r := a.regions[len(a.regions)-1]
	if r.hi != a.size || r.policy != Drop {
		return fmt.Errorf("arena: Grow: trace %q: its last region [%s] does not reach the arena's end or is backed up on Pause",
			a.name, strings.Join(r.tags, " "))
	}
	end := uint64(lifetime.RoundUp(size, int64(a.gran)) - r.wlo)
	more := end - r.size
	if more > a.room {
		return fmt.Errorf("arena: Grow: trace %q to %s: %w: %s more addresses needed, %s reserved for growth",
			a.name, devmem.Bytes(uint64(size)), ErrOutOfMemory, devmem.Bytes(more), devmem.Bytes(a.room))
	}
	if more > 0 {
		if free, total, err := a.dev.MemGetInfo(); err == nil && more > free {
			return fmt.Errorf("arena: Grow: trace %q to %s: %w: %s more device memory needed, %s free of %s",
				a.name, devmem.Bytes(uint64(size)), ErrOutOfMemory, devmem.Bytes(more), devmem.Bytes(free), devmem.Bytes(total))
		}
	}
	old := len(r.chunks)
	for off := r.size; off < end; off += a.handle {
		r.chunks = append(r.chunks, chunk{off: off, size: min(a.handle, end-off)})
	}
	oldSize := r.size
	r.size = end
	if !r.paused {
		if err := a.mapRegion(r); err != nil {
			for i := old; i < len(r.chunks); i++ {
				c := &r.chunks[i]
				if c.mapped {
					_ = a.dev.MemUnmap(r.window.Add(c.off), c.size)
				}
				if c.live {
					_ = a.dev.MemRelease(c.h)
				}
			}
			r.chunks, r.size = r.chunks[:old], oldSize
			return fmt.Errorf("arena: Grow: trace %q: %w", a.name, a.mapError(r, err))
		}
	}
	r.hi = size
	a.size = size
	a.resv += more
	a.room -= more
	return nil
}

// Room returns the bytes of addresses still reserved for Grow.
func (a *Arena) Room() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.room
}

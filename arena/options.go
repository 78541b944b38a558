package arena

import (
	"fmt"
	"strconv"
)

// Policy says what happens to a tag's contents across Pause and Resume.
type Policy int

const (
	// Drop loses the contents on Pause: the region is rewritten by every
	// replay (activations, scratch), so nothing needs saving. After Resume
	// its bytes are whatever the new physical memory holds (usually zero).
	Drop Policy = iota
	// Backup copies the region to page-locked host memory on Pause and
	// back on Resume:
	// weights and state initialised once that replays read but never
	// rewrite.
	Backup
)

func (p Policy) String() string {
	switch p {
	case Drop:
		return "drop"
	case Backup:
		return "backup"
	}
	return "Policy(" + strconv.Itoa(int(p)) + ")"
}

// config is what the options set.
type config struct {
	policies   map[string]Policy
	handleSize uint64 // 0: defaultHandleSize
	room       uint64 // addresses reserved past the last region, for Grow
}

// defaultHandleSize caps one physical handle: few large handles keep map
// and unmap cheap (their cost grows with the number of handles), while a
// cap keeps one request from having to find a huge contiguous grant.
const defaultHandleSize = 1 << 30

// Option configures New. Options validate their arguments: a bad one makes
// New fail with an error that names it.
type Option func(*config) error

// WithPolicy sets the pause policy of every buffer with the given tag
// (default Drop). The tag must occur in the trace. Setting two different
// policies for one tag is an error. When tags share a region (their plan
// ranges overlap) the region is backed up if any of its tags asks for it;
// a plan made by planner.RunByTag never lets two tags share one.
func WithPolicy(tag string, p Policy) Option {
	return func(c *config) error {
		if p != Drop && p != Backup {
			return fmt.Errorf("WithPolicy(%q): unknown policy %d", tag, int(p))
		}
		if old, ok := c.policies[tag]; ok && old != p {
			return fmt.Errorf("WithPolicy(%q): policy set twice (%v, then %v)", tag, old, p)
		}
		c.policies[tag] = p
		return nil
	}
}

// WithHandleSize caps the size of one physical handle (default 1 GiB). It
// must be a positive multiple of the device's granularity; New checks.
func WithHandleSize(n uint64) Option {
	return func(c *config) error {
		if n == 0 {
			return fmt.Errorf("WithHandleSize(0): size must be positive")
		}
		c.handleSize = n
		return nil
	}
}

// WithRoom reserves n more bytes of virtual addresses past the arena's
// last region (rounded up to the granularity), which Grow can later back
// with memory so that the arena grows in place: every address it had
// stays valid. Addresses cost no memory; only what Grow maps does.
func WithRoom(n uint64) Option {
	return func(c *config) error {
		c.room = n
		return nil
	}
}

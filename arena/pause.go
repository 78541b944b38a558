package arena

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/arenaplan/arenaplan/cuda"
	"github.com/arenaplan/arenaplan/internal/devmem"
)

// SetCaptureGuard installs f, which reports whether a stream capture is
// underway. Pause, Resume and Close refuse (ErrCapturing) while it returns
// true: unmapping memory that captured nodes point at, or the synchronous
// copies of a backup, would corrupt or invalidate the capture. f is called
// with the arena's lock held and must not call the arena. nil removes it.
func (a *Arena) SetCaptureGuard(f func() bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.guard = f
}

// WatchStreams adds streams whose capture status Pause, Resume and Close
// check (cuda.Device.CaptureInfo) before touching memory: any of them
// capturing, or with an invalidated capture not yet ended, makes them
// refuse with ErrCapturing. Streams must outlive the arena or be
// unwatched with UnwatchStreams before they are closed.
func (a *Arena) WatchStreams(streams ...cuda.Stream) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.watched = append(a.watched, streams...)
}

// UnwatchStreams removes streams that WatchStreams added.
func (a *Arena) UnwatchStreams(streams ...cuda.Stream) {
	a.mu.Lock()
	defer a.mu.Unlock()
	keep := a.watched[:0]
	for _, w := range a.watched {
		drop := false
		for _, s := range streams {
			if w == s {
				drop = true
				break
			}
		}
		if !drop {
			keep = append(keep, w)
		}
	}
	a.watched = keep
}

func (a *Arena) checkCapture(op string) error {
	if a.guard != nil && a.guard() {
		return fmt.Errorf("arena: %s: %w (the capture guard says so)", op, ErrCapturing)
	}
	for i, s := range a.watched {
		info, err := a.dev.CaptureInfo(s)
		if err != nil {
			return fmt.Errorf("arena: %s: capture status of watched stream %d: %w", op, i, err)
		}
		if info.Status != cuda.CaptureNone {
			return fmt.Errorf("arena: %s: %w on watched stream %d (status %v)", op, ErrCapturing, i, info.Status)
		}
	}
	return nil
}

// selectRegions resolves tags to regions for Pause (wantPaused false: the
// regions must be running) or Resume (true: they must be paused). No tags
// means every region in the other state.
func (a *Arena) selectRegions(op string, tags []string, wantPaused bool) ([]*region, error) {
	if a.closed {
		return nil, fmt.Errorf("arena: %s: %w", op, ErrClosed)
	}
	if len(tags) == 0 {
		var out []*region
		for _, r := range a.regions {
			if r.paused == wantPaused {
				out = append(out, r)
			}
		}
		if len(out) == 0 && len(a.regions) > 0 {
			if wantPaused {
				return nil, fmt.Errorf("arena: %s: nothing to resume: %w", op, ErrNotPaused)
			}
			return nil, fmt.Errorf("arena: %s: nothing to pause: every %w", op, ErrPaused)
		}
		return out, nil
	}
	call := fmt.Sprintf("%s(%s)", op, quoteAll(tags))
	named := map[string]bool{}
	var out []*region
	seen := map[*region]bool{}
	for _, tag := range tags {
		r := a.byTag[tag]
		if r == nil {
			return nil, fmt.Errorf("arena: %s: %w tag %q", call, ErrUnknown, tag)
		}
		named[tag] = true
		if !seen[r] {
			seen[r] = true
			out = append(out, r)
		}
	}
	for _, r := range out {
		var missing []string
		for _, t := range r.tags {
			if !named[t] {
				missing = append(missing, t)
			}
		}
		if len(missing) > 0 {
			return nil, fmt.Errorf("arena: %s: %w with %s (their plan ranges overlap); name them too",
				call, ErrSharedRegion, quoteAll(missing))
		}
		switch {
		case wantPaused && !r.paused:
			return nil, fmt.Errorf("arena: %s: tags %s: %w", call, quoteAll(r.tags), ErrNotPaused)
		case !wantPaused && r.paused:
			return nil, fmt.Errorf("arena: %s: tags %s: already paused: %w", call, quoteAll(r.tags), ErrPaused)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].lo < out[j].lo })
	return out, nil
}

func quoteAll(tags []string) string {
	q := make([]string, len(tags))
	for i, t := range tags {
		q[i] = fmt.Sprintf("%q", t)
	}
	return strings.Join(q, ", ")
}

// Pause releases the physical memory of the regions holding tags (no tags:
// every running region), so that it goes back to the driver, and keeps
// their addresses reserved so that captured graphs stay valid. It waits
// for the device first (cuda.Device.Synchronize), then copies Backup
// regions to host memory (page-locked, kept for the next Pause; see
// ReleaseHost), then unmaps and releases their handles.
//
// Errors, with nothing changed: a tag that is unknown, already paused, or
// shares its region with a tag not named (ErrSharedRegion); a capture
// underway (SetCaptureGuard, WatchStreams); a closed arena. A driver error
// while unmapping leaves the region paused (Resume maps it again).
func (a *Arena) Pause(tags ...string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	regs, err := a.selectRegions("Pause", tags, false)
	if err != nil {
		return err
	}
	if err := a.checkCapture("Pause"); err != nil {
		return err
	}
	if len(regs) == 0 {
		return nil
	}
	// Replays in flight may still read or write the memory.
	if err := a.dev.Synchronize(); err != nil {
		return fmt.Errorf("arena: Pause: %w", err)
	}
	// Backups go to page-locked memory, which the copy fills at the bus's
	// speed (55 GB/s on an H200, against 18 GB/s for warm pageable memory
	// and 1.8 GB/s for fresh); to Go memory when the driver has none to
	// give. A region gets its page-locked memory when it is made (New)
	// and keeps it from one Pause to the next: pinning 1 GiB costs
	// ~360 ms, the copy ~20 ms. Here it is pinned only where New could
	// not, or after ReleaseHost.
	var fresh []*region // host buffers made by this call, undone on error
	undo := func() {
		for _, r := range fresh {
			a.dropHost(r)
		}
	}
	for _, r := range regs {
		if r.policy != Backup {
			continue
		}
		n := uint64(r.hi - r.lo)
		if r.host == nil {
			b, err := a.dev.PinnedAlloc(n)
			r.host, r.pinned = b, err == nil
			if err != nil {
				r.host = make([]byte, n)
			}
			fresh = append(fresh, r)
		}
		if err := a.dev.CopyDtoH(r.host, r.window.Add(uint64(r.lo-r.wlo))); err != nil {
			undo()
			return fmt.Errorf("arena: Pause: backing up region [%s] (%s): %w", strings.Join(r.tags, " "), devmem.Bytes(n), err)
		}
	}
	var errs []error
	for _, r := range regs {
		r.paused = true
		if err := a.unmapRegion(r); err != nil {
			errs = append(errs, fmt.Errorf("arena: Pause: region [%s]: %w", strings.Join(r.tags, " "), err))
		}
	}
	return errors.Join(errs...)
}

// Resume maps new physical memory for the paused regions holding tags (no
// tags: every paused region) at their old addresses and restores Backup
// regions from host memory; Drop regions hold whatever the new memory
// holds. Graphs captured before Pause replay correctly afterwards.
//
// Errors: as Pause's, with ErrNotPaused for a region that is not paused.
// Regions resume one by one; a region that fails (device memory exhausted:
// ErrOutOfMemory) stays paused with its backup, the ones before it stay
// resumed.
func (a *Arena) Resume(tags ...string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	regs, err := a.selectRegions("Resume", tags, true)
	if err != nil {
		return err
	}
	if err := a.checkCapture("Resume"); err != nil {
		return err
	}
	for _, r := range regs {
		if err := a.mapRegion(r); err != nil {
			a.unmapRegion(r)
			return fmt.Errorf("arena: Resume: %w", a.mapError(r, err))
		}
		if r.host != nil {
			if err := a.dev.CopyHtoD(r.window.Add(uint64(r.lo-r.wlo)), r.host); err != nil {
				a.unmapRegion(r)
				return fmt.Errorf("arena: Resume: restoring region [%s]: %w", strings.Join(r.tags, " "), err)
			}
		}
		r.paused = false
		if !r.pinned {
			r.host = nil // Go memory: let the collector have it
		}
	}
	return nil
}

// Paused says whether any region is paused (a Pause that failed half way
// leaves some).
func (a *Arena) Paused() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, r := range a.regions {
		if r.paused {
			return true
		}
	}
	return false
}

// ReleaseHost gives back the page-locked host memory that running Backup
// regions keep for their next Pause (the bytes of those regions, pinned
// by New or by an earlier Pause; see Pause). The next Pause pins afresh. Paused regions keep
// theirs: it holds their contents.
func (a *Arena) ReleaseHost() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return fmt.Errorf("arena: ReleaseHost: %w", ErrClosed)
	}
	var errs []error
	for _, r := range a.regions {
		if !r.paused {
			if err := a.dropHost(r); err != nil {
				errs = append(errs, fmt.Errorf("arena: ReleaseHost: region [%s]: %w", strings.Join(r.tags, " "), err))
			}
		}
	}
	return errors.Join(errs...)
}

// dropHost lets go of a region's host buffer, giving page-locked memory
// back to the driver.
func (a *Arena) dropHost(r *region) error {
	b, pinned := r.host, r.pinned
	r.host, r.pinned = nil, false
	if pinned {
		return a.dev.PinnedFree(b)
	}
	return nil
}

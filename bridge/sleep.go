package bridge

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/arenaplan/arenaplan/arena"
	"github.com/arenaplan/arenaplan/cuda"
	"github.com/arenaplan/arenaplan/spill"
)

// GraphsTag names, in Pause and Resume, the memory of the captured graphs:
// every step's and family's arena and the spill pools of graph captures.
// Its contents are dropped: a replay rewrites them.
const GraphsTag = "graphs"

// region is memory a program set apart under a tag (BeginRegion).
type region struct {
	tag    string
	pool   *spill.Pool
	backup bool
	paused bool
	mem    *memPool // the memory pool this region serves (mempool.go), if any
}

// graphsPause is what Pause(GraphsTag) released, for Resume.
type graphsPause struct {
	arenas []*arena.Arena
	pools  []*spill.Pool
}

// BeginRegion routes the allocations that thread makes on device ordinal
// (outside steps) to the region tag until EndRegion: weights, a KV cache,
// whatever Pause and Resume should release and take back as one. backup
// says whether Pause keeps the contents (in page-locked host memory kept
// from one pause to the next) or drops them; a tag keeps the choice it was
// first made with. Regions do not nest on one thread.
func (b *Bridge) BeginRegion(ordinal, thread int, tag string, backup bool) error {
	if tag == "" || tag == GraphsTag {
		return fmt.Errorf("bridge: BeginRegion: tag %q is reserved (want a name of your own)", tag)
	}
	d, err := b.device(ordinal)
	if err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if r := d.threadRegion[thread]; r != nil {
		return fmt.Errorf("bridge: BeginRegion(%q): thread %d is in region %q already (regions do not nest)", tag, thread, r.tag)
	}
	r := d.regions[tag]
	if r == nil {
		p, err := d.spill.NewRegionPool(tag, backup)
		if err != nil {
			return fmt.Errorf("bridge: BeginRegion(%q): %w", tag, err)
		}
		r = &region{tag: tag, pool: p, backup: backup}
		d.regions[tag] = r
	} else if r.backup != backup {
		return fmt.Errorf("bridge: BeginRegion(%q, backup=%v): the region was made with backup=%v", tag, backup, r.backup)
	}
	if r.paused {
		return fmt.Errorf("bridge: BeginRegion(%q): the region is paused: Resume it first", tag)
	}
	d.threadRegion[thread] = r
	b.regionsOpen.Add(1)
	return nil
}

// EndRegion ends thread's region on device ordinal.
func (b *Bridge) EndRegion(ordinal, thread int) error {
	d, err := b.device(ordinal)
	if err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.threadRegion[thread] == nil {
		return fmt.Errorf("bridge: EndRegion: thread %d is in no region", thread)
	}
	if r := d.threadRegion[thread]; r.mem != nil {
		return fmt.Errorf("bridge: EndRegion: thread %d routes to %s (end that first)", thread, r.tag)
	}
	delete(d.threadRegion, thread)
	b.regionsOpen.Add(-1)
	return nil
}

// regionAlloc serves size bytes from region r; d.mu is held.
func (d *Device) regionAlloc(r *region, size uint64, stream uintptr) (cuda.DevicePtr, error) {
	st, err := d.stream(stream)
	if err != nil {
		return 0, err
	}
	p, err := d.spill.AllocIn(r.pool, size, st)
	if errors.Is(err, spill.ErrPaused) {
		return 0, fmt.Errorf("bridge: device %d: allocating %d bytes in region %q: the region is paused (Resume it first): %w", d.ordinal, size, r.tag, err)
	}
	if err != nil {
		return 0, d.oom(size, err)
	}
	d.st.Spilled++
	return p, nil
}

// resolve turns Pause's or Resume's tags into regions and whether the
// graphs are meant; no tags means every region and the graphs in the
// state the call changes. d.mu is held.
func (d *Device) resolve(op string, tags []string, pausing bool) ([]*region, bool, error) {
	var regs []*region
	graphs := false
	if len(tags) == 0 {
		for _, r := range d.regions {
			if r.paused != pausing {
				regs = append(regs, r)
			}
		}
		graphs = (d.graphs == nil) == pausing
		if len(regs) == 0 && !graphs {
			if pausing {
				return nil, false, fmt.Errorf("bridge: %s: nothing to pause: %w", op, arena.ErrPaused)
			}
			return nil, false, fmt.Errorf("bridge: %s: nothing to resume: %w", op, arena.ErrNotPaused)
		}
		sort.Slice(regs, func(i, j int) bool { return regs[i].tag < regs[j].tag })
		return regs, graphs, nil
	}
	seen := map[string]bool{}
	for _, t := range tags {
		if seen[t] {
			return nil, false, fmt.Errorf("bridge: %s: tag %q named twice", op, t)
		}
		seen[t] = true
		if t == GraphsTag {
			if (d.graphs != nil) == pausing {
				return nil, false, d.stateError(op, t, pausing)
			}
			graphs = true
			continue
		}
		r := d.regions[t]
		if r == nil {
			return nil, false, fmt.Errorf("bridge: %s: no region %q (made with region(tag=...)), nor %q", op, t, GraphsTag)
		}
		if r.paused == pausing {
			return nil, false, d.stateError(op, t, pausing)
		}
		regs = append(regs, r)
	}
	return regs, graphs, nil
}

func (d *Device) stateError(op, tag string, pausing bool) error {
	if pausing {
		return fmt.Errorf("bridge: %s: %q is paused already: %w", op, tag, arena.ErrPaused)
	}
	return fmt.Errorf("bridge: %s: %q is not paused: %w", op, tag, arena.ErrNotPaused)
}

// Pause releases the physical memory of the regions named by tags (and of
// the graphs, for GraphsTag; no tags: everything running) on device
// ordinal, keeping every virtual address: tensors and captured graphs stay
// valid and are usable again after Resume. It waits for the device, backs
// up the regions made with backup, and also gives back the spill
// allocator's cached free memory. Nothing may run on the memory while it
// is paused: a step refuses to serve, and replaying a paused graph is the
// caller's error (the Python package asks Paused and refuses it).
//
// Errors, with nothing changed: an unknown tag, a tag paused already, a
// step recording or serving. A device failure half way is undone: what
// this call paused is resumed, and the error says that nothing is paused;
// where undoing fails too, the error names exactly what stays paused (as
// Paused reports it; Resume takes it back). Freeing a paused tensor is
// allowed (bookkeeping; nothing is released twice); allocating in a
// paused region fails.
func (b *Bridge) Pause(ordinal int, tags ...string) error {
	d, err := b.device(ordinal)
	if err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	op := fmt.Sprintf("Pause(%s)", strings.Join(tags, ", "))
	regs, graphs, err := d.resolve(op, tags, true)
	if err != nil {
		return err
	}
	if len(d.active) > 0 {
		return fmt.Errorf("bridge: %s: a step is recording or serving: End it first", op)
	}
	restore, err := makeCurrent(d.dev)
	if err != nil {
		return err
	}
	defer restore()
	defer b.pauseChanged()
	var pools []*spill.Pool
	for _, r := range regs {
		pools = append(pools, r.pool)
	}
	var gp graphsPause
	if graphs {
		gp.pools = d.spill.GraphPools()
		pools = append(pools, gp.pools...)
	}
	var failed error
	if err := d.spill.PausePools(pools...); err != nil {
		failed = fmt.Errorf("bridge: %s: %w", op, err)
	}
	if failed == nil && graphs {
		d.notePeak()
		for _, a := range d.arenasLocked() {
			if err := a.Pause(); err != nil {
				failed = fmt.Errorf("bridge: %s: graph arena: %w", op, err)
				if a.Paused() {
					gp.arenas = append(gp.arenas, a) // unmapped in part
				}
				break
			}
			gp.arenas = append(gp.arenas, a)
		}
	}
	if failed != nil {
		return d.undoPause(failed, regs, graphs, &gp)
	}
	for _, r := range regs {
		r.paused = true
	}
	if graphs {
		d.graphs = &gp
	}
	if err := d.spill.EmptyCache(); err != nil {
		return fmt.Errorf("bridge: %s: paused, but giving back cached memory failed: %w", op, err)
	}
	return nil
}

// undoPause resumes what a Pause that failed with cause had paused
// (regs' pools, and gp's arenas and pools when graphs), and records what
// stays paused where that fails too, so that Paused tells the truth; d.mu
// is held.
func (d *Device) undoPause(cause error, regs []*region, graphs bool, gp *graphsPause) error {
	var errs []error
	for _, a := range gp.arenas {
		if err := a.Resume(); err != nil && !errors.Is(err, arena.ErrNotPaused) {
			errs = append(errs, fmt.Errorf("graph arena: %w", err))
		}
	}
	var pools []*spill.Pool
	for _, r := range regs {
		pools = append(pools, r.pool)
	}
	pools = append(pools, gp.pools...)
	for _, p := range pools {
		if !p.Paused() {
			continue
		}
		if err := d.spill.ResumePools(p); err != nil {
			errs = append(errs, err)
		}
	}
	// What stays paused, asked of the memory itself.
	var still []string
	for _, r := range regs {
		r.paused = r.pool.Paused()
		if r.paused {
			still = append(still, r.tag)
		}
	}
	if graphs {
		var left graphsPause
		for _, a := range gp.arenas {
			if a.Paused() {
				left.arenas = append(left.arenas, a)
			}
		}
		for _, p := range gp.pools {
			if p.Paused() {
				left.pools = append(left.pools, p)
			}
		}
		if len(left.arenas) > 0 || len(left.pools) > 0 {
			d.graphs = &left
			still = append(still, GraphsTag)
		}
	}
	if len(still) == 0 {
		if len(errs) > 0 {
			return fmt.Errorf("%w (undone: nothing is paused, though undoing reported: %w)", cause, errors.Join(errs...))
		}
		return fmt.Errorf("%w (undone: nothing is paused)", cause)
	}
	sort.Strings(still)
	if len(errs) == 0 {
		return fmt.Errorf("%w; paused now: %s (Resume them)", cause, strings.Join(still, ", "))
	}
	return fmt.Errorf("%w; undoing it failed (%w): paused now: %s (Resume them)", cause, errors.Join(errs...), strings.Join(still, ", "))
}

// OnPauseChange installs f, which every Pause and Resume call that may
// have changed what is paused calls before it returns (with a device's
// lock held: f must not call the Bridge). A caller that keeps what Paused
// answered can drop it then. nil removes it.
func (b *Bridge) OnPauseChange(f func()) {
	b.mu.Lock()
	b.onPause = f
	b.mu.Unlock()
}

func (b *Bridge) pauseChanged() {
	b.mu.Lock()
	f := b.onPause
	b.mu.Unlock()
	if f != nil {
		f()
	}
}

// Resume maps memory back, at the same addresses, for the regions named
// by tags (and the graphs, for GraphsTag; no tags: everything paused),
// restoring the regions made with backup. Graphs captured before Pause
// replay as before. Errors: an unknown tag, a tag not paused; out of
// device memory (what could not be mapped stays paused: call again).
func (b *Bridge) Resume(ordinal int, tags ...string) error {
	d, err := b.device(ordinal)
	if err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	op := fmt.Sprintf("Resume(%s)", strings.Join(tags, ", "))
	regs, graphs, err := d.resolve(op, tags, false)
	if err != nil {
		return err
	}
	restore, err := makeCurrent(d.dev)
	if err != nil {
		return err
	}
	defer restore()
	defer b.pauseChanged()
	for _, r := range regs {
		if err := d.spill.ResumePools(r.pool); err != nil {
			return fmt.Errorf("bridge: %s: region %q: %w", op, r.tag, err)
		}
		r.paused = false
	}
	if graphs {
		d.notePeak()
		gp := d.graphs
		for len(gp.arenas) > 0 {
			// An arena closed while paused (its step closed) has nothing
			// to map back.
			if err := gp.arenas[0].Resume(); err != nil && !errors.Is(err, arena.ErrClosed) {
				return fmt.Errorf("bridge: %s: graph arena: %w", op, err)
			}
			gp.arenas = gp.arenas[1:]
		}
		if len(gp.pools) > 0 {
			if err := d.spill.ResumePools(gp.pools...); err != nil {
				return fmt.Errorf("bridge: %s: graph pools: %w", op, err)
			}
			gp.pools = nil
		}
		d.graphs = nil
	}
	return nil
}

// Paused returns the paused tags of device ordinal, sorted.
func (b *Bridge) Paused(ordinal int) ([]string, error) {
	d, err := b.device(ordinal)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	for _, r := range d.regions {
		if r.paused {
			out = append(out, r.tag)
		}
	}
	if d.graphs != nil {
		out = append(out, GraphsTag)
	}
	sort.Strings(out)
	return out, nil
}

// arenasLocked returns the distinct arenas of the device's steps; d.mu is
// held.
func (d *Device) arenasLocked() []*arena.Arena {
	seen := map[*arena.Arena]bool{}
	var out []*arena.Arena
	for _, s := range d.b.stepsOf(d) {
		if s.ar != nil && !seen[s.ar] {
			seen[s.ar] = true
			out = append(out, s.ar)
		}
	}
	return out
}

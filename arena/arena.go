package arena

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/arenaplan/arenaplan/cuda"
	"github.com/arenaplan/arenaplan/internal/devmem"
	"github.com/arenaplan/arenaplan/lifetime"
	"github.com/arenaplan/arenaplan/planner"
)

// Arena is device memory laid out by a plan: every buffer of the trace at
// its planned offset, for as long as the arena lives.
//
// The plan's buffers are grouped by tag. A tag's region is the plan range
// [min offset, max offset+size) over its buffers; tags whose ranges overlap
// share one region. Every region has its own window of virtual addresses,
// granularity-aligned, inside one reservation, and its own physical
// handles, so that it can be paused (handles released, memory back to the
// driver) and resumed (new handles at the same addresses) on its own.
//
// An Arena is safe for concurrent use. On the driver, every call must come
// from a goroutine bound to the device's context (cuda.Device.BindThread).
type Arena struct {
	mu     sync.Mutex
	dev    cuda.Device
	name   string // the trace's name, for errors
	size   int64  // plan bytes
	gran   uint64
	base   cuda.DevicePtr // the reservation
	resv   uint64         // its size used by the regions' windows
	room   uint64         // reserved past the last window, for Grow (WithRoom)
	handle uint64         // the cap of one physical handle
	closed bool

	offsets []int64  // by lifetime.ID
	names   []string // by lifetime.ID, for errors
	region  []int32  // by lifetime.ID: index into regions

	regions []*region
	byTag   map[string]*region

	guard   func() bool
	watched []cuda.Stream
}

// region is one pausable range of the plan.
type region struct {
	tags   []string // sorted
	lo, hi int64    // plan range of its buffers
	wlo    int64    // lo rounded down to the granularity: the window's plan offset
	window cuda.DevicePtr
	size   uint64 // window bytes: (hi rounded up) - wlo
	policy Policy
	chunks []chunk
	paused bool
	// host holds a Backup region's bytes while it is paused. Page-locked
	// memory (pinned) is made with the region (New) and stays after Resume
	// for the next Pause, which then copies at the bus's speed without
	// pinning again; Go memory (the fallback) is dropped.
	host   []byte
	pinned bool
}

// chunk is one physical handle of a region, at window offset off.
type chunk struct {
	off, size uint64
	h         cuda.MemHandle
	live      bool // h is a created, unreleased handle
	mapped    bool
}

// RegionInfo describes one region, as Regions reports it.
type RegionInfo struct {
	Tags   []string       // the tags whose buffers it holds, sorted
	Lo, Hi int64          // plan range [Lo, Hi)
	VA     cuda.DevicePtr // the address of plan offset Lo
	Size   uint64         // bytes of its address window (granularity multiple)
	Mapped uint64         // physical bytes mapped now: Size, or 0 while paused
	Policy Policy
	Paused bool
	// Host is the host memory holding or kept for a Backup region's
	// bytes (Hi-Lo from New, or from the first Pause where New could not
	// pin it, until ReleaseHost or Close), and Pinned says it is
	// page-locked.
	Host   uint64
	Pinned bool
}

// New checks p against t (planner.Check: a plan is never trusted), reserves
// one range of virtual addresses for every region, and maps physical memory
// for all of them. Sizes are rounded to the device's VMM granularity; each
// region's window starts at a granularity boundary and its plan range
// starts at the same offset within the granule as in the plan, so a
// pointer is aligned exactly as its planned offset is (alignments up to the
// granularity). On error nothing stays allocated.
func New(dev cuda.Device, t *lifetime.Trace, p *planner.Plan, opts ...Option) (*Arena, error) {
	if dev == nil || t == nil || p == nil {
		return nil, errors.New("arena: New: nil device, trace or plan")
	}
	cfg := config{policies: map[string]Policy{}}
	for _, o := range opts {
		if err := o(&cfg); err != nil {
			return nil, fmt.Errorf("arena: New: %w", err)
		}
	}
	if err := planner.Check(t, p); err != nil {
		return nil, fmt.Errorf("arena: New: trace %q: plan refused: %w", t.Name, err)
	}
	gran, err := dev.Granularity(false)
	if err != nil {
		return nil, fmt.Errorf("arena: New: %w", err)
	}
	if gran == 0 || gran&(gran-1) != 0 {
		return nil, fmt.Errorf("arena: New: device granularity %d is not a power of two", gran)
	}
	handleSize := cfg.handleSize
	if handleSize == 0 {
		handleSize = max(defaultHandleSize/gran, 1) * gran
	}
	if handleSize%gran != 0 {
		return nil, fmt.Errorf("arena: New: WithHandleSize(%d) is not a multiple of the granularity %d", handleSize, gran)
	}

	a := &Arena{
		dev:     dev,
		name:    t.Name,
		size:    p.Arena,
		gran:    gran,
		handle:  handleSize,
		offsets: append([]int64(nil), p.Offsets...),
		names:   make([]string, len(t.Buffers)),
		region:  make([]int32, len(t.Buffers)),
		byTag:   map[string]*region{},
	}
	a.buildRegions(t, p, cfg.policies)
	for tag := range cfg.policies {
		if a.byTag[tag] == nil {
			return nil, fmt.Errorf("arena: New: WithPolicy(%q): trace %q has no buffer with that tag", tag, t.Name)
		}
	}
	var g uint64 = gran
	for _, r := range a.regions {
		r.wlo = r.lo / int64(g) * int64(g)
		r.size = uint64(lifetime.RoundUp(r.hi, int64(g)) - r.wlo)
		for off := uint64(0); off < r.size; off += handleSize {
			r.chunks = append(r.chunks, chunk{off: off, size: min(handleSize, r.size-off)})
		}
		a.resv += r.size
	}
	if a.resv == 0 {
		return a, nil // an empty trace: nothing to map
	}
	if len(a.regions) > 0 {
		a.room = uint64(lifetime.RoundUp(int64(cfg.room), int64(gran)))
	}
	// Refuse an arena the device cannot hold before mapping any of it:
	// failing at the last handle would first take (and on the simulated
	// device, touch) everything before it.
	if free, total, err := dev.MemGetInfo(); err == nil && a.resv > free {
		return nil, fmt.Errorf("arena: New: trace %q: %w: the arena needs %s of device memory in %d regions, %s free of %s",
			t.Name, ErrOutOfMemory, devmem.Bytes(a.resv), len(a.regions), devmem.Bytes(free), devmem.Bytes(total))
	}
	if a.base, err = dev.AddressReserve(a.resv+a.room, gran); err != nil {
		return nil, fmt.Errorf("arena: New: trace %q: reserving %s of addresses: %w", t.Name, devmem.Bytes(a.resv), err)
	}
	at := a.base
	for _, r := range a.regions {
		r.window = at
		at = at.Add(r.size)
	}
	for i := range t.Buffers {
		b := &t.Buffers[i]
		if b.Align > 1 && uint64(a.ptr(lifetime.ID(i)))%uint64(b.Align) != 0 {
			a.release()
			return nil, fmt.Errorf("arena: New: trace %q: buffer %d (%s) needs alignment %d, more than the granularity %d the arena can honour",
				t.Name, i, b.Name, b.Align, gran)
		}
	}
	for _, r := range a.regions {
		if err := a.mapRegion(r); err != nil {
			a.release()
			return nil, fmt.Errorf("arena: New: trace %q: %w", t.Name, a.mapError(r, err))
		}
	}
	a.pinHost()
	return a, nil
}

// pinHost gives every Backup region its page-locked host copy now, so
// that the first Pause copies at the bus's speed as later ones do instead
// of pinning first (pinning 1 GiB takes ~360 ms; backing up into freshly
// pinned memory ran at 2.4-2.7 GiB/s against >= 25 GiB/s into memory
// pinned before). It costs host memory only, and it happens here, not in
// the background: PinnedAlloc is not allowed during a stream capture,
// which may begin as soon as New returns. A region the driver cannot pin
// for is left as before: its first Pause tries again.
func (a *Arena) pinHost() {
	for _, r := range a.regions {
		if r.policy != Backup || r.host != nil || r.hi <= r.lo {
			continue
		}
		if b, err := a.dev.PinnedAlloc(uint64(r.hi - r.lo)); err == nil {
			r.host, r.pinned = b, true
		}
	}
}

// buildRegions groups buffers by tag and merges tags whose plan ranges
// overlap.
func (a *Arena) buildRegions(t *lifetime.Trace, p *planner.Plan, policies map[string]Policy) {
	type span struct {
		tag    string
		lo, hi int64
	}
	spans := map[string]*span{}
	for i := range t.Buffers {
		b := &t.Buffers[i]
		a.names[i] = b.Name
		lo := p.Offsets[i]
		hi := lo + lifetime.RoundUp(b.Size, p.Align)
		s := spans[b.Tag]
		if s == nil {
			spans[b.Tag] = &span{b.Tag, lo, hi}
			continue
		}
		s.lo, s.hi = min(s.lo, lo), max(s.hi, hi)
	}
	list := make([]*span, 0, len(spans))
	for _, s := range spans {
		list = append(list, s)
	}
	sort.Slice(list, func(i, j int) bool {
		if list[i].lo != list[j].lo {
			return list[i].lo < list[j].lo
		}
		return list[i].tag < list[j].tag
	})
	var cur *region
	for _, s := range list {
		if cur == nil || s.lo >= cur.hi {
			cur = &region{lo: s.lo, hi: s.hi}
			a.regions = append(a.regions, cur)
		}
		cur.hi = max(cur.hi, s.hi)
		cur.tags = append(cur.tags, s.tag)
		if policies[s.tag] == Backup {
			cur.policy = Backup
		}
		a.byTag[s.tag] = cur
	}
	index := map[*region]int32{}
	for i, r := range a.regions {
		sort.Strings(r.tags)
		index[r] = int32(i)
	}
	for i := range t.Buffers {
		a.region[i] = index[a.byTag[t.Buffers[i].Tag]]
	}
}

// ptr is the address of buffer id (no checks).
func (a *Arena) ptr(id lifetime.ID) cuda.DevicePtr {
	r := a.regions[a.region[id]]
	return r.window.Add(uint64(a.offsets[id] - r.wlo))
}

func (a *Arena) known(op string, id lifetime.ID) error {
	if a.closed {
		return fmt.Errorf("arena: %s(%d): %w", op, id, ErrClosed)
	}
	if id < 0 || int(id) >= len(a.offsets) {
		return fmt.Errorf("arena: %s(%d): %w buffer id (trace %q has %d buffers)", op, id, ErrUnknown, a.name, len(a.offsets))
	}
	return nil
}

// Ptr returns the device address of buffer id. It is an error while the
// buffer's region is paused: the address stays reserved, but nothing is
// mapped there.
func (a *Arena) Ptr(id lifetime.ID) (cuda.DevicePtr, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.known("Ptr", id); err != nil {
		return 0, err
	}
	if r := a.regions[a.region[id]]; r.paused {
		return 0, fmt.Errorf("arena: Ptr(%d) (%s): %w (tags %s)", id, a.names[id], ErrPaused, strings.Join(r.tags, ", "))
	}
	return a.ptr(id), nil
}

// Within returns the plan range [lo, hi) of the part of the addresses
// [p, q) that lies in the first of the arena's regions they meet, and
// whether they meet one. It works while paused.
func (a *Arena) Within(p, q cuda.DevicePtr) (lo, hi int64, ok bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, r := range a.regions {
		wlo := r.window.Add(uint64(r.lo - r.wlo))
		whi := r.window.Add(uint64(r.hi - r.wlo))
		if p < whi && wlo < q {
			lo = r.lo + int64(max(p, wlo)-wlo)
			hi = r.lo + int64(min(q, whi)-wlo)
			return lo, hi, true
		}
	}
	return 0, 0, false
}

// Offset returns buffer id's planned offset. It works while paused.
func (a *Arena) Offset(id lifetime.ID) (int64, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.known("Offset", id); err != nil {
		return 0, err
	}
	return a.offsets[id], nil
}

// Size returns the plan's arena size in bytes.
func (a *Arena) Size() int64 { return a.size }

// Reserved returns the bytes of virtual addresses the arena's regions
// use: the sum of their windows (not the room kept for Grow).
func (a *Arena) Reserved() uint64 { return a.resv }

// Mapped returns the physical bytes mapped now.
func (a *Arena) Mapped() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	var n uint64
	for _, r := range a.regions {
		n += r.mapped()
	}
	return n
}

func (r *region) mapped() uint64 {
	var n uint64
	for _, c := range r.chunks {
		if c.mapped {
			n += c.size
		}
	}
	return n
}

// Regions describes every region in plan order.
func (a *Arena) Regions() []RegionInfo {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]RegionInfo, len(a.regions))
	for i, r := range a.regions {
		out[i] = RegionInfo{
			Tags:   append([]string(nil), r.tags...),
			Lo:     r.lo,
			Hi:     r.hi,
			VA:     r.window.Add(uint64(r.lo - r.wlo)),
			Size:   r.size,
			Mapped: r.mapped(),
			Policy: r.policy,
			Paused: r.paused,
			Host:   uint64(len(r.host)),
			Pinned: r.pinned,
		}
	}
	return out
}

// Close unmaps and releases all physical memory and the address range.
// It waits for the device first (cuda.Device.Synchronize), and refuses
// while a watched capture is underway. A second Close is an error.
func (a *Arena) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return fmt.Errorf("arena: Close: %w", ErrClosed)
	}
	if err := a.checkCapture("Close"); err != nil {
		return err
	}
	a.closed = true
	if a.resv == 0 {
		return nil
	}
	if err := a.dev.Synchronize(); err != nil {
		a.release()
		return fmt.Errorf("arena: Close: %w", err)
	}
	if err := a.release(); err != nil {
		return fmt.Errorf("arena: Close: %w", err)
	}
	return nil
}

// release unmaps and releases every handle and frees the reservation,
// trying every step, and returns the first error.
func (a *Arena) release() error {
	var first error
	for _, r := range a.regions {
		if err := a.unmapRegion(r); err != nil && first == nil {
			first = err
		}
		if err := a.dropHost(r); err != nil && first == nil {
			first = err
		}
	}
	if a.base != 0 {
		if err := a.dev.AddressFree(a.base, a.resv+a.room); err != nil && first == nil {
			first = err
		}
		a.base = 0
	}
	return first
}

// mapRegion creates and maps every chunk that is not mapped, then sets
// access on the window. On error the chunks it mapped stay mapped; the
// caller unmaps.
func (a *Arena) mapRegion(r *region) error {
	for i := range r.chunks {
		c := &r.chunks[i]
		if c.mapped {
			continue
		}
		if !c.live {
			h, err := a.dev.MemCreate(c.size)
			if err != nil {
				return err
			}
			c.h, c.live = h, true
		}
		if err := a.dev.MemMap(r.window.Add(c.off), c.size, c.h); err != nil {
			return err
		}
		c.mapped = true
	}
	return a.dev.MemSetAccess(r.window, r.size)
}

// unmapRegion unmaps and releases every chunk, trying each step.
func (a *Arena) unmapRegion(r *region) error {
	var first error
	for i := range r.chunks {
		c := &r.chunks[i]
		if c.mapped {
			if err := a.dev.MemUnmap(r.window.Add(c.off), c.size); err != nil {
				if first == nil {
					first = err
				}
			} else {
				c.mapped = false
			}
		}
		if c.live {
			// Released while still mapped, the memory goes back at unmap.
			if err := a.dev.MemRelease(c.h); err != nil {
				if first == nil {
					first = err
				}
			} else {
				c.live = false
			}
		}
	}
	return first
}

// mapError turns a failure to map r into one line; device memory
// exhaustion also wraps ErrOutOfMemory.
func (a *Arena) mapError(r *region, err error) error {
	if errors.Is(err, cuda.ErrorOutOfMemory) {
		free, total, ierr := a.dev.MemGetInfo()
		have := ""
		if ierr == nil {
			have = fmt.Sprintf(", %s free of %s", devmem.Bytes(free), devmem.Bytes(total))
		}
		return fmt.Errorf("%w: region [%s] needs %s of device memory (arena %s in %d regions, %s mapped%s): %w",
			ErrOutOfMemory, strings.Join(r.tags, " "), devmem.Bytes(r.size), devmem.Bytes(a.resv), len(a.regions),
			devmem.Bytes(a.mappedLocked()), have, err)
	}
	return fmt.Errorf("region [%s]: mapping %s: %w", strings.Join(r.tags, " "), devmem.Bytes(r.size), err)
}

func (a *Arena) mappedLocked() uint64 {
	var n uint64
	for _, r := range a.regions {
		n += r.mapped()
	}
	return n
}

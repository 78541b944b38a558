package bridge

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/arenaplan/arenaplan/arena"
	"github.com/arenaplan/arenaplan/cuda"
	"github.com/arenaplan/arenaplan/spill"
)

// Snapshots and allocation history, for PyTorch's memory tooling
// (torch.cuda.memory._snapshot, _record_memory_history, memory_viz): a
// device's memory described as segments of blocks, and a bounded ring of
// the allocator's events. The Python package turns them into PyTorch's
// snapshot schema.
//
// While history is recorded every allocation and free of the process goes
// through Go (FastPathAllowed is false, so the C library keeps no block),
// and recorded calls on one device are serialized, so that the ring holds
// them in the order they took effect. Off, the cost is one atomic load per
// call into Go.

// DefaultHistoryEntries is the ring's size when RecordHistory is given 0.
const DefaultHistoryEntries = 1 << 20

// MaxHistoryEntries bounds the ring of each device.
const MaxHistoryEntries = 1 << 24

// Trace entry actions, as PyTorch names them.
const (
	ActionAlloc         = "alloc"
	ActionFreeRequested = "free_requested"
	ActionFreeCompleted = "free_completed"
	ActionSegmentAlloc  = "segment_alloc"
	ActionSegmentFree   = "segment_free"
	ActionSegmentMap    = "segment_map"   // a segment grown in place: the range mapped at its end
	ActionSegmentUnmap  = "segment_unmap" // a segment shrunk in place: the range unmapped at its end
	ActionOOM           = "oom"
)

// TraceEntry is one event of a device's history. For an oom, Addr is the
// device's free memory (PyTorch's device_free) and Size the request.
type TraceEntry struct {
	Action string  `json:"action"`
	Addr   uint64  `json:"addr"`
	Size   uint64  `json:"size"`
	Stream uintptr `json:"stream"`
	TimeUS int64   `json:"time_us"`
	// Step and Buffer name the planned buffer that served an allocation
	// (the step's name and the buffer's index in its plan); Buffer is -1
	// otherwise.
	Step   string `json:"step,omitempty"`
	Buffer int    `json:"buffer"`
	// Seq numbers the device's entries from 1 since recording began: the
	// key under which a host keeps what it knows of an allocation's call
	// (AllocSeq; the Python stack of PyTorch's snapshots).
	Seq uint64 `json:"seq"`
}

// Snapshot is a device's memory now: every segment with its blocks, and
// the history ring when it is recorded.
type Snapshot struct {
	Device    int            `json:"device"`
	Segments  []SegmentState `json:"segments"`
	Recording bool           `json:"recording"`
	// Trace is the device's history, oldest first (empty unless recorded).
	Trace []TraceEntry `json:"trace"`
	// Dropped counts the entries the ring has overwritten.
	Dropped uint64 `json:"dropped"`
}

// Segment kinds.
const (
	SegmentArena   = "arena"   // a step's or family's planned arena
	SegmentSpill   = "spill"   // the spill allocator's default pool
	SegmentCapture = "capture" // a private pool of graph captures
	SegmentRegion  = "region"  // a tagged region's pool (BeginRegion)
)

// SegmentState is one segment: a planned arena's region, or a spill
// segment.
type SegmentState struct {
	Address   uint64  `json:"address"`
	TotalSize uint64  `json:"total_size"`
	Stream    uintptr `json:"stream"`
	Kind      string  `json:"kind"`
	// Pool is PyTorch's segment_pool_id: (0, 0) for the default pool and
	// the arenas, (id, 0) for capture pools, (0, id) for regions.
	Pool [2]uint64 `json:"pool"`
	// Owner is the step or family whose arena it is, or the region's tag.
	Owner  string `json:"owner,omitempty"`
	Paused bool   `json:"paused"`
	// Small says the segment serves only requests of at most 1 MiB
	// (spill.SmallBlock), PyTorch's small pool: segment_type "small".
	Small bool `json:"small"`
	// Blocks tile the segment, as PyTorch's do: in address order, each
	// starting where the one before it ends, their sizes adding up to
	// TotalSize, free space as inactive blocks. memory_viz lays a
	// segment's blocks end to end and ignores their addresses.
	Blocks []BlockState `json:"blocks"`
	// Planned is an arena segment's planned buffers, every one of them,
	// in address order (nil for other kinds): buffers whose lifetimes do
	// not overlap share addresses, so these overlap; those live now are
	// active, the rest inactive. Blocks holds the live ones.
	Planned []BlockState `json:"planned_blocks,omitempty"`
}

// Block states, as PyTorch names them.
const (
	StateActive  = "active_allocated"
	StatePending = "active_pending_free"
	StateFree    = "inactive"
)

// BlockState is one block of a segment: an allocation, free space, or (in
// an arena) a planned buffer.
type BlockState struct {
	Address   uint64 `json:"address"`
	Size      uint64 `json:"size"`
	Requested uint64 `json:"requested_size"`
	State     string `json:"state"`
	// Name is a planned buffer's step and name ("step/t12"; "step/orphan"
	// for a live buffer of a plan the step has since replaced).
	Name string `json:"name,omitempty"`
}

// tile returns blocks in address order with inactive blocks filling the
// space before, between and after them, so that together they cover
// [lo, lo+size) exactly once. A block reaching outside the segment, or
// overlapping one before it (live outputs of a family's members, which
// share memory by design), is left out.
func tile(lo, size uint64, blocks []BlockState) []BlockState {
	sort.SliceStable(blocks, func(i, j int) bool { return blocks[i].Address < blocks[j].Address })
	tiled := make([]BlockState, 0, 2*len(blocks)+1)
	at, hi := lo, lo+size
	for _, bl := range blocks {
		if bl.Address < at || bl.Address > hi || bl.Size > hi-bl.Address {
			continue
		}
		if bl.Address > at {
			tiled = append(tiled, BlockState{Address: at, Size: bl.Address - at, State: StateFree})
		}
		tiled = append(tiled, bl)
		at = bl.Address + bl.Size
	}
	if at < hi {
		tiled = append(tiled, BlockState{Address: at, Size: hi - at, State: StateFree})
	}
	return tiled
}

// history is the Bridge's recording state.
type history struct {
	on  atomic.Bool
	mu  sync.Mutex // guards below and serializes recorded calls
	max int
	dev map[int]*deviceHistory
}

// deviceHistory is one device's ring and what it needs to describe frees
// and segment changes.
type deviceHistory struct {
	ring    []TraceEntry
	next    int // where the next entry goes once the ring is full
	dropped uint64
	live    map[uint64]liveAlloc // allocations by address
	segs    map[uint64]uint64    // spill segments known: address → size
	grows   uint64               // the spill's Grows and Unmaps when segs was taken
	unmaps  uint64
	arenas  map[uint64]uint64 // planned arenas' regions known: address → size
	seq     uint64            // the last entry's Seq
}

type liveAlloc struct {
	size   uint64
	stream uintptr
}

func (h *deviceHistory) add(e TraceEntry, max int) {
	h.seq++
	e.Seq = h.seq
	if e.TimeUS == 0 {
		e.TimeUS = time.Now().UnixMicro()
	}
	if len(h.ring) < max {
		h.ring = append(h.ring, e)
		return
	}
	h.ring[h.next] = e
	h.next = (h.next + 1) % len(h.ring)
	h.dropped++
}

// entries returns the ring oldest first.
func (h *deviceHistory) entries() []TraceEntry {
	out := make([]TraceEntry, 0, len(h.ring))
	out = append(out, h.ring[h.next:]...)
	return append(out, h.ring[:h.next]...)
}

// resize keeps the newest max entries.
func (h *deviceHistory) resize(max int) {
	if len(h.ring) <= max && h.next == 0 {
		return
	}
	es := h.entries()
	if len(es) > max {
		h.dropped += uint64(len(es) - max)
		es = es[len(es)-max:]
	}
	h.ring, h.next = es, 0
}

// Recording says whether history is recorded now. While it is,
// FastPathAllowed is false: every allocation and free must reach Go.
func (b *Bridge) Recording() bool { return b.hist.on.Load() }

// RecordHistory turns history recording on (keeping up to maxEntries
// events per device, the newest; 0: DefaultHistoryEntries) or off, which
// drops the history recorded so far (as PyTorch does).
func (b *Bridge) RecordHistory(enabled bool, maxEntries int) error {
	if maxEntries < 0 || maxEntries > MaxHistoryEntries {
		return fmt.Errorf("bridge: RecordHistory: %d entries: want 0 (the default, %d) to %d", maxEntries, DefaultHistoryEntries, MaxHistoryEntries)
	}
	if maxEntries == 0 {
		maxEntries = DefaultHistoryEntries
	}
	h := &b.hist
	h.mu.Lock()
	defer h.mu.Unlock()
	if !enabled {
		h.on.Store(false)
		h.dev = nil
		return nil
	}
	h.max = maxEntries
	if h.dev == nil {
		h.dev = map[int]*deviceHistory{}
	}
	for _, dh := range h.dev {
		dh.resize(maxEntries)
	}
	for _, d := range b.deviceList() {
		if h.dev[d.ordinal] == nil {
			h.dev[d.ordinal] = d.newHistory()
		}
	}
	h.on.Store(true)
	return nil
}

// newHistory starts a device's history from what it holds now: its live
// allocations (so that their frees have sizes) and its spill segments (so
// that only later changes become events).
func (d *Device) newHistory() *deviceHistory {
	dh := &deviceHistory{live: map[uint64]liveAlloc{}, segs: map[uint64]uint64{}, arenas: map[uint64]uint64{}}
	for a, r := range d.arenaRegions() {
		dh.arenas[a] = r.size
	}
	st := d.spill.Stats()
	dh.grows, dh.unmaps = st.Grows, st.Unmaps
	for _, sg := range d.spill.Segments() {
		dh.segs[sg.Addr] = sg.Size
		for _, bl := range sg.Blocks {
			if bl.State == spill.BlockAllocated {
				dh.live[bl.Addr] = liveAlloc{bl.Requested, sg.Stream}
			}
		}
	}
	d.mu.Lock()
	for p, sl := range d.planned {
		var size uint64
		if sl.k != orphan && sl.k < len(sl.step.need) {
			size = uint64(sl.step.trace.Buffers[sl.k].Size)
		}
		dh.live[uint64(p)] = liveAlloc{size, sl.step.stream}
	}
	d.mu.Unlock()
	return dh
}

// historyLocked returns d's history, starting it if d opened after
// recording began; b.hist.mu is held.
func (d *Device) historyLocked() *deviceHistory {
	h := &d.b.hist
	dh := h.dev[d.ordinal]
	if dh == nil {
		dh = d.newHistory()
		h.dev[d.ordinal] = dh
	}
	return dh
}

// allocRecorded is alloc while history is recorded: the allocation and its
// events happen under the history's lock. The block is never keepable. It
// returns the Seq of the allocation's entry (0 if none was added).
func (d *Device) allocRecorded(size uint64, stream uintptr) (cuda.DevicePtr, uint64, error) {
	h := &d.b.hist
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.on.Load() {
		p, _, err := d.alloc(size, stream, false, true) // turned off meanwhile
		return p, 0, err
	}
	// The history starts before the allocation (a device opened since
	// recording began): a segment the allocation maps is an event.
	dh := d.historyLocked()
	p, _, err := d.alloc(size, stream, false, true)
	if err != nil {
		if errors.Is(err, arena.ErrOutOfMemory) {
			var free uint64
			if restore, cerr := makeCurrent(d.dev); cerr == nil {
				free, _, _ = d.dev.MemGetInfo()
				restore()
			}
			dh.add(TraceEntry{Action: ActionOOM, Addr: free, Size: size, Stream: stream, Buffer: -1}, h.max)
		}
		return p, 0, err
	}
	if size == 0 {
		return p, 0, nil // a token, not memory: PyTorch never records one
	}
	d.segmentEvents(dh, stream)
	e := TraceEntry{Action: ActionAlloc, Addr: uint64(p), Size: size, Stream: stream, Buffer: -1}
	d.mu.Lock()
	if sl, ok := d.planned[p]; ok && sl.k != orphan {
		e.Step, e.Buffer = sl.step.name, sl.k
	}
	d.mu.Unlock()
	dh.live[uint64(p)] = liveAlloc{size, stream}
	dh.add(e, h.max)
	return p, dh.seq, nil
}

// freeRecorded is free while history is recorded.
func (d *Device) freeRecorded(p cuda.DevicePtr) error {
	h := &d.b.hist
	h.mu.Lock()
	defer h.mu.Unlock()
	d.mu.Lock()
	zero := d.zero.owns(p)
	d.mu.Unlock()
	err := d.free(p)
	if !h.on.Load() || zero || err != nil {
		return err
	}
	dh := d.historyLocked()
	la := dh.live[uint64(p)]
	delete(dh.live, uint64(p))
	now := time.Now().UnixMicro()
	dh.add(TraceEntry{Action: ActionFreeRequested, Addr: uint64(p), Size: la.size, Stream: la.stream, TimeUS: now, Buffer: -1}, h.max)
	dh.add(TraceEntry{Action: ActionFreeCompleted, Addr: uint64(p), Size: la.size, Stream: la.stream, TimeUS: now, Buffer: -1}, h.max)
	d.segmentEvents(dh, la.stream)
	return nil
}

// segmentEvents adds the segments mapped and unmapped since the last
// look: the spill's (cheap when none were: two counters) and the planned
// arenas' regions (as Snapshot lists them); b.hist.mu is held. Segments
// given back by EmptyCache are seen at the next recorded call or snapshot.
func (d *Device) segmentEvents(dh *deviceHistory, stream uintptr) {
	now := time.Now().UnixMicro()
	if st := d.spill.Stats(); st.Grows != dh.grows || st.Unmaps != dh.unmaps {
		dh.grows, dh.unmaps = st.Grows, st.Unmaps
		cur := map[uint64]segRegion{}
		for _, sg := range d.spill.Segments() {
			cur[sg.Addr] = segRegion{sg.Size, sg.Stream}
		}
		d.b.segmentDiff(dh, dh.segs, cur, stream, now)
	}
	d.b.segmentDiff(dh, dh.arenas, d.arenaRegions(), stream, now)
}

// segRegion is a segment's size and stream.
type segRegion struct {
	size   uint64
	stream uintptr
}

// segmentDiff adds a segment_free for each segment of known (address →
// size) that cur lacks, a segment_map or segment_unmap of the range at the
// end of each that cur holds with another size (a spill segment or an
// arena grown in place, as PyTorch's expandable segments record it), then
// a segment_alloc for each segment of cur that known lacks, in address
// order, and makes known cur's; b.hist.mu is held.
func (b *Bridge) segmentDiff(dh *deviceHistory, known map[uint64]uint64, cur map[uint64]segRegion, stream uintptr, now int64) {
	var gone, resized []uint64
	for a, size := range known {
		switch r, ok := cur[a]; {
		case !ok:
			gone = append(gone, a)
		case r.size != size:
			resized = append(resized, a)
		}
	}
	slices.Sort(gone)
	for _, a := range gone {
		dh.add(TraceEntry{Action: ActionSegmentFree, Addr: a, Size: known[a], Stream: stream, TimeUS: now, Buffer: -1}, b.hist.max)
		delete(known, a)
	}
	slices.Sort(resized)
	for _, a := range resized {
		old, r := known[a], cur[a]
		e := TraceEntry{Action: ActionSegmentMap, Addr: a + old, Size: r.size - old, Stream: r.stream, TimeUS: now, Buffer: -1}
		if r.size < old {
			e = TraceEntry{Action: ActionSegmentUnmap, Addr: a + r.size, Size: old - r.size, Stream: r.stream, TimeUS: now, Buffer: -1}
		}
		dh.add(e, b.hist.max)
		known[a] = r.size
	}
	var added []uint64
	for a := range cur {
		if _, ok := known[a]; !ok {
			added = append(added, a)
		}
	}
	slices.Sort(added)
	for _, a := range added {
		r := cur[a]
		dh.add(TraceEntry{Action: ActionSegmentAlloc, Addr: a, Size: r.size, Stream: r.stream, TimeUS: now, Buffer: -1}, b.hist.max)
		known[a] = r.size
	}
}

// arenaRegions returns the mapped regions of the device's planned arenas,
// the segments Snapshot lists for them: address → size and stream.
func (d *Device) arenaRegions() map[uint64]segRegion {
	out := map[uint64]segRegion{}
	d.mu.Lock()
	defer d.mu.Unlock()
	seen := map[*arena.Arena]bool{}
	for _, s := range d.b.stepsOf(d) {
		if s.ar == nil || s.trace == nil || seen[s.ar] {
			continue
		}
		seen[s.ar] = true
		for _, r := range s.ar.Regions() {
			out[uint64(r.VA)] = segRegion{uint64(r.Hi - r.Lo), s.stream}
		}
	}
	return out
}

// Snapshot describes device ordinal's memory now: each planned arena
// (of steps and families) as segments whose blocks are the planned
// buffers live now and the free space between them (Planned lists every
// planned buffer), each spill segment (default pool, capture pools,
// regions) with its blocks, and, while history is recorded, the device's
// history.
// Buffers of a replaced plan still live in a retired arena are not
// described (their sizes are no longer known). A device never used is
// not opened: its snapshot is empty.
func (b *Bridge) Snapshot(ordinal int) (*Snapshot, error) {
	snap := &Snapshot{Device: ordinal, Segments: []SegmentState{}, Trace: []TraceEntry{}}
	b.mu.Lock()
	d, closed := b.devices[ordinal], b.closed
	b.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	if d == nil {
		if ordinal < 0 {
			return nil, fmt.Errorf("bridge: Snapshot(%d): negative ordinal", ordinal)
		}
		return snap, nil
	}
	h := &b.hist
	h.mu.Lock()
	if h.on.Load() {
		dh := d.historyLocked()
		d.segmentEvents(dh, 0)
		snap.Recording, snap.Trace, snap.Dropped = true, dh.entries(), dh.dropped
	}
	h.mu.Unlock()

	for _, sg := range d.spill.Segments() {
		s := SegmentState{Address: sg.Addr, TotalSize: sg.Size, Stream: sg.Stream, Paused: sg.Paused, Small: sg.Small}
		blocks := make([]BlockState, 0, len(sg.Blocks))
		switch {
		case sg.Region != "":
			s.Kind, s.Owner, s.Pool = SegmentRegion, sg.Region, [2]uint64{0, sg.Pool}
		case sg.Private:
			s.Kind, s.Pool = SegmentCapture, [2]uint64{sg.Pool, 0}
		default:
			s.Kind = SegmentSpill
		}
		for _, bl := range sg.Blocks {
			st := StateFree
			switch bl.State {
			case spill.BlockAllocated:
				st = StateActive
			case spill.BlockFreeing:
				st = StatePending
			}
			blocks = append(blocks, BlockState{Address: bl.Addr, Size: bl.Size, Requested: bl.Requested, State: st})
		}
		// The spill's blocks tile their segment already; tile keeps that
		// promise should one ever not.
		s.Blocks = tile(s.Address, s.TotalSize, blocks)
		snap.Segments = append(snap.Segments, s)
	}

	arenas, err := d.arenaSegments()
	if err != nil {
		return nil, fmt.Errorf("bridge: device %d: snapshot: %w", ordinal, err)
	}
	snap.Segments = append(snap.Segments, arenas...)
	sort.SliceStable(snap.Segments, func(i, j int) bool { return snap.Segments[i].Address < snap.Segments[j].Address })
	return snap, nil
}

// arenaSegments describes the device's planned arenas: a segment per
// region, its blocks the planned buffers live now (and the orphans a
// Replan left in the arena) tiled with free space, Planned every planned
// buffer in it.
func (d *Device) arenaSegments() ([]SegmentState, error) {
	// Families first, under b.mu alone: d.mu is taken before b.mu
	// elsewhere, never after.
	var famList []*Family
	d.b.mu.Lock()
	for _, f := range d.b.families {
		if f.d == d {
			famList = append(famList, f)
		}
	}
	d.b.mu.Unlock()

	d.mu.Lock()
	defer d.mu.Unlock()
	type arenaUse struct {
		owner   string
		stream  uintptr
		planned []BlockState // every planned buffer
		live    []BlockState // the live ones and orphans
	}
	fams := map[*arena.Arena]string{}
	for _, f := range famList {
		if f.ar != nil {
			fams[f.ar] = "family " + f.name
		}
	}
	uses := map[*arena.Arena]*arenaUse{}
	var order []*arena.Arena
	for _, s := range d.b.stepsOf(d) {
		if s.ar == nil || s.trace == nil {
			continue
		}
		u := uses[s.ar]
		if u == nil {
			owner := fams[s.ar]
			if owner == "" {
				owner = "step " + s.name
			}
			u = &arenaUse{owner: owner, stream: s.stream}
			uses[s.ar] = u
			order = append(order, s.ar)
		}
		planned := map[uint64]bool{}
		for k, p := range s.addrs {
			if k >= len(s.trace.Buffers) || k >= len(s.need) {
				break
			}
			bl := BlockState{Address: uint64(p), Size: s.need[k], Requested: uint64(s.trace.Buffers[k].Size),
				State: StateFree, Name: s.name + "/t" + strconv.Itoa(k)}
			if k < len(s.isLive) && s.isLive[k] {
				bl.State = StateActive
				u.live = append(u.live, bl)
				planned[bl.Address] = true
			}
			u.planned = append(u.planned, bl)
		}
		// The other live ranges are orphans of a replaced plan kept in
		// this arena; their requests are no longer known.
		if s.live != nil {
			s.live.Ascend(func(sp span) bool {
				if !planned[sp.lo] {
					u.live = append(u.live, BlockState{Address: sp.lo, Size: sp.hi - sp.lo, Requested: sp.hi - sp.lo,
						State: StateActive, Name: s.name + "/orphan"})
				}
				return true
			})
		}
	}
	var out []SegmentState
	for _, a := range order {
		u := uses[a]
		sort.SliceStable(u.planned, func(i, j int) bool { return u.planned[i].Address < u.planned[j].Address })
		for _, r := range a.Regions() {
			lo, hi := uint64(r.VA), uint64(r.VA)+uint64(r.Hi-r.Lo)
			seg := SegmentState{Address: lo, TotalSize: hi - lo, Stream: u.stream, Kind: SegmentArena, Owner: u.owner,
				Paused: r.Paused, Planned: []BlockState{}}
			var live []BlockState
			for _, bl := range u.live {
				if bl.Address >= lo && bl.Address < hi {
					live = append(live, bl)
				}
			}
			for _, bl := range u.planned {
				if bl.Address >= lo && bl.Address < hi {
					seg.Planned = append(seg.Planned, bl)
				}
			}
			seg.Blocks = tile(lo, hi-lo, live)
			out = append(out, seg)
		}
	}
	return out, nil
}

package bridge

// A device: its spill allocator, planned addresses, streams and arenas.

import (
	"cmp"
	"fmt"
	"sync"

	"github.com/arenaplan/arenaplan/arena"
	"github.com/arenaplan/arenaplan/cuda"
	"github.com/arenaplan/arenaplan/spill"
)

// capturing says whether a capture may be underway in the process: the
// host's count, or one the spill allocator knows of; d.mu is held.
func (d *Device) capturing() bool {
	d.b.mu.Lock()
	n := d.b.captures
	d.b.mu.Unlock()
	return n > 0 || d.spill.Capturing()
}

// closeArena closes an arena nothing uses any more, or, while a capture
// is underway (closing synchronizes the device, which would end the
// capture in error), once none is (closeDeferred); d.mu is held.
func (d *Device) closeArena(a *arena.Arena) error {
	d.notePeak()
	if d.capturing() {
		d.deferred = append(d.deferred, a)
		return nil
	}
	return a.Close()
}

// closeDeferred closes the arenas closeArena put off; d.mu is held.
func (d *Device) closeDeferred() {
	if len(d.deferred) == 0 || d.capturing() {
		return
	}
	restore, err := makeCurrent(d.dev)
	if err != nil {
		return // tried again after the next capture
	}
	defer restore()
	for _, a := range d.deferred {
		if err := a.Close(); err != nil {
			d.lastCloseErr = err
		}
	}
	d.deferred = nil
}

// Device is one device's memory: its spill allocator, its zero-byte
// tokens and the steps planned on it.
type Device struct {
	b       *Bridge
	ordinal int
	dev     cuda.Device
	spill   *spill.Allocator
	zero    *zeroTokens
	heap    *graphHeap // small arenas and the graphs' workspaces (heap.go)

	mu      sync.Mutex
	active  map[uintptr]*Step       // steps recording or serving, by stream handle
	streams map[uintptr]cuda.Stream // dev.Foreign's answers, cached
	planned map[cuda.DevicePtr]slot // live planned buffers by address
	st      DeviceStats

	regions      map[string]*region // by tag (BeginRegion)
	threadRegion map[int]*region    // the region each thread is in
	poolStack    map[int][]*region  // per thread, what each memory pool routing replaced (mempool.go)
	graphs       *graphsPause       // non-nil while the graphs are paused

	deferred     []*arena.Arena // to close once no capture is underway
	lastCloseErr error          // the last failure closing one of them

	// reservedPeak is the most device memory held at once (spill and
	// arenas) up to the last change of the arenas (notePeak).
	reservedPeak uint64
}

// slot is a live planned buffer: buffer k of the step's plan, or an
// orphan (a buffer of a plan the step has replaced: Step.Replan), in the
// retired arena old or, when old is nil, in the step's arena.
type slot struct {
	step *Step
	k    int
	old  *retired
}

// DeviceStats are a device's counters (PyTorch's own statistics are off
// while a plugged allocator is installed; these replace them).
type DeviceStats struct {
	Allocs, Frees uint64 // every call (those the C library's fast path serves never reach here)
	ZeroAllocs    uint64 // 0-byte requests among them
	Planned       uint64 // allocations served from a step's plan
	Spilled       uint64 // allocations served by the spill allocator
	Divergences   uint64 // step allocations the plan could not serve
	PlannedLive   int    // planned buffers live now
	// CloseError is the last failure closing an arena whose close waited
	// for the captures underway to end ("" if none).
	CloseError string `json:",omitempty"`
	Arenas     int    // planned arenas held
	ArenaBytes uint64 // planned arenas, sum of sizes
	// ArenaMapped: physical bytes the arenas map now; for those laid out
	// in the graph heap, the heap's granules less the memory pools'
	// segments there (which Spill counts).
	ArenaMapped uint64
	// ReservedPeak is the most device memory held at once, spill and
	// arenas together, since the last reset.
	ReservedPeak uint64
	Spill        spill.Stats
}

// device returns the state of ordinal, opening it on first use.
func (b *Bridge) device(ordinal int) (*Device, error) {
	if ordinal >= 0 && ordinal < len(b.opened) {
		if d := b.opened[ordinal].Load(); d != nil {
			return d, nil
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, ErrClosed
	}
	if d := b.devices[ordinal]; d != nil {
		return d, nil
	}
	if ordinal < 0 {
		return nil, fmt.Errorf("bridge: device %d: negative ordinal", ordinal)
	}
	dev, err := b.open(ordinal)
	if err != nil {
		return nil, fmt.Errorf("bridge: opening device %d: %w", ordinal, err)
	}
	d, err := newDevice(b, ordinal, dev)
	if err != nil {
		dev.Close()
		return nil, fmt.Errorf("bridge: device %d: %w", ordinal, err)
	}
	if b.captures >= 0 {
		d.spill.ForeignCaptures(b.captures)
	}
	b.devices[ordinal] = d
	if ordinal < len(b.opened) {
		b.opened[ordinal].Store(d)
	}
	return d, nil
}

func (b *Bridge) open(ordinal int) (cuda.Device, error) {
	switch {
	case b.cfg.Open != nil:
		return b.cfg.Open(ordinal)
	case b.cfg.Sim:
		if n := cmp.Or(b.cfg.SimDevices, defaultSimDevices); ordinal >= n {
			return nil, fmt.Errorf("the simulation has %d devices, 0 to %d (ARENAPLAN_SIM_DEVICES): %w", n, n-1,
				&cuda.Error{Op: "cuDeviceGet", Code: cuda.ErrorInvalidDevice})
		}
		// A guest, as OpenGuest's driver: PyTorch calls from its own threads.
		return cuda.OpenSim(cuda.SimConfig{Name: fmt.Sprintf("sim:%d", ordinal), TotalMemory: b.cfg.SimMemory, Guest: true})
	}
	return cuda.OpenGuest(ordinal)
}

// defaultSimDevices is Config.SimDevices unless set.
const defaultSimDevices = 8

func newDevice(b *Bridge, ordinal int, dev cuda.Device) (*Device, error) {
	restore, err := makeCurrent(dev)
	if err != nil {
		return nil, err
	}
	defer restore()
	space := b.cfg.SpillAddressSpace
	if space == 0 {
		_, total, err := dev.MemGetInfo()
		if err != nil {
			return nil, err
		}
		space = 4 * total
	}
	opts := []spill.Option{spill.WithAddressSpace(space), spill.WithForeignCaptures(true)}
	if b.cfg.SpillPlain {
		opts = append(opts, spill.WithPlainSegments(true))
	}
	if b.cfg.SpillChunk != 0 {
		opts = append(opts, spill.WithChunk(b.cfg.SpillChunk))
	}
	sp, err := spill.New(dev, opts...)
	if err != nil {
		return nil, err
	}
	zero, err := newZeroTokens(dev)
	if err != nil {
		sp.Close()
		return nil, err
	}
	return &Device{b: b, ordinal: ordinal, dev: dev, spill: sp, zero: zero, heap: newGraphHeap(dev),
		active: map[uintptr]*Step{}, planned: map[cuda.DevicePtr]slot{}, streams: map[uintptr]cuda.Stream{},
		regions: map[string]*region{}, threadRegion: map[int]*region{}}, nil
}

// makeCurrent makes dev's context current on the calling thread where the
// device needs that (the driver as a guest of PyTorch), and returns what
// undoes it.
func makeCurrent(dev cuda.Device) (func(), error) {
	if g, ok := dev.(interface{ MakeCurrent() (func(), error) }); ok {
		return g.MakeCurrent()
	}
	return func() {}, nil
}

// deviceList returns the devices opened so far.
func (b *Bridge) deviceList() []*Device {
	b.mu.Lock()
	defer b.mu.Unlock()
	devs := make([]*Device, 0, len(b.devices))
	for _, d := range b.devices {
		devs = append(devs, d)
	}
	return devs
}

// stepsOf returns the open steps of device d (nil: of every device).
func (b *Bridge) stepsOf(d *Device) []*Step {
	b.mu.Lock()
	defer b.mu.Unlock()
	var steps []*Step
	for _, s := range b.steps {
		if d == nil || s.d == d {
			steps = append(steps, s)
		}
	}
	return steps
}

// notePeak folds into the device's reserved peak the spill allocator's
// peak since the arenas last changed, with the arenas mapped meanwhile:
// call it just before the arenas' mapped bytes change; d.mu is held.
func (d *Device) notePeak() {
	_, mapped, _ := d.arenas()
	d.reservedPeak = max(d.reservedPeak, d.spill.MappedPeak(true)+mapped)
}

// beforeArena readies the device for an arena about to be mapped: the
// peak held so far is noted, and the spill allocator's wholly free
// segments go back to the driver, so that what the step's warm-up and
// recorded runs left cached and the arena are never held at once (the
// reserved peak is the larger of the two, not their sum). Memory in use
// stays, and so does everything while a capture may be underway (the
// trim waits for the device, which a capture forbids). d.mu is not held.
func (d *Device) beforeArena() {
	d.mu.Lock()
	d.notePeak()
	d.mu.Unlock()
	d.b.mu.Lock()
	quiet := d.b.captures == 0 // the host counts captures, and none is underway
	d.b.mu.Unlock()
	if quiet {
		// A failed trim leaves the cache mapped: more memory held, nothing wrong.
		if d.spill.EmptyCache() == nil {
			_ = d.heap.trim() // no capture: the host counts none
		}
	}
	d.mu.Lock()
	d.notePeak() // restarts the spill's interval at what stays mapped
	d.mu.Unlock()
}

// arenas returns the planned bytes and the mapped bytes of the device's
// open steps' arenas, and how many there are; d.mu is held.
func (d *Device) arenas() (planned, mapped uint64, n int) {
	seen := map[*arena.Arena]bool{}
	// Arenas in the graph heap count in the heap's granules, once.
	own := func(a *arena.Arena) uint64 {
		if rs := a.Regions(); len(rs) > 0 && d.heap.owns(rs[0].VA) {
			return 0
		}
		return a.Mapped()
	}
	mapped = d.heap.extra()
	for _, a := range d.deferred {
		seen[a] = true
		planned += uint64(a.Size())
		mapped += own(a)
	}
	for _, s := range d.b.stepsOf(d) {
		ars := []*arena.Arena{s.ar}
		for _, r := range s.retired {
			ars = append(ars, r.ar)
		}
		for _, a := range ars {
			if a != nil && !seen[a] {
				seen[a] = true
				planned += uint64(a.Size())
				mapped += own(a)
			}
		}
	}
	return planned, mapped, len(seen)
}

// maxStreams bounds the device's cache of Streams: a program may use a
// stream per request, and the spill allocator keys its state by handle,
// so a Stream made again for a handle is as good as the one forgotten.
const maxStreams = 1024

// stream returns the Stream for a handle; d.mu is held.
func (d *Device) stream(h uintptr) (cuda.Stream, error) {
	if st, ok := d.streams[h]; ok {
		return st, nil
	}
	st, err := d.dev.Foreign(h)
	if err != nil {
		return nil, fmt.Errorf("bridge: device %d: stream %#x: %w", d.ordinal, h, err)
	}
	if len(d.streams) >= maxStreams {
		clear(d.streams)
	}
	d.streams[h] = st
	return st, nil
}

// owns says whether p is a live allocation of this device.
func (d *Device) owns(p cuda.DevicePtr) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.zero.owns(p) {
		return true
	}
	if _, ok := d.planned[p]; ok {
		return true
	}
	return d.spill.Owns(p)
}

package bridge

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/arenaplan/arenaplan/arena"
	"github.com/arenaplan/arenaplan/cuda"
)

// Config says how a Bridge opens its devices.
type Config struct {
	// Open opens device ordinal. Nil: the CUDA driver as a guest of the
	// host program (cuda.OpenGuest), or the simulation when Sim is set.
	Open func(ordinal int) (cuda.Device, error)
	// Sim opens simulated devices (ARENAPLAN_DEVICE=sim).
	Sim bool
	// SimMemory is each simulated device's memory (default 16 GiB).
	SimMemory uint64
	// SpillAddressSpace is the virtual address space each device's spill
	// allocator reserves (default: four times the device's total memory,
	// so that scattered live segments never leave a request that the
	// device's memory could hold without a run of addresses for it).
	SpillAddressSpace uint64
	// SpillChunk is the unit the spill allocator grows by (default the
	// device's VMM granularity, 2 MiB).
	SpillChunk uint64
	// SpillPlain grows the spill allocator with cuMemAlloc outside
	// captures (arena.WithPlainSegments; ARENAPLAN_SPILL_PLAIN=1).
	SpillPlain bool
	// Rank and WorldSize say which process of a tensor-parallel job this
	// is (torchrun's RANK and WORLD_SIZE): plan files record them and a
	// plan made by another rank or world size is refused. Zero values: a
	// single process.
	Rank, WorldSize int
	// ThreadID names the calling thread for regions (BeginRegion); nil:
	// the operating system's thread id (gettid on Linux), which the host
	// program knows too (Python's threading.get_native_id).
	ThreadID func() int
}

// ConfigFromEnv reads ARENAPLAN_DEVICE ("sim" or "cuda", default cuda),
// ARENAPLAN_SIM_MEMORY, ARENAPLAN_SPILL_ADDRESS_SPACE and
// ARENAPLAN_SPILL_CHUNK (bytes), and torchrun's RANK and WORLD_SIZE, with
// getenv (nil: os.Getenv). A Go shared library must pass C's getenv: its
// os.Getenv sees the environment the process started with, not what the
// host program set since.
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	var c Config
	switch v := getenv("ARENAPLAN_DEVICE"); v {
	case "", "cuda":
	case "sim":
		c.Sim = true
	default:
		return c, fmt.Errorf("bridge: ARENAPLAN_DEVICE=%q: want sim or cuda", v)
	}
	switch v := getenv("ARENAPLAN_SPILL_PLAIN"); v {
	case "", "0":
	case "1":
		c.SpillPlain = true
	default:
		return c, fmt.Errorf("bridge: ARENAPLAN_SPILL_PLAIN=%q: want 0 or 1", v)
	}
	for _, e := range []struct {
		name string
		dst  *int
		min  int
	}{{"RANK", &c.Rank, 0}, {"WORLD_SIZE", &c.WorldSize, 1}} {
		if v := getenv(e.name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < e.min {
				return c, fmt.Errorf("bridge: %s=%q: want a whole number of at least %d", e.name, v, e.min)
			}
			*e.dst = n
		}
	}
	if c.Rank >= max(c.WorldSize, 1) {
		return c, fmt.Errorf("bridge: RANK=%d is not below WORLD_SIZE=%d", c.Rank, max(c.WorldSize, 1))
	}
	for _, e := range []struct {
		name string
		dst  *uint64
	}{{"ARENAPLAN_SIM_MEMORY", &c.SimMemory}, {"ARENAPLAN_SPILL_ADDRESS_SPACE", &c.SpillAddressSpace},
		{"ARENAPLAN_SPILL_CHUNK", &c.SpillChunk}} {
		if v := getenv(e.name); v != "" {
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil || n == 0 {
				return c, fmt.Errorf("bridge: %s=%q: want a positive number of bytes", e.name, v)
			}
			*e.dst = n
		}
	}
	return c, nil
}

// Bridge is the process's allocator: one device state per device ordinal,
// opened on first use.
type Bridge struct {
	cfg Config

	mu       sync.Mutex
	devices  map[int]*Device
	steps    map[int]*Step
	families map[int]*Family
	nextID   int
	closed   bool
	captures int // CapturesUnderway's count; -1 until it is called

	regionsOpen atomic.Int32 // threads inside a region, on any device
	onPause     func()       // OnPauseChange's hook

	mempools memPools // NewMemPool's pools; their routings count in regionsOpen (mempool.go)

	hist history // allocation history for snapshots (snapshot.go)

	// opened holds the devices of ordinals below len(open), read
	// without b.mu: every allocation looks its device up.
	opened [16]atomic.Pointer[Device]
}

// New returns a Bridge; devices open on first use.
func New(cfg Config) *Bridge {
	return &Bridge{cfg: cfg, devices: map[int]*Device{}, steps: map[int]*Step{}, families: map[int]*Family{}, captures: -1}
}

// CapturesUnderway says how many CUDA graph captures are underway in the
// process now, as the host counts them (the Python package wraps
// torch.cuda.CUDAGraph.capture_begin and capture_end). Until the first
// call every allocation on a stream other than the legacy one asks the
// driver whether its stream is capturing; afterwards only while the count
// is above 0. A capture begun behind the host's back is then not seen: its
// allocations come from the default pool, as with PyTorch's own allocator.
func (b *Bridge) CapturesUnderway(n int) {
	b.mu.Lock()
	b.captures = max(n, 0)
	devs := make([]*Device, 0, len(b.devices))
	for _, d := range b.devices {
		d.spill.ForeignCaptures(b.captures)
		devs = append(devs, d)
	}
	b.mu.Unlock()
	if n <= 0 {
		for _, d := range devs {
			d.mu.Lock()
			d.closeDeferred()
			d.mu.Unlock()
		}
	}
}

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

// ErrClosed is returned by every call after Close.
var ErrClosed = errors.New("bridge: closed")

// Device is one device's memory: its spill allocator, its zero-byte
// tokens and the steps planned on it.
type Device struct {
	b       *Bridge
	ordinal int
	dev     cuda.Device
	spill   *arena.Spill
	zero    *zeroTokens

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
	Allocs, Frees uint64 // every call
	ZeroAllocs    uint64 // 0-byte requests
	Planned       uint64 // allocations served from a step's plan
	Spilled       uint64 // allocations served by the spill allocator
	Divergences   uint64 // step allocations the plan could not serve
	PlannedLive   int    // planned buffers live now
	// CloseError is the last failure closing an arena whose close waited
	// for the captures underway to end ("" if none).
	CloseError  string `json:",omitempty"`
	Arenas      int    // planned arenas held
	ArenaBytes  uint64 // planned arenas, sum of sizes
	ArenaMapped uint64 // physical bytes the arenas map now
	Spill       arena.SpillStats
}

func (b *Bridge) threadID() int {
	if b.cfg.ThreadID != nil {
		return b.cfg.ThreadID()
	}
	return gettid()
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
		// A guest, as OpenGuest's driver: PyTorch calls from its own threads.
		return cuda.OpenSim(cuda.SimConfig{Name: fmt.Sprintf("sim:%d", ordinal), TotalMemory: b.cfg.SimMemory, Guest: true})
	}
	return cuda.OpenGuest(ordinal)
}

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
	opts := []arena.SpillOption{arena.WithAddressSpace(space), arena.WithForeignCaptures(true)}
	if b.cfg.SpillPlain {
		opts = append(opts, arena.WithPlainSegments(true))
	}
	if b.cfg.SpillChunk != 0 {
		opts = append(opts, arena.WithChunk(b.cfg.SpillChunk))
	}
	spill, err := arena.NewSpill(dev, opts...)
	if err != nil {
		return nil, err
	}
	zero, err := newZeroTokens(dev)
	if err != nil {
		spill.Close()
		return nil, err
	}
	return &Device{b: b, ordinal: ordinal, dev: dev, spill: spill, zero: zero,
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

// AllocCacheable is Alloc that also says whether the block came from the
// spill allocator's default pool outside any step, region or capture: a
// block the caller may keep when it is freed and hand out again for the
// next request of the same size, device and stream without calling Alloc
// (the C library's fast path), while FastPathAllowed holds.
func (b *Bridge) AllocCacheable(size uint64, ordinal int, stream uintptr) (cuda.DevicePtr, bool, error) {
	d, err := b.device(ordinal)
	if err != nil {
		return 0, false, err
	}
	if b.hist.on.Load() {
		return d.allocRecorded(size, stream)
	}
	return d.alloc(size, stream, true)
}

// FastPathAllowed says whether a caller may serve allocations from blocks
// it kept (AllocCacheable) without calling Alloc and Free: no capture is
// underway as the host counts them (CapturesUnderway was called, and the
// count is 0), no step runs on any device, no region is open and no
// history is recorded (RecordHistory: it must see every call). Ask it
// again after every call that changes those; with frees kept by the caller
// given back (Free) before such a call.
func (b *Bridge) FastPathAllowed() bool {
	if b.Recording() {
		return false
	}
	b.mu.Lock()
	if b.closed || b.captures != 0 {
		b.mu.Unlock()
		return false
	}
	devs := make([]*Device, 0, len(b.devices))
	for _, d := range b.devices {
		devs = append(devs, d)
	}
	b.mu.Unlock()
	if b.regionsOpen.Load() > 0 {
		return false
	}
	for _, d := range devs {
		d.mu.Lock()
		n := len(d.active)
		d.mu.Unlock()
		if n > 0 {
			return false
		}
	}
	return true
}

// Alloc serves one allocation of size bytes on the given device, for use on
// stream (a CUstream handle, 0 for the legacy default stream).
func (b *Bridge) Alloc(size uint64, ordinal int, stream uintptr) (cuda.DevicePtr, error) {
	d, err := b.device(ordinal)
	if err != nil {
		return 0, err
	}
	if b.hist.on.Load() {
		p, _, err := d.allocRecorded(size, stream)
		return p, err
	}
	p, _, err := d.alloc(size, stream, false)
	return p, err
}

// Free gives back the allocation at p. size and stream are what the
// allocation was made with (PyTorch passes them back); they are checked
// against nothing the bridge relies on.
func (b *Bridge) Free(p cuda.DevicePtr, ordinal int) error {
	d, err := b.device(ordinal)
	if err != nil {
		return err
	}
	if b.hist.on.Load() {
		return d.freeRecorded(p)
	}
	return d.free(p)
}

// RecordStream says that work on stream uses the allocation at p
// (Tensor.record_stream).
func (b *Bridge) RecordStream(p cuda.DevicePtr, ordinal int, stream uintptr) error {
	d, err := b.device(ordinal)
	if err != nil {
		return err
	}
	return d.recordStream(p, stream)
}

// EmptyCache gives the spill allocators' unused memory back to the driver
// (torch.cuda.empty_cache). Devices never used are left alone.
func (b *Bridge) EmptyCache() error {
	var errs []error
	for _, d := range b.deviceList() {
		restore, err := makeCurrent(d.dev)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if err := d.spill.EmptyCache(); err != nil && !errors.Is(err, arena.ErrCapturing) {
			errs = append(errs, fmt.Errorf("bridge: device %d: %w", d.ordinal, err))
		}
		restore()
	}
	return errors.Join(errs...)
}

// Stats returns device ordinal's counters.
func (b *Bridge) Stats(ordinal int) (DeviceStats, error) {
	d, err := b.device(ordinal)
	if err != nil {
		return DeviceStats{}, err
	}
	d.mu.Lock()
	st := d.st
	st.PlannedLive = len(d.planned)
	st.ArenaBytes, st.ArenaMapped, st.Arenas = d.arenas()
	if d.lastCloseErr != nil {
		st.CloseError = d.lastCloseErr.Error()
	}
	d.mu.Unlock()
	st.Spill = d.spill.Stats()
	return st, nil
}

// Close closes every step and device. PyTorch never calls it (the process
// just exits); tests and Go programs do.
func (b *Bridge) Close() error {
	b.mu.Lock()
	closed := b.closed
	b.mu.Unlock()
	if closed {
		return ErrClosed
	}
	var errs []error
	b.mu.Lock()
	fams := make([]*Family, 0, len(b.families))
	for _, f := range b.families {
		fams = append(fams, f)
	}
	b.mu.Unlock()
	for _, f := range fams {
		if err := f.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	for _, s := range b.stepsOf(nil) {
		if err := s.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	b.mu.Lock()
	b.closed = true
	devs := b.devices
	b.devices = nil
	for i := range b.opened {
		b.opened[i].Store(nil)
	}
	b.mu.Unlock()
	for _, d := range devs {
		d.mu.Lock()
		d.closeDeferred()
		errs = append(errs, d.lastCloseErr)
		d.mu.Unlock()
		errs = append(errs, d.zero.close(), d.spill.Close(), d.dev.Close())
	}
	return errors.Join(errs...)
}

func (d *Device) alloc(size uint64, stream uintptr, cacheable bool) (cuda.DevicePtr, bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.st.Allocs++
	if size == 0 {
		d.st.ZeroAllocs++
		p, err := d.zero.take()
		return p, false, err
	}
	if len(d.active) > 0 {
		if s := d.active[stream]; s != nil {
			p, err := s.alloc(size)
			return p, false, err
		}
	}
	if d.b.regionsOpen.Load() > 0 && len(d.threadRegion) > 0 {
		if r := d.threadRegion[d.b.threadID()]; r != nil {
			p, err := d.regionAlloc(r, size, stream)
			return p, false, err
		}
	}
	if !cacheable {
		p, err := d.spillAllocLocked(size, stream)
		return p, false, err
	}
	st, err := d.stream(stream)
	if err != nil {
		return 0, false, err
	}
	p, def, err := d.spill.AllocDefault(size, st)
	if err != nil {
		return 0, false, d.oom(size, err)
	}
	d.st.Spilled++
	return p, def, nil
}

// spillAllocLocked serves size bytes from the spill allocator; d.mu is
// held.
func (d *Device) spillAllocLocked(size uint64, stream uintptr) (cuda.DevicePtr, error) {
	st, err := d.stream(stream)
	if err != nil {
		return 0, err
	}
	p, err := d.spill.Alloc(size, st)
	if err != nil {
		return 0, d.oom(size, err)
	}
	d.st.Spilled++
	return p, nil
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

// arenas returns the planned bytes and the mapped bytes of the device's
// open steps' arenas, and how many there are; d.mu is held.
func (d *Device) arenas() (planned, mapped uint64, n int) {
	seen := map[*arena.Arena]bool{}
	for _, a := range d.deferred {
		seen[a] = true
		planned += uint64(a.Size())
		mapped += a.Mapped()
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
				mapped += a.Mapped()
			}
		}
	}
	return planned, mapped, len(seen)
}

// oom adds what the device holds to an allocation failure; d.mu is held.
func (d *Device) oom(size uint64, err error) error {
	arenas, _, _ := d.arenas()
	sp := d.spill.Stats()
	return fmt.Errorf("bridge: device %d: allocating %d bytes (planned arenas %s, spill %s mapped, %s in use): %w",
		d.ordinal, size, fmtBytes(arenas), fmtBytes(sp.Mapped), fmtBytes(sp.InUse), err)
}

func (d *Device) free(p cuda.DevicePtr) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.st.Frees++
	if d.zero.owns(p) {
		return d.zero.give(p)
	}
	if sl, ok := d.planned[p]; ok {
		delete(d.planned, p)
		if sl.k == orphan {
			if err := sl.step.releaseOrphan(p, sl.old); err != nil {
				return fmt.Errorf("bridge: device %d: %w", d.ordinal, err)
			}
		} else {
			sl.step.freePlanned(sl.k)
		}
		return nil
	}
	for _, s := range d.active {
		s.freeRecorded(p)
	}
	if err := d.spill.Free(p); err != nil {
		return fmt.Errorf("bridge: device %d: %w", d.ordinal, err)
	}
	return nil
}

func (d *Device) recordStream(p cuda.DevicePtr, stream uintptr) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.zero.owns(p) {
		return nil
	}
	if sl, ok := d.planned[p]; ok {
		if sl.k != orphan {
			sl.step.usedElsewhere(sl.k)
		}
		return nil
	}
	for _, s := range d.active {
		s.recordStreamRecorded(p)
	}
	st, err := d.stream(stream)
	if err != nil {
		return err
	}
	return d.spill.RecordStream(p, st)
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

func fmtBytes(n uint64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// RecordStreamAny is RecordStream for callers that do not know the device
// (PyTorch's record_stream hook passes only the pointer and the stream).
func (b *Bridge) RecordStreamAny(p cuda.DevicePtr, stream uintptr) error {
	for _, d := range b.deviceList() {
		if d.owns(p) {
			return d.recordStream(p, stream)
		}
	}
	return fmt.Errorf("bridge: record_stream of %#x: not an allocation of this allocator", uint64(p))
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

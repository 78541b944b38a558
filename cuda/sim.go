package cuda

import (
	"errors"
	"fmt"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"
)

// SimConfig configures a simulated device.
type SimConfig struct {
	// Name is what Name returns; default "sim".
	Name string
	// TotalMemory is the device memory MemGetInfo reports and Alloc and
	// MemCreate draw from; default 16 GiB. The simulation's device memory
	// is host memory, as pinned memory is: PinnedAlloc fails with
	// ErrorOutOfMemory where device and pinned memory together would
	// pass TotalMemory. (Device allocations count device memory only,
	// as MemGetInfo does, as on the driver: pinning first and then
	// allocating up to MemGetInfo's free can still pass it.) Host memory
	// is used only for bytes allocated, mapped, held by an unmapped
	// handle, or pinned (HostBytes): untouched pages of reserved or
	// mapped memory cost nothing, and on Linux freed memory goes back
	// to the system at once.
	TotalMemory uint64
	// Granularity is the VMM granularity; default 2 MiB, as on an H100 or
	// H200.
	Granularity uint64
	// Kernels are the Go references of PTX entries, by entry name.
	Kernels map[string]KernelFunc
	// ComputeCapability is what ComputeCapability returns, as
	// {major, minor}; default {9, 0}, an H100 or H200.
	ComputeCapability [2]int
	// Multiprocessors is what Multiprocessors returns; default 132, an
	// H100 SXM or H200.
	Multiprocessors int
	// Guest makes the simulation behave as OpenGuest's driver: it locks no
	// thread and accepts calls from any thread, as if the host program had
	// made the context current on every thread it calls from. Without it,
	// the simulation refuses what the driver refuses: a call from a thread
	// that neither opened the device nor called BindThread fails with
	// ErrorInvalidContext.
	Guest bool
}

// Sim is the simulated device. Work runs at once, in the order the streams
// impose, on the calling goroutine; captures build a real DAG that
// instantiated graphs replay in a topological order (node creation order).
// Memory is host bytes at simulated device addresses: Alloc blocks are
// separated by unmapped gaps so that an overrun is an ErrorIllegalAddress.
//
// It follows the driver's capture rules, as the conformance suite checked
// them on an H200 (driver 580): Alloc, Free and synchronisation during a
// global or thread-local capture fail with ErrorStreamCaptureUnsupported and
// invalidate every such capture; querying or synchronising an event recorded
// in a capture fails with ErrorCapturedEvent and invalidates that capture;
// synchronous host copies (on the legacy stream, which does not wait for
// non-blocking streams) run at once and leave the capture alone; VMM calls
// are legal during capture.
//
// A Sim is safe for concurrent use; kernels run under its lock.
// Known differences from the driver: a physical handle can be mapped at
// one place at a time; thread-local capture mode behaves as global.
type Sim struct {
	mu      sync.Mutex
	cfg     SimConfig
	kernels map[string]KernelFunc
	closed  bool
	// threads are the OS threads on which the context is current: the one
	// that opened the device and those that called BindThread.
	threads map[int]bool

	window      int // takeSimWindow's index
	nextAddr    uint64
	regions     []*simRegion // sorted by base
	used        uint64
	handles     map[MemHandle]*simPhys
	nextHandle  MemHandle
	pinned      map[*byte][]byte // PinnedAlloc memory not yet freed
	host        uint64           // host bytes held (HostBytes)
	pinnedBytes uint64           // PinnedAlloc bytes not yet freed

	byHandle map[uintptr]*simStream // streams by Handle
	// foreignSweep is the size of byHandle at which Foreign next
	// forgets idle foreign streams.
	foreignSweep int
	nextStream   uintptr

	captures  map[*simCapture]bool // underway
	nextCapID uint64
	nextNode  GraphNode
	clock     time.Duration
}

var _ Device = (*Sim)(nil)

// OpenSim makes a simulated device. Like Open, it locks the calling
// goroutine to its OS thread and makes the context current there (unless
// cfg.Guest); Close undoes the lock.
func OpenSim(cfg SimConfig) (*Sim, error) {
	if cfg.Name == "" {
		cfg.Name = "sim"
	}
	if cfg.TotalMemory == 0 {
		cfg.TotalMemory = 16 << 30
	}
	if cfg.Granularity == 0 {
		cfg.Granularity = 2 << 20
	}
	if cfg.ComputeCapability == [2]int{} {
		cfg.ComputeCapability = [2]int{9, 0}
	}
	if cfg.Multiprocessors == 0 {
		cfg.Multiprocessors = 132
	}
	if cfg.Multiprocessors < 0 {
		return nil, fmt.Errorf("cuda: OpenSim: %d multiprocessors", cfg.Multiprocessors)
	}
	if cfg.Granularity&(cfg.Granularity-1) != 0 {
		return nil, fmt.Errorf("cuda: OpenSim: granularity %d is not a power of two", cfg.Granularity)
	}
	window, base, err := takeSimWindow()
	if err != nil {
		return nil, err
	}
	s := &Sim{
		cfg:        cfg,
		kernels:    map[string]KernelFunc{},
		window:     window,
		nextAddr:   base,
		handles:    map[MemHandle]*simPhys{},
		nextHandle: 1,
		captures:   map[*simCapture]bool{},
		nextCapID:  1,
		nextNode:   1,
		threads:    map[int]bool{},
	}
	for name, fn := range cfg.Kernels {
		if err := s.RegisterKernel(name, fn); err != nil {
			giveSimWindow(window)
			return nil, err
		}
	}
	if !cfg.Guest {
		runtime.LockOSThread()
		s.threads[currentThread()] = true
	}
	return s, nil
}

// RegisterKernel adds the Go reference for the PTX entry name. Modules
// loaded afterwards can use it.
func (s *Sim) RegisterKernel(name string, fn KernelFunc) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if fn == nil {
		return fmt.Errorf("cuda: sim: RegisterKernel %q: nil function", name)
	}
	if _, dup := s.kernels[name]; dup {
		return fmt.Errorf("cuda: sim: RegisterKernel %q: already registered", name)
	}
	s.kernels[name] = fn
	return nil
}

func (s *Sim) Name() string { return s.cfg.Name }

// BindThread locks the calling goroutine to its OS thread and makes the
// context current there, as the driver's does: later calls from this
// goroutine are accepted.
func (s *Sim) BindThread() error {
	runtime.LockOSThread()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return &Error{Op: "cuCtxSetCurrent", Code: ErrorInvalidContext}
	}
	s.threads[currentThread()] = true
	return nil
}

func (s *Sim) Synchronize() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.live("cuCtxSynchronize"); err != nil {
		return err
	}
	return s.unsafeDuringCapture("cuCtxSynchronize")
}

func (s *Sim) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return &Error{Op: "cuDevicePrimaryCtxRelease_v2", Code: ErrorInvalidContext}
	}
	s.closed = true
	// Everything goes back: the driver frees a context's memory, pinned
	// memory included, when the context goes.
	for _, r := range s.regions {
		if r.reserved {
			hostUnmap(r.data)
		} else {
			hostFree(r.data)
		}
		r.data, r.maps = nil, nil
	}
	for _, h := range s.handles {
		hostFree(h.data)
		h.data = nil
	}
	for _, b := range s.pinned {
		hostFree(b)
	}
	s.regions, s.handles, s.pinned = nil, nil, nil
	s.used, s.host, s.pinnedBytes = 0, 0, 0
	giveSimWindow(s.window)
	if !s.cfg.Guest {
		runtime.UnlockOSThread() // OpenSim's lock, as the driver's Close undoes Open's
	}
	return nil
}

func (s *Sim) live(op string) error {
	if s.closed {
		return &Error{Op: op, Code: ErrorInvalidContext}
	}
	// The driver keeps the current context per OS thread: a call from a
	// thread where it is not current fails.
	if !s.cfg.Guest && !s.threads[currentThread()] {
		return &Error{Op: op, Code: ErrorInvalidContext}
	}
	return nil
}

// unsafeDuringCapture applies the rule for calls that global and
// thread-local captures forbid, as the driver applies it to a thread in
// its default (global) interaction mode: a global-mode capture forbids
// them on every thread, a thread-local one only on the thread that began
// it, a relaxed one nowhere. The call fails and invalidates the captures
// that forbade it.
func (s *Sim) unsafeDuringCapture(op string) error {
	bad := false
	me := currentThread()
	for c := range s.captures {
		if c.mode == CaptureModeGlobal || (c.mode == CaptureModeThreadLocal && c.thread == me) {
			c.status = CaptureInvalidated
			bad = true
		}
	}
	if bad {
		return &Error{Op: op, Code: ErrorStreamCaptureUnsupported}
	}
	return nil
}

// ---- streams and events ----

type simStream struct {
	sim      *Sim
	handle   uintptr
	foreign  bool // Foreign: not ours to destroy
	closed   bool
	capture  *simCapture
	frontier []*simNode
}

func (s *Sim) NewStream() (Stream, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.live("cuStreamCreate"); err != nil {
		return nil, err
	}
	s.nextStream++
	st := &simStream{sim: s, handle: 0x5000_0000 + s.nextStream*0x100}
	if s.byHandle == nil {
		s.byHandle = map[uintptr]*simStream{}
	}
	s.byHandle[st.handle] = st
	return st, nil
}

func (s *Sim) stream(op string, st Stream) (*simStream, error) {
	if err := s.live(op); err != nil {
		return nil, err
	}
	ss, ok := st.(*simStream)
	if !ok || ss == nil || ss.sim != s || ss.closed {
		return nil, &Error{Op: op, Code: ErrorInvalidHandle}
	}
	return ss, nil
}

func (st *simStream) Synchronize() error {
	s := st.sim
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.stream("cuStreamSynchronize", st); err != nil {
		return err
	}
	if st.capture != nil {
		st.capture.status = CaptureInvalidated
		return &Error{Op: "cuStreamSynchronize", Code: ErrorStreamCaptureUnsupported}
	}
	return nil
}

func (st *simStream) WaitEvent(e Event) error {
	const op = "cuStreamWaitEvent"
	s := st.sim
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.stream(op, st); err != nil {
		return err
	}
	ev, err := s.event(op, e)
	if err != nil {
		return err
	}
	c := ev.capture
	if c != nil && !s.captures[c] {
		c = nil // the capture has ended: the event stands for finished work
	}
	switch {
	case c == nil && st.capture == nil:
		return nil // everything recorded has already run
	case c == nil:
		if st.capture.status == CaptureInvalidated {
			return &Error{Op: op, Code: ErrorStreamCaptureInvalidated}
		}
		return &Error{Op: op, Code: ErrorStreamCaptureIsolation}
	case st.capture == nil:
		st.capture = c
		c.streams[st] = true
		st.frontier = append([]*simNode(nil), ev.nodes...)
		return nil
	case st.capture == c:
		st.frontier = unionNodes(st.frontier, ev.nodes)
		return nil
	default:
		return &Error{Op: op, Code: ErrorStreamCaptureMerge}
	}
}

func (st *simStream) Close() error {
	s := st.sim
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.stream("cuStreamDestroy_v2", st); err != nil {
		return err
	}
	if st.foreign {
		return &Error{Op: "cuStreamDestroy_v2", Code: ErrorNotPermitted}
	}
	if st.capture != nil {
		return &Error{Op: "cuStreamDestroy_v2", Code: ErrorIllegalState}
	}
	st.closed = true
	delete(s.byHandle, st.handle)
	return nil
}

type simEvent struct {
	sim      *Sim
	timing   bool
	closed   bool
	recorded bool
	at       time.Duration
	capture  *simCapture
	nodes    []*simNode
}

func (s *Sim) NewEvent(timing bool) (Event, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.live("cuEventCreate"); err != nil {
		return nil, err
	}
	return &simEvent{sim: s, timing: timing}, nil
}

func (s *Sim) event(op string, e Event) (*simEvent, error) {
	if err := s.live(op); err != nil {
		return nil, err
	}
	ev, ok := e.(*simEvent)
	if !ok || ev == nil || ev.sim != s || ev.closed {
		return nil, &Error{Op: op, Code: ErrorInvalidHandle}
	}
	return ev, nil
}

func (ev *simEvent) Record(st Stream) error {
	const op = "cuEventRecord"
	s := ev.sim
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.event(op, ev); err != nil {
		return err
	}
	ss, err := s.stream(op, st)
	if err != nil {
		return err
	}
	ev.recorded = true
	if c := ss.capture; c != nil {
		if c.status == CaptureInvalidated {
			return &Error{Op: op, Code: ErrorStreamCaptureInvalidated}
		}
		ev.capture = c
		ev.nodes = append([]*simNode(nil), ss.frontier...)
		return nil
	}
	ev.capture, ev.nodes = nil, nil
	ev.at = s.clock
	return nil
}

func (ev *simEvent) Synchronize() error { return ev.check("cuEventSynchronize") }

func (ev *simEvent) Query() error { return ev.check("cuEventQuery") }

func (ev *simEvent) check(op string) error {
	s := ev.sim
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.live(op); err != nil {
		return err
	}
	if _, err := s.event(op, ev); err != nil {
		return err
	}
	if c := ev.capture; c != nil && s.captures[c] {
		// The driver also invalidates the capture (seen on an H200,
		// driver 580): waiting for capture-time work is meaningless.
		c.status = CaptureInvalidated
		return &Error{Op: op, Code: ErrorCapturedEvent}
	}
	return nil
}

func (ev *simEvent) Close() error {
	s := ev.sim
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.event("cuEventDestroy_v2", ev); err != nil {
		return err
	}
	ev.closed = true
	return nil
}

func (s *Sim) ElapsedTime(start, end Event) (time.Duration, error) {
	const op = "cuEventElapsedTime_v2"
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.live(op); err != nil {
		return 0, err
	}
	a, err := s.event(op, start)
	if err != nil {
		return 0, err
	}
	b, err := s.event(op, end)
	if err != nil {
		return 0, err
	}
	for _, e := range []*simEvent{a, b} {
		if !e.timing || !e.recorded {
			return 0, &Error{Op: op, Code: ErrorInvalidHandle}
		}
		if e.capture != nil {
			return 0, &Error{Op: op, Code: ErrorCapturedEvent}
		}
	}
	return b.at - a.at, nil
}

// ---- work on streams ----

// enqueue runs work now, or adds it to the capture that st is part of.
func (s *Sim) enqueue(op string, st *simStream, n *simNode) error {
	if c := st.capture; c != nil {
		if c.status == CaptureInvalidated {
			return &Error{Op: op, Code: ErrorStreamCaptureInvalidated}
		}
		n.id = s.nextNode
		s.nextNode++
		n.deps = append([]*simNode(nil), st.frontier...)
		c.graph.add(n)
		st.frontier = []*simNode{n}
		return nil
	}
	return s.runNode(n)
}

func (s *Sim) runNode(n *simNode) error {
	s.clock += time.Microsecond
	if n.run == nil {
		return nil
	}
	return n.run(s)
}

func (s *Sim) Memset32(p DevicePtr, value uint32, count uint64, st Stream) error {
	const op = "cuMemsetD32Async"
	s.mu.Lock()
	defer s.mu.Unlock()
	ss, err := s.stream(op, st)
	if err != nil {
		return err
	}
	if p%4 != 0 || count == 0 || !s.addressable(p, count*4) {
		return &Error{Op: op, Code: ErrorInvalidValue}
	}
	n := &simNode{typ: NodeMemset, key: "memset", params: [3]uint64{uint64(p), uint64(value), count}}
	n.run = func(s *Sim) error {
		b, err := s.bytes(p, count*4)
		if err != nil {
			return err
		}
		for i := uint64(0); i < count; i++ {
			putU32(b[4*i:], value)
		}
		return nil
	}
	return s.enqueue(op, ss, n)
}

func (s *Sim) CopyDtoD(dst, src DevicePtr, n uint64, st Stream) error {
	const op = "cuMemcpyDtoDAsync_v2"
	s.mu.Lock()
	defer s.mu.Unlock()
	ss, err := s.stream(op, st)
	if err != nil {
		return err
	}
	if n == 0 || !s.addressable(dst, n) || !s.addressable(src, n) {
		return &Error{Op: op, Code: ErrorInvalidValue}
	}
	node := &simNode{typ: NodeMemcpy, key: "memcpy", params: [3]uint64{uint64(dst), uint64(src), n}}
	node.run = func(s *Sim) error {
		d, err := s.bytes(dst, n)
		if err != nil {
			return err
		}
		b, err := s.bytes(src, n)
		if err != nil {
			return err
		}
		copy(d, b)
		return nil
	}
	return s.enqueue(op, ss, node)
}

// ---- modules and kernels ----

type simModule struct {
	sim     *Sim
	closed  bool
	entries map[string]*simFunction
}

type simFunction struct {
	module *simModule
	name   string
	params []int // sizes in bytes, from the PTX
	fn     KernelFunc
}

func (f *simFunction) Name() string { return f.name }

var (
	ptxEntry = regexp.MustCompile(`\.entry\s+([A-Za-z_$%][\w$]*)\s*\(([^)]*)\)`)
	ptxParam = regexp.MustCompile(`\.param\s+\.([a-z]+)(\d+)`)
)

// parsePTX returns the entries of a PTX text and their parameter sizes.
func parsePTX(ptx string) (map[string][]int, error) {
	if !strings.Contains(ptx, ".version") || !strings.Contains(ptx, ".target") {
		return nil, errors.New("no .version or .target directive")
	}
	out := map[string][]int{}
	for _, m := range ptxEntry.FindAllStringSubmatch(ptx, -1) {
		var sizes []int
		for _, p := range ptxParam.FindAllStringSubmatch(m[2], -1) {
			bits := 0
			fmt.Sscan(p[2], &bits)
			sizes = append(sizes, bits/8)
		}
		out[m[1]] = sizes
	}
	return out, nil
}

func (s *Sim) LoadModule(ptx []byte) (Module, error) {
	const op = "cuModuleLoadData"
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.live(op); err != nil {
		return nil, err
	}
	entries, err := parsePTX(string(ptx))
	if err != nil {
		return nil, fmt.Errorf("cuda: sim: %v: %w", err, &Error{Op: op, Code: ErrorInvalidPTX})
	}
	m := &simModule{sim: s, entries: map[string]*simFunction{}}
	var missing []string
	for name, params := range entries {
		fn, ok := s.kernels[name]
		if !ok {
			missing = append(missing, name)
			continue
		}
		m.entries[name] = &simFunction{module: m, name: name, params: params, fn: fn}
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		return nil, fmt.Errorf("cuda: sim: PTX entries without a registered Go kernel: %s: %w",
			strings.Join(missing, ", "), &Error{Op: op, Code: ErrorNotFound})
	}
	return m, nil
}

func (m *simModule) Function(name string) (Function, error) {
	s := m.sim
	s.mu.Lock()
	defer s.mu.Unlock()
	if m.closed {
		return nil, &Error{Op: "cuModuleGetFunction", Code: ErrorInvalidHandle}
	}
	f, ok := m.entries[name]
	if !ok {
		return nil, &Error{Op: "cuModuleGetFunction", Code: ErrorNotFound}
	}
	return f, nil
}

func (m *simModule) Close() error {
	m.sim.mu.Lock()
	defer m.sim.mu.Unlock()
	if m.closed {
		return &Error{Op: "cuModuleUnload", Code: ErrorInvalidHandle}
	}
	m.closed = true
	return nil
}

// ComputeCapability returns SimConfig.ComputeCapability.
func (s *Sim) ComputeCapability() (major, minor int, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.live("cuDeviceGetAttribute"); err != nil {
		return 0, 0, err
	}
	return s.cfg.ComputeCapability[0], s.cfg.ComputeCapability[1], nil
}

// Multiprocessors returns SimConfig.Multiprocessors.
func (s *Sim) Multiprocessors() (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.live("cuDeviceGetAttribute"); err != nil {
		return 0, err
	}
	return s.cfg.Multiprocessors, nil
}

func (s *Sim) Launch(fn Function, grid, block Dim3, sharedMem uint32, st Stream, args ...KernelArg) error {
	return s.launch("cuLaunchKernel", fn, grid, block, sharedMem, st, args)
}

// LaunchEx is Launch: kernels run one after another on the simulation, so
// programmatic serialization changes nothing (a kernel that follows the
// rule of Device.LaunchEx computes the same either way).
func (s *Sim) LaunchEx(fn Function, cfg LaunchConfig, args ...KernelArg) error {
	return s.launch("cuLaunchKernelEx", fn, cfg.Grid, cfg.Block, cfg.SharedMem, cfg.Stream, args)
}

func (s *Sim) launch(op string, fn Function, grid, block Dim3, sharedMem uint32, st Stream, args []KernelArg) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss, err := s.stream(op, st)
	if err != nil {
		return err
	}
	f, ok := fn.(*simFunction)
	if !ok || f.module.sim != s || f.module.closed {
		return &Error{Op: op, Code: ErrorInvalidHandle}
	}
	if grid.Count() == 0 || block.Count() == 0 || block.Count() > 1024 || sharedMem > 48<<10 {
		return &Error{Op: op, Code: ErrorInvalidValue}
	}
	if len(args) != len(f.params) {
		return fmt.Errorf("cuda: sim: %s takes %d parameters, got %d: %w",
			f.name, len(f.params), len(args), &Error{Op: op, Code: ErrorInvalidValue})
	}
	for i, a := range args {
		if a.Size() != f.params[i] {
			return fmt.Errorf("cuda: sim: %s parameter %d is %d bytes, got %v: %w",
				f.name, i, f.params[i], a, &Error{Op: op, Code: ErrorInvalidValue})
		}
	}
	args = append([]KernelArg(nil), args...)
	n := &simNode{typ: NodeKernel, key: "kernel", params: args}
	n.run = func(s *Sim) error {
		if err := f.fn(simMem{s}, grid, block, args); err != nil {
			var ce *Error
			if errors.As(err, &ce) {
				return fmt.Errorf("cuda: sim kernel %s: %w", f.name, err)
			}
			return fmt.Errorf("cuda: sim kernel %s: %v: %w", f.name, err, &Error{Op: op, Code: ErrorLaunchFailed})
		}
		return nil
	}
	return s.enqueue(op, ss, n)
}

type simMem struct{ s *Sim }

func (m simMem) Bytes(p DevicePtr, n uint64) ([]byte, error) { return m.s.bytes(p, n) }

func putU32(b []byte, v uint32) {
	_ = b[3]
	b[0], b[1], b[2], b[3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
}

func unionNodes(a, b []*simNode) []*simNode {
	out := append([]*simNode(nil), a...)
	for _, n := range b {
		dup := false
		for _, m := range out {
			if m == n {
				dup = true
				break
			}
		}
		if !dup {
			out = append(out, n)
		}
	}
	return out
}

package cuda

import (
	"fmt"
	"math"
	"runtime"
	"time"
	"unsafe"
)

// begin takes the driver's lock for operation f; the caller defers
// d.mu.Unlock() when err is nil.
func (d *Driver) begin(f int) error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return &Error{Op: fnNames[f], Code: ErrorInvalidContext}
	}
	return nil
}

// ---- memory ----

func (d *Driver) Alloc(size uint64) (DevicePtr, error) {
	if err := d.begin(fnMemAlloc); err != nil {
		return 0, err
	}
	defer d.mu.Unlock()
	if err := d.check(fnMemAlloc, d.out(0), uintptr(size)); err != nil {
		return 0, err
	}
	return DevicePtr(d.u64(0)), nil
}

func (d *Driver) Free(p DevicePtr) error { return d.locked(fnMemFree, uintptr(p)) }

func (d *Driver) MemGetInfo() (free, total uint64, err error) {
	if err := d.begin(fnMemGetInfo); err != nil {
		return 0, 0, err
	}
	defer d.mu.Unlock()
	if err := d.check(fnMemGetInfo, d.out(0), d.out(8)); err != nil {
		return 0, 0, err
	}
	return d.u64(0), d.u64(8), nil
}

func (d *Driver) CopyHtoD(dst DevicePtr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	if err := d.begin(fnMemcpyHtoD); err != nil {
		return err
	}
	defer d.mu.Unlock()
	r := d.callGo(fnMemcpyHtoD, uintptr(dst), uintptr(unsafe.Pointer(&src[0])), uintptr(len(src)))
	runtime.KeepAlive(src)
	if r != Success {
		return d.err(fnMemcpyHtoD, r)
	}
	return nil
}

func (d *Driver) CopyDtoH(dst []byte, src DevicePtr) error {
	if len(dst) == 0 {
		return nil
	}
	if err := d.begin(fnMemcpyDtoH); err != nil {
		return err
	}
	defer d.mu.Unlock()
	r := d.callGo(fnMemcpyDtoH, uintptr(unsafe.Pointer(&dst[0])), uintptr(src), uintptr(len(dst)))
	runtime.KeepAlive(dst)
	if r != Success {
		return d.err(fnMemcpyDtoH, r)
	}
	return nil
}

func (d *Driver) PinnedAlloc(size uint64) ([]byte, error) {
	if err := d.begin(fnMemAllocHost); err != nil {
		return nil, err
	}
	defer d.mu.Unlock()
	if size == 0 {
		return nil, &Error{Op: fnNames[fnMemAllocHost], Code: ErrorInvalidValue}
	}
	if err := d.check(fnMemAllocHost, d.out(0), uintptr(size)); err != nil {
		return nil, err
	}
	p := *(*unsafe.Pointer)(unsafe.Add(d.scratch, 0))
	if d.pinned == nil {
		d.pinned = map[unsafe.Pointer]uint64{}
	}
	d.pinned[p] = size
	return unsafe.Slice((*byte)(p), size), nil
}

func (d *Driver) PinnedFree(b []byte) error {
	if err := d.begin(fnMemFreeHost); err != nil {
		return err
	}
	defer d.mu.Unlock()
	if len(b) == 0 {
		return &Error{Op: fnNames[fnMemFreeHost], Code: ErrorInvalidValue}
	}
	p := unsafe.Pointer(unsafe.SliceData(b))
	if n, ok := d.pinned[p]; !ok || n != uint64(len(b)) {
		return &Error{Op: fnNames[fnMemFreeHost], Code: ErrorInvalidValue}
	}
	delete(d.pinned, p)
	return d.check(fnMemFreeHost, uintptr(p))
}

func (d *Driver) CopyDtoD(dst, src DevicePtr, n uint64, s Stream) error {
	h, err := d.streamHandle(fnMemcpyDtoDAsync, s)
	if err != nil {
		return err
	}
	return d.locked(fnMemcpyDtoDAsync, uintptr(dst), uintptr(src), uintptr(n), h)
}

func (d *Driver) CopyHtoDAsync(dst DevicePtr, src []byte, s Stream) error {
	if len(src) == 0 {
		return nil
	}
	h, err := d.streamHandle(fnMemcpyHtoDAsync, s)
	if err != nil {
		return err
	}
	err = d.locked(fnMemcpyHtoDAsync, uintptr(dst), uintptr(unsafe.Pointer(&src[0])), uintptr(len(src)), h)
	runtime.KeepAlive(src)
	return err
}

func (d *Driver) CopyDtoHAsync(dst []byte, src DevicePtr, s Stream) error {
	if len(dst) == 0 {
		return nil
	}
	h, err := d.streamHandle(fnMemcpyDtoHAsync, s)
	if err != nil {
		return err
	}
	err = d.locked(fnMemcpyDtoHAsync, uintptr(unsafe.Pointer(&dst[0])), uintptr(src), uintptr(len(dst)), h)
	runtime.KeepAlive(dst)
	return err
}

func (d *Driver) Memset32(p DevicePtr, value uint32, count uint64, s Stream) error {
	h, err := d.streamHandle(fnMemsetD32Async, s)
	if err != nil {
		return err
	}
	return d.locked(fnMemsetD32Async, uintptr(p), uintptr(value), uintptr(count), h)
}

// ---- streams and events ----

type driverStream struct {
	d       *Driver
	h       uintptr
	foreign bool // made by another program (Foreign): not ours to destroy
}

type driverEvent struct {
	d *Driver
	h uintptr
}

func (d *Driver) streamHandle(f int, s Stream) (uintptr, error) {
	ds, ok := s.(*driverStream)
	if !ok || ds == nil || ds.d != d || (ds.h == 0 && !ds.foreign) {
		return 0, &Error{Op: fnNames[f], Code: ErrorInvalidHandle}
	}
	return ds.h, nil
}

func (d *Driver) eventHandle(f int, e Event) (uintptr, error) {
	de, ok := e.(*driverEvent)
	if !ok || de == nil || de.d != d || de.h == 0 {
		return 0, &Error{Op: fnNames[f], Code: ErrorInvalidHandle}
	}
	return de.h, nil
}

const cuStreamNonBlocking = 1

func (d *Driver) NewStream() (Stream, error) {
	if err := d.begin(fnStreamCreate); err != nil {
		return nil, err
	}
	defer d.mu.Unlock()
	if err := d.check(fnStreamCreate, d.out(0), cuStreamNonBlocking); err != nil {
		return nil, err
	}
	return &driverStream{d: d, h: uintptr(d.u64(0))}, nil
}

func (s *driverStream) Synchronize() error {
	h, err := s.d.streamHandle(fnStreamSynchronize, s)
	if err != nil {
		return err
	}
	return s.d.locked(fnStreamSynchronize, h)
}

func (s *driverStream) WaitEvent(e Event) error {
	h, err := s.d.streamHandle(fnStreamWaitEvent, s)
	if err != nil {
		return err
	}
	eh, err := s.d.eventHandle(fnStreamWaitEvent, e)
	if err != nil {
		return err
	}
	return s.d.locked(fnStreamWaitEvent, h, eh, 0)
}

func (s *driverStream) Close() error {
	h, err := s.d.streamHandle(fnStreamDestroy, s)
	if err != nil {
		return err
	}
	if s.foreign {
		return &Error{Op: fnNames[fnStreamDestroy], Code: ErrorNotPermitted} // a foreign stream belongs to the program that made it
	}
	if err := s.d.locked(fnStreamDestroy, h); err != nil {
		return err
	}
	s.h = 0
	return nil
}

const cuEventDisableTiming = 2

func (d *Driver) NewEvent(timing bool) (Event, error) {
	if err := d.begin(fnEventCreate); err != nil {
		return nil, err
	}
	defer d.mu.Unlock()
	flags := uintptr(0)
	if !timing {
		flags = cuEventDisableTiming
	}
	if err := d.check(fnEventCreate, d.out(0), flags); err != nil {
		return nil, err
	}
	return &driverEvent{d: d, h: uintptr(d.u64(0))}, nil
}

func (e *driverEvent) Record(s Stream) error {
	h, err := e.d.eventHandle(fnEventRecord, e)
	if err != nil {
		return err
	}
	sh, err := e.d.streamHandle(fnEventRecord, s)
	if err != nil {
		return err
	}
	return e.d.locked(fnEventRecord, h, sh)
}

func (e *driverEvent) Synchronize() error {
	h, err := e.d.eventHandle(fnEventSynchronize, e)
	if err != nil {
		return err
	}
	return e.d.locked(fnEventSynchronize, h)
}

func (e *driverEvent) Query() error {
	h, err := e.d.eventHandle(fnEventQuery, e)
	if err != nil {
		return err
	}
	return e.d.locked(fnEventQuery, h)
}

func (e *driverEvent) Close() error {
	h, err := e.d.eventHandle(fnEventDestroy, e)
	if err != nil {
		return err
	}
	if err := e.d.locked(fnEventDestroy, h); err != nil {
		return err
	}
	e.h = 0
	return nil
}

func (d *Driver) ElapsedTime(start, end Event) (time.Duration, error) {
	a, err := d.eventHandle(fnEventElapsedTime, start)
	if err != nil {
		return 0, err
	}
	b, err := d.eventHandle(fnEventElapsedTime, end)
	if err != nil {
		return 0, err
	}
	if err := d.begin(fnEventElapsedTime); err != nil {
		return 0, err
	}
	defer d.mu.Unlock()
	if err := d.check(fnEventElapsedTime, d.out(0), a, b); err != nil {
		return 0, err
	}
	ms := math.Float32frombits(d.u32(0))
	return time.Duration(float64(ms) * float64(time.Millisecond)), nil
}

// ---- modules and launch ----

type driverModule struct {
	d *Driver
	h uintptr
}

type driverFunction struct {
	m    *driverModule
	h    uintptr
	name string
}

func (f *driverFunction) Name() string { return f.name }

func (d *Driver) LoadModule(ptx []byte) (Module, error) {
	if err := d.begin(fnModuleLoadData); err != nil {
		return nil, err
	}
	defer d.mu.Unlock()
	img, err := d.bigBuf(uintptr(len(ptx)) + 1) // zeroed: NUL-terminated
	if err != nil {
		return nil, err
	}
	copy(unsafe.Slice((*byte)(img), len(ptx)), ptx)
	if err := d.check(fnModuleLoadData, d.out(0), uintptr(img)); err != nil {
		return nil, err
	}
	return &driverModule{d: d, h: uintptr(d.u64(0))}, nil
}

func (m *driverModule) Function(name string) (Function, error) {
	d := m.d
	if err := d.begin(fnModuleGetFunction); err != nil {
		return nil, err
	}
	defer d.mu.Unlock()
	if m.h == 0 {
		return nil, &Error{Op: fnNames[fnModuleGetFunction], Code: ErrorInvalidHandle}
	}
	cname, err := d.bigBuf(uintptr(len(name)) + 1)
	if err != nil {
		return nil, err
	}
	copy(unsafe.Slice((*byte)(cname), len(name)), name)
	if err := d.check(fnModuleGetFunction, d.out(0), m.h, uintptr(cname)); err != nil {
		return nil, fmt.Errorf("cuda: kernel %q: %w", name, err)
	}
	return &driverFunction{m: m, h: uintptr(d.u64(0)), name: name}, nil
}

func (m *driverModule) Close() error {
	if m.h == 0 {
		return &Error{Op: "cuModuleUnload", Code: ErrorInvalidHandle}
	}
	if err := m.d.locked(fnModuleUnload, m.h); err != nil {
		return err
	}
	m.h = 0
	return nil
}

// Launch marshals args into C memory: an array of len(args) pointers
// (kernelParams), each pointing at an 8-byte slot that holds the value.
func (d *Driver) Launch(fn Function, grid, block Dim3, sharedMem uint32, s Stream, args ...KernelArg) error {
	f, ok := fn.(*driverFunction)
	if !ok || f == nil || f.m.d != d || f.m.h == 0 {
		return &Error{Op: fnNames[fnLaunchKernel], Code: ErrorInvalidHandle}
	}
	sh, err := d.streamHandle(fnLaunchKernel, s)
	if err != nil {
		return err
	}
	if err := d.begin(fnLaunchKernel); err != nil {
		return err
	}
	defer d.mu.Unlock()
	buf, err := d.bigBuf(16 * uintptr(len(args)))
	if err != nil {
		return err
	}
	params := kernelParams(buf, args)
	if err := d.check(fnLaunchKernel, f.h,
		uintptr(grid.X), uintptr(grid.Y), uintptr(grid.Z),
		uintptr(block.X), uintptr(block.Y), uintptr(block.Z),
		uintptr(sharedMem), sh, params, 0); err != nil {
		return fmt.Errorf("cuda: launching %s: %w", f.name, err)
	}
	return nil
}

// kernelParams writes args at buf (16 bytes each: the kernelParams array of
// pointers, then the 8-byte value slots they point at) and returns the
// array's address, or 0 for no arguments.
func kernelParams(buf unsafe.Pointer, args []KernelArg) uintptr {
	n := uintptr(len(args))
	if n == 0 {
		return 0
	}
	for i, a := range args {
		slot := unsafe.Add(buf, 8*n+8*uintptr(i))
		*(*uint64)(slot) = a.Bits
		*(*uintptr)(unsafe.Add(buf, 8*uintptr(i))) = uintptr(slot)
	}
	return uintptr(buf)
}

// CUlaunchConfig and CUlaunchAttribute as laid out by cuda.h of CUDA 12 and
// 13 (LP64), checked with sizeof/offsetof against the 13.0 header:
//
//	CUlaunchConfig    { uint32 gridDimX, gridDimY, gridDimZ;      // +0 +4 +8
//	                    uint32 blockDimX, blockDimY, blockDimZ;   // +12 +16 +20
//	                    uint32 sharedMemBytes;                    // +24
//	                    CUstream hStream;                         // +32
//	                    CUlaunchAttribute *attrs;                 // +40
//	                    uint32 numAttrs; }                        // +48, 56 bytes
//	CUlaunchAttribute { uint32 id; char pad[4];                   // +0
//	                    CUlaunchAttributeValue value; }           // +8 (union, 64 bytes), 72 bytes
const (
	launchConfigSize    = 56
	launchAttributeSize = 72
	launchAttrOff       = 64 // the attribute array, after the config
	launchParamsOff     = launchAttrOff + launchAttributeSize

	// CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION; its value is
	// the int programmaticStreamSerializationAllowed at the union's start.
	cuLaunchAttributeProgrammaticStreamSerialization = 6
)

// LaunchEx builds a CUlaunchConfig with its attribute array and the kernel
// parameters in C memory and calls cuLaunchKernelEx.
func (d *Driver) LaunchEx(fn Function, cfg LaunchConfig, args ...KernelArg) error {
	const op = fnLaunchKernelEx
	f, ok := fn.(*driverFunction)
	if !ok || f == nil || f.m.d != d || f.m.h == 0 {
		return &Error{Op: fnNames[op], Code: ErrorInvalidHandle}
	}
	sh, err := d.streamHandle(op, cfg.Stream)
	if err != nil {
		return err
	}
	if err := d.begin(op); err != nil {
		return err
	}
	defer d.mu.Unlock()
	buf, err := d.bigBuf(launchParamsOff + 16*uintptr(len(args)))
	if err != nil {
		return err
	}
	c := unsafe.Slice((*uint32)(buf), launchConfigSize/4)
	c[0], c[1], c[2] = cfg.Grid.X, cfg.Grid.Y, cfg.Grid.Z
	c[3], c[4], c[5] = cfg.Block.X, cfg.Block.Y, cfg.Block.Z
	c[6] = cfg.SharedMem
	*(*uintptr)(unsafe.Add(buf, 32)) = sh
	if cfg.ProgrammaticSerialization {
		attr := unsafe.Add(buf, launchAttrOff)
		*(*uint32)(attr) = cuLaunchAttributeProgrammaticStreamSerialization
		*(*int32)(unsafe.Add(attr, 8)) = 1
		*(*uintptr)(unsafe.Add(buf, 40)) = uintptr(attr)
		*(*uint32)(unsafe.Add(buf, 48)) = 1
	}
	params := kernelParams(unsafe.Add(buf, launchParamsOff), args)
	if err := d.check(op, uintptr(buf), f.h, params, 0); err != nil {
		return fmt.Errorf("cuda: launching %s: %w", f.name, err)
	}
	return nil
}

// ---- capture ----

func (d *Driver) BeginCapture(s Stream, mode CaptureMode) error {
	h, err := d.streamHandle(fnStreamBeginCapture, s)
	if err != nil {
		return err
	}
	return d.locked(fnStreamBeginCapture, h, uintptr(mode))
}

func (d *Driver) EndCapture(s Stream) (Graph, error) {
	h, err := d.streamHandle(fnStreamEndCapture, s)
	if err != nil {
		return nil, err
	}
	if err := d.begin(fnStreamEndCapture); err != nil {
		return nil, err
	}
	defer d.mu.Unlock()
	if err := d.check(fnStreamEndCapture, h, d.out(0)); err != nil {
		return nil, err
	}
	return &driverGraph{d: d, h: uintptr(d.u64(0)), owned: true}, nil
}

func (d *Driver) CaptureInfo(s Stream) (CaptureInfo, error) {
	h, err := d.streamHandle(fnStreamGetCaptureInfo, s)
	if err != nil {
		return CaptureInfo{}, err
	}
	if h == 0 {
		// The legacy default stream is never captured, and asking about it
		// while another stream captures in global mode would invalidate
		// that capture.
		return CaptureInfo{Status: CaptureNone}, nil
	}
	if err := d.begin(fnStreamGetCaptureInfo); err != nil {
		return CaptureInfo{}, err
	}
	defer d.mu.Unlock()
	// status@0 id@8 graph@16 deps@24 edgeData@32 numDeps@40
	if err := d.check(fnStreamGetCaptureInfo, h, d.out(0), d.out(8), d.out(16), d.out(24), d.out(32), d.out(40)); err != nil {
		return CaptureInfo{}, err
	}
	info := CaptureInfo{Status: CaptureStatus(d.i32(0))}
	if info.Status != CaptureActive {
		return info, nil
	}
	info.ID = d.u64(8)
	info.Graph = &driverGraph{d: d, h: uintptr(d.u64(16))}
	if n := d.u64(40); n > 0 {
		info.Terminals = nodeArray(*(*unsafe.Pointer)(unsafe.Add(d.scratch, 24)), n)
	}
	return info, nil
}

func (d *Driver) UpdateCaptureDependencies(s Stream, nodes []GraphNode, mode DepsMode) error {
	h, err := d.streamHandle(fnStreamUpdateCaptureDependencies, s)
	if err != nil {
		return err
	}
	if err := d.begin(fnStreamUpdateCaptureDependencies); err != nil {
		return err
	}
	defer d.mu.Unlock()
	arr, err := d.nodesToC(nodes)
	if err != nil {
		return err
	}
	return d.check(fnStreamUpdateCaptureDependencies, h, arr, 0, uintptr(len(nodes)), uintptr(mode))
}

// nodesToC copies node handles into C memory (bigBuf) and returns its
// address, or 0 for none.
func (d *Driver) nodesToC(nodes []GraphNode) (uintptr, error) {
	if len(nodes) == 0 {
		return 0, nil
	}
	buf, err := d.bigBuf(8 * uintptr(len(nodes)))
	if err != nil {
		return 0, err
	}
	for i, n := range nodes {
		*(*uintptr)(unsafe.Add(buf, 8*uintptr(i))) = uintptr(n)
	}
	return uintptr(buf), nil
}

// ---- graphs ----

type driverGraph struct {
	d     *Driver
	h     uintptr
	owned bool // false for the graph of a capture underway
}

type driverExec struct {
	d *Driver
	h uintptr
}

func (g *driverGraph) lock(f int) error {
	if err := g.d.begin(f); err != nil {
		return err
	}
	if g.h == 0 {
		g.d.mu.Unlock()
		return &Error{Op: fnNames[f], Code: ErrorInvalidHandle}
	}
	return nil
}

func (g *driverGraph) Nodes() ([]GraphNode, error) {
	d := g.d
	if err := g.lock(fnGraphGetNodes); err != nil {
		return nil, err
	}
	defer d.mu.Unlock()
	if err := d.check(fnGraphGetNodes, g.h, 0, d.out(0)); err != nil {
		return nil, err
	}
	n := d.u64(0)
	if n == 0 {
		return nil, nil
	}
	buf, err := d.bigBuf(uintptr(8 * n))
	if err != nil {
		return nil, err
	}
	*(*uint64)(d.scratch) = n // in: the array's capacity
	if err := d.check(fnGraphGetNodes, g.h, uintptr(buf), uintptr(d.scratch)); err != nil {
		return nil, err
	}
	return nodeArray(buf, min(n, d.u64(0))), nil
}

func (g *driverGraph) Dependencies(node GraphNode) ([]GraphNode, error) {
	d := g.d
	if err := g.lock(fnGraphNodeGetDependencies); err != nil {
		return nil, err
	}
	defer d.mu.Unlock()
	if err := d.check(fnGraphNodeGetDependencies, uintptr(node), 0, 0, d.out(0)); err != nil {
		return nil, err
	}
	n := d.u64(0)
	if n == 0 {
		return nil, nil
	}
	// Nodes at buf, edge data (8 bytes each) after them: passing edge data
	// avoids CUDA_ERROR_LOSSY_QUERY when an edge carries data.
	buf, err := d.bigBuf(uintptr(16 * n))
	if err != nil {
		return nil, err
	}
	*(*uint64)(d.scratch) = n // in: the arrays' capacity
	if err := d.check(fnGraphNodeGetDependencies, uintptr(node), uintptr(buf), uintptr(unsafe.Add(buf, 8*n)), uintptr(d.scratch)); err != nil {
		return nil, err
	}
	return nodeArray(buf, min(n, d.u64(0))), nil
}

func (g *driverGraph) NodeType(node GraphNode) (NodeType, error) {
	d := g.d
	if err := g.lock(fnGraphNodeGetType); err != nil {
		return 0, err
	}
	defer d.mu.Unlock()
	if err := d.check(fnGraphNodeGetType, uintptr(node), d.out(0)); err != nil {
		return 0, err
	}
	return NodeType(d.i32(0)), nil
}

func (g *driverGraph) AddEmptyNode(deps []GraphNode) (GraphNode, error) {
	d := g.d
	if err := g.lock(fnGraphAddEmptyNode); err != nil {
		return 0, err
	}
	defer d.mu.Unlock()
	arr, err := d.nodesToC(deps)
	if err != nil {
		return 0, err
	}
	if err := d.check(fnGraphAddEmptyNode, d.out(0), g.h, arr, uintptr(len(deps))); err != nil {
		return 0, err
	}
	return GraphNode(d.u64(0)), nil
}

func (g *driverGraph) Instantiate(flags InstantiateFlags) (Exec, error) {
	d := g.d
	if err := g.lock(fnGraphInstantiateWithFlags); err != nil {
		return nil, err
	}
	defer d.mu.Unlock()
	if err := d.check(fnGraphInstantiateWithFlags, d.out(0), g.h, uintptr(flags)); err != nil {
		return nil, err
	}
	return &driverExec{d: d, h: uintptr(d.u64(0))}, nil
}

func (g *driverGraph) Close() error {
	if !g.owned {
		return fmt.Errorf("cuda: graph of a capture underway: %w",
			&Error{Op: fnNames[fnGraphDestroy], Code: ErrorIllegalState})
	}
	if err := g.lock(fnGraphDestroy); err != nil {
		return err
	}
	defer g.d.mu.Unlock()
	if err := g.d.check(fnGraphDestroy, g.h); err != nil {
		return err
	}
	g.h = 0
	return nil
}

func (x *driverExec) lock(f int) error {
	if err := x.d.begin(f); err != nil {
		return err
	}
	if x.h == 0 {
		x.d.mu.Unlock()
		return &Error{Op: fnNames[f], Code: ErrorInvalidHandle}
	}
	return nil
}

func (x *driverExec) Launch(s Stream) error {
	sh, err := x.d.streamHandle(fnGraphLaunch, s)
	if err != nil {
		return err
	}
	if err := x.lock(fnGraphLaunch); err != nil {
		return err
	}
	defer x.d.mu.Unlock()
	return x.d.check(fnGraphLaunch, x.h, sh)
}

func (x *driverExec) Update(gr Graph) (UpdateResult, error) {
	d := x.d
	g, ok := gr.(*driverGraph)
	if !ok || g == nil || g.d != d || g.h == 0 {
		return UpdateError, &Error{Op: fnNames[fnGraphExecUpdate], Code: ErrorInvalidHandle}
	}
	if err := x.lock(fnGraphExecUpdate); err != nil {
		return UpdateError, err
	}
	defer d.mu.Unlock()
	// CUgraphExecUpdateResultInfo: result@0 errorNode@8 errorFromNode@16.
	clear(unsafe.Slice((*byte)(d.scratch), 24))
	r := d.call(fnGraphExecUpdate, x.h, g.h, uintptr(d.scratch))
	res := UpdateResult(d.i32(0))
	if r != Success {
		return res, d.err(fnGraphExecUpdate, r)
	}
	return res, nil
}

func (x *driverExec) Close() error {
	if err := x.lock(fnGraphExecDestroy); err != nil {
		return err
	}
	defer x.d.mu.Unlock()
	if err := x.d.check(fnGraphExecDestroy, x.h); err != nil {
		return err
	}
	x.h = 0
	return nil
}

// ---- virtual memory ----

const (
	propOff   = 128 // CUmemAllocationProp, 32 bytes
	accessOff = 192 // CUmemAccessDesc, 12 bytes
)

// prop writes a CUmemAllocationProp for pinned memory on this device into
// scratch and returns its address.
func (d *Driver) prop() uintptr {
	p := unsafe.Add(d.scratch, propOff)
	clear(unsafe.Slice((*byte)(p), 32))
	*(*int32)(p) = 1                            // CU_MEM_ALLOCATION_TYPE_PINNED
	*(*int32)(unsafe.Add(p, 8)) = 1             // CU_MEM_LOCATION_TYPE_DEVICE
	*(*int32)(unsafe.Add(p, 12)) = int32(d.dev) // location.id
	return uintptr(p)
}

func (d *Driver) Granularity(recommended bool) (uint64, error) {
	if err := d.begin(fnMemGetAllocationGranularity); err != nil {
		return 0, err
	}
	defer d.mu.Unlock()
	opt := uintptr(0)
	if recommended {
		opt = 1
	}
	if err := d.check(fnMemGetAllocationGranularity, d.out(0), d.prop(), opt); err != nil {
		return 0, err
	}
	return d.u64(0), nil
}

func (d *Driver) AddressReserve(size, alignment uint64) (DevicePtr, error) {
	if err := d.begin(fnMemAddressReserve); err != nil {
		return 0, err
	}
	defer d.mu.Unlock()
	if err := d.check(fnMemAddressReserve, d.out(0), uintptr(size), uintptr(alignment), 0, 0); err != nil {
		return 0, err
	}
	return DevicePtr(d.u64(0)), nil
}

func (d *Driver) AddressFree(p DevicePtr, size uint64) error {
	return d.locked(fnMemAddressFree, uintptr(p), uintptr(size))
}

func (d *Driver) MemCreate(size uint64) (MemHandle, error) {
	if err := d.begin(fnMemCreate); err != nil {
		return 0, err
	}
	defer d.mu.Unlock()
	if err := d.check(fnMemCreate, d.out(0), uintptr(size), d.prop(), 0); err != nil {
		return 0, err
	}
	return MemHandle(d.u64(0)), nil
}

func (d *Driver) MemRelease(h MemHandle) error { return d.locked(fnMemRelease, uintptr(h)) }

func (d *Driver) MemMap(p DevicePtr, size uint64, h MemHandle) error {
	return d.locked(fnMemMap, uintptr(p), uintptr(size), 0, uintptr(h), 0)
}

func (d *Driver) MemUnmap(p DevicePtr, size uint64) error {
	return d.locked(fnMemUnmap, uintptr(p), uintptr(size))
}

func (d *Driver) MemSetAccess(p DevicePtr, size uint64) error {
	if err := d.begin(fnMemSetAccess); err != nil {
		return err
	}
	defer d.mu.Unlock()
	a := unsafe.Add(d.scratch, accessOff)
	clear(unsafe.Slice((*byte)(a), 12))
	*(*int32)(a) = 1                           // CU_MEM_LOCATION_TYPE_DEVICE
	*(*int32)(unsafe.Add(a, 4)) = int32(d.dev) // location.id
	*(*int32)(unsafe.Add(a, 8)) = 3            // CU_MEM_ACCESS_FLAGS_PROT_READWRITE
	return d.check(fnMemSetAccess, uintptr(p), uintptr(size), uintptr(a), 1)
}

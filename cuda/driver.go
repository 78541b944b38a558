package cuda

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
)

// The driver functions bound, by their exact exported (versioned) names.
// Each Go call site passes the arguments of that exact ABI, as written in
// the CUDA 13.0 cuda.h (docs/cuda-brief.md §5.2).
const (
	fnInit = iota
	fnDriverGetVersion
	fnGetErrorName
	fnDeviceGet
	fnDeviceGetName
	fnDevicePrimaryCtxRetain
	fnDevicePrimaryCtxRelease
	fnCtxSetCurrent
	fnCtxSynchronize
	fnCtxGetCurrent
	fnMemGetInfo
	fnMemAlloc
	fnMemFree
	fnMemcpyHtoD
	fnMemcpyDtoH
	fnMemAllocHost
	fnMemFreeHost
	fnMemcpyDtoDAsync
	fnMemcpyHtoDAsync
	fnMemcpyDtoHAsync
	fnMemsetD32Async
	fnStreamCreate
	fnStreamDestroy
	fnStreamSynchronize
	fnStreamWaitEvent
	fnEventCreate
	fnEventRecord
	fnEventSynchronize
	fnEventQuery
	fnEventElapsedTime
	fnEventDestroy
	fnModuleLoadData
	fnModuleGetFunction
	fnModuleUnload
	fnLaunchKernel
	fnLaunchKernelEx
	fnDeviceGetAttribute
	fnStreamBeginCapture
	fnStreamEndCapture
	fnStreamGetCaptureInfo
	fnStreamUpdateCaptureDependencies
	fnGraphGetNodes
	fnGraphNodeGetDependencies
	fnGraphNodeGetType
	fnGraphAddEmptyNode
	fnGraphInstantiateWithFlags
	fnGraphLaunch
	fnGraphExecUpdate
	fnGraphExecDestroy
	fnGraphDestroy
	fnMemGetAllocationGranularity
	fnMemAddressReserve
	fnMemAddressFree
	fnMemCreate
	fnMemRelease
	fnMemMap
	fnMemUnmap
	fnMemSetAccess
	numFns
)

var fnNames = [numFns]string{
	fnInit:                            "cuInit",
	fnDriverGetVersion:                "cuDriverGetVersion",
	fnGetErrorName:                    "cuGetErrorName",
	fnDeviceGet:                       "cuDeviceGet",
	fnDeviceGetName:                   "cuDeviceGetName",
	fnDevicePrimaryCtxRetain:          "cuDevicePrimaryCtxRetain",
	fnDevicePrimaryCtxRelease:         "cuDevicePrimaryCtxRelease_v2",
	fnCtxSetCurrent:                   "cuCtxSetCurrent",
	fnCtxSynchronize:                  "cuCtxSynchronize",
	fnCtxGetCurrent:                   "cuCtxGetCurrent",
	fnMemGetInfo:                      "cuMemGetInfo_v2",
	fnMemAlloc:                        "cuMemAlloc_v2",
	fnMemFree:                         "cuMemFree_v2",
	fnMemcpyHtoD:                      "cuMemcpyHtoD_v2",
	fnMemcpyDtoH:                      "cuMemcpyDtoH_v2",
	fnMemAllocHost:                    "cuMemAllocHost_v2",
	fnMemFreeHost:                     "cuMemFreeHost",
	fnMemcpyDtoDAsync:                 "cuMemcpyDtoDAsync_v2",
	fnMemcpyHtoDAsync:                 "cuMemcpyHtoDAsync_v2",
	fnMemcpyDtoHAsync:                 "cuMemcpyDtoHAsync_v2",
	fnMemsetD32Async:                  "cuMemsetD32Async",
	fnStreamCreate:                    "cuStreamCreate",
	fnStreamDestroy:                   "cuStreamDestroy_v2",
	fnStreamSynchronize:               "cuStreamSynchronize",
	fnStreamWaitEvent:                 "cuStreamWaitEvent",
	fnEventCreate:                     "cuEventCreate",
	fnEventRecord:                     "cuEventRecord",
	fnEventSynchronize:                "cuEventSynchronize",
	fnEventQuery:                      "cuEventQuery",
	fnEventElapsedTime:                "cuEventElapsedTime",
	fnEventDestroy:                    "cuEventDestroy_v2",
	fnModuleLoadData:                  "cuModuleLoadData",
	fnModuleGetFunction:               "cuModuleGetFunction",
	fnModuleUnload:                    "cuModuleUnload",
	fnLaunchKernel:                    "cuLaunchKernel",
	fnLaunchKernelEx:                  "cuLaunchKernelEx",
	fnDeviceGetAttribute:              "cuDeviceGetAttribute",
	fnStreamBeginCapture:              "cuStreamBeginCapture_v2",
	fnStreamEndCapture:                "cuStreamEndCapture",
	fnStreamGetCaptureInfo:            "cuStreamGetCaptureInfo_v3",
	fnStreamUpdateCaptureDependencies: "cuStreamUpdateCaptureDependencies_v2",
	fnGraphGetNodes:                   "cuGraphGetNodes",
	fnGraphNodeGetDependencies:        "cuGraphNodeGetDependencies_v2",
	fnGraphNodeGetType:                "cuGraphNodeGetType",
	fnGraphAddEmptyNode:               "cuGraphAddEmptyNode",
	fnGraphInstantiateWithFlags:       "cuGraphInstantiateWithFlags",
	fnGraphLaunch:                     "cuGraphLaunch",
	fnGraphExecUpdate:                 "cuGraphExecUpdate_v2",
	fnGraphExecDestroy:                "cuGraphExecDestroy",
	fnGraphDestroy:                    "cuGraphDestroy",
	fnMemGetAllocationGranularity:     "cuMemGetAllocationGranularity",
	fnMemAddressReserve:               "cuMemAddressReserve",
	fnMemAddressFree:                  "cuMemAddressFree",
	fnMemCreate:                       "cuMemCreate",
	fnMemRelease:                      "cuMemRelease",
	fnMemMap:                          "cuMemMap",
	fnMemUnmap:                        "cuMemUnmap",
	fnMemSetAccess:                    "cuMemSetAccess",
}

// DriverLibrary is the file Open loads.
const DriverLibrary = "libcuda.so.1"

// scratchSize is the C memory for out-parameters and small structs.
const scratchSize = 4096

// Driver is a Device backed by the CUDA driver (libcuda.so.1).
type Driver struct {
	mu      sync.Mutex
	fn      [numFns]uintptr
	malloc  uintptr
	free    uintptr
	scratch unsafe.Pointer // scratchSize bytes of C memory
	big     unsafe.Pointer // C memory for arrays and kernel parameters
	bigCap  uintptr
	names   map[Result]string

	ordinal int
	dev     int32
	ctx     uintptr
	name    string
	version int
	ccMajor int
	ccMinor int
	sms     int
	closed  bool
	pinned  map[unsafe.Pointer]uint64 // PinnedAlloc memory not yet freed
	foreign map[uintptr]*driverStream // Foreign streams by handle
	guest   bool                      // OpenGuest: the host program owns the threads
}

var _ Device = (*Driver)(nil)

// Open loads libcuda.so.1, initialises the driver, retains the primary
// context of device ordinal and makes it current. It locks the calling
// goroutine to its OS thread for the life of the Driver (see the package
// documentation). Without a driver the error wraps ErrNoDriver.
func Open(ordinal int) (*Driver, error) { return OpenLibrary(DriverLibrary, ordinal) }

// OpenLibrary is Open with another library file (tests use it to check the
// errors for a missing library and for missing symbols).
func OpenLibrary(path string, ordinal int) (*Driver, error) {
	runtime.LockOSThread()
	d, err := openLibrary(path, ordinal)
	if err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	return d, nil
}

func openLibrary(path string, ordinal int) (*Driver, error) {
	lib, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		return nil, fmt.Errorf("cuda: %w: %v", ErrNoDriver, err)
	}
	d := &Driver{ordinal: ordinal, names: map[Result]string{}}
	var missing []string
	for i, name := range fnNames {
		p, err := purego.Dlsym(lib, name)
		if err != nil || p == 0 {
			missing = append(missing, name)
			continue
		}
		d.fn[i] = p
	}
	if len(missing) > 0 {
		purego.Dlclose(lib)
		return nil, fmt.Errorf("cuda: %s lacks %d of the %d driver functions this package binds (driver too old, or not the CUDA driver): %s",
			path, len(missing), numFns, strings.Join(missing, ", "))
	}
	libc, err := purego.Dlopen("libc.so.6", purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		return nil, fmt.Errorf("cuda: loading libc for C memory: %v", err)
	}
	if d.malloc, err = purego.Dlsym(libc, "malloc"); err == nil {
		d.free, err = purego.Dlsym(libc, "free")
	}
	if err != nil {
		return nil, fmt.Errorf("cuda: libc: %v", err)
	}
	if d.scratch = d.cmalloc(scratchSize); d.scratch == nil {
		return nil, errors.New("cuda: malloc of scratch memory failed")
	}
	if err := d.init(); err != nil {
		d.freeC()
		return nil, err
	}
	return d, nil
}

func (d *Driver) init() error {
	if r := d.call(fnInit, 0); r != Success {
		return fmt.Errorf("cuda: initialising the driver: %w", d.err(fnInit, r))
	}
	if r := d.call(fnDriverGetVersion, d.out(0)); r != Success {
		return d.err(fnDriverGetVersion, r)
	}
	d.version = int(d.i32(0))
	if r := d.call(fnDeviceGet, d.out(0), uintptr(d.ordinal)); r != Success {
		return fmt.Errorf("cuda: device %d: %w", d.ordinal, d.err(fnDeviceGet, r))
	}
	d.dev = d.i32(0)
	clear(unsafe.Slice((*byte)(d.scratch), 257))
	if r := d.call(fnDeviceGetName, d.out(0), 256, uintptr(d.dev)); r != Success {
		return d.err(fnDeviceGetName, r)
	}
	d.name = cString(d.scratch)
	for _, a := range [...]struct {
		attr uintptr
		dst  *int
		what string
	}{
		{cuDeviceAttributeComputeCapabilityMajor, &d.ccMajor, "compute capability"},
		{cuDeviceAttributeComputeCapabilityMinor, &d.ccMinor, "compute capability"},
		{cuDeviceAttributeMultiprocessorCount, &d.sms, "multiprocessor count"},
	} {
		if r := d.call(fnDeviceGetAttribute, d.out(0), a.attr, uintptr(d.dev)); r != Success {
			return fmt.Errorf("cuda: device %d: %s: %w", d.ordinal, a.what, d.err(fnDeviceGetAttribute, r))
		}
		*a.dst = int(d.i32(0))
	}
	if r := d.call(fnDevicePrimaryCtxRetain, d.out(0), uintptr(d.dev)); r != Success {
		return fmt.Errorf("cuda: device %d: %w", d.ordinal, d.err(fnDevicePrimaryCtxRetain, r))
	}
	d.ctx = uintptr(d.u64(0))
	if r := d.call(fnCtxSetCurrent, d.ctx); r != Success {
		d.call(fnDevicePrimaryCtxRelease, uintptr(d.dev))
		return d.err(fnCtxSetCurrent, r)
	}
	return nil
}

// Version is cuDriverGetVersion's answer (13000 for CUDA 13.0).
func (d *Driver) Version() int { return d.version }

func (d *Driver) Name() string { return d.name }

// CUdevice_attribute values.
const (
	cuDeviceAttributeMultiprocessorCount    = 16
	cuDeviceAttributeComputeCapabilityMajor = 75
	cuDeviceAttributeComputeCapabilityMinor = 76
)

// ComputeCapability is cuDeviceGetAttribute's COMPUTE_CAPABILITY_MAJOR
// and _MINOR, read when the device was opened.
func (d *Driver) ComputeCapability() (major, minor int, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return 0, 0, &Error{Op: fnNames[fnDeviceGetAttribute], Code: ErrorInvalidContext}
	}
	return d.ccMajor, d.ccMinor, nil
}

// Multiprocessors is cuDeviceGetAttribute's MULTIPROCESSOR_COUNT, read
// when the device was opened.
func (d *Driver) Multiprocessors() (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return 0, &Error{Op: fnNames[fnDeviceGetAttribute], Code: ErrorInvalidContext}
	}
	return d.sms, nil
}

func (d *Driver) BindThread() error {
	runtime.LockOSThread()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return &Error{Op: fnNames[fnCtxSetCurrent], Code: ErrorInvalidContext}
	}
	return d.check(fnCtxSetCurrent, d.ctx)
}

func (d *Driver) Synchronize() error { return d.locked(fnCtxSynchronize) }

// Close releases the primary context and the C memory, and undoes Open's
// thread lock when called from the goroutine that called Open. The
// library stays loaded: unloading libcuda is not safe.
func (d *Driver) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return &Error{Op: fnNames[fnDevicePrimaryCtxRelease], Code: ErrorInvalidContext}
	}
	d.closed = true
	var errs []error
	for p := range d.pinned {
		if err := d.check(fnMemFreeHost, uintptr(p)); err != nil {
			errs = append(errs, err)
		}
	}
	d.pinned = nil
	errs = append(errs, d.check(fnDevicePrimaryCtxRelease, uintptr(d.dev)))
	err := errors.Join(errs...)
	d.freeC()
	runtime.UnlockOSThread()
	return err
}

// ---- calling ----

// call calls driver function f. The arguments are integers or pointers to
// C memory.
func (d *Driver) call(f int, args ...uintptr) Result {
	r, _, _ := purego.SyscallN(d.fn[f], args...)
	return Result(int32(r))
}

// callGo is call for arguments that include Go pointers converted to
// uintptr in the call expression: uintptrescapes moves what they point to
// onto the heap, where it cannot move, and keeps it alive for the call.
//
//go:uintptrescapes
func (d *Driver) callGo(f int, args ...uintptr) Result {
	r, _, _ := purego.SyscallN(d.fn[f], args...)
	return Result(int32(r))
}

// check calls f and turns a failure into *Error.
func (d *Driver) check(f int, args ...uintptr) error {
	if r := d.call(f, args...); r != Success {
		return d.err(f, r)
	}
	return nil
}

// locked is check under the driver's lock.
func (d *Driver) locked(f int, args ...uintptr) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return &Error{Op: fnNames[f], Code: ErrorInvalidContext}
	}
	return d.check(f, args...)
}

func (d *Driver) err(f int, r Result) error {
	return &Error{Op: fnNames[f], Code: r, Name: d.errName(r)}
}

// errName asks the driver for its name of r (cached).
func (d *Driver) errName(r Result) string {
	if n, ok := d.names[r]; ok {
		return n
	}
	name := ""
	if d.scratch != nil {
		off := uintptr(scratchSize - 8)
		*(*unsafe.Pointer)(unsafe.Add(d.scratch, off)) = nil
		if d.call(fnGetErrorName, uintptr(uint32(r)), d.out(off)) == Success {
			name = cString(*(*unsafe.Pointer)(unsafe.Add(d.scratch, off)))
		}
	}
	d.names[r] = name
	return name
}

// ---- C memory ----

func (d *Driver) cmalloc(n uintptr) unsafe.Pointer {
	r, _, _ := purego.SyscallN(d.malloc, n)
	return *(*unsafe.Pointer)(unsafe.Pointer(&r))
}

func (d *Driver) cfree(p unsafe.Pointer) {
	if p != nil {
		purego.SyscallN(d.free, uintptr(p))
	}
}

func (d *Driver) freeC() {
	d.cfree(d.scratch)
	d.cfree(d.big)
	d.scratch, d.big, d.bigCap = nil, nil, 0
}

// bigBuf returns at least n bytes of C memory, zeroed; valid until the next
// bigBuf call (all under d.mu).
func (d *Driver) bigBuf(n uintptr) (unsafe.Pointer, error) {
	if n == 0 {
		n = 8
	}
	if n > d.bigCap {
		c := max(n, 2*d.bigCap, 4096)
		p := d.cmalloc(c)
		if p == nil {
			return nil, fmt.Errorf("cuda: malloc of %d bytes failed", c)
		}
		d.cfree(d.big)
		d.big, d.bigCap = p, c
	}
	clear(unsafe.Slice((*byte)(d.big), n))
	return d.big, nil
}

// out returns the address of scratch byte off, zeroing its 8 bytes.
func (d *Driver) out(off uintptr) uintptr {
	p := unsafe.Add(d.scratch, off)
	*(*uint64)(p) = 0
	return uintptr(p)
}

func (d *Driver) u64(off uintptr) uint64 { return *(*uint64)(unsafe.Add(d.scratch, off)) }
func (d *Driver) i32(off uintptr) int32  { return *(*int32)(unsafe.Add(d.scratch, off)) }
func (d *Driver) u32(off uintptr) uint32 { return *(*uint32)(unsafe.Add(d.scratch, off)) }

func cString(p unsafe.Pointer) string {
	if p == nil {
		return ""
	}
	n := 0
	for *(*byte)(unsafe.Add(p, n)) != 0 {
		n++
	}
	return string(unsafe.Slice((*byte)(p), n))
}

// nodeArray copies n CUgraphNode handles from C memory at p.
func nodeArray(p unsafe.Pointer, n uint64) []GraphNode {
	out := make([]GraphNode, n)
	for i := range out {
		out[i] = GraphNode(*(*uintptr)(unsafe.Add(p, uintptr(i)*8)))
	}
	return out
}

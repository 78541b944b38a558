package cuda

import (
	"strconv"
	"time"
)

// MemHandle is a physical allocation made by MemCreate
// (CUmemGenericAllocationHandle).
type MemHandle uint64

// GraphNode identifies one node of a graph (CUgraphNode). It is comparable,
// so callers can keep visited sets keyed by node. Zero is never a node.
type GraphNode uintptr

// Device is one CUDA device: the real driver (Open) or the simulation
// (OpenSim). Both behave alike on everything the conformance suite in
// package cudatest checks; arena and graphexec use only this interface.
//
// Calls that take a Stream enqueue work on it and, when the stream is being
// captured, add a node to the capture graph instead of running. Handles
// (Stream, Event, Module, Function, Graph, Exec) are only valid with the
// Device that made them.
//
// Goroutines: see the package documentation. In short, on the driver every
// call must come from an OS thread on which the device's context is current:
// the goroutine that called Open, or one that called BindThread.
type Device interface {
	// Name says which device this is ("NVIDIA H200", "sim").
	Name() string
	// BindThread locks the calling goroutine to its OS thread and makes
	// the device's context current on it. Open does this for its caller.
	// The simulation needs no binding; there it only locks the thread.
	BindThread() error
	// Synchronize waits until all work on the device has finished.
	Synchronize() error
	// Close releases the device (its primary context on the driver). Free
	// every handle first; Close does not chase them.
	Close() error

	// Alloc allocates size bytes (cuMemAlloc_v2), 256-byte aligned. It
	// fails and invalidates any global-mode capture underway.
	Alloc(size uint64) (DevicePtr, error)
	// Free frees an Alloc allocation (cuMemFree_v2); same capture rule.
	Free(p DevicePtr) error
	// MemGetInfo returns free and total device memory in bytes.
	MemGetInfo() (free, total uint64, err error)
	// CopyHtoD copies src to dst and returns when the copy is done.
	CopyHtoD(dst DevicePtr, src []byte) error
	// CopyDtoH copies len(dst) bytes from src and returns when done.
	CopyDtoH(dst []byte, src DevicePtr) error
	// PinnedAlloc returns size bytes of page-locked host memory
	// (cuMemAllocHost_v2): copies between it and the device run at the
	// bus's speed, where pageable memory goes through the driver's
	// staging buffers. The bytes are C memory, not Go's: give them back
	// with PinnedFree (Close frees what is left) and do not touch the
	// slice afterwards. Not for use during a stream capture.
	PinnedAlloc(size uint64) ([]byte, error)
	// PinnedFree releases memory from PinnedAlloc (cuMemFreeHost); b must
	// be the whole slice PinnedAlloc returned. Anything else, and a
	// second free, fails with ErrorInvalidValue before reaching the
	// driver.
	PinnedFree(b []byte) error
	// CopyHtoDAsync enqueues a copy of src to dst on s; src must stay
	// as it is until s has done it. From PinnedAlloc memory the copy runs
	// at the bus's speed while the host goes on; from other memory the
	// driver stages it (may return only once staged). Not during a
	// capture.
	CopyHtoDAsync(dst DevicePtr, src []byte, s Stream) error
	// CopyDtoHAsync enqueues a copy of len(dst) bytes from src into dst
	// on s: dst holds them once s is synchronized. Not during a capture.
	CopyDtoHAsync(dst []byte, src DevicePtr, s Stream) error
	// CopyDtoD enqueues a device-to-device copy of n bytes on s.
	CopyDtoD(dst, src DevicePtr, n uint64, s Stream) error
	// Memset32 enqueues setting count 32-bit words at p to value on s.
	Memset32(p DevicePtr, value uint32, count uint64, s Stream) error

	// NewStream creates a non-blocking stream.
	NewStream() (Stream, error)
	// Foreign returns the Stream for a CUstream handle that another part
	// of the process made (cudaStream_t is the same handle), 0 being the
	// legacy default stream; see Driver.Foreign.
	Foreign(h uintptr) (Stream, error)
	// NewEvent creates an event; timing says whether it records time.
	NewEvent(timing bool) (Event, error)
	// ElapsedTime returns the time between two completed, timed events.
	ElapsedTime(start, end Event) (time.Duration, error)

	// LoadModule loads a module from PTX text (cuModuleLoadData). On the
	// simulation every .entry of the PTX must have a registered kernel.
	LoadModule(ptx []byte) (Module, error)
	// Launch enqueues fn on s with the given arguments, in the order of
	// the kernel's parameters.
	Launch(fn Function, grid, block Dim3, sharedMem uint32, s Stream, args ...KernelArg) error

	// LaunchEx is Launch with a launch configuration (cuLaunchKernelEx).
	// With cfg.ProgrammaticSerialization the kernel may start before the
	// previous kernel on cfg.Stream has finished (programmatic dependent
	// launch, compute capability 9.0 and later): from the moment every
	// block of that kernel has executed griddepcontrol.launch_dependents
	// (or exited). The kernel must then execute griddepcontrol.wait before
	// it touches memory that the previous kernel writes or reads. In a
	// capture the dependency becomes a programmatic edge. Results are the
	// same as Launch's for kernels that follow that rule.
	LaunchEx(fn Function, cfg LaunchConfig, args ...KernelArg) error
	// ComputeCapability returns the device's compute capability (9.0 on
	// an H100 or H200).
	ComputeCapability() (major, minor int, err error)
	// Multiprocessors returns the device's multiprocessor count
	// (MULTIPROCESSOR_COUNT: 132 on an H100 SXM or H200), which launch
	// grids are sized by.
	Multiprocessors() (int, error)

	// BeginCapture starts capturing s in the given mode.
	BeginCapture(s Stream, mode CaptureMode) error
	// EndCapture ends the capture that began on s and returns its graph.
	// A capture that an illegal call invalidated returns an error with
	// code ErrorStreamCaptureInvalidated and no graph.
	EndCapture(s Stream) (Graph, error)
	// CaptureInfo reports whether s is capturing and, if so, the capture's
	// id, graph and the nodes that the next work on s will depend on.
	CaptureInfo(s Stream) (CaptureInfo, error)
	// UpdateCaptureDependencies adds to (DepsAdd) or replaces (DepsSet)
	// the nodes that the next captured work on s depends on.
	UpdateCaptureDependencies(s Stream, nodes []GraphNode, mode DepsMode) error

	// Granularity is the VMM granularity for pinned memory on this device.
	Granularity(recommended bool) (uint64, error)
	// AddressReserve reserves size bytes of virtual addresses.
	AddressReserve(size, alignment uint64) (DevicePtr, error)
	// AddressFree frees a reservation (with its reserved size).
	AddressFree(p DevicePtr, size uint64) error
	// MemCreate creates size bytes of physical memory on this device.
	MemCreate(size uint64) (MemHandle, error)
	// MemRelease releases a handle; memory goes back once it is unmapped.
	MemRelease(h MemHandle) error
	// MemMap maps the first size bytes of h at p.
	MemMap(p DevicePtr, size uint64, h MemHandle) error
	// MemUnmap unmaps [p, p+size).
	MemUnmap(p DevicePtr, size uint64) error
	// MemSetAccess makes [p, p+size) readable and writable by this device.
	MemSetAccess(p DevicePtr, size uint64) error
}

// LaunchConfig is the launch configuration of LaunchEx (CUlaunchConfig with
// its attributes).
type LaunchConfig struct {
	Grid, Block Dim3
	SharedMem   uint32
	Stream      Stream
	// ProgrammaticSerialization sets the launch attribute
	// CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION to 1.
	ProgrammaticSerialization bool
}

// Stream is an ordered queue of device work (CUstream).
type Stream interface {
	// Handle is the CUstream (0: the legacy default stream).
	Handle() uintptr
	// Synchronize waits until all work on the stream has finished.
	Synchronize() error
	// WaitEvent makes later work on the stream wait for e's last record.
	// During capture this is how streams fork and join.
	WaitEvent(e Event) error
	// Close destroys the stream.
	Close() error
}

// Event marks a point in a stream (CUevent).
type Event interface {
	// Record records the event at the current end of s.
	Record(s Stream) error
	// Synchronize waits until the recorded work has finished.
	Synchronize() error
	// Query returns nil when the recorded work has finished, an error with
	// code ErrorNotReady while it runs, and ErrorCapturedEvent when the
	// event was recorded in a capture that is still underway.
	Query() error
	// Close destroys the event.
	Close() error
}

// Module is loaded device code (CUmodule).
type Module interface {
	// Function looks a kernel up by its PTX entry name; a missing name is
	// an error with code ErrorNotFound.
	Function(name string) (Function, error)
	// Close unloads the module.
	Close() error
}

// Function is a kernel of a loaded module (CUfunction).
type Function interface {
	Name() string
}

// Graph is a graph of device work, built by capture (CUgraph).
type Graph interface {
	// Nodes returns every node of the graph.
	Nodes() ([]GraphNode, error)
	// Dependencies returns the nodes n depends on
	// (cuGraphNodeGetDependencies_v2).
	Dependencies(n GraphNode) ([]GraphNode, error)
	// NodeType returns the kind of n.
	NodeType(n GraphNode) (NodeType, error)
	// AddEmptyNode adds a node that does nothing and depends on deps.
	// Legal while the graph is being captured.
	AddEmptyNode(deps []GraphNode) (GraphNode, error)
	// Instantiate makes an executable graph
	// (cuGraphInstantiateWithFlags).
	Instantiate(flags InstantiateFlags) (Exec, error)
	// Close destroys the graph. A graph that CaptureInfo returned belongs
	// to its capture; closing it is an error.
	Close() error
}

// Exec is an instantiated graph (CUgraphExec).
type Exec interface {
	// Launch enqueues one replay of the graph on s.
	Launch(s Stream) error
	// Update takes g's parameters into the exec without re-instantiating
	// (cuGraphExecUpdate_v2). When g's topology differs the result says
	// why and the error has code ErrorGraphExecUpdateFailure.
	Update(g Graph) (UpdateResult, error)
	// Close destroys the exec.
	Close() error
}

// CaptureMode is CUstreamCaptureMode.
type CaptureMode int32

const (
	CaptureModeGlobal      CaptureMode = 0
	CaptureModeThreadLocal CaptureMode = 1
	CaptureModeRelaxed     CaptureMode = 2
)

// CaptureStatus is CUstreamCaptureStatus.
type CaptureStatus int32

const (
	CaptureNone        CaptureStatus = 0
	CaptureActive      CaptureStatus = 1
	CaptureInvalidated CaptureStatus = 2
)

func (s CaptureStatus) String() string {
	switch s {
	case CaptureNone:
		return "NONE"
	case CaptureActive:
		return "ACTIVE"
	case CaptureInvalidated:
		return "INVALIDATED"
	}
	return "CaptureStatus(" + strconv.Itoa(int(s)) + ")"
}

// CaptureInfo is what cuStreamGetCaptureInfo_v3 reports about a stream.
// Terminals is a copy: it stays valid after later calls.
type CaptureInfo struct {
	Status    CaptureStatus
	ID        uint64
	Graph     Graph // the capture's graph while Status is CaptureActive
	Terminals []GraphNode
}

// DepsMode says how UpdateCaptureDependencies treats the given nodes.
type DepsMode uint32

const (
	DepsAdd DepsMode = 0 // CU_STREAM_ADD_CAPTURE_DEPENDENCIES
	DepsSet DepsMode = 1 // CU_STREAM_SET_CAPTURE_DEPENDENCIES
)

// InstantiateFlags are CUgraphInstantiate_flags.
type InstantiateFlags uint64

const (
	InstantiateAutoFreeOnLaunch InstantiateFlags = 1
	InstantiateUpload           InstantiateFlags = 2
	InstantiateDeviceLaunch     InstantiateFlags = 4
	InstantiateUseNodePriority  InstantiateFlags = 8
)

// NodeType is CUgraphNodeType.
type NodeType int32

const (
	NodeKernel      NodeType = 0
	NodeMemcpy      NodeType = 1
	NodeMemset      NodeType = 2
	NodeHost        NodeType = 3
	NodeGraph       NodeType = 4
	NodeEmpty       NodeType = 5
	NodeWaitEvent   NodeType = 6
	NodeEventRecord NodeType = 7
	NodeMemAlloc    NodeType = 10
	NodeMemFree     NodeType = 11
)

func (t NodeType) String() string {
	switch t {
	case NodeKernel:
		return "KERNEL"
	case NodeMemcpy:
		return "MEMCPY"
	case NodeMemset:
		return "MEMSET"
	case NodeHost:
		return "HOST"
	case NodeGraph:
		return "GRAPH"
	case NodeEmpty:
		return "EMPTY"
	case NodeWaitEvent:
		return "WAIT_EVENT"
	case NodeEventRecord:
		return "EVENT_RECORD"
	case NodeMemAlloc:
		return "MEM_ALLOC"
	case NodeMemFree:
		return "MEM_FREE"
	}
	return "NodeType(" + strconv.Itoa(int(t)) + ")"
}

// UpdateResult is CUgraphExecUpdateResult.
type UpdateResult int32

const (
	UpdateSuccess                   UpdateResult = 0
	UpdateError                     UpdateResult = 1
	UpdateTopologyChanged           UpdateResult = 2
	UpdateNodeTypeChanged           UpdateResult = 3
	UpdateFunctionChanged           UpdateResult = 4
	UpdateParametersChanged         UpdateResult = 5
	UpdateNotSupported              UpdateResult = 6
	UpdateUnsupportedFunctionChange UpdateResult = 7
	UpdateAttributesChanged         UpdateResult = 8
)

var updateResultNames = [...]string{
	"SUCCESS", "ERROR", "TOPOLOGY_CHANGED", "NODE_TYPE_CHANGED",
	"FUNCTION_CHANGED", "PARAMETERS_CHANGED", "NOT_SUPPORTED",
	"UNSUPPORTED_FUNCTION_CHANGE", "ATTRIBUTES_CHANGED",
}

func (r UpdateResult) String() string {
	if r >= 0 && int(r) < len(updateResultNames) {
		return updateResultNames[r]
	}
	return "UpdateResult(" + strconv.Itoa(int(r)) + ")"
}

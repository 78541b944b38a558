package cuda

import "github.com/arenaplan/arenaplan/launch"

// The values of a launch live in package launch (so that a graph
// description links no driver binding); these are the same types.
type (
	// DevicePtr is a device virtual address (CUdeviceptr).
	DevicePtr = launch.DevicePtr
	// Dim3 is a launch grid or block shape.
	Dim3 = launch.Dim3
	// ArgKind is the parameter type a KernelArg carries.
	ArgKind = launch.ArgKind
	// KernelArg is one kernel parameter: a device pointer or a scalar.
	KernelArg = launch.KernelArg
	// SimMemory gives a simulated kernel raw access to device memory.
	SimMemory = launch.SimMemory
	// KernelFunc is the Go reference of one PTX kernel.
	KernelFunc = launch.KernelFunc
)

// The kinds of KernelArg.
const (
	ArgPtr = launch.ArgPtr
	ArgU32 = launch.ArgU32
	ArgU64 = launch.ArgU64
	ArgF32 = launch.ArgF32
	ArgF64 = launch.ArgF64
)

// D1 returns the one-dimensional shape {n, 1, 1}.
func D1(n uint32) Dim3 { return launch.D1(n) }

// Ptr is a device pointer argument.
func Ptr(p DevicePtr) KernelArg { return launch.Ptr(p) }

// U32 is a 32-bit unsigned argument.
func U32(v uint32) KernelArg { return launch.U32(v) }

// I32 is a 32-bit signed argument.
func I32(v int32) KernelArg { return launch.I32(v) }

// U64 is a 64-bit unsigned argument.
func U64(v uint64) KernelArg { return launch.U64(v) }

// I64 is a 64-bit signed argument.
func I64(v int64) KernelArg { return launch.I64(v) }

// F32 is a float32 argument.
func F32(v float32) KernelArg { return launch.F32(v) }

// F64 is a float64 argument.
func F64(v float64) KernelArg { return launch.F64(v) }

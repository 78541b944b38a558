package launch

import (
	"fmt"
	"math"
)

// ArgKind is the parameter type a KernelArg carries.
type ArgKind uint8

const (
	ArgPtr ArgKind = iota + 1 // .u64 device pointer
	ArgU32                    // .u32 / .s32
	ArgU64                    // .u64 / .s64
	ArgF32                    // .f32
	ArgF64                    // .f64
)

// KernelArg is one kernel parameter: a device pointer or a scalar, by
// value. The driver copies it into memory outside the Go heap before
// cuLaunchKernel; the simulation hands it to the kernel's Go reference.
type KernelArg struct {
	Kind ArgKind
	Bits uint64 // the value's bits, zero-extended
}

// Ptr is a device pointer argument.
func Ptr(p DevicePtr) KernelArg { return KernelArg{ArgPtr, uint64(p)} }

// U32 is a 32-bit unsigned argument.
func U32(v uint32) KernelArg { return KernelArg{ArgU32, uint64(v)} }

// I32 is a 32-bit signed argument.
func I32(v int32) KernelArg { return KernelArg{ArgU32, uint64(uint32(v))} }

// U64 is a 64-bit unsigned argument.
func U64(v uint64) KernelArg { return KernelArg{ArgU64, v} }

// I64 is a 64-bit signed argument.
func I64(v int64) KernelArg { return KernelArg{ArgU64, uint64(v)} }

// F32 is a float32 argument.
func F32(v float32) KernelArg { return KernelArg{ArgF32, uint64(math.Float32bits(v))} }

// F64 is a float64 argument.
func F64(v float64) KernelArg { return KernelArg{ArgF64, math.Float64bits(v)} }

// Size is the argument's size in bytes as the kernel sees it.
func (a KernelArg) Size() int {
	switch a.Kind {
	case ArgU32, ArgF32:
		return 4
	}
	return 8
}

// AsPtr, AsU32, AsI32, AsU64, AsF32 and AsF64 read the value back (for Go
// reference kernels); they do not check Kind.
func (a KernelArg) AsPtr() DevicePtr { return DevicePtr(a.Bits) }
func (a KernelArg) AsU32() uint32    { return uint32(a.Bits) }
func (a KernelArg) AsI32() int32     { return int32(uint32(a.Bits)) }
func (a KernelArg) AsU64() uint64    { return a.Bits }
func (a KernelArg) AsF32() float32   { return math.Float32frombits(uint32(a.Bits)) }
func (a KernelArg) AsF64() float64   { return math.Float64frombits(a.Bits) }

func (a KernelArg) String() string {
	switch a.Kind {
	case ArgPtr:
		return fmt.Sprintf("ptr(%#x)", a.Bits)
	case ArgU32:
		return fmt.Sprintf("u32(%d)", uint32(a.Bits))
	case ArgU64:
		return fmt.Sprintf("u64(%d)", a.Bits)
	case ArgF32:
		return fmt.Sprintf("f32(%g)", a.AsF32())
	case ArgF64:
		return fmt.Sprintf("f64(%g)", a.AsF64())
	}
	return fmt.Sprintf("arg(%d,%#x)", a.Kind, a.Bits)
}

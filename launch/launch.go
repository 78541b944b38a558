// Package launch holds the plain values a kernel launch is described with
// (device addresses, grid and block shapes, kernel parameters), the shape
// of a kernel's Go reference, and what a PTX module says about its launch
// (its target, the entries that may launch with programmatic dependent
// launch).
//
// It is the part of package cuda that describes a launch without making
// one: package cuda declares these types as aliases, so they are the same
// types there, and a graph description, the built-in workloads and the
// plan command use them without linking the driver binding. It makes no
// call to any device and holds no state.
package launch

// DevicePtr is a device virtual address (CUdeviceptr). It is a number, not a
// Go pointer: arithmetic on it is address arithmetic on the device.
type DevicePtr uint64

// Add returns p advanced by n bytes.
func (p DevicePtr) Add(n uint64) DevicePtr { return p + DevicePtr(n) }

// Dim3 is a launch grid or block shape.
type Dim3 struct{ X, Y, Z uint32 }

// D1 returns the one-dimensional shape {n, 1, 1}.
func D1(n uint32) Dim3 { return Dim3{n, 1, 1} }

// Count returns X*Y*Z.
func (d Dim3) Count() uint64 { return uint64(d.X) * uint64(d.Y) * uint64(d.Z) }

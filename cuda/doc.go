// Package cuda binds the CUDA driver API at run time (dlopen of
// libcuda.so.1 through purego: no cgo, no toolkit needed to build) and
// provides a simulated device with the same surface for machines without a
// GPU. Both implement Device; arena and graphexec use only that interface.
//
// It is not a runtime-API wrapper, knows nothing about plans, and covers
// only what the project needs: one device's primary context, streams,
// events, memory, PTX modules, kernel launch, stream capture, graphs and
// virtual memory management (VMM).
//
// # Choosing a device
//
// Open(ordinal) loads the driver; on a machine without one it returns an
// error that wraps ErrNoDriver ("no CUDA driver: ..."), never a crash.
// OpenSim(SimConfig) returns the simulation, whose kernels are Go functions
// registered by PTX entry name. Package cudatest holds a conformance suite
// that runs the same cases on both and prints one canonical line per case,
// so that a GPU run and a simulated run can be compared line by line.
//
// # Goroutines and OS threads
//
// The driver keeps the current context, and the mode of a stream capture,
// per OS thread. Open therefore locks the calling goroutine to its OS
// thread (runtime.LockOSThread) and makes the device's primary context
// current there; every later call on the Device and its handles must come
// from that goroutine, or from another goroutine that first called
// BindThread (which locks that goroutine's thread and makes the context
// current on it). A capture belongs to the thread that began it: in global
// or thread-local mode, unsafe calls (Alloc, Free, synchronous copies,
// synchronisation) made during it fail with ErrorStreamCaptureUnsupported
// and invalidate it. The driver binding serialises its calls with a mutex,
// because out-parameters and kernel parameter arrays live in one block of C
// memory per device; that makes concurrent calls safe but not parallel.
//
// The simulation follows the same rule: OpenSim locks the calling
// goroutine to its thread, and a call from a thread that neither opened
// the device nor called BindThread fails with ErrorInvalidContext, as on
// the driver (SimConfig.Guest lifts the rule, as OpenGuest does).
//
// # Memory that the driver sees
//
// DevicePtr is a uint64, never a Go pointer. Out-parameters and kernel
// parameter arrays are written into memory from libc malloc, outside the Go
// heap, so the garbage collector can neither move nor free them during a
// call. Synchronous copies read and write the caller's Go slice directly for
// the duration of the call only; there are no asynchronous host copies.
//
// # Errors
//
// A failed call returns *Error{Op, Code} with the driver's own name for the
// code (cuGetErrorName at run time, a static table otherwise); errors.Is
// works against Result constants such as ErrorStreamCaptureUnsupported.
// Nothing in this package panics across its boundary, and nothing is freed
// by finalizers: every handle has a Close method.
package cuda

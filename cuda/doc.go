// Package cuda binds the CUDA driver API at run time (dlopen of
// libcuda.so.1, no cgo, no toolkit needed to build) and provides a
// simulated device with the same surface for machines without a GPU.
//
// It is not a runtime-API wrapper and knows nothing about plans.
package cuda

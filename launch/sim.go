package launch

// SimMemory gives a simulated kernel raw access to device memory.
type SimMemory interface {
	// Bytes returns the n bytes at p. The slice aliases device memory
	// and is valid only while the kernel runs. A range that is not wholly
	// allocated, or mapped with access set, is an error with code
	// CUDA_ERROR_ILLEGAL_ADDRESS.
	Bytes(p DevicePtr, n uint64) ([]byte, error)
}

// KernelFunc is the Go reference of one PTX kernel, as the simulated device
// of package cuda runs it. It runs the whole grid; args are as given to
// the launch. It must not call back into the device.
type KernelFunc func(mem SimMemory, grid, block Dim3, args []KernelArg) error

//go:build linux

package cuda

import (
	"syscall"
	"unsafe"
)

// Host memory of the simulated device on Linux: anonymous mappings outside
// the Go heap, so that what the simulation frees goes back to the system at
// once (no garbage waiting for a collection, no heap goal at twice the
// live bytes), and a reservation's backing grows with mremap, which moves
// page tables instead of copying bytes.

// hostMapMin is the size from which hostAlloc maps memory of its own;
// smaller blocks are Go memory (a mapping each would cost a page and a
// kernel object).
const hostMapMin = 64 << 10

var hostPage = uint64(syscall.Getpagesize())

const mremapMayMove = 1 // MREMAP_MAYMOVE

func mapAnon(n uint64) ([]byte, error) {
	size := alignUp(n, hostPage)
	b, err := syscall.Mmap(-1, 0, int(size), syscall.PROT_READ|syscall.PROT_WRITE,
		syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS|syscall.MAP_NORESERVE)
	if err != nil {
		return nil, err
	}
	return b[:n:size], nil
}

// hostAlloc returns n zero bytes that hostFree gives back.
func hostAlloc(n uint64) ([]byte, error) {
	if n < hostMapMin {
		return make([]byte, n), nil
	}
	return mapAnon(n)
}

// hostFree gives back memory from hostAlloc (b with its full capacity).
func hostFree(b []byte) {
	if cap(b) < hostMapMin {
		return // Go memory: the collector takes it
	}
	syscall.Munmap(b[:cap(b)])
}

// hostGrow returns b (a reservation's backing from hostGrow, or nil)
// extended to n bytes, the new bytes zero; b must not be used afterwards.
// The mapping is one area that only ever grows, so mremap can extend or
// move it without copying.
func hostGrow(b []byte, n uint64) ([]byte, error) {
	if b == nil {
		return mapAnon(n)
	}
	size := alignUp(n, hostPage)
	old := uint64(cap(b))
	if size <= old {
		return b[:n:old], nil
	}
	addr, _, errno := syscall.Syscall6(syscall.SYS_MREMAP, uintptr(unsafe.Pointer(unsafe.SliceData(b))),
		uintptr(old), uintptr(size), mremapMayMove, 0, 0)
	if errno != 0 {
		return nil, errno
	}
	// The address came from the kernel, outside the Go heap; this form
	// of the conversion keeps go vet's unsafeptr check quiet.
	p := *(*unsafe.Pointer)(unsafe.Pointer(&addr))
	return unsafe.Slice((*byte)(p), size)[:n:size], nil
}

// hostUnmap gives back a reservation's backing from hostGrow.
func hostUnmap(b []byte) {
	if b != nil {
		syscall.Munmap(b[:cap(b)])
	}
}

// hostDiscard zeroes b, a part of a reservation's backing from hostGrow,
// and gives its whole pages back to the system.
func hostDiscard(b []byte) {
	if len(b) == 0 {
		return
	}
	start := uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b))))
	lo := alignUp(start, hostPage) - start
	hi := (start + uint64(len(b))) &^ (hostPage - 1)
	if hi <= start+lo {
		clearChunked(b)
		return
	}
	hi -= start
	clear(b[:lo])
	clear(b[hi:])
	if syscall.Madvise(b[lo:hi], syscall.MADV_DONTNEED) != nil {
		clearChunked(b[lo:hi])
	}
}

// currentThread is the calling OS thread's id: the simulation keeps its
// context current per thread, as the driver does.
func currentThread() int { return syscall.Gettid() }

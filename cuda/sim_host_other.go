//go:build !linux

package cuda

// Host memory of the simulated device elsewhere than on Linux: Go memory.
// It is correct but not bounded as on Linux: freed bytes wait for the
// collector, and a reservation's backing grows by copying it.

const hostMapMin = 1 << 62 // nothing is mapped apart

func hostAlloc(n uint64) ([]byte, error) { return make([]byte, n), nil }

func hostFree(b []byte) {}

func hostGrow(b []byte, n uint64) ([]byte, error) {
	if n <= uint64(cap(b)) {
		return b[:n], nil
	}
	grown := make([]byte, n, max(n, uint64(cap(b))+uint64(cap(b))/4))
	copyChunked(grown, b)
	return grown, nil
}

func hostUnmap(b []byte) {}

func hostDiscard(b []byte) { clearChunked(b) }

// currentThread is 0 elsewhere than on Linux: every thread counts as the
// one the context is current on, so the simulation checks no thread there.
func currentThread() int { return 0 }

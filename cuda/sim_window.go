package cuda

import (
	"fmt"
	"sync"
)

// Each open Sim hands out addresses from a window of its own, as the
// driver's unified addressing gives the devices of one process disjoint
// addresses: a pointer names its device, which callers rely on (PyTorch's
// record_stream hook, say, passes a pointer and no device). Windows are
// 256 TiB apart, far more than a simulated device reserves, and go back to
// the pool at Close. The first begins at 256 TiB, above every address a
// process's own mappings get (the kernel maps below 128 TiB unless asked
// for more): a simulated address is never also a host one, which C code
// handed it, or Go's checks of pointers passed through cgo, would take
// for that memory (a library's data, mapped where the first window once
// began, made cgo's check fail a pointer returned to C).
const (
	simWindowBase = 1 << 48
	simWindowSize = 1 << 48
	simWindows    = 4096
)

var simWindowPool struct {
	sync.Mutex
	used [simWindows]bool
}

// takeSimWindow returns the first free window's index and base address.
func takeSimWindow() (int, uint64, error) {
	simWindowPool.Lock()
	defer simWindowPool.Unlock()
	for i, used := range simWindowPool.used {
		if !used {
			simWindowPool.used[i] = true
			return i, simWindowBase + uint64(i)*simWindowSize, nil
		}
	}
	return 0, 0, fmt.Errorf("cuda: OpenSim: %d simulated devices open at once; close some", simWindows)
}

func giveSimWindow(i int) {
	simWindowPool.Lock()
	simWindowPool.used[i] = false
	simWindowPool.Unlock()
}

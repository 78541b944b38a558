package cuda

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// SimDefaultMemory is the simulated device's memory (16 GiB) when the host
// has room for it; see SizedSimConfig.
const SimDefaultMemory = 16 << 30

// SizedSimConfig is a SimConfig with the given kernels whose device memory
// fits this host: SimDefaultMemory, or three quarters of the host's
// available memory where that is less. The simulated device's memory is
// host memory, so a device larger than the host could hold would let an
// oversized arena kill the process instead of failing with
// CUDA_ERROR_OUT_OF_MEMORY.
func SizedSimConfig(kernels map[string]KernelFunc) SimConfig {
	total := uint64(SimDefaultMemory)
	if avail := memAvailable(); avail > 0 {
		total = min(total, avail/4*3)
	}
	return SimConfig{Kernels: kernels, TotalMemory: total}
}

// memAvailable reads MemAvailable from /proc/meminfo (0 when unknown).
func memAvailable() uint64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "MemAvailable:" {
			kb, err := strconv.ParseUint(fields[1], 10, 64)
			if err != nil {
				return 0
			}
			return kb << 10
		}
	}
	return 0
}

// OpenAuto is the device a program that must run anywhere takes: GPU 0
// when a CUDA driver is present (Open(0)), else the simulated device
// OpenSim(sim). The string says which it chose and why. A driver that is
// present but fails to open GPU 0 is an error, never a quiet fall back to
// the simulation. Like Open, it locks the calling goroutine to its thread.
func OpenAuto(sim SimConfig) (Device, string, error) {
	d, err := Open(0)
	if err == nil {
		return d, "cuda:0, a CUDA driver is present", nil
	}
	if !errors.Is(err, ErrNoDriver) {
		return nil, "", fmt.Errorf("cuda: OpenAuto: a CUDA driver is present but GPU 0 did not open: %w", err)
	}
	s, err := OpenSim(sim)
	if err != nil {
		return nil, "", err
	}
	return s, "sim, no CUDA driver", nil
}

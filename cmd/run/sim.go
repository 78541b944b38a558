package main

import (
	"bufio"
	"os"
	"strconv"
	"strings"

	"github.com/arenaplan/arenaplan/cuda"
)

// simDefaultMemory is the simulated device's memory when the host has room.
const simDefaultMemory = 16 << 30

// simConfig sizes the simulated device to what this host can hold: its
// memory is host memory, so a device larger than the host's available
// memory would let an oversized arena kill the process instead of failing
// with CUDA_ERROR_OUT_OF_MEMORY.
func simConfig() cuda.SimConfig {
	total := uint64(simDefaultMemory)
	if avail := memAvailable(); avail > 0 {
		total = min(total, avail/4*3)
	}
	return cuda.SimConfig{Kernels: simKernels(), TotalMemory: total}
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

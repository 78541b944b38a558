package bridge

// The bridge's configuration, from code or the environment.

import (
	"fmt"
	"os"
	"strconv"

	"github.com/arenaplan/arenaplan/cuda"
)

// Config says how a Bridge opens its devices.
type Config struct {
	// Open opens device ordinal. Nil: the CUDA driver as a guest of the
	// host program (cuda.OpenGuest), or the simulation when Sim is set.
	Open func(ordinal int) (cuda.Device, error)
	// Sim opens simulated devices (ARENAPLAN_DEVICE=sim).
	Sim bool
	// SimMemory is each simulated device's memory (default 16 GiB).
	SimMemory uint64
	// SimDevices is how many simulated devices there are (default 8, as
	// on an 8-GPU machine): a larger ordinal is refused, as the driver
	// refuses one beyond its devices.
	SimDevices int
	// SpillAddressSpace is the virtual address space each device's spill
	// allocator reserves (default: four times the device's total memory,
	// so that scattered live segments never leave a request that the
	// device's memory could hold without a run of addresses for it).
	SpillAddressSpace uint64
	// SpillChunk is the unit the spill allocator grows by (default the
	// device's VMM granularity, 2 MiB).
	SpillChunk uint64
	// SpillPlain grows the spill allocator with cuMemAlloc outside
	// captures (spill.WithPlainSegments; ARENAPLAN_SPILL_PLAIN=1).
	SpillPlain bool
	// Rank and WorldSize say which process of a tensor-parallel job this
	// is (torchrun's RANK and WORLD_SIZE): plan files record them and a
	// plan made by another rank or world size is refused. Zero values: a
	// single process.
	Rank, WorldSize int
	// ThreadID names the calling thread for regions (BeginRegion); nil:
	// the operating system's thread id (gettid on Linux), which the host
	// program knows too (Python's threading.get_native_id).
	ThreadID func() int
}

// ConfigFromEnv reads ARENAPLAN_DEVICE ("sim" or "cuda", default cuda),
// ARENAPLAN_SIM_MEMORY, ARENAPLAN_SIM_DEVICES, ARENAPLAN_SPILL_ADDRESS_SPACE and
// ARENAPLAN_SPILL_CHUNK (bytes), and torchrun's RANK and WORLD_SIZE, with
// getenv (nil: os.Getenv). A Go shared library must pass C's getenv: its
// os.Getenv sees the environment the process started with, not what the
// host program set since.
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	var c Config
	switch v := getenv("ARENAPLAN_DEVICE"); v {
	case "", "cuda":
	case "sim":
		c.Sim = true
	default:
		return c, fmt.Errorf("bridge: ARENAPLAN_DEVICE=%q: want sim or cuda", v)
	}
	switch v := getenv("ARENAPLAN_SPILL_PLAIN"); v {
	case "", "0":
	case "1":
		c.SpillPlain = true
	default:
		return c, fmt.Errorf("bridge: ARENAPLAN_SPILL_PLAIN=%q: want 0 or 1", v)
	}
	for _, e := range []struct {
		name string
		dst  *int
		min  int
	}{{"RANK", &c.Rank, 0}, {"WORLD_SIZE", &c.WorldSize, 1}, {"ARENAPLAN_SIM_DEVICES", &c.SimDevices, 1}} {
		if v := getenv(e.name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < e.min {
				return c, fmt.Errorf("bridge: %s=%q: want a whole number of at least %d", e.name, v, e.min)
			}
			*e.dst = n
		}
	}
	if c.Rank >= max(c.WorldSize, 1) {
		return c, fmt.Errorf("bridge: RANK=%d is not below WORLD_SIZE=%d", c.Rank, max(c.WorldSize, 1))
	}
	for _, e := range []struct {
		name string
		dst  *uint64
	}{{"ARENAPLAN_SIM_MEMORY", &c.SimMemory}, {"ARENAPLAN_SPILL_ADDRESS_SPACE", &c.SpillAddressSpace},
		{"ARENAPLAN_SPILL_CHUNK", &c.SpillChunk}} {
		if v := getenv(e.name); v != "" {
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil || n == 0 {
				return c, fmt.Errorf("bridge: %s=%q: want a positive number of bytes", e.name, v)
			}
			*e.dst = n
		}
	}
	return c, nil
}

package main

/*
#include "fastpath.h"
*/
import "C"

import "github.com/arenaplan/arenaplan/bridge"

// counts reads device's allocator counts from the C library (fastpath.c
// counts every allocation and free, fast path or not).
func counts(device int) bridge.AllocatorCounts {
	var d C.ap_dev_stats
	C.ap_dev_read(C.int(device), &d)
	pools := func(p *[3]C.ap_stat) bridge.Pools {
		s := func(i int) bridge.Stat {
			return bridge.Stat{Current: int64(p[i].current), Peak: int64(p[i].peak),
				Allocated: int64(p[i].allocated), Freed: int64(p[i].freed)}
		}
		return bridge.Pools{All: s(0), Small: s(1), Large: s(2)}
	}
	return bridge.AllocatorCounts{Allocation: pools(&d.allocation), AllocatedBytes: pools(&d.allocated_bytes),
		RequestedBytes: pools(&d.requested_bytes), OutOfMemory: uint64(d.num_ooms), Retries: uint64(d.num_alloc_retries)}
}

// arenaplan_memory_stats sets *out to device's statistics as JSON, in the
// schema of PyTorch's torch.cuda.memory_stats before flattening
// (bridge.TorchMemoryStats). Like the other statistics calls here, it
// leaves the fast path open (reader).
//
//export arenaplan_memory_stats
func arenaplan_memory_stats(device C.int, out **C.char) *C.char {
	return reader("arenaplan_memory_stats", func(b *bridge.Bridge) error {
		return setJSON("arenaplan_memory_stats", out, func() (any, error) {
			st, err := b.Stats(int(device))
			if err != nil {
				return nil, err
			}
			return bridge.TorchMemoryStats(counts(int(device)), st), nil
		})
	})
}

// arenaplan_reset_peak_stats sets device's peaks to their current values
// (torch.cuda.reset_peak_memory_stats).
//
//export arenaplan_reset_peak_stats
func arenaplan_reset_peak_stats(device C.int) *C.char {
	return reader("arenaplan_reset_peak_stats", func(b *bridge.Bridge) error {
		C.ap_dev_reset_peak(device)
		return b.ResetPeaks(int(device))
	})
}

// arenaplan_reset_accumulated_stats zeroes device's cumulative counts, its
// out-of-memory count and its retries
// (torch.cuda.reset_accumulated_memory_stats).
//
//export arenaplan_reset_accumulated_stats
func arenaplan_reset_accumulated_stats(device C.int) *C.char {
	return reader("arenaplan_reset_accumulated_stats", func(*bridge.Bridge) error {
		C.ap_dev_reset_accumulated(device)
		return nil
	})
}

package bridge

// Stat is one of PyTorch's allocator statistics: its current value, its
// peak since the last reset, and what was added and taken away in all
// since the last reset of accumulated statistics.
type Stat struct{ Current, Peak, Allocated, Freed int64 }

// Pools are a statistic over every allocation and split as PyTorch's
// caching allocator splits them: small (at most 1 MiB) and large.
type Pools struct{ All, Small, Large Stat }

// AllocatorCounts are the counts kept for every allocation and free of a
// device by whoever sees them all (the C library counts them on its fast
// path, which serves allocations without the bridge).
type AllocatorCounts struct {
	Allocation, AllocatedBytes, RequestedBytes Pools
	OutOfMemory, Retries                       uint64
}

// TorchMemoryStats returns a device's statistics in the schema of PyTorch's
// torch.cuda.memory_stats (torch._C._cuda_memoryStats: a nested dict that
// memory_stats flattens with "."), so that code reading PyTorch's keys
// (memory_allocated, max_memory_reserved, memory_summary, vLLM's start-up
// profile, Lightning's DeviceStatsMonitor) reads arenaplan's memory:
//
//   - allocation, allocated_bytes, requested_bytes: live tensors, planned
//     and spilled, rounded to 512 bytes as the spill allocator rounds;
//   - reserved_bytes: device memory held (planned arenas mapped and the
//     spill allocator's segments, regions included); its peak is the most
//     of both held at once;
//   - segment: the spill allocator's segments plus the planned arenas;
//   - active and active_bytes: as allocation and allocated_bytes (a block
//     freed while other streams still use it counts as freed);
//   - inactive_split_bytes: free bytes inside mapped segments (current
//     only); inactive_split, oversize_*, num_sync_all_streams: 0, for
//     what arenaplan does not have.
func TorchMemoryStats(c AllocatorCounts, st DeviceStats) map[string]any {
	pools := func(p Pools) map[string]any {
		return map[string]any{"all": stat(p.All), "small_pool": stat(p.Small), "large_pool": stat(p.Large)}
	}
	large := func(s Stat) Pools { return Pools{All: s, Large: s} }
	sp := st.Spill
	arenas := int64(st.Arenas)
	reserved := Stat{
		Current:   int64(sp.Mapped + st.ArenaMapped),
		Peak:      int64(st.ReservedPeak),
		Allocated: int64(sp.GrownBytes),
		Freed:     int64(sp.UnmappedBytes),
	}
	segments := Stat{Current: int64(sp.Segments) + arenas, Allocated: int64(sp.Grows), Freed: int64(sp.Unmaps)}
	segments.Peak = segments.Current
	inactive := Stat{Current: int64(sp.Cached - sp.Waiting)}
	inactive.Peak = inactive.Current
	return map[string]any{
		"num_alloc_retries":    c.Retries,
		"num_ooms":             c.OutOfMemory,
		"max_split_size":       int64(-1),
		"num_sync_all_streams": 0,
		"num_device_alloc":     sp.Grows,
		"num_device_free":      sp.Unmaps,
		"allocation":           pools(c.Allocation),
		"segment":              pools(large(segments)),
		"active":               pools(c.Allocation),
		"inactive_split":       pools(Pools{}),
		"allocated_bytes":      pools(c.AllocatedBytes),
		"reserved_bytes":       pools(large(reserved)),
		"active_bytes":         pools(c.AllocatedBytes),
		"inactive_split_bytes": pools(large(inactive)),
		"requested_bytes":      pools(c.RequestedBytes),
		"oversize_allocations": stat(Stat{}),
		"oversize_segments":    stat(Stat{}),
	}
}

func stat(s Stat) map[string]any {
	return map[string]any{"current": s.Current, "peak": s.Peak, "allocated": s.Allocated, "freed": s.Freed}
}

// ResetPeaks sets device ordinal's peaks held by the bridge to their
// current values (the spill allocator's; the C library resets its own).
func (b *Bridge) ResetPeaks(ordinal int) error {
	d, err := b.device(ordinal)
	if err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.spill.ResetPeaks()
	d.reservedPeak = 0
	return nil
}

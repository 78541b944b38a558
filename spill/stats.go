package spill

// Stats are the allocator's counters. Mapped = InUse + Cached, and
// Waiting is the part of Cached not yet reusable.
type Stats struct {
	AddressSpace  uint64 // virtual addresses reserved up front
	Mapped        uint64 // physical bytes mapped in segments
	InUse         uint64 // bytes of allocated blocks (rounded sizes)
	Requested     uint64 // bytes the live allocations asked for
	Cached        uint64 // Mapped - InUse: free blocks and blocks waiting
	Waiting       uint64 // freed blocks not reusable yet (other streams)
	PeakInUse     uint64
	PeakMapped    uint64
	Segments      int
	Live          int    // allocated blocks
	Allocs        uint64 // successful Alloc calls
	Frees         uint64
	Grows         uint64 // segments mapped
	Unmaps        uint64 // segments unmapped
	GrownBytes    uint64 // bytes of the segments mapped, in all
	UnmappedBytes uint64 // bytes of the segments unmapped, in all
	// CaptureReuses counts blocks made reusable during a capture by the
	// marker walk; NodesVisited what the walk cost in graph nodes.
	CaptureReuses uint64
	NodesVisited  uint64
	// Paused is the bytes of segments whose physical memory PausePools
	// released (not in Mapped); Backup the host bytes kept for them.
	Paused uint64
	Backup uint64
	// Adopted counts segments a stream without a free block of its own
	// took over, wholly free, from another stream instead of mapping more;
	// AdoptWaits those of them it first waited for (an event on the old
	// stream, or the device).
	Adopted    uint64
	AdoptWaits uint64
	// CrossStreamFrees counts frees of blocks used on other streams too
	// (record_stream): an event recorded on each, the block reusable once
	// they completed; EventQueries the queries of those events; Syncs the
	// waits for the whole device or a stream (a trim that unmaps, an
	// adoption without an event, an event that could not be recorded).
	// A steady eager step should add nothing to Grows, Unmaps and Syncs.
	CrossStreamFrees uint64
	EventQueries     uint64
	Syncs            uint64
	// FreeLists counts the per-pool, per-stream lists of free blocks: at
	// most one per segment, whatever the number of streams seen.
	FreeLists int
}

// Stats returns the counters.
func (s *Allocator) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.st
	st.Cached = st.Mapped - st.InUse
	for p := range s.pools {
		st.FreeLists += len(p.free)
	}
	return st
}

// ResetPeaks sets the peaks of in-use and mapped bytes to their current
// values (PyTorch's reset_peak_memory_stats).
func (s *Allocator) ResetPeaks() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.st.PeakInUse, s.st.PeakMapped = s.st.InUse, s.st.Mapped
	s.intervalPeak = s.st.Mapped
}

// MappedPeak returns the most bytes mapped at once since the last call
// that restarted the interval (or since ResetPeaks); restart starts a new
// interval at the bytes mapped now. A host that maps other memory on the
// device (planned arenas) adds what it held during each interval, so
// that its peak is what the device held at once, not the sum of peaks
// reached at different times.
func (s *Allocator) MappedPeak(restart bool) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := max(s.intervalPeak, s.st.Mapped)
	if restart {
		s.intervalPeak = s.st.Mapped
	}
	return p
}

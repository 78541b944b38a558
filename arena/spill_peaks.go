package arena

// ResetPeaks sets the peaks of in-use and mapped bytes to their current
// values (PyTorch's reset_peak_memory_stats).
func (s *Spill) ResetPeaks() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.st.PeakInUse, s.st.PeakMapped = s.st.InUse, s.st.Mapped
}

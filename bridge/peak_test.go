package bridge

import "testing"

// TestReservedPeakIsHeldAtOnce: the reserved peak is the most memory held
// at once, not the spill's peak added to the arenas mapped later: eager
// memory given back before a step's arena is mapped does not count twice.
func TestReservedPeakIsHeldAtOnce(t *testing.T) {
	b := newTestBridge(t)
	const big = 96 << 20
	p, err := b.Alloc(big, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Free(p, 0); err != nil {
		t.Fatal(err)
	}
	if err := b.EmptyCache(); err != nil {
		t.Fatal(err)
	}
	s, err := b.NewStep(0, "step")
	if err != nil {
		t.Fatal(err)
	}
	prog := &program{t: t, b: b, stream: 0x99, layers: 6, scale: 64}
	recordRun(t, s, prog)
	if err := s.Plan(0); err != nil {
		t.Fatal(err)
	}
	st, err := b.Stats(0)
	if err != nil {
		t.Fatal(err)
	}
	if st.ArenaMapped == 0 || st.Spill.PeakMapped < big {
		t.Fatalf("arena mapped %d, spill peak %d: want an arena and a spill peak of at least %d", st.ArenaMapped, st.Spill.PeakMapped, big)
	}
	now := st.Spill.Mapped + st.ArenaMapped
	want := max(st.Spill.PeakMapped, now)
	if st.ReservedPeak != want {
		t.Fatalf("reserved peak %d, want %d (the spill's peak %d before the arena, %d held now); the sum would be %d",
			st.ReservedPeak, want, st.Spill.PeakMapped, now, st.Spill.PeakMapped+st.ArenaMapped)
	}
	if err := b.ResetPeaks(0); err != nil {
		t.Fatal(err)
	}
	if st, _ = b.Stats(0); st.ReservedPeak != st.Spill.Mapped+st.ArenaMapped {
		t.Fatalf("after ResetPeaks: reserved peak %d, want what is held now, %d", st.ReservedPeak, st.Spill.Mapped+st.ArenaMapped)
	}
}

// TestArenaMappedAfterTheCacheGoesBack: what eager work left cached (a
// step's warm-up and recorded runs, the program's own steps) goes back to
// the driver before a step's arena is mapped, so that the two are never
// held at once; memory in use stays.
func TestArenaMappedAfterTheCacheGoesBack(t *testing.T) {
	for _, captures := range []int{0, 1} {
		arenaAfterCache(t, captures)
	}
}

// arenaAfterCache: with captures counted underway (the trim would wait
// for the device, which a capture forbids) the cache stays.
func arenaAfterCache(t *testing.T, captures int) {
	b := newTestBridge(t)
	b.CapturesUnderway(captures)
	const big = 96 << 20
	held, err := b.Alloc(1<<20, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	p, err := b.Alloc(big, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Free(p, 0); err != nil { // cached: no EmptyCache
		t.Fatal(err)
	}
	s, err := b.NewStep(0, "step")
	if err != nil {
		t.Fatal(err)
	}
	prog := &program{t: t, b: b, stream: 0x99, layers: 6, scale: 64}
	recordRun(t, s, prog)
	before, err := b.Stats(0)
	if err != nil {
		t.Fatal(err)
	}
	if before.Spill.Mapped < big {
		t.Fatalf("spill mapped %d before the plan: want the %d bytes freed still cached", before.Spill.Mapped, big)
	}
	if err := s.Plan(0); err != nil {
		t.Fatal(err)
	}
	st, err := b.Stats(0)
	if err != nil {
		t.Fatal(err)
	}
	if captures > 0 {
		if st.Spill.Mapped < before.Spill.Mapped {
			t.Fatalf("a capture underway: spill mapped %d after the plan, %d before: want the cache kept", st.Spill.Mapped, before.Spill.Mapped)
		}
		return
	}
	if st.Spill.Mapped >= big || st.Spill.InUse < 1<<20 {
		t.Fatalf("after the plan: spill mapped %d, in use %d: want the cache given back (under %d) and the held MiB kept",
			st.Spill.Mapped, st.Spill.InUse, big)
	}
	if sum := before.Spill.Mapped + st.ArenaMapped; st.ReservedPeak >= sum {
		t.Fatalf("reserved peak %d: the cache and the arena were held at once (%d)", st.ReservedPeak, sum)
	}
	if err := b.Free(held, 0); err != nil {
		t.Fatal(err)
	}
}

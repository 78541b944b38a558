package spill

import (
	"bytes"
	"errors"
	"testing"
)

func fill(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7)
	}
	return b
}

// A backed-up region pool gives its memory back on pause and returns with
// its contents at the same addresses; a dropped one returns empty-handed;
// misuse is refused with the state unchanged.
func TestRegionPoolPauseResume(t *testing.T) {
	e := newSimEnv(t, 1*GiB)
	s := newSpill(t, e)
	st := e.Stream(t)
	weights, err := s.NewRegionPool("weights", true)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := s.NewRegionPool("kv", false)
	if err != nil {
		t.Fatal(err)
	}
	w1, err := s.AllocIn(weights, 3*MiB, st)
	if err != nil {
		t.Fatal(err)
	}
	w2, err := s.AllocIn(weights, 5000, st)
	if err != nil {
		t.Fatal(err)
	}
	k1, err := s.AllocIn(kv, 1*MiB, st)
	if err != nil {
		t.Fatal(err)
	}
	other := mustAlloc(t, s, 4096, st)
	data1, data2 := fill(3*MiB, 1), fill(5000, 9)
	if err := e.Dev.CopyHtoD(w1, data1); err != nil {
		t.Fatal(err)
	}
	if err := e.Dev.CopyHtoD(w2, data2); err != nil {
		t.Fatal(err)
	}
	free0, _, _ := e.Dev.MemGetInfo()
	mapped0 := s.Stats().Mapped

	if err := s.PausePools(weights, kv); err != nil {
		t.Fatal(err)
	}
	free1, _, _ := e.Dev.MemGetInfo()
	st1 := s.Stats()
	// weights: a 4 MiB segment (3 MiB) and a small one of 2 MiB (5000 B);
	// kv: one of 2 MiB.
	const paused = 8 * MiB
	if st1.Paused != paused || st1.Mapped != mapped0-paused || free1-free0 != paused {
		t.Errorf("after pause: paused %d mapped %d (was %d), device free +%d; want %d released", st1.Paused, st1.Mapped, mapped0, free1-free0, paused)
	}
	if st1.Backup != 6*MiB {
		t.Errorf("backup %d bytes, want the weights' 6 MiB", st1.Backup)
	}
	if !weights.Paused() || !kv.Paused() {
		t.Error("pools not marked paused")
	}
	if _, err := s.AllocIn(weights, 100, st); !errors.Is(err, ErrPaused) {
		t.Errorf("AllocIn on a paused pool: %v, want ErrPaused", err)
	}
	if err := s.PausePools(kv); !errors.Is(err, ErrPaused) {
		t.Errorf("pausing twice: %v, want ErrPaused", err)
	}
	// Freeing paused memory is bookkeeping: nothing is released twice.
	if err := s.Free(k1); err != nil {
		t.Errorf("freeing a paused block: %v", err)
	}
	if p, err := s.Alloc(4096, st); err != nil || p == 0 {
		t.Errorf("the default pool stops serving during a pause: %v", err)
	} else {
		mustFree(t, s, p)
	}

	if err := s.ResumePools(weights, kv); err != nil {
		t.Fatal(err)
	}
	if err := s.ResumePools(weights); !errors.Is(err, ErrNotPaused) {
		t.Errorf("resuming a running pool: %v, want ErrNotPaused", err)
	}
	st2 := s.Stats()
	if st2.Paused != 0 || st2.Mapped != mapped0 {
		t.Errorf("after resume: paused %d mapped %d, want 0 and %d", st2.Paused, st2.Mapped, mapped0)
	}
	got1, got2 := make([]byte, len(data1)), make([]byte, len(data2))
	if err := e.Dev.CopyDtoH(got1, w1); err != nil {
		t.Fatal(err)
	}
	if err := e.Dev.CopyDtoH(got2, w2); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got1, data1) || !bytes.Equal(got2, data2) {
		t.Error("weights not restored at their addresses")
	}
	// The freed kv block is reusable after resume, at its old address.
	if k, err := s.AllocIn(kv, 1*MiB, st); err != nil || k != k1 {
		t.Errorf("kv after resume: %#x, %v; want %#x", k, err, k1)
	}
	mustFree(t, s, other)
	if err := s.validate(); err != nil {
		t.Fatal(err)
	}
}

// A hundred pause/resume cycles hold device and host memory flat: backups
// are kept, not made afresh, and nothing leaks.
func TestRegionPoolCyclesFlat(t *testing.T) {
	e := newSimEnv(t, 1*GiB)
	s := newSpill(t, e)
	st := e.Stream(t)
	w, err := s.NewRegionPool("weights", true)
	if err != nil {
		t.Fatal(err)
	}
	p, err := s.AllocIn(w, 10*MiB, st)
	if err != nil {
		t.Fatal(err)
	}
	data := fill(10*MiB, 3)
	if err := e.Dev.CopyHtoD(p, data); err != nil {
		t.Fatal(err)
	}
	var host0, free0 uint64
	for i := range 100 {
		if err := s.PausePools(w); err != nil {
			t.Fatal(i, err)
		}
		if err := s.ResumePools(w); err != nil {
			t.Fatal(i, err)
		}
		free, _, _ := e.Dev.MemGetInfo()
		host := e.Sim.HostBytes()
		if i == 1 {
			host0, free0 = host, free
		}
		if i > 1 && (host != host0 || free != free0) {
			t.Fatalf("cycle %d: host %d device free %d, cycle 1 had %d and %d", i, host, free, host0, free0)
		}
	}
	got := make([]byte, len(data))
	if err := e.Dev.CopyDtoH(got, p); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Error("contents changed over 100 cycles")
	}
}

// Closing the allocator with a pool paused releases nothing twice.
func TestRegionPoolCloseWhilePaused(t *testing.T) {
	e := newSimEnv(t, 1*GiB)
	s, err := New(e.Dev, WithAddressSpace(256*MiB))
	if err != nil {
		t.Fatal(err)
	}
	st := e.Stream(t)
	w, err := s.NewRegionPool("weights", true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.AllocIn(w, 3*MiB, st); err != nil {
		t.Fatal(err)
	}
	if err := s.PausePools(w); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close with a paused pool: %v", err)
	}
	if err := s.ResumePools(w); !errors.Is(err, ErrClosed) {
		t.Errorf("ResumePools after Close: %v, want ErrClosed", err)
	}
	if free, total, _ := e.Dev.MemGetInfo(); free != total {
		t.Errorf("device free %d of %d after Close", free, total)
	}
	if err := s.PausePools(s.def); err == nil {
		t.Error("PausePools on the default pool accepted")
	}
}

// A graph pool released while paused still resumes (tensors made in it
// may be alive), and its memory goes back once it is free.
func TestPausedPoolReleased(t *testing.T) {
	e := newSimEnv(t, 1*GiB)
	s := newSpill(t, e)
	st := e.Stream(t)
	gp, err := s.NewSharedPool()
	if err != nil {
		t.Fatal(err)
	}
	p, err := s.AllocIn(gp, 1*MiB, st)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.PausePools(gp); err != nil {
		t.Fatal(err)
	}
	if err := gp.Release(); err != nil {
		t.Fatal(err)
	}
	if err := s.ResumePools(gp); err != nil {
		t.Fatalf("resuming a pool released while paused: %v", err)
	}
	mustFree(t, s, p)
	if err := s.EmptyCache(); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Mapped != 0 || st.Paused != 0 {
		t.Fatalf("after free and EmptyCache: mapped %d paused %d", st.Mapped, st.Paused)
	}
}

// TestRegionBackupPinnedBeforePause: a backed-up region's segments get
// their page-locked host copy when they are mapped, so the first pause
// only copies; regions that drop their contents get none, and no device
// memory is spent on it.
func TestRegionBackupPinnedBeforePause(t *testing.T) {
	e := newSimEnv(t, 1*GiB)
	s := newSpill(t, e)
	st := e.Stream(t)
	weights, err := s.NewRegionPool("weights", true)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := s.NewRegionPool("kv", false)
	if err != nil {
		t.Fatal(err)
	}
	free0, _, _ := e.Dev.MemGetInfo()
	if _, err := s.AllocIn(weights, 3*MiB, st); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AllocIn(kv, 1*MiB, st); err != nil {
		t.Fatal(err)
	}
	for _, seg := range s.poolSegments(weights) {
		if seg.host == nil || !seg.pinned || uint64(len(seg.host)) != seg.size {
			t.Fatalf("weights segment at %#x: host copy %d bytes, pinned %v, before any pause", uint64(seg.addr), len(seg.host), seg.pinned)
		}
	}
	for _, seg := range s.poolSegments(kv) {
		if seg.host != nil {
			t.Fatalf("kv segment at %#x has a host copy; its region drops its contents", uint64(seg.addr))
		}
	}
	free1, _, _ := e.Dev.MemGetInfo()
	if st := s.Stats(); free0-free1 != st.Mapped || st.Backup != 4*MiB {
		t.Fatalf("device memory spent %d, mapped %d; backup %d, want %d", free0-free1, st.Mapped, st.Backup, 4*MiB)
	}
	mustValid(t, s)
}

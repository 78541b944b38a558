package bridge

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/arenaplan/arenaplan/arena"
	"github.com/arenaplan/arenaplan/cuda"
)

// TestPauseResume: weights (backed up), a KV cache (dropped) and a planned
// step's graph memory go back to the device on Pause and return at the
// same addresses on Resume, weights intact; misuse is refused with nothing
// changed.
func TestPauseResume(t *testing.T) {
	thread := 1
	b := New(Config{Sim: true, SimMemory: 1 << 30, SpillAddressSpace: 256 << 20, ThreadID: func() int { return thread }})
	defer b.Close()
	const st = 0x77
	if err := b.BeginRegion(0, 1, "weights", true); err != nil {
		t.Fatal(err)
	}
	w, err := b.Alloc(3<<20, 0, st)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.EndRegion(0, 1); err != nil {
		t.Fatal(err)
	}
	if err := b.BeginRegion(0, 1, "kv", false); err != nil {
		t.Fatal(err)
	}
	kv, err := b.Alloc(1<<20, 0, st)
	if err != nil {
		t.Fatal(err)
	}
	// Another thread's allocation during the region is not the region's.
	thread = 2
	outsider, err := b.Alloc(4096, 0, st)
	if err != nil {
		t.Fatal(err)
	}
	thread = 1
	if err := b.EndRegion(0, 1); err != nil {
		t.Fatal(err)
	}
	d := b.devices[0]
	data := bytes.Repeat([]byte{1, 2, 3, 5, 8}, (3<<20)/5)
	if err := d.dev.CopyHtoD(w, data); err != nil {
		t.Fatal(err)
	}
	p := &program{t: t, b: b, stream: st, layers: 10}
	s := recordAndPlan(t, b, p)
	if err := s.Serve(p.stream, true); err != nil {
		t.Fatal(err)
	}
	out := p.run()
	if err := s.End(false); err != nil {
		t.Fatal(err)
	}
	first := append([]cuda.DevicePtr(nil), p.addrs...)
	p.free(out)

	free0, _, _ := d.dev.MemGetInfo()
	stats0, _ := b.Stats(0)
	if err := b.Pause(0); err != nil {
		t.Fatal(err)
	}
	free1, _, _ := d.dev.MemGetInfo()
	// Regions: a 4 MiB segment (weights) and a 2 MiB one (kv); graphs: the
	// arena's mapped bytes.
	want := uint64(6<<20) + stats0.ArenaMapped
	if got := free1 - free0; got < want*99/100 {
		t.Fatalf("Pause gave back %d bytes, want at least 99%% of %d (regions and graph arena)", got, want)
	}
	if tags, _ := b.Paused(0); strings.Join(tags, ",") != "graphs,kv,weights" {
		t.Fatalf("paused tags %v", tags)
	}
	// Misuse, refused.
	if err := b.Pause(0, "kv"); !errors.Is(err, arena.ErrPaused) {
		t.Errorf("pausing twice: %v", err)
	}
	if err := b.Pause(0); !errors.Is(err, arena.ErrPaused) {
		t.Errorf("pausing everything twice: %v", err)
	}
	if err := b.Resume(0, "nosuch"); err == nil {
		t.Error("resuming an unknown tag accepted")
	}
	if err := b.BeginRegion(0, 1, "kv", false); err == nil {
		t.Error("entering a paused region accepted")
	}
	if err := s.Serve(p.stream, true); err == nil {
		t.Error("serving a step while its arena is paused accepted")
	}
	// Freeing paused memory is bookkeeping.
	if err := b.Free(kv, 0); err != nil {
		t.Errorf("freeing a paused tensor: %v", err)
	}
	if err := b.Resume(0, "weights"); err != nil {
		t.Fatal(err)
	}
	if err := b.Resume(0, "weights"); !errors.Is(err, arena.ErrNotPaused) {
		t.Errorf("resuming twice: %v", err)
	}
	if err := b.Resume(0); err != nil {
		t.Fatal(err)
	}
	if tags, _ := b.Paused(0); len(tags) != 0 {
		t.Fatalf("paused after Resume: %v", tags)
	}
	got := make([]byte, len(data))
	if err := d.dev.CopyDtoH(got, w); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("weights not restored")
	}
	// The step serves the same addresses after the cycle.
	if err := s.Serve(p.stream, true); err != nil {
		t.Fatal(err)
	}
	out = p.run()
	if err := s.End(false); err != nil {
		t.Fatal(err)
	}
	for i := range first {
		if first[i] != p.addrs[i] && !d.zero.owns(first[i]) {
			t.Fatalf("allocation %d at %#x after resume, %#x before", i, uint64(p.addrs[i]), uint64(first[i]))
		}
	}
	p.free(out)
	if err := b.Free(outsider, 0); err != nil {
		t.Fatal(err)
	}
	if err := b.Free(w, 0); err != nil {
		t.Fatal(err)
	}
}

// TestRegionMisuse: reserved names, nesting, and a tag's backup choice.
func TestRegionMisuse(t *testing.T) {
	b := newTestBridge(t)
	if err := b.BeginRegion(0, 1, GraphsTag, false); err == nil {
		t.Error("the reserved tag accepted")
	}
	if err := b.BeginRegion(0, 1, "w", true); err != nil {
		t.Fatal(err)
	}
	if err := b.BeginRegion(0, 1, "x", true); err == nil {
		t.Error("nested regions accepted")
	}
	if err := b.EndRegion(0, 1); err != nil {
		t.Fatal(err)
	}
	if err := b.EndRegion(0, 1); err == nil {
		t.Error("EndRegion outside a region accepted")
	}
	if err := b.BeginRegion(0, 1, "w", false); err == nil {
		t.Error("a region's backup choice changed silently")
	}
	if err := b.Resume(0); !errors.Is(err, arena.ErrNotPaused) {
		t.Errorf("Resume with nothing paused: %v", err)
	}
}

// TestCloseWhilePaused: a step closed while its graphs are paused leaves
// nothing for Resume to trip on, and nothing mapped behind.
func TestCloseWhilePaused(t *testing.T) {
	b := newTestBridge(t)
	p := &program{t: t, b: b, stream: 0x77, layers: 6}
	s := recordAndPlan(t, b, p)
	if err := s.Serve(p.stream, true); err != nil {
		t.Fatal(err)
	}
	p.free(p.run())
	if err := s.End(false); err != nil {
		t.Fatal(err)
	}
	if err := b.Pause(0, GraphsTag); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Resume(0, GraphsTag); err != nil {
		t.Fatalf("Resume after the step closed: %v", err)
	}
	st, _ := b.Stats(0)
	if st.ArenaMapped != 0 || st.ArenaBytes != 0 || st.Spill.Paused != 0 {
		t.Fatalf("after close and resume: %+v", st)
	}
}

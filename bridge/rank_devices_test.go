package bridge

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/arenaplan/arenaplan/cuda"
)

// onDevice is a model-like step (program's shape) on one device ordinal.
type onDevice struct {
	t       *testing.T
	b       *Bridge
	ordinal int
	stream  uintptr
	addrs   []cuda.DevicePtr
}

func (p *onDevice) alloc(size uint64) cuda.DevicePtr {
	p.t.Helper()
	a, err := p.b.Alloc(size, p.ordinal, p.stream)
	if err != nil {
		p.t.Fatalf("device %d: Alloc(%d): %v", p.ordinal, size, err)
	}
	p.addrs = append(p.addrs, a)
	return a
}

func (p *onDevice) free(a cuda.DevicePtr) {
	p.t.Helper()
	if err := p.b.Free(a, p.ordinal); err != nil {
		p.t.Fatalf("device %d: Free(%#x): %v", p.ordinal, uint64(a), err)
	}
}

// run makes a tensor-parallel layer's allocations: a column-parallel
// output, its activation, a row-parallel partial sum that a collective
// on another stream reads (record_stream), and a kept output.
func (p *onDevice) run() cuda.DevicePtr {
	p.t.Helper()
	p.addrs = nil
	x := p.alloc(8192)
	for i := range 4 {
		up := p.alloc(uint64(32768 + 4096*i))
		act := p.alloc(16384)
		p.free(up)
		partial := p.alloc(8192)
		if err := p.b.RecordStreamAny(partial, 0x5ccc); err != nil { // the NCCL stream
			p.t.Fatalf("device %d: record_stream: %v", p.ordinal, err)
		}
		p.free(act)
		p.free(x)
		x = partial
	}
	return x
}

// step records p's run into a new step of p's device, plans it and returns
// it with the run's addresses.
func (p *onDevice) step(name string) *Step {
	p.t.Helper()
	s, err := p.b.NewStep(p.ordinal, name)
	if err != nil {
		p.t.Fatal(err)
	}
	if err := s.Record(p.stream); err != nil {
		p.t.Fatal(err)
	}
	out := p.run()
	if err := s.End(false); err != nil {
		p.t.Fatal(err)
	}
	p.free(out)
	if err := s.Plan(0); err != nil {
		p.t.Fatal(err)
	}
	return s
}

// serve runs p once from s's plan and returns the addresses it got.
func (p *onDevice) serve(s *Step) []cuda.DevicePtr {
	p.t.Helper()
	if err := s.Serve(p.stream, true); err != nil {
		p.t.Fatal(err)
	}
	out := p.run()
	if err := s.End(false); err != nil {
		p.t.Fatal(err)
	}
	p.free(out)
	return p.addrs
}

// deviceView is what must not change on one device while another works.
type deviceView struct {
	allocs, frees, planned, spilled, divergences uint64
	arenaBytes, arenaMapped                      uint64
	spillMapped, spillInUse                      uint64
}

func viewOf(t *testing.T, b *Bridge, ordinal int) deviceView {
	t.Helper()
	st, err := b.Stats(ordinal)
	if err != nil {
		t.Fatal(err)
	}
	return deviceView{st.Allocs, st.Frees, st.Planned, st.Spilled, st.Divergences,
		st.ArenaBytes, st.ArenaMapped, st.Spill.Mapped, st.Spill.InUse}
}

// TestDevicesAreIndependent: one process serving several device ordinals
// (a tensor-parallel rank's library sees its own device, and a program
// may touch several) keeps each device's arena, spill, steps and pause
// state to itself: a step recorded, planned, served, saved and paused on
// device 1 changes nothing on device 0, addresses never collide across
// devices (as with the driver's unified addressing), and each device's
// plan serves at the same addresses every run.
func TestDevicesAreIndependent(t *testing.T) {
	b := New(Config{Sim: true, SimMemory: 1 << 30, SpillAddressSpace: 256 << 20, Rank: 1, WorldSize: 2})
	t.Cleanup(func() { b.Close() })

	// Device 0: weights in its spill and a planned step, both live.
	weights0, err := b.Alloc(4<<20, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	p0 := &onDevice{t: t, b: b, ordinal: 0, stream: 0x77}
	s0 := p0.step("d0")
	first0 := p0.serve(s0)
	before := viewOf(t, b, 0)
	if before.arenaBytes == 0 || before.spillMapped == 0 {
		t.Fatalf("device 0: %+v, want an arena and spill memory", before)
	}

	// Device 1, the same stream handle value: its own spill and step.
	weights1, err := b.Alloc(4<<20, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	p1 := &onDevice{t: t, b: b, ordinal: 1, stream: 0x77}
	s1 := p1.step("d1")
	var first1 []cuda.DevicePtr
	for run := range 3 {
		got := p1.serve(s1)
		if run == 0 {
			first1 = got
		} else if !slices.Equal(got, first1) {
			t.Fatalf("device 1, run %d: addresses %#x, want %#x", run, got, first1)
		}
	}
	plan := filepath.Join(t.TempDir(), "rank1.plan")
	if err := s1.Save(plan); err != nil {
		t.Fatal(err)
	}
	if after := viewOf(t, b, 0); after != before {
		t.Fatalf("device 1's steps changed device 0:\nbefore %+v\nafter  %+v", before, after)
	}
	r1 := s1.Report()
	if st1, _ := b.Stats(1); st1.ArenaBytes != uint64(r1.Arena) || st1.Divergences != 0 || st1.Planned == 0 {
		t.Fatalf("device 1: %+v, want its own arena of %d bytes, served without divergence", st1, r1.Arena)
	}

	// No address is two devices' (PyTorch's record_stream hook names none).
	mine := map[cuda.DevicePtr]int{weights0: 0, weights1: 1}
	for _, p := range first0 {
		mine[p] = 0
	}
	for _, p := range first1 {
		if d, ok := mine[p]; ok && d != 1 {
			t.Fatalf("address %#x served on device 1 is device %d's too", uint64(p), d)
		}
	}
	if err := b.Free(weights1, 0); err == nil {
		t.Fatalf("device 1's allocation freed as device 0's")
	}

	// Pausing device 1's graphs leaves device 0 serving.
	if err := b.Pause(1, GraphsTag); err != nil {
		t.Fatal(err)
	}
	if st1, _ := b.Stats(1); st1.ArenaMapped != 0 {
		t.Fatalf("device 1 paused: %d arena bytes still mapped", st1.ArenaMapped)
	}
	if tags, _ := b.Paused(0); len(tags) != 0 {
		t.Fatalf("device 0 paused %v by device 1's pause", tags)
	}
	if got := p0.serve(s0); !slices.Equal(got, first0) {
		t.Fatalf("device 0 while device 1 is paused: addresses %#x, want %#x", got, first0)
	}
	if err := s1.Serve(p1.stream, true); err == nil || !strings.Contains(err.Error(), "paused") {
		t.Fatalf("serving paused device 1: %v, want a refusal", err)
	}
	if err := b.Resume(1); err != nil {
		t.Fatal(err)
	}
	if got := p1.serve(s1); !slices.Equal(got, first1) {
		t.Fatalf("device 1 after resume: addresses %#x, want %#x", got, first1)
	}
	after := viewOf(t, b, 0)
	before.allocs, before.frees, before.planned = after.allocs, after.frees, after.planned // device 0 served once more
	if after != before {
		t.Fatalf("device 1's pause and resume changed device 0:\nbefore %+v\nafter  %+v", before, after)
	}

	// The saved plan is this rank's, whatever device serves it.
	o := New(Config{Sim: true, SimMemory: 1 << 30, SpillAddressSpace: 256 << 20, Rank: 1, WorldSize: 2})
	defer o.Close()
	st, err := o.NewStep(3, "d3")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Load(plan); err != nil {
		t.Fatalf("rank 1 of 2's plan on device 3 of the same rank: %v", err)
	}
	p3 := &onDevice{t: t, b: o, ordinal: 3, stream: 0x99}
	p3.serve(st)
	if r := st.Report(); r.Divergences != 0 {
		t.Fatalf("device 3 from rank 1's plan: %d divergences (%s)", r.Divergences, r.FirstDivergence)
	}
}

// TestRankRefusals: which plan files a rank accepts, and what the refusal
// says (both ranks and world sizes, so a user sees which file went where).
func TestRankRefusals(t *testing.T) {
	dir := t.TempDir()
	save := func(rank, world int) string {
		b := New(Config{Sim: true, SimMemory: 1 << 30, SpillAddressSpace: 256 << 20, Rank: rank, WorldSize: world})
		defer b.Close()
		p := &onDevice{t: t, b: b, ordinal: 0, stream: 0x77}
		s := p.step("tp")
		path := filepath.Join(dir, strings.ReplaceAll(t.Name(), "/", "_")+"-"+string(rune('0'+rank))+"-"+string(rune('0'+world))+".plan")
		if err := s.Save(path); err != nil {
			t.Fatal(err)
		}
		return path
	}
	single, r0of2, r1of2, r1of4 := save(0, 0), save(0, 2), save(1, 2), save(1, 4)
	for _, tc := range []struct {
		file        string
		rank, world int
		want        string // "" accepted, else in the error
	}{
		{single, 0, 0, ""},
		{single, 0, 1, ""},
		{r0of2, 0, 2, ""},
		{r1of2, 1, 2, ""},
		{r1of4, 1, 4, ""},
		{single, 0, 2, "made by rank 0 of 1; this process is rank 0 of 2"},
		{r0of2, 1, 2, "made by rank 0 of 2; this process is rank 1 of 2"},
		{r1of2, 0, 2, "made by rank 1 of 2; this process is rank 0 of 2"},
		{r1of2, 0, 1, "made by rank 1 of 2; this process is rank 0 of 1"},
		{r1of2, 1, 4, "made by rank 1 of 2; this process is rank 1 of 4"},
		{r1of4, 1, 2, "made by rank 1 of 4; this process is rank 1 of 2"},
	} {
		b := New(Config{Sim: true, SimMemory: 1 << 30, SpillAddressSpace: 256 << 20, Rank: tc.rank, WorldSize: tc.world})
		s, err := b.NewStep(0, "tp")
		if err != nil {
			t.Fatal(err)
		}
		err = s.Load(tc.file)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s on rank %d of %d: refused: %v", filepath.Base(tc.file), tc.rank, tc.world, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), tc.file)):
			t.Errorf("%s on rank %d of %d: %v, want an error naming the file and %q", filepath.Base(tc.file), tc.rank, tc.world, err, tc.want)
		}
		if tc.want != "" {
			// A refused file leaves the step without a plan: recording
			// (the fallback) still works.
			p := &onDevice{t: t, b: b, ordinal: 0, stream: 0x77}
			if err := s.Record(p.stream); err != nil {
				t.Errorf("rank %d of %d: recording after a refused plan: %v", tc.rank, tc.world, err)
			} else {
				p.free(p.run())
				if err := s.End(false); err != nil {
					t.Error(err)
				}
			}
		}
		b.Close()
	}
}

package bridge

import (
	"bytes"
	"errors"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/arenaplan/arenaplan/cuda"
)

// faultyDevice is a simulated device whose Synchronize and MemCreate fail
// on demand, for the failure paths of Pause.
type faultyDevice struct {
	cuda.Device
	mu         sync.Mutex
	syncs      int // Synchronize calls since arm
	failSyncAt int // fail the n-th of them (0: never)
	failCreate bool
}

var errInjected = &cuda.Error{Op: "injected", Code: cuda.ErrorLaunchFailed}

func (f *faultyDevice) arm(failSyncAt int, failCreate bool) {
	f.mu.Lock()
	f.syncs, f.failSyncAt, f.failCreate = 0, failSyncAt, failCreate
	f.mu.Unlock()
}

func (f *faultyDevice) Synchronize() error {
	f.mu.Lock()
	f.syncs++
	fail := f.failSyncAt != 0 && f.syncs == f.failSyncAt
	f.mu.Unlock()
	if fail {
		return errInjected
	}
	return f.Device.Synchronize()
}

func (f *faultyDevice) MemCreate(size uint64) (cuda.MemHandle, error) {
	f.mu.Lock()
	fail := f.failCreate
	f.mu.Unlock()
	if fail {
		return 0, &cuda.Error{Op: "cuMemCreate", Code: cuda.ErrorOutOfMemory}
	}
	return f.Device.MemCreate(size)
}

// pausedFixture is a bridge on a faulty device with a backed-up region
// "weights" holding data, a dropped region "kv", and a planned step.
type pausedFixture struct {
	b       *Bridge
	dev     *faultyDevice
	s       *Step
	p       *program
	w       cuda.DevicePtr
	data    []byte
	mapped0 uint64 // free device memory before the pause
}

func newPausedFixture(t *testing.T) *pausedFixture {
	t.Helper()
	f := &pausedFixture{}
	b := New(Config{SpillAddressSpace: 256 << 20, ThreadID: func() int { return 1 },
		Open: func(int) (cuda.Device, error) {
			sim, err := cuda.OpenSim(cuda.SimConfig{TotalMemory: 1 << 30, Guest: true})
			if err != nil {
				return nil, err
			}
			f.dev = &faultyDevice{Device: sim}
			return f.dev, nil
		}})
	t.Cleanup(func() { b.Close() })
	f.b = b
	for _, tag := range []string{"weights", "kv"} {
		if err := b.BeginRegion(0, 1, tag, tag == "weights"); err != nil {
			t.Fatal(err)
		}
		p, err := b.Alloc(3<<20, 0, 0x77)
		if err != nil {
			t.Fatal(err)
		}
		if tag == "weights" {
			f.w = p
		}
		if err := b.EndRegion(0, 1); err != nil {
			t.Fatal(err)
		}
	}
	f.data = bytes.Repeat([]byte{1, 2, 3, 5, 8}, (3<<20)/5)
	if err := f.dev.CopyHtoD(f.w, f.data); err != nil {
		t.Fatal(err)
	}
	f.p = &program{t: t, b: b, stream: 0x78, layers: 6}
	f.s = recordAndPlan(t, b, f.p)
	f.mapped0, _, _ = f.dev.MemGetInfo()
	return f
}

// check asserts that the weights hold their data and that the step
// serves (nothing of it paused).
func (f *pausedFixture) check(t *testing.T) {
	t.Helper()
	got := make([]byte, len(f.data))
	if err := f.dev.CopyDtoH(got, f.w); err != nil {
		t.Fatalf("reading the weights: %v", err)
	}
	if !bytes.Equal(got, f.data) {
		t.Fatal("weights lost")
	}
	if err := f.s.Serve(f.p.stream, true); err != nil {
		t.Fatalf("serving after the failed pause: %v", err)
	}
	f.p.free(f.p.run())
	if err := f.s.End(false); err != nil {
		t.Fatal(err)
	}
}

// TestPauseFailureUndone: a device failure half way through Pause (the
// regions released, then the graph arena's wait fails) is undone: nothing
// is paused, the memory is mapped again with its contents, and the error
// says so.
func TestPauseFailureUndone(t *testing.T) {
	f := newPausedFixture(t)
	// The 1st wait is the regions' (PausePools), the 2nd the arena's.
	f.dev.arm(2, false)
	err := f.b.Pause(0)
	if !errors.Is(err, errInjected) || !strings.Contains(err.Error(), "nothing is paused") {
		t.Fatalf("Pause with a failing device: %v; want the injected error and \"nothing is paused\"", err)
	}
	f.dev.arm(0, false)
	if tags, err := f.b.Paused(0); err != nil || len(tags) != 0 {
		t.Fatalf("paused after an undone Pause: %v, %v", tags, err)
	}
	if free, _, _ := f.dev.MemGetInfo(); free != f.mapped0 {
		t.Errorf("free device memory %d after the undone Pause, %d before", free, f.mapped0)
	}
	f.check(t)
	if err := f.b.BeginRegion(0, 1, "kv", false); err != nil {
		t.Fatalf("entering a region after the undone Pause: %v", err)
	}
	if _, err := f.b.Alloc(4096, 0, 0x77); err != nil {
		t.Fatalf("allocating in it: %v", err)
	}
	if err := f.b.EndRegion(0, 1); err != nil {
		t.Fatal(err)
	}
	// And the next Pause and Resume work.
	if err := f.b.Pause(0); err != nil {
		t.Fatal(err)
	}
	if err := f.b.Resume(0); err != nil {
		t.Fatal(err)
	}
	f.check(t)
}

// TestPauseFailureReported: when undoing fails too (no memory to map the
// regions back), the error and Paused name exactly what stays paused, and
// Resume takes it back once memory is there.
func TestPauseFailureReported(t *testing.T) {
	f := newPausedFixture(t)
	var changes int
	f.b.OnPauseChange(func() { changes++ })
	f.dev.arm(2, true)
	err := f.b.Pause(0)
	if !errors.Is(err, errInjected) || !strings.Contains(err.Error(), "paused now: kv, weights") {
		t.Fatalf("Pause with a failing device: %v; want the injected error and \"paused now: kv, weights\"", err)
	}
	if changes != 1 {
		t.Errorf("OnPauseChange's hook ran %d times, want 1", changes)
	}
	tags, _ := f.b.Paused(0)
	if !slices.Equal(tags, []string{"kv", "weights"}) {
		t.Fatalf("Paused = %v, want [kv weights]", tags)
	}
	// The graphs were never paused: the step serves.
	if err := f.s.Serve(f.p.stream, true); err != nil {
		t.Fatalf("serving while only regions are paused: %v", err)
	}
	f.p.free(f.p.run())
	if err := f.s.End(false); err != nil {
		t.Fatal(err)
	}
	f.dev.arm(0, false)
	if err := f.b.Resume(0); err != nil {
		t.Fatal(err)
	}
	if changes != 2 {
		t.Errorf("OnPauseChange's hook ran %d times, want 2", changes)
	}
	if tags, _ := f.b.Paused(0); len(tags) != 0 {
		t.Fatalf("paused after Resume: %v", tags)
	}
	f.check(t)
}

// TestPausedArenaServesNothing: a paused step arena hands out no address,
// even to a step that began serving before (Pause refuses then) or after.
func TestPausedArenaServesNothing(t *testing.T) {
	b := newTestBridge(t)
	p := &program{t: t, b: b, stream: 0x77, layers: 6}
	s := recordAndPlan(t, b, p)
	if err := s.Serve(p.stream, true); err != nil {
		t.Fatal(err)
	}
	if err := b.Pause(0, GraphsTag); err == nil {
		t.Fatal("Pause while a step serves accepted")
	}
	p.free(p.run())
	if err := s.End(false); err != nil {
		t.Fatal(err)
	}
	if err := b.Pause(0, GraphsTag); err != nil {
		t.Fatal(err)
	}
	if err := s.Serve(p.stream, true); err == nil {
		t.Fatal("Serve while the graphs are paused accepted")
	}
	// Were a step serving (the two checks above bypassed), its allocation
	// would still be refused.
	d := b.devices[0]
	d.mu.Lock()
	s.state = stepServing
	_, err := s.alloc(4096)
	s.state = stepIdle
	d.mu.Unlock()
	if err == nil || !strings.Contains(err.Error(), "paused") {
		t.Fatalf("a planned allocation from a paused arena: %v", err)
	}
}

// TestBudgetSeconds: budgets the C ABI and Python pass in seconds.
func TestBudgetSeconds(t *testing.T) {
	for _, c := range []struct {
		s    float64
		want time.Duration
		err  string
	}{
		{0, 0, ""},
		{1.5, 1500 * time.Millisecond, ""},
		{math.NaN(), 0, "finite"},
		{math.Inf(1), 0, "finite"},
		{math.Inf(-1), 0, "finite"},
		{-1, 0, "negative"},
		{1e12, 0, "more than"},
	} {
		got, err := BudgetSeconds(c.s)
		switch {
		case c.err == "" && (err != nil || got != c.want):
			t.Errorf("BudgetSeconds(%v) = %v, %v; want %v", c.s, got, err, c.want)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("BudgetSeconds(%v) = %v, %v; want an error saying %q", c.s, got, err, c.err)
		}
	}
	b := newTestBridge(t)
	p := &program{t: t, b: b, stream: 0x77, layers: 4}
	s, err := b.NewStep(0, "budget")
	if err != nil {
		t.Fatal(err)
	}
	recordRun(t, s, p)
	for _, d := range []time.Duration{-time.Second, MaxBudget + 1} {
		if err := s.Plan(d); err == nil || !strings.Contains(err.Error(), "planning budget") {
			t.Errorf("Plan(%v): %v", d, err)
		}
	}
	if err := s.Plan(0); err != nil {
		t.Fatalf("Plan(0) after refused budgets: %v", err)
	}
}

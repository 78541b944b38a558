package bridge

import (
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/arenaplan/arenaplan/cuda"
)

func newTestBridge(t *testing.T) *Bridge {
	t.Helper()
	b := New(Config{Sim: true, SimMemory: 1 << 30, SpillAddressSpace: 256 << 20})
	t.Cleanup(func() { b.Close() })
	return b
}

// program is a model-like step: layers of activations, each freed two
// layers later, a workspace per layer, and one output kept.
type program struct {
	t      *testing.T
	b      *Bridge
	stream uintptr
	layers int
	extra  uint64 // added to layer 3's activation size (a divergent step)
	scale  uint64 // multiplies every size (a batch size); 0 means 1
	// addrs collects every address the step got, in order, and sizes
	// their sizes.
	addrs []cuda.DevicePtr
	sizes []uint64
}

func (p *program) alloc(size uint64) cuda.DevicePtr {
	p.t.Helper()
	a, err := p.b.Alloc(size, 0, p.stream)
	if err != nil {
		p.t.Fatalf("Alloc(%d): %v", size, err)
	}
	p.addrs = append(p.addrs, a)
	p.sizes = append(p.sizes, size)
	return a
}

func (p *program) free(a cuda.DevicePtr) {
	p.t.Helper()
	if err := p.b.Free(a, 0); err != nil {
		p.t.Fatalf("Free(%#x): %v", uint64(a), err)
	}
}

// run makes the step's allocations and returns its output, still live.
func (p *program) run() cuda.DevicePtr {
	p.addrs, p.sizes = nil, nil
	var acts []cuda.DevicePtr
	for i := range p.layers {
		k := max(p.scale, 1)
		size := uint64(4096+1000*i) * k
		if i == 3 {
			size += p.extra
		}
		acts = append(acts, p.alloc(size))
		ws := p.alloc(65536 * k)
		zero := p.alloc(0)
		p.free(ws)
		p.free(zero)
		if len(acts) > 2 {
			p.free(acts[0])
			acts = acts[1:]
		}
	}
	out := p.alloc(8192 * max(p.scale, 1))
	for _, a := range acts {
		p.free(a)
	}
	return out
}

// checkDisjoint fails when two of the live ranges overlap.
func checkDisjoint(t *testing.T, live map[cuda.DevicePtr]uint64) {
	t.Helper()
	type r struct{ lo, hi uint64 }
	var rs []r
	for p, n := range live {
		rs = append(rs, r{uint64(p), uint64(p) + max(n, 1)})
	}
	sort.Slice(rs, func(i, j int) bool { return rs[i].lo < rs[j].lo })
	for i := 1; i < len(rs); i++ {
		if rs[i].lo < rs[i-1].hi {
			t.Fatalf("live allocations overlap: [%#x, %#x) and [%#x, %#x)", rs[i-1].lo, rs[i-1].hi, rs[i].lo, rs[i].hi)
		}
	}
}

// recordRun records one run of p into s: every allocation and free of the
// run, ended without a plan.
func recordRun(t *testing.T, s *Step, p *program) {
	t.Helper()
	if err := s.Record(p.stream); err != nil {
		t.Fatal(err)
	}
	out := p.run()
	if err := s.End(false); err != nil {
		t.Fatal(err)
	}
	p.free(out)
}

func recordAndPlan(t *testing.T, b *Bridge, p *program) *Step {
	t.Helper()
	s, err := b.NewStep(0, "test")
	if err != nil {
		t.Fatal(err)
	}
	recordRun(t, s, p)
	if err := s.Plan(0); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestServeSameAddresses: a recorded step planned at the lower bound is
// served from its arena, every run at the same addresses, with no
// divergence and no allocation left to the spill allocator.
func TestServeSameAddresses(t *testing.T) {
	b := newTestBridge(t)
	p := &program{t: t, b: b, stream: 0x77, layers: 12}
	s := recordAndPlan(t, b, p)
	r := s.Report()
	if r.Arena != r.LowerBound || r.Buffers != 12*2+1 {
		t.Fatalf("plan: arena %d, lower bound %d, %d buffers; want the arena at the bound and 25 buffers (0-byte requests are not the plan's)", r.Arena, r.LowerBound, r.Buffers)
	}
	var first []cuda.DevicePtr
	for run := range 3 {
		if err := s.Serve(p.stream, true); err != nil {
			t.Fatal(err)
		}
		out := p.run()
		if err := s.End(false); err != nil {
			t.Fatal(err)
		}
		p.free(out)
		got := p.addrs
		if run == 0 {
			first = got
			continue
		}
		for i := range got {
			if got[i] != first[i] && !b.devices[0].zero.owns(got[i]) {
				t.Fatalf("run %d: allocation %d at %#x, run 0 had %#x", run, i, uint64(got[i]), uint64(first[i]))
			}
		}
	}
	r = s.Report()
	if r.Divergences != 0 || r.Runs != 3 || r.Served != 3*25 {
		t.Fatalf("report %+v: want 3 runs, 75 served, 0 divergences", r)
	}
	st, _ := b.Stats(0)
	if st.Planned != 75 || st.ZeroAllocs != 4*12 {
		t.Fatalf("stats %+v", st)
	}
}

// TestDivergenceSpills: a step that differs from its recording, or whose
// output is still live when the next run starts, gets spill memory for
// what the plan cannot serve — never an address a live buffer holds.
func TestDivergenceSpills(t *testing.T) {
	b := newTestBridge(t)
	p := &program{t: t, b: b, stream: 0x77, layers: 8}
	s := recordAndPlan(t, b, p)
	live := map[cuda.DevicePtr]uint64{}
	// Keep each run's output across the next run (eager loop that holds
	// the previous logits), and make run 1 differ in one size.
	var prev cuda.DevicePtr
	for run := range 3 {
		p.extra = 0
		if run == 1 {
			p.extra = 512
		}
		if err := s.Serve(p.stream, false); err != nil {
			t.Fatal(err)
		}
		// A live outsider: allocated on another stream during the step.
		other, err := b.Alloc(1<<20, 0, 0x99)
		if err != nil {
			t.Fatal(err)
		}
		live[other] = 1 << 20
		out := p.run()
		live[out] = 8192
		checkDisjoint(t, live)
		if err := s.End(false); err != nil {
			t.Fatal(err)
		}
		if prev != 0 {
			p.free(prev)
			delete(live, prev)
		}
		prev = out
	}
	r := s.Report()
	if r.Divergences == 0 || !strings.Contains(r.FirstDivergence, "taken") && !strings.Contains(r.FirstDivergence, "bytes") {
		t.Fatalf("report %+v: want divergences counted with a reason", r)
	}
	if r.Served == 0 {
		t.Fatal("nothing was served from the plan")
	}
	// Strict mode refuses instead of spilling.
	p.free(prev)
	p.extra = 100
	if err := s.Serve(p.stream, true); err != nil {
		t.Fatal(err)
	}
	var sawErr error
	for i := range 4 {
		size := uint64(4096 + 1000*i)
		if i == 3 {
			size += p.extra
		}
		a, err := b.Alloc(size, 0, p.stream)
		if err != nil {
			sawErr = err
			break
		}
		defer b.Free(a, 0)
		b.Free(mustAlloc(t, b, 65536, p.stream), 0)
	}
	if sawErr == nil || !strings.Contains(sawErr.Error(), "strict: allocation 6 is 7196 bytes, the plan has 7096") {
		t.Fatalf("strict serve of a different size: %v; want a strict error", sawErr)
	}
	s.End(false)
}

func mustAlloc(t *testing.T, b *Bridge, size uint64, stream uintptr) cuda.DevicePtr {
	t.Helper()
	a, err := b.Alloc(size, 0, stream)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestZeroByte: 0-byte requests get distinct addresses, reused only after
// their free, and never an address of a real allocation.
func TestZeroByte(t *testing.T) {
	b := newTestBridge(t)
	seen := map[cuda.DevicePtr]bool{}
	var zs []cuda.DevicePtr
	for range 1000 {
		z := mustAlloc(t, b, 0, 0)
		if seen[z] {
			t.Fatalf("0-byte allocation got %#x twice while live", uint64(z))
		}
		seen[z] = true
		zs = append(zs, z)
	}
	real := mustAlloc(t, b, 4096, 0)
	if seen[real] {
		t.Fatal("a real allocation got a 0-byte token's address")
	}
	for _, z := range zs {
		if err := b.Free(z, 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Free(zs[0], 0); err == nil {
		t.Fatal("second free of a 0-byte allocation succeeded")
	}
	if err := b.Free(real, 0); err != nil {
		t.Fatal(err)
	}
	if err := b.Free(real, 0); err == nil {
		t.Fatal("double free succeeded")
	}
}

// TestConcurrentCallers: several threads allocate and free at once (as
// autograd's threads and the main thread do) while a step serves on its
// stream; run with -race.
func TestConcurrentCallers(t *testing.T) {
	b := newTestBridge(t)
	p := &program{t: t, b: b, stream: 0x77, layers: 6}
	s := recordAndPlan(t, b, p)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			stream := uintptr(0x1000 + g)
			var live []cuda.DevicePtr
			for i := range 500 {
				a, err := b.Alloc(uint64(512*(1+i%7)+g*3), 0, stream)
				if err != nil {
					errs <- err
					return
				}
				live = append(live, a)
				if len(live) > 5 {
					if err := b.Free(live[0], 0); err != nil {
						errs <- err
						return
					}
					live = live[1:]
				}
			}
			for _, a := range live {
				b.Free(a, 0)
			}
		}()
	}
	for range 5 {
		if err := s.Serve(p.stream, false); err != nil {
			t.Fatal(err)
		}
		p.free(p.run())
		if err := s.End(false); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if r := s.Report(); r.Divergences != 0 {
		t.Fatalf("other streams' allocations took plan slots: %+v", r)
	}
}

// TestPlanFile: a saved plan serves a step loaded into a new step; a plan
// for another step is refused after its first run, saying what differs.
func TestPlanFile(t *testing.T) {
	b := newTestBridge(t)
	p := &program{t: t, b: b, stream: 0x77, layers: 5}
	s := recordAndPlan(t, b, p)
	path := filepath.Join(t.TempDir(), "step.plan")
	if err := s.Save(path); err != nil {
		t.Fatal(err)
	}
	s2, err := b.NewStep(0, "loaded")
	if err != nil {
		t.Fatal(err)
	}
	if err := s2.Load(path); err != nil {
		t.Fatal(err)
	}
	if err := s2.Serve(p.stream, true); err != nil {
		t.Fatal(err)
	}
	p.free(p.run())
	if err := s2.End(false); err != nil {
		t.Fatalf("the step the plan was made for: %v", err)
	}
	// The same step with a workspace made lazily at its start (and kept,
	// as cuBLAS keeps its workspaces): it spills, the plan stands.
	s4, _ := b.NewStep(0, "lazy")
	if err := s4.Load(path); err != nil {
		t.Fatal(err)
	}
	if err := s4.Serve(p.stream, false); err != nil {
		t.Fatal(err)
	}
	ws := p.alloc(524288)
	p.free(p.run())
	if err := s4.End(false); err != nil {
		t.Fatalf("the plan's step with one extra allocation refused: %v", err)
	}
	if r := s4.Report(); r.Divergences != 1 {
		t.Fatalf("%d divergences, want the extra allocation's 1", r.Divergences)
	}
	p.free(ws)
	// An extra allocation the size of a planned buffer just ahead (a
	// 64 KiB workspace, as each layer's) takes that buffer's place; the
	// buffer's own allocation then spills. The plan still stands.
	s5, _ := b.NewStep(0, "steal")
	if err := s5.Load(path); err != nil {
		t.Fatal(err)
	}
	if err := s5.Serve(p.stream, false); err != nil {
		t.Fatal(err)
	}
	ws = p.alloc(65536)
	p.free(p.run())
	if err := s5.End(false); err != nil {
		t.Fatalf("the plan's step with an extra allocation of a planned size refused: %v", err)
	}
	// The buffers whose planned range the extra one (kept live) covers
	// spill: here every layer's workspace. The buffers skipped on the way
	// find their places behind the cursor, so nothing else diverges.
	if r := s5.Report(); r.Divergences == 0 || r.Divergences > uint64(p.layers)+1 {
		t.Fatalf("%d divergences (%s), want the %d workspaces' (and at most one more)", r.Divergences, r.FirstDivergence, p.layers)
	}
	p.free(ws)
	other := &program{t: t, b: b, stream: 0x78, layers: 7}
	s3, _ := b.NewStep(0, "other")
	if err := s3.Load(path); err != nil {
		t.Fatal(err)
	}
	if err := s3.Serve(other.stream, false); err != nil {
		t.Fatal(err)
	}
	other.free(other.run())
	err = s3.End(false)
	if err == nil || !strings.Contains(err.Error(), "another step") {
		t.Fatalf("a plan for another step: %v; want it refused", err)
	}
}

// TestCaptureOnSim: the graph flow on the simulated device. A recording
// run under a throwaway capture, then a serving run under the real
// capture; the capture's spilled allocations stay in the step's pool, and
// eager allocations after the capture never get them.
func TestCaptureOnSim(t *testing.T) {
	b := newTestBridge(t)
	d, err := b.device(0)
	if err != nil {
		t.Fatal(err)
	}
	st, err := d.dev.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	p := &program{t: t, b: b, stream: st.Handle(), layers: 6}
	s, _ := b.NewStep(0, "graph")
	capture := func(serve bool) cuda.DevicePtr {
		t.Helper()
		if serve {
			if err := s.Serve(p.stream, false); err != nil {
				t.Fatal(err)
			}
		} else if err := s.Record(p.stream); err != nil {
			t.Fatal(err)
		}
		if err := d.dev.BeginCapture(st, cuda.CaptureModeGlobal); err != nil {
			t.Fatal(err)
		}
		if err := s.JoinCapture(); err != nil {
			t.Fatal(err)
		}
		out := p.run()
		g, err := d.dev.EndCapture(st)
		if err != nil {
			t.Fatal(err)
		}
		g.Close()
		if err := s.End(false); err != nil {
			t.Fatal(err)
		}
		return out
	}
	out := capture(false)
	p.free(out)
	if err := s.Plan(0); err != nil {
		t.Fatal(err)
	}
	// A bigger activation in the real capture: it spills into the step's pool.
	p.extra = 4096
	out = capture(true)
	r := s.Report()
	if r.Divergences != 1 || r.SpillHeld == 0 {
		t.Fatalf("report %+v: want 1 divergence held in the step's pool", r)
	}
	spilled := p.addrs[6]
	eager := mustAlloc(t, b, 4096+3000+4096, 0)
	if eager == spilled {
		t.Fatal("an eager allocation got the graph's spilled block")
	}
	b.Free(eager, 0)
	p.free(out)
	// Its graph destroyed, the step gives its captures' pools back and
	// can be captured again on its plan; not while a run is underway.
	if err := s.Serve(p.stream, false); err != nil {
		t.Fatal(err)
	}
	if err := s.DropCaptures(); err == nil {
		t.Fatal("DropCaptures during a run succeeded")
	}
	if err := s.End(false); err != nil {
		t.Fatal(err)
	}
	if err := s.DropCaptures(); err != nil {
		t.Fatal(err)
	}
	if r := s.Report(); r.SpillHeld != 0 {
		t.Fatalf("%d bytes held for dropped captures", r.SpillHeld)
	}
	p.free(capture(true))
	if r := s.Report(); r.SpillHeld == 0 {
		t.Fatalf("report %+v: the capture again spills into a pool of its own", r)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err == nil {
		t.Fatal("second Close succeeded")
	}
	if _, err := b.Step(s.ID()); err == nil {
		t.Fatal("a closed step is still found")
	}
}

func TestConfigFromEnv(t *testing.T) {
	for _, c := range []struct {
		dev, mem string
		ok       bool
	}{{"sim", "", true}, {"", "", true}, {"cuda", "123", true}, {"gpu", "", false}, {"sim", "-1", false}, {"sim", "x", false}} {
		t.Setenv("ARENAPLAN_DEVICE", c.dev)
		t.Setenv("ARENAPLAN_SIM_MEMORY", c.mem)
		_, err := ConfigFromEnv(nil)
		if (err == nil) != c.ok {
			t.Errorf("ARENAPLAN_DEVICE=%q ARENAPLAN_SIM_MEMORY=%q: err %v", c.dev, c.mem, err)
		}
	}
}

// TestResync: a run that lacks one recorded allocation (a workspace made
// lazily during the recording) falls back into step after it: no
// divergence, every later allocation at its planned address.
func TestResync(t *testing.T) {
	b := newTestBridge(t)
	p := &program{t: t, b: b, stream: 0x77, layers: 6}
	s, _ := b.NewStep(0, "lazy")
	if err := s.Record(p.stream); err != nil {
		t.Fatal(err)
	}
	ws := mustAlloc(t, b, 32<<20, p.stream) // the lazy workspace, never freed
	out := p.run()
	s.End(false)
	p.free(out)
	if err := s.Plan(0); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := s.Serve(p.stream, true); err != nil {
			t.Fatal(err)
		}
		p.free(p.run())
		if err := s.End(false); err != nil {
			t.Fatal(err)
		}
	}
	if r := s.Report(); r.Divergences != 0 || r.Served != 2*13 {
		t.Fatalf("report %+v: want 26 served, 0 divergences", r)
	}
	b.Free(ws, 0)
}

// TestCapturesUnderway: once the host counts captures, a capture it
// announced joins a private pool; with the count at 0 no capture query is
// made (a capture behind the host's back then uses the default pool, as
// with PyTorch's own allocator).
func TestCapturesUnderway(t *testing.T) {
	b := newTestBridge(t)
	d, err := b.device(0)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := d.dev.NewStream()
	defer st.Close()
	freed := mustAlloc(t, b, 4096, st.Handle())
	b.Free(freed, 0)
	capture := func() cuda.DevicePtr {
		if err := d.dev.BeginCapture(st, cuda.CaptureModeGlobal); err != nil {
			t.Fatal(err)
		}
		p := mustAlloc(t, b, 4096, st.Handle())
		b.Free(p, 0)
		g, err := d.dev.EndCapture(st)
		if err != nil {
			t.Fatal(err)
		}
		g.Close()
		return p
	}
	b.CapturesUnderway(1)
	if p := capture(); p == freed {
		t.Fatal("an announced capture got a block of the default pool")
	}
	b.CapturesUnderway(0)
	if p := capture(); p != freed {
		t.Fatalf("with no capture announced the allocator still asked the driver: got %#x, want the default pool's %#x", uint64(p), uint64(freed))
	}
}

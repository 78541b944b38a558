package bridge

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/arenaplan/arenaplan/cuda"
)

// serveRun serves one run of p from s and returns its addresses and its
// output (still live).
func serveRun(t *testing.T, s *Step, p *program) ([]cuda.DevicePtr, cuda.DevicePtr) {
	t.Helper()
	if err := s.Serve(p.stream, false); err != nil {
		t.Fatal(err)
	}
	out := p.run()
	if err := s.End(false); err != nil {
		t.Fatal(err)
	}
	return append([]cuda.DevicePtr(nil), p.addrs...), out
}

// inside fails unless every allocation of p's last run but the 0-byte
// ones (which have addresses of their own) lies in [lo, lo+n).
func inside(t *testing.T, p *program, lo cuda.DevicePtr, n uint64) {
	t.Helper()
	for i, a := range p.addrs {
		if p.sizes[i] == 0 {
			continue
		}
		if a < lo || uint64(a) >= uint64(lo)+n {
			t.Fatalf("allocation %d at %#x is outside the arena [%#x, +%d)", i, uint64(a), uint64(lo), n)
		}
	}
}

// TestReplanFromServedRun: a plan recorded from one run (an eager step) and
// served to a run that allocates differently (the capture) spills; Replan
// plans that run's own allocations, after which the same run is served
// entirely from the new plan at the same addresses every time.
func TestReplanFromServedRun(t *testing.T) {
	b := newTestBridge(t)
	p := &program{t: t, b: b, stream: 0x77, layers: 10}
	s := recordAndPlan(t, b, p)
	if err := s.Replan(0); err == nil || !strings.Contains(err.Error(), "diverged") {
		t.Fatalf("Replan with no served run: %v; want an error", err)
	}
	p.extra = 512 // the capture makes a larger buffer than the eager run
	_, out := serveRun(t, s, p)
	r := s.Report()
	if r.LastRunDivergences == 0 {
		t.Fatalf("report %+v: the differing run did not diverge", r)
	}
	p.free(out)
	if err := s.Replan(0); err != nil {
		t.Fatal(err)
	}
	r = s.Report()
	if r.Replans != 1 || r.Divergences != 0 || r.ReplanReason == "" || r.Ratio != 1 {
		t.Fatalf("after Replan: %+v; want 1 replan, its reason, counters reset, the plan at the lower bound", r)
	}
	var first []cuda.DevicePtr
	for run := range 3 {
		addrs, out := serveRun(t, s, p)
		p.free(out)
		if r := s.Report(); r.LastRunDivergences != 0 {
			t.Fatalf("run %d after Replan diverged: %+v", run, r)
		}
		p0, _ := s.ar.Ptr(0)
		off, _ := s.ar.Offset(0)
		inside(t, p, p0-cuda.DevicePtr(off), uint64(s.Report().Arena))
		if run == 0 {
			first = addrs
			continue
		}
		for i := range addrs {
			if addrs[i] != first[i] {
				t.Fatalf("run %d: allocation %d at %#x, run 0 had %#x", run, i, uint64(addrs[i]), uint64(first[i]))
			}
		}
	}
	if err := s.Replan(0); err == nil {
		t.Fatal("Replan after a run that followed the plan: want an error")
	}

	// A plan from a file is what the file says: never replanned.
	path := filepath.Join(t.TempDir(), "step.plan")
	if err := s.Save(path); err != nil {
		t.Fatal(err)
	}
	s2, _ := b.NewStep(0, "loaded")
	if err := s2.Load(path); err != nil {
		t.Fatal(err)
	}
	_, out = serveRun(t, s2, p)
	p.free(out)
	if err := s2.Replan(0); err == nil || !strings.Contains(err.Error(), "came from") {
		t.Fatalf("Replan of a loaded plan: %v; want a refusal", err)
	}
}

// TestReplanAroundLiveOutputs: outputs of the diverged run that the
// program still holds (a training step's gradients) stay at their
// addresses: the arena is kept, the new plan is served around them until
// they are freed, and then exactly. A new plan larger than the kept arena
// is refused and the step keeps its plan.
func TestReplanAroundLiveOutputs(t *testing.T) {
	b := newTestBridge(t)
	p := &program{t: t, b: b, stream: 0x77, layers: 10, extra: 4096}
	s := recordAndPlan(t, b, p) // the eager run is the larger one here
	arenaBefore := s.Report().Arena
	p.extra = 0
	_, out := serveRun(t, s, p)
	if s.Report().LastRunDivergences == 0 {
		t.Fatal("the smaller run did not diverge")
	}
	if err := s.Replan(0); err != nil {
		t.Fatalf("Replan with the output live: %v", err)
	}
	r := s.Report()
	if r.Replans != 1 || r.Arena > arenaBefore || r.ArenaMapped < uint64(arenaBefore) {
		t.Fatalf("after Replan: %+v; want the old arena (%d bytes) kept and the new plan inside it", r, arenaBefore)
	}
	// The old output is still live and still the program's: no run may
	// put a live allocation on it.
	live := map[cuda.DevicePtr]uint64{out: 8192}
	addrs, out2 := serveRun(t, s, p)
	for i, a := range addrs {
		if p.sizes[i] > 0 && a < out+8192 && out < a+cuda.DevicePtr(p.sizes[i]) {
			t.Fatalf("allocation %d at %#x overlaps the live orphan at %#x", i, uint64(a), uint64(out))
		}
	}
	live[out2] = 8192
	checkDisjoint(t, live)
	p.free(out) // the orphan: bookkeeping
	p.free(out2)
	var prev []cuda.DevicePtr
	for run := range 2 {
		addrs, o := serveRun(t, s, p)
		p.free(o)
		if r := s.Report(); r.LastRunDivergences != 0 {
			t.Fatalf("run %d after the orphan was freed diverged: %+v", run, r)
		}
		if run == 1 && !slices.Equal(addrs, prev) {
			t.Fatal("runs after the orphan was freed differ in addresses")
		}
		prev = addrs
	}
	if st, _ := b.Stats(0); st.PlannedLive != 0 {
		t.Fatalf("%d planned buffers live after every free", st.PlannedLive)
	}

	// Larger than the arena while an output is live: a new arena, the old
	// one retired until that output is freed.
	p.extra = 1 << 20
	_, out = serveRun(t, s, p)
	oldArena := s.ar.Size()
	if err := s.Replan(0); err != nil {
		t.Fatalf("Replan beyond the arena with an output live: %v", err)
	}
	r = s.Report()
	st, _ := b.Stats(0)
	if r.Arena <= oldArena || st.ArenaBytes != uint64(r.Arena+oldArena) {
		t.Fatalf("after growing: plan arena %d (was %d), device arenas %d; want a larger arena beside the retired one", r.Arena, oldArena, st.ArenaBytes)
	}
	live = map[cuda.DevicePtr]uint64{out: 8192}
	_, out2 = serveRun(t, s, p)
	live[out2] = 8192
	checkDisjoint(t, live)
	if r := s.Report(); r.LastRunDivergences != 0 {
		t.Fatalf("the grown plan diverged: %+v", r)
	}
	// The retired arena's last orphan freed during a capture (a training
	// step's zero_grad): closing waits for the capture's end, since it
	// synchronizes the device.
	b.CapturesUnderway(1)
	p.free(out)
	if st, _ := b.Stats(0); st.ArenaBytes != uint64(r.Arena+oldArena) {
		t.Fatalf("device arenas %d while a capture is underway; want the retired arena still there (%d)", st.ArenaBytes, r.Arena+oldArena)
	}
	b.CapturesUnderway(0)
	if st, _ := b.Stats(0); st.ArenaBytes != uint64(s.Report().Arena) || st.CloseError != "" {
		t.Fatalf("device arenas %d (close error %q) after the capture ended; want only the step's %d", st.ArenaBytes, st.CloseError, s.Report().Arena)
	}
	p.free(out2)
}

// TestFamilyMemberReplan: a family member whose served run diverged is
// planned again inside the family arena (the family plan passes
// CheckFamily again); one whose run needs more than the arena keeps its
// plan, and its runs still spill correctly.
func TestFamilyMemberReplan(t *testing.T) {
	b := newTestBridge(t)
	f, ps := recordFamily(t, b, []uint64{4, 2, 1})
	if err := f.Plan(0); err != nil {
		t.Fatal(err)
	}
	before := f.Report()
	ms := f.Members()
	base, err := f.ar.Ptr(0)
	if err != nil {
		t.Fatal(err)
	}

	// Member "bs2" diverges a little: it fits the family arena.
	p := ps[1]
	p.extra = 512
	_, out := serveRun(t, ms[1], p)
	p.free(out)
	if err := ms[1].Replan(0); err != nil {
		t.Fatal(err)
	}
	after := f.Report()
	if after.Arena != before.Arena || after.ArenaMap != before.ArenaMap {
		t.Fatalf("family arena %d (%d mapped) after a member's replan; it was %d (%d)", after.Arena, after.ArenaMap, before.Arena, before.ArenaMap)
	}
	for run := range 2 {
		addrs, out := serveRun(t, ms[1], p)
		if r := ms[1].Report(); r.LastRunDivergences != 0 || r.Replans != 1 {
			t.Fatalf("run %d of the replanned member: %+v", run, r)
		}
		if len(addrs) != len(p.addrs) {
			t.Fatal("run addresses not collected")
		}
		inside(t, p, base, uint64(after.Arena))
		p.free(out)
	}
	// The other members still run from their plans.
	for i, p := range []*program{ps[0], ps[2]} {
		_, out := serveRun(t, ms[[]int{0, 2}[i]], p)
		if r := ms[[]int{0, 2}[i]].Report(); r.LastRunDivergences != 0 {
			t.Fatalf("member %s diverged after another member's replan: %+v", r.Name, r)
		}
		p.free(out)
	}

	// The largest member grows beyond the arena: Replan refuses, the
	// member keeps its plan and its runs spill without overlap.
	p = ps[0]
	p.extra = 4 << 20
	_, out = serveRun(t, ms[0], p)
	p.free(out)
	if err := ms[0].Replan(0); err == nil || !strings.Contains(err.Error(), "keeps its plan") {
		t.Fatalf("Replan beyond the family arena: %v; want a refusal", err)
	}
	live := map[cuda.DevicePtr]uint64{}
	addrs, out := serveRun(t, ms[0], p)
	live[out] = 8192 * 4
	if r := ms[0].Report(); r.LastRunDivergences == 0 || r.Replans != 0 {
		t.Fatalf("member kept its plan: %+v; want divergences and no replan", r)
	}
	if len(addrs) == 0 {
		t.Fatal("no allocations")
	}
	checkDisjoint(t, live)
	p.free(out)

	// A family plan file round-trips with the replanned member.
	path := filepath.Join(t.TempDir(), "fam.plan")
	if err := f.Save(path); err != nil {
		t.Fatal(err)
	}
}

package bridge

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/arenaplan/arenaplan/cuda"
	"github.com/arenaplan/arenaplan/lifetime"
	"github.com/arenaplan/arenaplan/lifetime/tracegen"
	"github.com/arenaplan/arenaplan/planner"
)

// recordFamily records one member per scale (largest first, as engines
// capture) and plans the family.
func recordFamily(t *testing.T, b *Bridge, scales []uint64) (*Family, []*program) {
	t.Helper()
	f, err := b.NewFamily(0, "decode")
	if err != nil {
		t.Fatal(err)
	}
	var ps []*program
	for _, k := range scales {
		p := &program{t: t, b: b, stream: 0x77, layers: 6, scale: k}
		s, err := f.NewMember("bs" + string(rune('0'+k)))
		if err != nil {
			t.Fatal(err)
		}
		recordRun(t, s, p)
		ps = append(ps, p)
	}
	return f, ps
}

// noDivergence fails t where a member of f has diverged from its plan.
func noDivergence(t *testing.T, f *Family) {
	t.Helper()
	for _, m := range f.Report().Members {
		if m.Divergences != 0 {
			t.Fatalf("member %s: %d divergences (%s)", m.Name, m.Divergences, m.FirstDivergence)
		}
	}
}

// TestFamilySharesOneArena: members planned jointly share one arena as
// large as the largest member's lower bound; each replays at its own
// addresses every time, in any order, inside that arena.
func TestFamilySharesOneArena(t *testing.T) {
	b := newTestBridge(t)
	scales := []uint64{8, 4, 2, 1}
	f, ps := recordFamily(t, b, scales)
	if err := f.Plan(0); err != nil {
		t.Fatal(err)
	}
	r := f.Report()
	var sum int64
	for _, m := range r.Members {
		sum += m.LowerBound
	}
	if r.Arena < r.LowerBound || r.Arena >= sum {
		t.Fatalf("family arena %d: want at least the largest member's bound %d and below the members' sum %d", r.Arena, r.LowerBound, sum)
	}
	st, _ := b.Stats(0)
	if st.ArenaBytes != uint64(r.Arena) {
		t.Fatalf("stats count %d arena bytes, want the one shared arena's %d", st.ArenaBytes, r.Arena)
	}
	members := f.Members()
	first := make([][]cuda.DevicePtr, len(members))
	base, hi := ^uint64(0), uint64(0)
	for _, order := range [][]int{{0, 1, 2, 3}, {3, 1, 0, 2}, {2, 2, 0, 3}} {
		for _, i := range order {
			s, p := members[i], ps[i]
			if err := s.Serve(p.stream, true); err != nil {
				t.Fatal(err)
			}
			out := p.run()
			if err := s.End(false); err != nil {
				t.Fatal(err)
			}
			p.free(out)
			if first[i] == nil {
				first[i] = append([]cuda.DevicePtr(nil), p.addrs...)
			}
			for j, a := range p.addrs {
				if b.devices[0].zero.owns(a) {
					continue
				}
				if a != first[i][j] {
					t.Fatalf("member %d allocation %d at %#x, first run had %#x", i, j, uint64(a), uint64(first[i][j]))
				}
				base, hi = min(base, uint64(a)), max(hi, uint64(a))
			}
		}
	}
	if hi-base >= uint64(r.Arena) {
		t.Fatalf("members' addresses span %d bytes, beyond the %d-byte arena", hi-base, r.Arena)
	}
	noDivergence(t, f)
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if st, _ := b.Stats(0); st.ArenaBytes != 0 {
		t.Fatalf("after Close the device still counts %d arena bytes", st.ArenaBytes)
	}
}

// TestFamilyPlanFile: a family plan round-trips through a file and serves
// the same addresses; a file made for other members is refused.
func TestFamilyPlanFile(t *testing.T) {
	b := newTestBridge(t)
	f, _ := recordFamily(t, b, []uint64{4, 2, 1})
	if err := f.Plan(0); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "decode.plan")
	if err := f.Save(path); err != nil {
		t.Fatal(err)
	}
	want := f.Report().Arena
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}

	g, err := b.NewFamily(0, "decode")
	if err != nil {
		t.Fatal(err)
	}
	var ss []*Step
	for _, k := range []uint64{4, 2, 1} {
		s, err := g.NewMember("bs" + string(rune('0'+k)))
		if err != nil {
			t.Fatal(err)
		}
		ss = append(ss, s)
	}
	if err := g.Load(path); err != nil {
		t.Fatal(err)
	}
	if got := g.Report().Arena; got != want {
		t.Fatalf("loaded arena %d, saved %d", got, want)
	}
	p := &program{t: t, b: b, stream: 0x77, layers: 6, scale: 2}
	if err := ss[1].Serve(p.stream, true); err != nil {
		t.Fatal(err)
	}
	out := p.run()
	if err := ss[1].End(false); err != nil {
		t.Fatalf("the member the plan was made for was refused: %v", err)
	}
	p.free(out)
	// Member 0 runs a different step (scale 3): its End refuses the plan.
	q := &program{t: t, b: b, stream: 0x77, layers: 6, scale: 3}
	if err := ss[0].Serve(q.stream, false); err != nil {
		t.Fatal(err)
	}
	out = q.run()
	if err := ss[0].End(false); err == nil || !strings.Contains(err.Error(), "another step") {
		t.Fatalf("a run unlike the plan: End said %v, want a refusal naming the difference", err)
	}
	q.free(out)
	g.Close()

	// Another family shape: refused at load.
	h, _ := b.NewFamily(0, "decode")
	for _, n := range []string{"bs4", "bs2"} {
		if _, err := h.NewMember(n); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.Load(path); err == nil || !strings.Contains(err.Error(), "another family") {
		t.Fatalf("a plan for 3 members loaded into 2: %v", err)
	}
	h.Close()
}

// TestFamilyKeepsOutOfABufferHeldPastItsPlan: an allocation one member's
// capture makes that its recording did not, kept for good (a library's
// workspace), takes a planned buffer out of its turn; another member's
// buffer planned over that range must not be served there while it lives.
// Members' outputs the program holds do not count: a family's members may
// overwrite each other's outputs.
func TestFamilyKeepsOutOfABufferHeldPastItsPlan(t *testing.T) {
	b := newTestBridge(t)
	f, err := b.NewFamily(0, "workspace")
	if err != nil {
		t.Fatal(err)
	}
	const mib = 1 << 20
	p := &program{t: t, b: b, stream: 0x79}
	var ws, y cuda.DevicePtr
	var outs []cuda.DevicePtr
	steps := []func(serve bool){
		func(serve bool) {
			if serve {
				ws = p.alloc(mib) // the extra allocation: it takes x's planned buffer
			}
			p.free(p.alloc(mib))
			outs = append(outs, p.alloc(mib))
		},
		func(bool) {
			y = p.alloc(2 * mib)
			p.free(y)
			outs = append(outs, p.alloc(mib))
		},
	}
	var ms []*Step
	for i := range steps {
		m, err := f.NewMember(fmt.Sprint(i))
		if err != nil {
			t.Fatal(err)
		}
		ms = append(ms, m)
	}
	for pass := range 2 {
		runMembers(t, p, ms, pass == 1, false, func(i int) { steps[i](pass == 1) })
		if pass == 0 {
			if err := f.Plan(0); err != nil {
				t.Fatal(err)
			}
		}
	}
	if uint64(y) < uint64(ws)+mib && uint64(ws) < uint64(y)+2*mib {
		t.Fatalf("member 1's buffer at %#x overlaps member 0's kept allocation at %#x", uint64(y), uint64(ws))
	}
	for _, o := range outs {
		p.free(o)
	}
	p.free(ws)
}

// TestFamilyGrowsAfterPlan: a member added to a planned family and
// recorded is planned into the family's arena on its own: the others keep
// their addresses, the arena its size, and every member serves without a
// divergence. A member that needs more than the arena is refused
// (ErrDoesNotFit) and leaves the family, which still serves.
func TestFamilyGrowsAfterPlan(t *testing.T) {
	b := newTestBridge(t)
	f, ps := recordFamily(t, b, []uint64{8, 4})
	if err := f.Plan(0); err != nil {
		t.Fatal(err)
	}
	arena := f.Report().Arena
	before := make([][]cuda.DevicePtr, len(ps))
	for i, s := range f.Members() {
		var out cuda.DevicePtr
		before[i], out = serveRun(t, s, ps[i])
		ps[i].free(out)
	}
	add := func(scale uint64) (*Step, *program, error) {
		p := &program{t: t, b: b, stream: 0x77, layers: 6, scale: scale}
		s, err := f.NewMember(fmt.Sprint("bs", scale))
		if err != nil {
			t.Fatal(err)
		}
		recordRun(t, s, p)
		return s, p, f.PlanMember(s, 0)
	}
	s2, p2, err := add(2)
	if err != nil {
		t.Fatal(err)
	}
	r := f.Report()
	if r.Arena != arena || len(r.Members) != 3 {
		t.Fatalf("arena %d with %d members; want the arena of %d with 3", r.Arena, len(r.Members), arena)
	}
	if _, _, err := add(16); !errors.Is(err, ErrDoesNotFit) {
		t.Fatalf("a member larger than the arena: %v, want ErrDoesNotFit", err)
	}
	if n := len(f.Members()); n != 3 {
		t.Fatalf("%d members after a refused one; want 3", n)
	}
	ps = append(ps, p2)
	lo := ^uint64(0)
	for i := range before {
		for j, a := range before[i] {
			if ps[i].sizes[j] > 0 {
				lo = min(lo, uint64(a))
			}
		}
	}
	for round := range 2 {
		for i, s := range f.Members() {
			addrs, out := serveRun(t, s, ps[i])
			ps[i].free(out)
			for j := range addrs {
				if i < len(before) && ps[i].sizes[j] > 0 && addrs[j] != before[i][j] {
					t.Fatalf("round %d: member %d's allocation %d moved", round, i, j)
				}
			}
			if s == s2 {
				inside(t, p2, cuda.DevicePtr(lo), uint64(arena))
			}
		}
	}
	noDivergence(t, f)
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestFamilyRefusesRepeatedName: a member name already in the family is
// refused when added (before, the family took it and every later plan
// failed with "member name appears twice"); the family still plans, and
// a name freed by closing its unplanned member can be used again.
func TestFamilyRefusesRepeatedName(t *testing.T) {
	b := newTestBridge(t)
	f, _ := recordFamily(t, b, []uint64{2, 1})
	if _, err := f.NewMember("bs2"); !errors.Is(err, ErrDuplicateMember) || !strings.Contains(err.Error(), `member "bs2"`) {
		t.Fatalf("a second member bs2: %v, want ErrDuplicateMember naming it", err)
	}
	if n := len(f.Members()); n != 2 {
		t.Fatalf("%d members after the refusal, want 2", n)
	}
	if err := f.Plan(0); err != nil {
		t.Fatalf("plan after the refusal: %v", err)
	}
	s, err := f.NewMember("late")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := f.NewMember("late"); err != nil {
		t.Errorf("the name of a closed, unplanned member: %v", err)
	}
}

// TestFamilyMemberAroundHeldOutput: a member planned while the program
// holds another member's output in the arena (a graph reading the one
// before it) leaves that output alone, on every replay and after a
// Replan, and the arena grows in place where the member needs more room
// than it has: the first member's addresses stay, and the arena is the
// larger need plus the held bytes, not the sum.
func TestFamilyMemberAroundHeldOutput(t *testing.T) {
	b := newTestBridge(t)
	b.CapturesUnderway(0) // as the Python package says at install: the cache may be trimmed
	f, ps := recordFamily(t, b, []uint64{2})
	if err := f.Plan(0); err != nil {
		t.Fatal(err)
	}
	a := f.Members()[0]
	before := f.Report().Arena
	addrsA, outA := serveRun(t, a, ps[0])
	held := Range{outA, outA.Add(8192 * 2)}
	pb := &program{t: t, b: b, stream: 0x77, layers: 6, scale: 4}
	s, err := f.NewMember("bs4")
	if err != nil {
		t.Fatal(err)
	}
	recordRun(t, s, pb)
	if st, _ := b.Stats(0); st.Spill.Cached == 0 {
		t.Fatal("the recorded run left nothing cached: the test below proves nothing")
	}
	if err := f.PlanMemberAround(s, 0, []Range{held, {1, 2}}); err != nil { // a range outside the arena is ignored
		t.Fatal(err)
	}
	// The arena grew; what the recorded run left cached went back first.
	if st, _ := b.Stats(0); st.Spill.Cached != 0 {
		t.Fatalf("%d bytes stay cached in the spill beside the grown arena: %+v", st.Spill.Cached, st.Spill)
	}
	r := f.Report()
	if r.Arena <= before {
		t.Fatalf("arena %d: the larger member did not grow it from %d", r.Arena, before)
	}
	lbB := r.Members[1].LowerBound
	if r.Arena > lbB+8192*2+256 || r.Arena >= before+lbB {
		t.Fatalf("arena %d: want at most the larger need %d plus the held output, below the sum %d", r.Arena, lbB, before+lbB)
	}
	avoids := func(what string) {
		t.Helper()
		for j, p := range pb.addrs {
			if pb.sizes[j] > 0 && p < held.Hi && held.Lo < p.Add(pb.sizes[j]) {
				t.Fatalf("%s: allocation %d at %#x meets the held output [%#x, %#x)", what, j, uint64(p), uint64(held.Lo), uint64(held.Hi))
			}
		}
	}
	for range 2 {
		_, out := serveRun(t, s, pb)
		avoids("served")
		pb.free(out)
	}
	// A capture that allocates differently: its Replan avoids the output too.
	pb.extra = 4096
	_, out := serveRun(t, s, pb)
	pb.free(out)
	grown := f.Report().Arena
	if err := s.Replan(0); err != nil {
		t.Fatal(err)
	}
	if st, _ := b.Stats(0); f.Report().Arena <= grown || st.Spill.Cached != 0 {
		t.Fatalf("the replan grew the arena from %d to %d with %d bytes still cached in the spill; want it grown, the cache given back first",
			grown, f.Report().Arena, st.Spill.Cached)
	}
	_, out = serveRun(t, s, pb)
	avoids("replanned")
	pb.free(out)
	ps[0].free(outA)
	// The first member kept its addresses across the growth.
	again, out := serveRun(t, a, ps[0])
	ps[0].free(out)
	for j := range again {
		if ps[0].sizes[j] > 0 && again[j] != addrsA[j] {
			t.Fatalf("the first member's allocation %d moved from %#x to %#x", j, uint64(addrsA[j]), uint64(again[j]))
		}
	}
	noDivergence(t, f)
	if st, _ := b.Stats(0); st.ArenaMapped < uint64(f.Report().Arena) {
		t.Fatalf("the device maps %d arena bytes, less than the grown arena's %d", st.ArenaMapped, f.Report().Arena)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestPlanAroundAvoidsHeldRanges: planAround never places a buffer over a held
// range, whatever the ranges (random traces, ranges anywhere), and its
// plan passes planner.Check on the member's own trace.
func TestPlanAroundAvoidsHeldRanges(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 9))
	for round := range 40 {
		tr := &lifetime.Trace{Name: fmt.Sprint("r", round)}
		for i := range 30 {
			s := rng.Int64N(40)
			tr.Buffers = append(tr.Buffers, lifetime.Buffer{ID: lifetime.ID(i), Size: 1 + rng.Int64N(1<<14), Start: s, End: s + 1 + rng.Int64N(20)})
		}
		var around []offRange
		for range 1 + rng.IntN(3) {
			lo := rng.Int64N(1 << 16)
			around = append(around, offRange{lo, lo + 1 + rng.Int64N(1<<13)})
		}
		p, err := planAround(tr, around, 20*time.Millisecond, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := planner.Check(tr, p); err != nil {
			t.Fatal(err)
		}
		for i, off := range p.Offsets {
			n := lifetime.RoundUp(tr.Buffers[i].Size, p.Align)
			for _, r := range around {
				if off < r.hi && r.lo < off+n {
					t.Fatalf("round %d: buffer %d at [%d, %d) meets held [%d, %d)", round, i, off, off+n, r.lo, r.hi)
				}
			}
		}
	}
}

// TestFamilyMemberReplannedAroundHeldOutput: a member planned before the
// program held another member's output across its replays (a loop: the
// first graph replays again while the program keeps the second one's
// output) is planned again around that output: its outputs stay where
// they were (the second member's plan avoids them), none of its
// allocations meets the held output any more, it serves without a
// divergence, and the other member keeps its addresses. A held range on
// its own output is refused, and so is one outside the arena alone; the
// member then keeps its plan.
func TestFamilyMemberReplannedAroundHeldOutput(t *testing.T) {
	b := newTestBridge(t)
	b.CapturesUnderway(0)
	f, ps := recordFamily(t, b, []uint64{2})
	if err := f.Plan(0); err != nil {
		t.Fatal(err)
	}
	a := f.Members()[0]
	_, outA := serveRun(t, a, ps[0])
	pb := &program{t: t, b: b, stream: 0x77, layers: 6, scale: 4}
	s, err := f.NewMember("bs4")
	if err != nil {
		t.Fatal(err)
	}
	recordRun(t, s, pb)
	if err := f.PlanMemberAround(s, 0, []Range{{outA, outA.Add(8192 * 2)}}); err != nil {
		t.Fatal(err)
	}
	ps[0].free(outA)
	addrsB, outB := serveRun(t, s, pb)
	held := Range{outB, outB.Add(8192 * 4)}
	meets := func() bool {
		for j, p := range ps[0].addrs {
			if ps[0].sizes[j] > 0 && p < held.Hi && held.Lo < p.Add(ps[0].sizes[j]) {
				return true
			}
		}
		return false
	}
	_, out := serveRun(t, a, ps[0])
	ps[0].free(out)
	if out != outA {
		t.Fatalf("the first member's output moved from %#x to %#x without a plan", uint64(outA), uint64(out))
	}
	if !meets() {
		t.Fatal("the first member's plan leaves the second one's output alone already: the test below proves nothing")
	}
	plan := a.plan
	for _, bad := range [][]Range{{{outA, outA.Add(16)}}, {{1, 2}}} {
		if err := f.ReplanMemberAround(a, 0, bad); err == nil || a.plan != plan {
			t.Fatalf("planned around %v (its own output, or nothing in the arena): %v", bad, err)
		}
	}
	if err := f.ReplanMemberAround(a, 0, []Range{{outA, outA.Add(16)}}); !errors.Is(err, ErrHeldOnOutput) {
		t.Fatalf("a held range on its own output: %v, want ErrHeldOnOutput", err)
	}
	if err := f.ReplanMemberAround(a, 0, []Range{held}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		_, out := serveRun(t, a, ps[0])
		ps[0].free(out)
		if out != outA {
			t.Fatalf("the first member's output moved from %#x to %#x", uint64(outA), uint64(out))
		}
		if meets() {
			t.Fatal("an allocation of the replanned member meets the held output")
		}
	}
	if r := a.Report(); r.Replans != 1 || r.Divergences != 0 || !strings.Contains(r.ReplanReason, "held") {
		t.Fatalf("replans %d, divergences %d, reason %q", r.Replans, r.Divergences, r.ReplanReason)
	}
	pb.free(outB)
	again, out := serveRun(t, s, pb)
	pb.free(out)
	for j := range again {
		if pb.sizes[j] > 0 && again[j] != addrsB[j] {
			t.Fatalf("the second member's allocation %d moved from %#x to %#x", j, uint64(addrsB[j]), uint64(again[j]))
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestPlanAroundStopsAtTheGoal: a step planned into an arena as it is
// (PlanMember, ReplanMemberAround, a member's Replan: the goal is the
// family's arena) stops at its first plan that fits, with or without
// held ranges, rather than search for a smaller one the arena would not
// use; without a goal it searches on.
func TestPlanAroundStopsAtTheGoal(t *testing.T) {
	tr, err := tracegen.TorchDecode(tracegen.TorchDecodeOptions{Model: tracegen.Model{Batch: 1}, Attention: "efficient"})
	if err != nil {
		t.Fatal(err)
	}
	searched, err := planAround(tr, nil, time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	if searched.Stop == planner.StopGoal || searched.Arena <= searched.LowerBound {
		t.Fatalf("without a goal: arena %d (peak %d), stopped by %q; want a search above the peak", searched.Arena, searched.LowerBound, searched.Stop)
	}
	goal := 2 * searched.Arena
	held := []offRange{{goal - 4096, goal}}
	for _, around := range [][]offRange{nil, held} {
		p, err := planAround(tr, around, time.Second, goal)
		if err != nil {
			t.Fatal(err)
		}
		if p.Stop != planner.StopGoal || p.Arena > goal {
			t.Errorf("%d held ranges, goal %d: arena %d, stopped by %q; want at most the goal, stopped by %q",
				len(around), goal, p.Arena, p.Stop, planner.StopGoal)
		}
	}
}

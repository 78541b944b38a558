package arena

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/arenaplan/arenaplan/lifetime"
	"github.com/arenaplan/arenaplan/planner"
)

func TestLayout(t *testing.T) {
	e := newSimEnv(t, 1*GiB)
	gran, _ := e.Dev.Granularity(false)
	tr := modelTrace()
	p, _ := groupedPlan(t, tr, int64(gran))
	l, err := NewLayout(e.Dev, tr, p, "weight", "kv", "nosuch")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	a := l.Arena()
	for i := range tr.Buffers {
		want := mustPtr(t, a, lifetime.ID(i))
		if got, _ := l.Addr(lifetime.ID(i)); got != want || l.Addrs()[i] != want {
			t.Errorf("buffer %d at %#x, arena says %#x", i, got, want)
		}
		if n, _ := planner.Need(&tr.Buffers[i], p.Align); l.Needs()[i] != uint64(n) {
			t.Errorf("buffer %d needs %d, want %d", i, l.Needs()[i], n)
		}
	}
	if _, err := l.Addr(lifetime.ID(len(tr.Buffers))); !errors.Is(err, ErrUnknown) {
		t.Errorf("Addr past the end: %v, want ErrUnknown", err)
	}
	// The kept tags are backed up, the rest dropped.
	for _, r := range a.Regions() {
		want := Drop
		if r.Tags[0] == "weight" || r.Tags[0] == "kv" {
			want = Backup
		}
		if r.Policy != want {
			t.Errorf("region %v: policy %v, want %v", r.Tags, r.Policy, want)
		}
	}
	if a.Paused() {
		t.Error("Paused before Pause")
	}
	if err := a.Pause("kv"); err != nil || !a.Paused() {
		t.Errorf("Pause(kv): %v, Paused %v", err, a.Paused())
	}
	if err := a.Resume(); err != nil || a.Paused() {
		t.Errorf("Resume: %v, Paused %v", err, a.Paused())
	}
	if got := l.TagBytes("weight"); got != lifetime.RoundUp(1*MiB+100, p.Align)+700*KiB {
		t.Errorf("TagBytes(weight) = %d", got)
	}
	if got := l.TagBytes("nosuch"); got != 0 {
		t.Errorf("TagBytes(nosuch) = %d", got)
	}

	// A later run that shrinks a buffer fits, at the same addresses; one
	// that grows one does not.
	run := *tr
	run.Buffers = append([]lifetime.Buffer(nil), tr.Buffers...)
	run.Buffers[2].Size /= 2
	l2, err := l.Fit(&run)
	if err != nil {
		t.Fatal(err)
	}
	if l2.Addrs()[2] != l.Addrs()[2] || l2.Needs()[2] >= l.Needs()[2] || l2.Trace() != &run || l2.Arena() != a {
		t.Errorf("Fit: %#x (need %d), want %#x (need < %d)", l2.Addrs()[2], l2.Needs()[2], l.Addrs()[2], l.Needs()[2])
	}
	run.Buffers[2].Size = 4 * tr.Buffers[2].Size
	if _, err := l.Fit(&run); err == nil || !strings.Contains(err.Error(), "grew") {
		t.Errorf("Fit of a grown buffer: %v", err)
	}
}

func TestLayoutRefusesBadPlan(t *testing.T) {
	e := newSimEnv(t, 1*GiB)
	tr := modelTrace()
	p := fixedPlan(tr, make([]int64, len(tr.Buffers))) // everything at 0
	if _, err := NewLayout(e.Dev, tr, p); err == nil {
		t.Fatal("NewLayout took a plan whose buffers overlap")
	}
	if free := e.Free(t); free != 1*GiB {
		t.Errorf("%d bytes free after a refused layout, want all", free)
	}
}

// TestPlace places a second plan of a smaller run in an arena, as the
// bridge's Replan does: inside the arena's regions it lands at the
// arena's addresses for its offsets; beyond them it is refused.
func TestPlace(t *testing.T) {
	e := newSimEnv(t, 1*GiB)
	tr := modelTrace()
	p, err := planner.Run(context.Background(), "bestfit", tr, planner.Options{Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	for i := range tr.Buffers {
		tr.Buffers[i].Tag = "" // one region: a step's arena in the bridge
	}
	l, err := NewLayout(e.Dev, tr, p)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	small := &lifetime.Trace{Name: "small", Buffers: []lifetime.Buffer{
		{Name: "x", Size: 4 * KiB, Start: 0, End: 2},
		{ID: 1, Name: "y", Size: 8 * KiB, Start: 1, End: 3},
	}}
	sp, err := planner.Run(context.Background(), "bestfit", small, planner.Options{Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	pl, err := l.Arena().Place(small, sp)
	if err != nil {
		t.Fatal(err)
	}
	base := l.Addrs()[0]
	for i, off := range p.Offsets {
		if off == 0 {
			base = l.Addrs()[i]
		}
	}
	for i, off := range sp.Offsets {
		if pl.Addrs()[i] != base.Add(uint64(off)) {
			t.Errorf("placed buffer %d at %#x, want %#x", i, pl.Addrs()[i], base.Add(uint64(off)))
		}
	}
	if err := pl.Close(); err != nil || l.Arena().Mapped() == 0 {
		t.Errorf("closing a placed layout closed the arena: %v", err)
	}
	big := &lifetime.Trace{Name: "big", Buffers: []lifetime.Buffer{{Name: "z", Size: p.Arena + 1, Start: 0, End: 1}}}
	bp := &planner.Plan{Algo: "fixed", Align: p.Align, Offsets: []int64{0}, Arena: lifetime.RoundUp(p.Arena+1, p.Align)}
	if _, err := l.Arena().Place(big, bp); err == nil || !strings.Contains(err.Error(), "outside the arena") {
		t.Errorf("Place beyond the arena: %v", err)
	}
	bad := &planner.Plan{Algo: "fixed", Align: sp.Align, Offsets: []int64{0, 0}, Arena: sp.Arena}
	if _, err := l.Arena().Place(small, bad); err == nil || !strings.Contains(err.Error(), "plan refused") {
		t.Errorf("Place of an overlapping plan: %v", err)
	}
}

func TestFamilyLayout(t *testing.T) {
	e := newSimEnv(t, 1*GiB)
	member := func(name string, act int64) planner.Member {
		tr := &lifetime.Trace{Name: name, Buffers: []lifetime.Buffer{
			{Name: "w", Size: 1 * MiB, Start: 0, End: 4, Tag: "weight"},
			{ID: 1, Name: "a", Size: act, Start: 0, End: 2, Tag: "act"},
			{ID: 2, Name: "b", Size: act, Start: 1, End: 4, Tag: "act"},
		}}
		return planner.Member{Name: name, Trace: tr, Keys: planner.SharedByTag(tr, "weight")}
	}
	members := []planner.Member{member("b1", 64*KiB), member("b8", 512*KiB)}
	f, fp := familyLayout(t, e, members)
	if len(f.Members) != 2 {
		t.Fatalf("%d member layouts", len(f.Members))
	}
	// The shared weight is at one address for both members.
	if f.Members[0].Addrs()[0] != f.Members[1].Addrs()[0] {
		t.Errorf("shared weight at %#x and %#x", f.Members[0].Addrs()[0], f.Members[1].Addrs()[0])
	}
	regs := f.Arena.Regions()
	if len(regs) != 2 || regs[0].Tags[0] != "shared" || regs[0].Policy != Backup || regs[1].Tags[0] != "private" || regs[1].Policy != Drop {
		t.Fatalf("regions %+v, want shared (backup) then private (drop)", regs)
	}
	if regs[1].Lo != fp.SharedRegion.Hi || regs[1].Hi != fp.Arena {
		t.Errorf("private region [%d, %d), want [%d, %d)", regs[1].Lo, regs[1].Hi, fp.SharedRegion.Hi, fp.Arena)
	}
	for i, l := range f.Members {
		for j, off := range fp.Members[i].Plan.Offsets {
			r := regs[1]
			if j == 0 {
				r = regs[0]
			}
			if want := r.VA.Add(uint64(off - r.Lo)); l.Addrs()[j] != want {
				t.Errorf("member %d buffer %d at %#x, want %#x", i, j, l.Addrs()[j], want)
			}
		}
	}
	// A plan that does not match its members is refused.
	wrong := *fp
	wrong.Members = fp.Members[:1]
	if _, err := NewFamilyLayout(e.Dev, members, &wrong); err == nil {
		t.Error("NewFamilyLayout took a plan for another family")
	}
}

// TestFamilyLayoutPrivate: a family with nothing shared (a PyTorch
// family) is one private region over the whole arena.
func TestFamilyLayoutPrivate(t *testing.T) {
	e := newSimEnv(t, 1*GiB)
	var members []planner.Member
	for _, n := range []int64{1, 4} {
		members = append(members, planner.Member{Name: "m", Trace: &lifetime.Trace{Name: "m", Buffers: []lifetime.Buffer{
			{Name: "a", Size: n * 64 * KiB, Start: 0, End: 2},
			{ID: 1, Name: "b", Size: n * 32 * KiB, Start: 1, End: 3},
		}}})
	}
	members[1].Name = "m4"
	f, fp := familyLayout(t, e, members)
	regs := f.Arena.Regions()
	if len(regs) != 1 || regs[0].Lo != 0 || regs[0].Hi != fp.Arena || regs[0].Policy != Drop {
		t.Fatalf("regions %+v, want one [0, %d) dropped", regs, fp.Arena)
	}
}

// familyLayout plans members as a family and maps its layout.
func familyLayout(t *testing.T, e *env, members []planner.Member) (*GroupLayout, *planner.GroupPlan) {
	t.Helper()
	fp, err := planner.PlanFamily(context.Background(), "bestfit", members, planner.Options{Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	f, err := NewFamilyLayout(e.Dev, members, fp)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f, fp
}

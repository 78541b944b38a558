package arena

import (
	"errors"
	"fmt"

	"github.com/arenaplan/arenaplan/cuda"
	"github.com/arenaplan/arenaplan/lifetime"
	"github.com/arenaplan/arenaplan/planner"
)

// Layout is a planned step made real: a trace, a plan that planner.Check
// accepted for it, the arena the plan is served from, and every buffer's
// address there. It is the one core both engines build on: Go's executor
// (graphexec) resolves its kernels' arguments from it, the PyTorch bridge
// hands its addresses out to allocations.
//
// Pause policy: a layout's arena backs up the regions of the tags it was
// made to keep (state a replay reads but never rewrites: weights, a KV
// cache, constant inputs) and drops every other (a replay rewrites it);
// a family layout keeps its shared buffers and drops its members'
// private memory (NewGroupLayout).
//
// A layout made by NewLayout owns its arena (Close closes it); one made
// by Place or Fit shares the arena it was placed in, and its Close does
// nothing. A Layout is immutable; its arena is safe for concurrent use.
type Layout struct {
	trace *lifetime.Trace
	plan  *planner.Plan
	arena *Arena
	addrs []cuda.DevicePtr
	need  []uint64
	owner bool
}

// NewLayout checks p against t, maps an arena for it (New) and resolves
// every buffer's address. The regions holding the tags in keep that t has
// are backed up on Pause (Backup), all others dropped (Drop).
func NewLayout(dev cuda.Device, t *lifetime.Trace, p *planner.Plan, keep ...string) (*Layout, error) {
	if dev == nil || t == nil || p == nil {
		return nil, errors.New("arena: NewLayout: nil device, trace or plan")
	}
	a, err := New(dev, t, p, backups(t, keep)...)
	if err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	l, _ := a.layout(t, p, func(i int, _ int64) (cuda.DevicePtr, bool) { return a.ptr(lifetime.ID(i)), true })
	l.owner = true
	return l, nil
}

// backups are the options that back up those of keep that t has.
func backups(t *lifetime.Trace, keep []string) []Option {
	has := map[string]bool{}
	for i := range t.Buffers {
		has[t.Buffers[i].Tag] = true
	}
	var opts []Option
	for _, tag := range keep {
		if has[tag] {
			opts = append(opts, WithPolicy(tag, Backup))
			has[tag] = false // once
		}
	}
	return opts
}

// Place lays plan p of trace t into the arena's memory: p's offsets are
// offsets of the arena's plan (a family member's, a chain stage's, or a
// step's new plan inside the arena it had), and each buffer must lie
// inside one of its regions. p must pass planner.Check on t. The layout
// shares the arena and does not close it.
func (a *Arena) Place(t *lifetime.Trace, p *planner.Plan) (*Layout, error) {
	if t == nil || p == nil {
		return nil, errors.New("arena: Place: nil trace or plan")
	}
	if err := planner.Check(t, p); err != nil {
		return nil, fmt.Errorf("arena: Place: trace %q: plan refused: %w", t.Name, err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil, fmt.Errorf("arena: Place: %w", ErrClosed)
	}
	return a.layout(t, p, func(i int, n int64) (cuda.DevicePtr, bool) { return a.at(p.Offsets[i], n) })
}

// layout resolves the addresses of p's buffers with addr; a.mu is held.
func (a *Arena) layout(t *lifetime.Trace, p *planner.Plan, addr func(i int, n int64) (cuda.DevicePtr, bool)) (*Layout, error) {
	l := &Layout{trace: t, plan: p, arena: a, addrs: make([]cuda.DevicePtr, len(t.Buffers)), need: make([]uint64, len(t.Buffers))}
	for i := range t.Buffers {
		b := &t.Buffers[i]
		n, _ := planner.Need(b, p.Align)
		ptr, ok := addr(i, n)
		if !ok {
			return nil, fmt.Errorf("arena: Place: trace %q: buffer %d (%s) at [%d, %d) lies outside the arena's regions (plan of %d bytes)",
				t.Name, i, b.Name, p.Offsets[i], p.Offsets[i]+n, a.size)
		}
		if b.Align > 1 && uint64(ptr)%uint64(b.Align) != 0 {
			return nil, fmt.Errorf("arena: Place: trace %q: buffer %d (%s) needs alignment %d, more than the granularity %d the arena can honour",
				t.Name, i, b.Name, b.Align, a.gran)
		}
		l.addrs[i], l.need[i] = ptr, uint64(n)
	}
	return l, nil
}

// at is the address of the n bytes at plan offset off, when one region
// holds them all (a 0-byte buffer may sit at a region's end).
func (a *Arena) at(off, n int64) (cuda.DevicePtr, bool) {
	for _, r := range a.regions {
		if r.lo <= off && off+n <= r.hi {
			return r.window.Add(uint64(off - r.wlo)), true
		}
	}
	return 0, false
}

// Fit says whether the layout's plan holds run, a later run of the same
// step (planner.Fits: the same buffers, none larger, and the plan passes
// Check on run), and returns the layout of run at the same addresses. The
// result takes over the arena: close it, not l.
func (l *Layout) Fit(run *lifetime.Trace) (*Layout, error) {
	if err := planner.Fits(l.trace, run, l.plan); err != nil {
		return nil, err
	}
	n := *l
	n.trace = run
	n.need = make([]uint64, len(run.Buffers))
	for i := range run.Buffers {
		s, _ := planner.Need(&run.Buffers[i], l.plan.Align)
		n.need[i] = uint64(s)
	}
	return &n, nil
}

// Trace returns the trace the plan was checked against.
func (l *Layout) Trace() *lifetime.Trace { return l.trace }

// Plan returns the plan.
func (l *Layout) Plan() *planner.Plan { return l.plan }

// Arena returns the arena the layout's buffers live in.
func (l *Layout) Arena() *Arena { return l.arena }

// Addrs returns every buffer's address, by lifetime.ID. The slice is the
// layout's: do not change it.
func (l *Layout) Addrs() []cuda.DevicePtr { return l.addrs }

// Needs returns the bytes each buffer occupies at its address: its size
// rounded up to the plan's alignment. The slice is the layout's.
func (l *Layout) Needs() []uint64 { return l.need }

// Addr returns buffer id's address. It works while the buffer's region
// is paused (nothing is mapped there then).
func (l *Layout) Addr(id lifetime.ID) (cuda.DevicePtr, error) {
	if id < 0 || int(id) >= len(l.addrs) {
		return 0, fmt.Errorf("arena: Addr(%d): %w buffer id (trace %q has %d buffers)", id, ErrUnknown, l.trace.Name, len(l.addrs))
	}
	return l.addrs[id], nil
}

// TagBytes is the plan's address range of the buffers of one tag: from
// the lowest offset to the highest end (sizes rounded to the alignment);
// 0 when no buffer has the tag.
func (l *Layout) TagBytes(tag string) int64 {
	lo, hi := int64(-1), int64(0)
	for i := range l.trace.Buffers {
		if l.trace.Buffers[i].Tag != tag {
			continue
		}
		off := l.plan.Offsets[i]
		if lo < 0 || off < lo {
			lo = off
		}
		hi = max(hi, off+int64(l.need[i]))
	}
	if lo < 0 {
		return 0
	}
	return hi - lo
}

// Close closes the arena when the layout owns it (NewLayout, or Fit of
// such a layout); else it does nothing.
func (l *Layout) Close() error {
	if !l.owner {
		return nil
	}
	return l.arena.Close()
}

// GroupLayout is one arena for the members of a group plan
// (planner.GroupPlan), and each member's layout in it: a family's members,
// which replay one at a time over overlapping private buffers, or a
// chain's stages, which replay in turn and hand buffers on.
type GroupLayout struct {
	Arena   *Arena
	Members []*Layout // Members[i] is member i's plan placed in Arena (it does not own it)
}

// RoomLimiter is a device whose addresses are scarce (the PyTorch
// bridge's graph heap, where small arenas are laid out side by side):
// MaxRoom caps the addresses NewGroupLayout keeps past a family's arena
// for Arena.Grow, which are otherwise as many bytes as the device has.
type RoomLimiter interface {
	MaxRoom() uint64
}

// NewGroupLayout maps the arena of group plan gp and places every
// member's plan in it: traces[i] is member i's trace, and its plan must
// pass planner.Check on it.
//
// A group planned as one trace (gp.Joint: a chain) gets that trace's
// arena, checked and with a region per tag as for a single step
// (NewLayout of gp.Plan, keep as there). A family's arena has one region
// per group of shared buffers, [0, gp.SharedRegion.Hi), backed up on
// Pause (weights, KV caches, inputs every member reads), and one region
// for everything above it, dropped on Pause (the members' private memory,
// which each replay rewrites); keep does not apply. The private region
// covers the whole range up to gp.Arena, not only the bytes today's
// members use: a member replanned later (the PyTorch bridge's Replan) may
// place its buffers anywhere in it, and a family's arena keeps room to
// grow in place (Arena.Grow). Check a family against its members first
// (NewFamilyLayout does).
func NewGroupLayout(dev cuda.Device, traces []*lifetime.Trace, gp *planner.GroupPlan, keep ...string) (*GroupLayout, error) {
	if dev == nil || gp == nil {
		return nil, errors.New("arena: NewGroupLayout: nil device or plan")
	}
	if len(traces) != len(gp.Members) {
		return nil, fmt.Errorf("arena: NewGroupLayout: %d traces, %d members", len(traces), len(gp.Members))
	}
	var a *Arena
	if gp.Joint != nil {
		l, err := NewLayout(dev, gp.Joint.Trace, gp.Plan, keep...)
		if err != nil {
			return nil, err
		}
		a = l.Arena()
	} else {
		t, p := familyCover(gp)
		var opts []Option
		if len(gp.Shared) > 0 {
			opts = append(opts, WithPolicy("shared", Backup))
		}
		// Room to grow in place (Arena.Grow), as much as the device has:
		// a member planned later around memory the program holds may need
		// more than the arena (the PyTorch bridge's PlanMember). Addresses
		// cost nothing until mapped, unless the device bounds them.
		if _, total, err := dev.MemGetInfo(); err == nil {
			if rl, ok := dev.(RoomLimiter); ok {
				total = min(total, rl.MaxRoom())
			}
			opts = append(opts, WithRoom(total))
		}
		var err error
		if a, err = New(dev, t, p, opts...); err != nil {
			return nil, err
		}
	}
	f := &GroupLayout{Arena: a}
	for i, t := range traces {
		l, err := a.Place(t, gp.Members[i].Plan)
		if err != nil {
			a.Close()
			return nil, fmt.Errorf("arena: NewGroupLayout: member %q: %w", gp.Members[i].Name, err)
		}
		f.Members = append(f.Members, l)
	}
	return f, nil
}

// NewFamilyLayout checks fp against members (planner.CheckFamily) and
// lays the family out (NewGroupLayout).
func NewFamilyLayout(dev cuda.Device, members []planner.Member, fp *planner.GroupPlan) (*GroupLayout, error) {
	if dev == nil || fp == nil {
		return nil, errors.New("arena: NewFamilyLayout: nil device or plan")
	}
	if err := planner.CheckFamily(members, fp); err != nil {
		return nil, fmt.Errorf("arena: NewFamilyLayout: %w", err)
	}
	traces := make([]*lifetime.Trace, len(members))
	for i, m := range members {
		traces[i] = m.Trace
	}
	return NewGroupLayout(dev, traces, fp)
}

// familyCover is a trace the family arena is built from, with its plan:
// one buffer per shared key and one over the private range above them,
// all live at once, at the family plan's offsets. An empty family still
// gets one alignment unit, so that its arena has an address.
func familyCover(fp *planner.GroupPlan) (*lifetime.Trace, *planner.Plan) {
	t := &lifetime.Trace{Name: "family"}
	p := &planner.Plan{Algo: fp.Algo, Align: fp.Align, Arena: fp.Arena}
	add := func(name, tag string, off, size, align int64) {
		t.Buffers = append(t.Buffers, lifetime.Buffer{ID: lifetime.ID(len(t.Buffers)), Name: name, Size: size, Align: align,
			Start: 0, End: 1, Tag: tag})
		p.Offsets = append(p.Offsets, off)
	}
	top := int64(0)
	for _, s := range fp.Shared {
		add("shared:"+s.Key, "shared", s.Offset, s.Size, s.Align)
		top = max(top, s.Offset+s.Size)
	}
	if fp.Arena > top || len(fp.Shared) == 0 {
		size := max(fp.Arena-top, fp.Align, 1) // the checker counts a buffer in whole alignment units
		add("private", "private", top, size, 0)
		p.Arena = max(p.Arena, top+size)
	}
	return t, p
}

// Close closes the group arena.
func (f *GroupLayout) Close() error { return f.Arena.Close() }

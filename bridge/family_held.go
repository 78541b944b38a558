package bridge

// Members planned around memory the program holds: a graph that reads
// another member's outputs, or runs while the program keeps them.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/arenaplan/arenaplan/arena"
	"github.com/arenaplan/arenaplan/cuda"
	"github.com/arenaplan/arenaplan/lifetime"
	"github.com/arenaplan/arenaplan/planner"
)

// Range is the device addresses [Lo, Hi).
type Range struct{ Lo, Hi cuda.DevicePtr }

// offRange is a plan range [lo, hi) of an arena.
type offRange struct{ lo, hi int64 }

// PlanMemberAround is PlanMember for a member that replays while the
// program holds memory in the family's arena: the outputs of another
// member that it reads, or that the program keeps past its replay. Its
// plan leaves every held range alone over its whole step (each becomes a
// fixed buffer of its trace, and planner.Check verifies that nothing
// else meets it), so its replays never write there and nothing needs to
// move out first; its later Replans leave the same ranges alone. Ranges
// outside the arena are ignored. Where its plan needs more than the
// arena, the arena grows in place (arena.Arena.Grow: every address stays,
// the other members' graphs stay valid) instead of ErrDoesNotFit.
func (f *Family) PlanMemberAround(s *Step, budget time.Duration, held []Range) error {
	return f.planMember(s, budget, held, "PlanMemberAround")
}

// heldOffsets returns the plan ranges of ar that held covers, sorted and
// merged.
func heldOffsets(ar *arena.Arena, held []Range) []offRange {
	var rs []offRange
	for _, h := range held {
		if h.Hi <= h.Lo {
			continue
		}
		if lo, hi, ok := ar.Within(h.Lo, h.Hi); ok && lo < hi {
			rs = append(rs, offRange{lo, hi})
		}
	}
	return mergeRanges(rs, 1)
}

// mergeRanges sorts rs and merges those that overlap or touch once
// rounded out to align.
func mergeRanges(rs []offRange, align int64) []offRange {
	for k := range rs {
		rs[k] = offRange{rs[k].lo / align * align, lifetime.RoundUp(rs[k].hi, align)}
	}
	slices.SortFunc(rs, func(a, b offRange) int { return cmp.Compare(a.lo, b.lo) })
	var out []offRange
	for _, r := range rs {
		if n := len(out); n > 0 && r.lo <= out[n-1].hi {
			out[n-1].hi = max(out[n-1].hi, r.hi)
			continue
		}
		out = append(out, r)
	}
	return out
}

// arenaGoal is the planner's goal for a step planned into a family's
// arena as it is: its size (a plan that fits serves as well as a
// smaller one), 0 before the family is planned.
func arenaGoal(fp *planner.GroupPlan) int64 {
	if fp == nil {
		return 0
	}
	return fp.Arena
}

// planAround plans trace t ("auto" within budget) so that no buffer
// meets a range of around at any time: each range is a fixed buffer
// live over the whole step in a copy of t, planned with t's buffers
// (planner.Run, which places around fixed buffers) and checked there;
// the plan returned is that plan's projection on t. With nothing around,
// t is planned as any step is (planner.RunByTag). goal: planner.Options.Goal.
func planAround(t *lifetime.Trace, around []offRange, budget time.Duration, goal int64) (*planner.Plan, error) {
	ctx, opt := context.Background(), planner.Options{Budget: budget, Goal: goal}
	if len(around) == 0 || len(t.Buffers) == 0 {
		p, _, err := planner.RunByTag(ctx, planner.Auto, t, opt)
		return p, err
	}
	align := int64(planner.DefaultAlign)
	around = mergeRanges(slices.Clone(around), align)
	start, end := t.Span()
	n := len(t.Buffers)
	ext := &lifetime.Trace{Name: t.Name, Buffers: slices.Clone(t.Buffers)}
	for k, r := range around {
		ext.Buffers = append(ext.Buffers, lifetime.Buffer{ID: lifetime.ID(n + k), Name: fmt.Sprintf("held %d", k),
			Size: r.hi - r.lo, Start: start, End: end, Tag: t.Buffers[0].Tag, Fixed: r.lo, HasFixed: true})
	}
	p, err := planner.Run(ctx, planner.Auto, ext, opt)
	if err != nil {
		return nil, err
	}
	if err := planner.Check(ext, p); err != nil {
		return nil, fmt.Errorf("plan around held memory: %w", err)
	}
	q := *p
	q.Offsets = p.Offsets[:n:n]
	q.Arena = planner.ArenaSize(t, q.Offsets, p.Align)
	q.LowerBound, _ = t.LowerBound(p.Align)
	q.Bound = q.LowerBound
	q.Optimal = q.Arena == q.LowerBound
	if err := planner.Check(t, &q); err != nil {
		return nil, fmt.Errorf("plan around held memory: %w", err)
	}
	return &q, nil
}

// growLocked grows the family's arena in place to size bytes; d.mu is
// held.
func (f *Family) growLocked(size int64) error {
	restore, err := makeCurrent(f.d.dev)
	if err != nil {
		return err
	}
	defer restore()
	f.d.notePeak() // the arenas' mapped bytes change
	return f.ar.Grow(size)
}

// ErrHeldOnOutput says that a held range meets an output of the member
// being planned around it: its outputs stay where they are, so its replays
// write there whatever its plan; what the program holds there must move
// out instead.
var ErrHeldOnOutput = errors.New("a held range meets one of the member's outputs")

// ReplanMemberAround plans member s again, planned already and captured
// perhaps, so that it leaves held alone as well as what its plan left
// alone before: a member captured before the program held another
// member's outputs across its replays (a loop: the first graph replays
// again while the program keeps the second one's output). Its outputs
// (the buffers of its plan's run never freed) keep their offsets, fixed
// buffers of its trace: the other members' plans that avoid them stay
// valid. The plan is checked by planner.Check and, with the others',
// planner.CheckFamily; where it needs more than the arena, the arena
// grows in place as for PlanMemberAround. The step's capture pools are
// released (destroy its graphs first, as for Replan) and it is served
// from the new plan; its later Replans leave the same ranges alone, but
// do not pin its outputs. A held range that meets an output is refused
// (ErrHeldOnOutput), as is one outside the arena alone; on any error the
// member keeps its plan and its captures.
func (f *Family) ReplanMemberAround(s *Step, budget time.Duration, held []Range) error {
	if err := checkBudget(fmt.Sprintf("family %d (%s): ReplanMemberAround", f.id, f.name), budget); err != nil {
		return err
	}
	d := f.d
	d.mu.Lock()
	i := slices.Index(f.members, s)
	t, p0, before := s.trace, s.plan, s.around
	var why string
	switch {
	case f.chained || f.plan == nil || f.ar == nil || f.closing:
		why = "needs a planned family, not a chain, not closed"
	case i < 0 || i >= len(f.plan.Members):
		why = fmt.Sprintf("step %d is not a planned member", s.id)
	case s.closing || s.state != stepIdle || t == nil || p0 == nil:
		why = fmt.Sprintf("member %q needs a plan and no run underway (%s)", s.name, s.state)
	}
	ar, goal := f.ar, arenaGoal(f.plan)
	d.mu.Unlock()
	if why != "" {
		return f.errorf("ReplanMemberAround: %s", why)
	}
	around := heldOffsets(ar, held)
	if len(around) == 0 {
		return f.errorf("ReplanMemberAround: member %q: no held range lies in the arena", s.name)
	}
	pinned, err := pinOutputs(t, p0, around)
	if err != nil {
		return f.errorf("member %q: %w", s.name, err)
	}
	all := mergeRanges(append(slices.Clone(before), around...), 1)
	p, err := planAround(pinned, all, budget, goal)
	if err != nil {
		return f.errorf("member %q: planning around held memory: %w", s.name, err)
	}
	f.beforeGrow(p.Arena)
	d.mu.Lock()
	defer d.mu.Unlock()
	if s.plan != p0 || s.state != stepIdle || s.closing || f.closing || f.ar != ar {
		return f.errorf("member %q changed while it was planned around held memory", s.name)
	}
	if p.Arena > f.plan.Arena {
		if err := f.growLocked(p.Arena); err != nil {
			return f.errorf("member %q needs %s around %d held ranges: %w", s.name, fmtBytes(uint64(p.Arena)), len(all), err)
		}
	}
	if err := f.installMemberLocked(s, i, t, p, "planned around held memory"); err != nil {
		return err
	}
	s.replanReason = fmt.Sprintf("planned around %d held ranges, its outputs where they were", len(all))
	s.around = all
	return nil
}

// pinOutputs returns a copy of trace t whose outputs (the buffers never
// freed in its run: they end last) are fixed at their offsets in plan p,
// or ErrHeldOnOutput where one meets a range of around (rounded out as
// planAround rounds them).
func pinOutputs(t *lifetime.Trace, p *planner.Plan, around []offRange) (*lifetime.Trace, error) {
	_, end := t.Span()
	align := max(p.Align, int64(planner.DefaultAlign))
	rounded := mergeRanges(slices.Clone(around), align)
	pinned := &lifetime.Trace{Name: t.Name, Buffers: slices.Clone(t.Buffers)}
	for k := range pinned.Buffers {
		b := &pinned.Buffers[k]
		if b.End != end {
			continue
		}
		lo := p.Offsets[k]
		n, _ := planner.Need(b, p.Align)
		for _, r := range rounded {
			if lo < r.hi && r.lo < lo+n {
				return nil, fmt.Errorf("%w: output %d at [%d, %d), held [%d, %d)", ErrHeldOnOutput, k, lo, lo+n, r.lo, r.hi)
			}
		}
		b.Fixed, b.HasFixed = lo, true
	}
	return pinned, nil
}

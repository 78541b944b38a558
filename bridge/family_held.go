package bridge

// Members planned around memory the program holds: a graph that reads
// another member's outputs, or runs while the program keeps them.

import (
	"cmp"
	"context"
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

// planAround plans trace t ("auto" within budget) so that no buffer
// meets a range of around at any time: each range is a fixed buffer
// live over the whole step in a copy of t, planned with t's buffers
// (planner.Run, which places around fixed buffers) and checked there;
// the plan returned is that plan's projection on t. With nothing around,
// t is planned as any step is (planner.RunByTag).
func planAround(t *lifetime.Trace, around []offRange, budget time.Duration) (*planner.Plan, error) {
	ctx, opt := context.Background(), planner.Options{Budget: budget}
	if len(around) == 0 || len(t.Buffers) == 0 {
		p, _, err := planner.RunByTag(ctx, planner.Auto, t, opt)
		return p, err
	}
	align := int64(planner.DefaultAlign)
	around = mergeRanges(slices.Clone(around), align)
	start, end := t.Buffers[0].Start, t.Buffers[0].End
	for i := range t.Buffers {
		start, end = min(start, t.Buffers[i].Start), max(end, t.Buffers[i].End)
	}
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

package planner

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/arenaplan/arenaplan/lifetime"
)

// Region is the address range [Lo, Hi) of a plan that holds the buffers of
// one group (for example one tag), so that an arena can map, pause and
// resume that group's memory on its own.
type Region struct {
	Group  string
	Lo, Hi int64
}

// RunByTag is the one way to plan a tagged trace for an arena, whoever
// calls it (plan -o, graphexec, the PyTorch bridge): each tag's buffers
// are planned in an address range of their own (RunGrouped by Tag, in the
// order of lifetime.Tags, then other tags by name), so that an arena maps,
// pauses and resumes every tag with its own policy and never merges two
// tags into one region. A trace with a single tag (or none) is planned as
// Run plans it, fixed offsets included; with several tags, fixed offsets
// are refused.
func RunByTag(ctx context.Context, algo string, t *lifetime.Trace, opt Options) (*Plan, []Region, error) {
	tags := map[string]bool{}
	for i := range t.Buffers {
		tags[t.Buffers[i].Tag] = true
	}
	if len(tags) <= 1 {
		p, err := Run(ctx, algo, t, opt)
		if err != nil {
			return nil, nil, err
		}
		var regions []Region
		if len(t.Buffers) > 0 {
			regions = []Region{{Group: t.Buffers[0].Tag, Lo: 0, Hi: p.Arena}}
		}
		return p, regions, nil
	}
	return RunGrouped(ctx, algo, t, opt, func(b *lifetime.Buffer) string { return b.Tag }, lifetime.Tags, opt.Align)
}

// RunGrouped plans each group of buffers (group(b) names it) separately
// with the named algorithm and stacks the groups' arenas, in the order of
// groups (groups not listed follow in name order), each starting at a
// multiple of regionAlign. It returns one plan for the whole trace, checked,
// and the region of every group.
//
// Stacking costs nothing over one joint plan when every group but one lives
// for the whole trace (weights, inputs, outputs, caches beside
// intermediates): the lower bound is then the sum of the groups' bounds.
func RunGrouped(ctx context.Context, algo string, t *lifetime.Trace, opt Options, group func(*lifetime.Buffer) string, order []string, regionAlign int64) (*Plan, []Region, error) {
	if err := t.Validate(); err != nil {
		return nil, nil, fmt.Errorf("planner: %w", err)
	}
	opt, err := opt.prepared()
	if err != nil {
		return nil, nil, fmt.Errorf("planner: %w", err)
	}
	regionAlign = max(regionAlign, opt.Align)
	opt.Goal = 0 // a goal for the whole arena says nothing of one group's
	members := map[string][]int{}
	for i := range t.Buffers {
		g := group(&t.Buffers[i])
		members[g] = append(members[g], i)
	}
	var names []string
	seen := map[string]bool{}
	for _, g := range order {
		if _, ok := members[g]; ok && !seen[g] {
			names = append(names, g)
			seen[g] = true
		}
	}
	var rest []string
	for g := range members {
		if !seen[g] {
			rest = append(rest, g)
		}
	}
	sort.Strings(rest)
	names = append(names, rest...)

	start := time.Now()
	full := &Plan{Offsets: make([]int64, len(t.Buffers)), Align: opt.Align}
	var regions []Region
	var base int64
	algoName := ""
	for _, g := range names {
		sub := &lifetime.Trace{Name: t.Name + "/" + g}
		for j, i := range members[g] {
			b := t.Buffers[i]
			b.ID = lifetime.ID(j)
			if b.HasFixed {
				return nil, nil, fmt.Errorf("planner: grouped planning does not support fixed offsets (buffer %d, %s)", i, b.Name)
			}
			sub.Buffers = append(sub.Buffers, b)
		}
		p, err := Run(ctx, algo, sub, opt)
		if err != nil {
			return nil, nil, fmt.Errorf("planner: group %q: %w", g, err)
		}
		for j, i := range members[g] {
			full.Offsets[i] = base + p.Offsets[j]
		}
		regions = append(regions, Region{Group: g, Lo: base, Hi: base + p.Arena})
		base = lifetime.RoundUp(base+p.Arena, regionAlign)
		algoName = p.Algo
	}
	full.Algo = algoName
	full.LowerBound, _ = t.LowerBound(opt.Align)
	full.Arena = ArenaSize(t, full.Offsets, opt.Align)
	full.Optimal = full.Arena == full.LowerBound
	full.Elapsed = time.Since(start)
	full.ToBest = full.Elapsed
	if err := Check(t, full); err != nil {
		return nil, nil, fmt.Errorf("planner: grouped plan is invalid: %w", err)
	}
	return full, regions, nil
}

package graph

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/arenaplan/arenaplan/planner"
)

// Share marks t as shared by every member of a family (several graphs
// replayed one at a time from one arena, planner.PlanFamily) under key:
// every member whose graph has a tensor with that key finds it at one
// address, so its contents survive the other members' replays. Members
// must agree on its size: a KV cache is sized for the family's largest
// batch (Shape.MaxBatch) and each member uses its first rows. Weights are
// shared under their names without a call; Share gives them another key.
// Only weights, state and inputs can be shared. It returns t.
func (t *Tensor) Share(key string) *Tensor { t.share = key; return t }

// SharedKey is t's family key: its Share key, a weight's name, or "" for
// a tensor each member keeps to itself.
func (t *Tensor) SharedKey() string {
	switch {
	case t.share != "":
		return t.share
	case t.Role == Weight:
		return t.Name
	}
	return ""
}

// FamilyKeys returns the shared key of every buffer of d, g's dry run, as
// planner.Member.Keys wants them (workspaces are private).
func FamilyKeys(g *Graph, d *DryRun) []string {
	keys := make([]string, len(d.Trace.Buffers))
	for i, t := range g.Tensors {
		if d.Tensor[i] >= 0 { // unplanned tensors have no buffer
			keys[d.Tensor[i]] = t.SharedKey()
		}
	}
	return keys
}

// CheckShared refuses shared keys on roles that cannot be shared and,
// in a family of several members, private tensors whose contents must
// outlive a replay: another member's replay would overwrite them.
func CheckShared(g *Graph, several bool) error {
	if UsesSpill(g) {
		return fmt.Errorf("graph: %s uses spillover or side streams, which families do not support", g.Label())
	}
	seen := map[string]string{}
	for _, t := range g.Tensors {
		k := t.SharedKey()
		switch {
		case k != "" && (t.Role == Intermediate || t.Role == Output):
			return fmt.Errorf("graph: %s: %s %s is shared (key %q); only weights, state and inputs can be", g.Label(), t.Role, t.Name, k)
		case k != "" && seen[k] != "":
			return fmt.Errorf("graph: %s: tensors %s and %s share key %q", g.Label(), seen[k], t.Name, k)
		case k == "" && several && (t.Role == Weight || t.Role == State || (t.Role == Input && t.feed == nil && t.init != nil)):
			return fmt.Errorf("graph: %s: %s %s is private to its member, so another member's replay would overwrite it; share it (Tensor.Share)",
				g.Label(), t.Role, t.Name)
		}
		if k != "" {
			seen[k] = t.Name
		}
	}
	return nil
}

// FamilyMembers dry-runs graphs and returns them as planner members with
// their shared keys (FamilyKeys), named by the shape dimensions in which
// they differ ("batch=8"), or by their labels when those do not tell them
// apart. In a family of several members every weight, state and constant
// input must be shared.
func FamilyMembers(graphs []*Graph) ([]planner.Member, []*DryRun, error) {
	if len(graphs) == 0 {
		return nil, nil, errors.New("graph: family: no graphs")
	}
	names := memberNames(graphs)
	members := make([]planner.Member, len(graphs))
	dry := make([]*DryRun, len(graphs))
	for i, g := range graphs {
		if err := CheckShared(g, len(graphs) > 1); err != nil {
			return nil, nil, fmt.Errorf("graph: family: %w", err)
		}
		d, err := g.DryRun()
		if err != nil {
			return nil, nil, fmt.Errorf("graph: family: %w", err)
		}
		dry[i] = d
		members[i] = planner.Member{Name: names[i], Trace: d.Trace, Keys: FamilyKeys(g, d)}
	}
	return members, dry, nil
}

// memberNames names each graph by the dimensions that differ across the
// family (max_batch aside), falling back to labels.
func memberNames(graphs []*Graph) []string {
	label := func(g *Graph) string { return g.Label() }
	differs := map[string]bool{}
	for _, g := range graphs[1:] {
		if g.Name != graphs[0].Name {
			return mapStrings(graphs, label)
		}
		for _, d := range g.Shape {
			if v, ok := graphs[0].Dim(d.Name); !ok || v != d.Value {
				differs[d.Name] = true
			}
		}
	}
	delete(differs, "max_batch")
	if len(differs) == 0 {
		return mapStrings(graphs, label)
	}
	names := mapStrings(graphs, func(g *Graph) string {
		var parts []string
		for _, d := range g.Shape {
			if differs[d.Name] {
				parts = append(parts, d.Name+"="+strconv.FormatInt(d.Value, 10))
			}
		}
		return strings.Join(parts, ",")
	})
	seen := map[string]bool{}
	for _, n := range names {
		if seen[n] {
			return mapStrings(graphs, label)
		}
		seen[n] = true
	}
	return names
}

func mapStrings(gs []*Graph, f func(*Graph) string) []string {
	out := make([]string, len(gs))
	for i, g := range gs {
		out[i] = f(g)
	}
	return out
}

// PlanFamily plans graphs as one family (planner.PlanFamily with the named
// algorithm): shared tensors at one offset each at the bottom of the
// arena, each member's private buffers above them, planned member by
// member so that they overlap across members.
func PlanFamily(ctx context.Context, algo string, graphs []*Graph, opt PlanOptions) (*planner.FamilyPlan, []planner.Member, error) {
	members, _, err := FamilyMembers(graphs)
	if err != nil {
		return nil, nil, err
	}
	align := opt.Align
	if align == 0 {
		align = planner.DefaultAlign
	}
	for _, g := range graphs {
		if align < g.Align {
			return nil, nil, &AlignError{Workload: g.Label(), Plan: align, Need: g.Align}
		}
	}
	fp, err := planner.PlanFamily(ctx, algo, members, opt)
	if err != nil {
		return nil, nil, fmt.Errorf("graph: %w", err)
	}
	return fp, members, nil
}

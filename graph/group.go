package graph

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/arenaplan/arenaplan/lifetime"
	"github.com/arenaplan/arenaplan/planner"
)

// dryRunGroup dry-runs the graphs of a group, several graphs laid on one
// joint timeline in one arena (what: a "family" of members that share
// tensors by key, or a "chain" of stages that read earlier stages'
// outputs in place), refusing an empty one (no nouns) and, through check,
// a graph the group cannot hold.
func dryRunGroup(what, nouns string, graphs []*Graph, check func(int, *Graph) error) ([]*DryRun, error) {
	if len(graphs) == 0 {
		return nil, fmt.Errorf("graph: %s: no %s", what, nouns)
	}
	dry := make([]*DryRun, len(graphs))
	for i, g := range graphs {
		if err := check(i, g); err != nil {
			return nil, fmt.Errorf("graph: %s: %w", what, err)
		}
		d, err := g.DryRun()
		if err != nil {
			return nil, fmt.Errorf("graph: %s: %w", what, err)
		}
		dry[i] = d
	}
	return dry, nil
}

// planGroup plans graphs as one group with plan (planner.PlanFamily or
// planner.PlanChain), after refusing a group plan's alignment (opt.Align,
// or the planner's default) when it is below a graph's own.
func planGroup(graphs []*Graph, opt PlanOptions, plan func() (*planner.GroupPlan, error)) (*planner.GroupPlan, error) {
	align := opt.Align
	if align == 0 {
		align = planner.DefaultAlign
	}
	for _, g := range graphs {
		if align < g.Align {
			return nil, &AlignError{Workload: g.Label(), Plan: align, Need: g.Align}
		}
	}
	gp, err := plan()
	if err != nil {
		return nil, fmt.Errorf("graph: %w", err)
	}
	return gp, nil
}

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
	dry, err := dryRunGroup("family", "graphs", graphs, func(_ int, g *Graph) error { return CheckShared(g, len(graphs) > 1) })
	if err != nil {
		return nil, nil, err
	}
	names := memberNames(graphs)
	members := make([]planner.Member, len(graphs))
	for i, g := range graphs {
		members[i] = planner.Member{Name: names[i], Trace: dry[i].Trace, Keys: FamilyKeys(g, dry[i])}
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
func PlanFamily(ctx context.Context, algo string, graphs []*Graph, opt PlanOptions) (*planner.GroupPlan, []planner.Member, error) {
	members, _, err := FamilyMembers(graphs)
	if err != nil {
		return nil, nil, err
	}
	fp, err := planGroup(graphs, opt, func() (*planner.GroupPlan, error) { return planner.PlanFamily(ctx, algo, members, opt) })
	if err != nil {
		return nil, nil, err
	}
	return fp, members, nil
}

// ChainLink says that stage To's tensor ToTensor is stage From's tensor
// FromTensor, read in place: a later graph consumes an earlier one's
// output (a model split where one part cannot be captured, a prefill
// handing its state to decode) with nothing copied. ToTensor must be an
// input with neither a feed nor an init function, of the same size.
type ChainLink struct {
	From       int
	FromTensor string
	To         int
	ToTensor   string
}

// LinkByName links every input of a stage that has neither a feed nor an
// init function to the output or state tensor of the same name of the
// latest earlier stage that has one.
func LinkByName(graphs []*Graph) ([]ChainLink, error) {
	var links []ChainLink
	for s, g := range graphs {
		for _, t := range g.Tensors {
			if t.Role != Input || t.feed != nil || t.init != nil {
				continue
			}
			from := -1
			for p := s - 1; p >= 0 && from < 0; p-- {
				if u := tensorNamed(graphs[p], t.Name); u != nil && (u.Role == Output || u.Role == State) {
					from = p
				}
			}
			if from < 0 {
				return nil, fmt.Errorf("graph: chain: stage %d (%s): input %s has no producer among the earlier stages", s, g.Label(), t.Name)
			}
			links = append(links, ChainLink{From: from, FromTensor: t.Name, To: s, ToTensor: t.Name})
		}
	}
	return links, nil
}

func tensorNamed(g *Graph, name string) *Tensor {
	for _, t := range g.Tensors {
		if t.Name == name {
			return t
		}
	}
	return nil
}

// ChainStages dry-runs graphs and returns them as planner stages, with
// weights, state and constant inputs persistent (they keep their bytes
// through the whole chain), and links as planner links.
func ChainStages(graphs []*Graph, links []ChainLink) ([]planner.Stage, []planner.Link, []*DryRun, error) {
	dry, err := dryRunGroup("chain", "stages", graphs, func(s int, g *Graph) error {
		if UsesSpill(g) {
			return fmt.Errorf("stage %d: %s uses spillover or side streams, which chains do not support", s, g.Label())
		}
		return nil
	})
	if err != nil {
		return nil, nil, nil, err
	}
	stages := make([]planner.Stage, len(graphs))
	for s, g := range graphs {
		d := dry[s]
		keep := map[lifetime.ID]bool{}
		for i, t := range g.Tensors {
			if t.Role == Weight || t.Role == State || (t.Role == Input && t.init != nil) {
				keep[d.Tensor[i]] = true
			}
		}
		stages[s] = planner.Stage{Name: fmt.Sprintf("%d:%s", s, g.Label()), Trace: d.Trace,
			Persistent: func(b *lifetime.Buffer) bool { return keep[b.ID] }}
	}
	pl := make([]planner.Link, len(links))
	for i, l := range links {
		if l.From < 0 || l.From >= len(graphs) || l.To < 0 || l.To >= len(graphs) {
			return nil, nil, nil, fmt.Errorf("graph: chain: link %d: stage %d or %d does not exist", i, l.From, l.To)
		}
		from, to := tensorNamed(graphs[l.From], l.FromTensor), tensorNamed(graphs[l.To], l.ToTensor)
		switch {
		case from == nil:
			return nil, nil, nil, fmt.Errorf("graph: chain: link %d: stage %d has no tensor %q", i, l.From, l.FromTensor)
		case to == nil:
			return nil, nil, nil, fmt.Errorf("graph: chain: link %d: stage %d has no tensor %q", i, l.To, l.ToTensor)
		case from.Role != Output && from.Role != State:
			return nil, nil, nil, fmt.Errorf("graph: chain: link %d: %s %s of stage %d is not an output or state", i, from.Role, from.Name, l.From)
		case to.Role != Input || to.feed != nil || to.init != nil:
			return nil, nil, nil, fmt.Errorf("graph: chain: link %d: %s %s of stage %d must be an input without feed or init", i, to.Role, to.Name, l.To)
		case from.Bytes() != to.Bytes():
			return nil, nil, nil, fmt.Errorf("graph: chain: link %d: %s is %d bytes, %s %d", i, from.Name, from.Bytes(), to.Name, to.Bytes())
		}
		pl[i] = planner.Link{
			From: planner.BufferRef{Stage: l.From, Buffer: dry[l.From].Tensor[from.index]},
			To:   planner.BufferRef{Stage: l.To, Buffer: dry[l.To].Tensor[to.index]},
		}
	}
	return stages, pl, dry, nil
}

// PlanChain plans graphs as one chain (planner.PlanChain with the named
// algorithm): the stages on one timeline, linked tensors one buffer each,
// so an output stays where its consumers read it.
func PlanChain(ctx context.Context, algo string, graphs []*Graph, links []ChainLink, opt PlanOptions) (*planner.GroupPlan, error) {
	stages, pl, _, err := ChainStages(graphs, links)
	if err != nil {
		return nil, err
	}
	return planGroup(graphs, opt, func() (*planner.GroupPlan, error) { return planner.PlanChain(ctx, algo, stages, pl, opt) })
}

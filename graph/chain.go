package graph

import (
	"context"
	"errors"
	"fmt"

	"github.com/arenaplan/arenaplan/lifetime"
	"github.com/arenaplan/arenaplan/planner"
)

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
	if len(graphs) == 0 {
		return nil, nil, nil, errors.New("graph: chain: no stages")
	}
	stages := make([]planner.Stage, len(graphs))
	dry := make([]*DryRun, len(graphs))
	for s, g := range graphs {
		if UsesSpill(g) {
			return nil, nil, nil, fmt.Errorf("graph: chain: stage %d: %s uses spillover or side streams, which chains do not support", s, g.Label())
		}
		d, err := g.DryRun()
		if err != nil {
			return nil, nil, nil, fmt.Errorf("graph: chain: %w", err)
		}
		dry[s] = d
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
func PlanChain(ctx context.Context, algo string, graphs []*Graph, links []ChainLink, opt PlanOptions) (*planner.ChainPlan, error) {
	stages, pl, _, err := ChainStages(graphs, links)
	if err != nil {
		return nil, err
	}
	align := opt.Align
	if align == 0 {
		align = planner.DefaultAlign
	}
	for _, g := range graphs {
		if align < g.Align {
			return nil, &AlignError{Workload: g.Label(), Plan: align, Need: g.Align}
		}
	}
	cp, err := planner.PlanChain(ctx, algo, stages, pl, opt)
	if err != nil {
		return nil, fmt.Errorf("graph: %w", err)
	}
	return cp, nil
}

package graphexec

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/arenaplan/arenaplan/arena"
	"github.com/arenaplan/arenaplan/cuda"
	"github.com/arenaplan/arenaplan/kernels"
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
				return nil, fmt.Errorf("graphexec: chain: stage %d (%s): input %s has no producer among the earlier stages", s, g.Label(), t.Name)
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
		return nil, nil, nil, errors.New("graphexec: chain: no stages")
	}
	stages := make([]planner.Stage, len(graphs))
	dry := make([]*DryRun, len(graphs))
	for s, g := range graphs {
		if usesSpill(g) {
			return nil, nil, nil, fmt.Errorf("graphexec: chain: stage %d: %s uses spillover or side streams, which chains do not support", s, g.Label())
		}
		d, err := g.DryRun()
		if err != nil {
			return nil, nil, nil, fmt.Errorf("graphexec: chain: %w", err)
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
			return nil, nil, nil, fmt.Errorf("graphexec: chain: link %d: stage %d or %d does not exist", i, l.From, l.To)
		}
		from, to := tensorNamed(graphs[l.From], l.FromTensor), tensorNamed(graphs[l.To], l.ToTensor)
		switch {
		case from == nil:
			return nil, nil, nil, fmt.Errorf("graphexec: chain: link %d: stage %d has no tensor %q", i, l.From, l.FromTensor)
		case to == nil:
			return nil, nil, nil, fmt.Errorf("graphexec: chain: link %d: stage %d has no tensor %q", i, l.To, l.ToTensor)
		case from.Role != Output && from.Role != State:
			return nil, nil, nil, fmt.Errorf("graphexec: chain: link %d: %s %s of stage %d is not an output or state", i, from.Role, from.Name, l.From)
		case to.Role != Input || to.feed != nil || to.init != nil:
			return nil, nil, nil, fmt.Errorf("graphexec: chain: link %d: %s %s of stage %d must be an input without feed or init", i, to.Role, to.Name, l.To)
		case from.Bytes() != to.Bytes():
			return nil, nil, nil, fmt.Errorf("graphexec: chain: link %d: %s is %d bytes, %s %d", i, from.Name, from.Bytes(), to.Name, to.Bytes())
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
		return nil, fmt.Errorf("graphexec: %w", err)
	}
	return cp, nil
}

// Chain runs graphs that consume each other's outputs in place, its
// stages, from one arena laid out by a chain plan, on one stream. Before
// every step of a stage it asks the plan's guard (planner.ChainGuard)
// whether the step may run: a stage whose input has not been produced, or
// was overwritten since, and a stage that would overwrite a value another
// stage has not yet read, are refused with a *planner.OrderError, and
// nothing runs.
//
// A Chain is not safe for concurrent use; on the driver, call it from the
// goroutine bound to the device.
type Chain struct {
	group // arena, stream, modules, and the stages' executors (execs)
	dev   cuda.Device
	plan  *planner.ChainPlan
	guard *planner.ChainGuard
}

// NewChain builds the chain's arena from cp (verified against graphs and
// links with planner.CheckChain) and one executor per stage. It uploads
// nothing: call Init.
func NewChain(dev cuda.Device, graphs []*Graph, links []ChainLink, cp *planner.ChainPlan, opt Options) (*Chain, error) {
	c := &Chain{group: group{what: "chain"}, dev: dev, plan: cp}
	if err := c.setup(graphs, links, opt); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func (c *Chain) setup(graphs []*Graph, links []ChainLink, opt Options) error {
	stages, pl, dry, err := ChainStages(graphs, links)
	if err != nil {
		return err
	}
	cp := c.plan
	if err := planner.CheckChain(stages, pl, cp); err != nil {
		return fmt.Errorf("graphexec: chain: %w", err)
	}
	for _, g := range graphs {
		if cp.Plan.Align < g.Align {
			return &AlignError{Workload: g.Label(), Plan: cp.Plan.Align, Need: g.Align}
		}
	}
	if c.arena, err = arena.New(c.dev, cp.Joint, cp.Plan); err != nil {
		return fmt.Errorf("graphexec: chain: %w", err)
	}
	if c.stream, err = c.dev.NewStream(); err != nil {
		return fmt.Errorf("graphexec: chain: %w", err)
	}
	all, mods, ptxs, err := groupModules(c.dev, graphs)
	c.mods = all
	if err != nil {
		return fmt.Errorf("graphexec: chain: %w", err)
	}
	for s, g := range graphs {
		joint := cp.Stages[s].Joint
		a := c.arena
		e := &Executor{dev: c.dev, opt: opt, stream: c.stream, mods: mods[s], modPTX: ptxs[s],
			plan: &planner.Plan{Algo: cp.Plan.Algo, Align: cp.Plan.Align, Offsets: cp.Stages[s].Offsets, Arena: cp.Plan.Arena},
			at: func(id lifetime.ID) (cuda.DevicePtr, error) {
				if id < 0 || int(id) >= len(joint) {
					return 0, fmt.Errorf("graphexec: chain: no buffer %d", id)
				}
				return a.Ptr(joint[id])
			}}
		c.execs = append(c.execs, e)
		if err := e.bind(g, dry[s], true); err != nil {
			return fmt.Errorf("graphexec: chain: stage %d: %w", s, err)
		}
	}
	c.guard = cp.Guard()
	return nil
}

// Len is the number of stages.
func (c *Chain) Len() int { return len(c.execs) }

// Stage returns stage s's executor, for Read and Stage. Its Eager and
// Replay bypass the guard: use the chain's.
func (c *Chain) Stage(s int) *Executor { return c.execs[s] }

// Plan returns the chain plan.
func (c *Chain) Plan() *planner.ChainPlan { return c.plan }

// Arena returns the chain's arena.
func (c *Chain) Arena() *arena.Arena { return c.arena }

// Init writes every stage's initial bytes (weights, state, constant
// inputs) and forgets every produced value.
func (c *Chain) Init() error {
	for _, e := range c.execs {
		if err := e.Init(); err != nil {
			return err
		}
	}
	c.guard.Reset()
	return nil
}

// ResetState rewrites state and constant inputs and forgets every
// produced value: the chain starts again from its first stage.
func (c *Chain) ResetState() error {
	for _, e := range c.execs {
		if err := e.ResetState(); err != nil {
			return err
		}
	}
	c.guard.Reset()
	return nil
}

// Capture captures every stage into its own graph.
func (c *Chain) Capture() (time.Duration, error) {
	var total time.Duration
	for _, e := range c.execs {
		d, err := e.Capture()
		if err != nil {
			return 0, err
		}
		total += d
	}
	return total, nil
}

// Eager runs step of stage s kernel by kernel, if the guard allows it.
func (c *Chain) Eager(s, step int) error { return c.run(s, step, (*Executor).Eager) }

// Replay replays step of stage s, if the guard allows it.
func (c *Chain) Replay(s, step int) error { return c.run(s, step, (*Executor).Replay) }

func (c *Chain) run(s, step int, f func(*Executor, int) error) error {
	if err := c.guard.Allow(s); err != nil {
		return fmt.Errorf("graphexec: %w", err)
	}
	if err := f(c.execs[s], step); err != nil {
		return err
	}
	if err := c.guard.Next(s); err != nil {
		return fmt.Errorf("graphexec: %w", err)
	}
	return nil
}

// MLPStages builds the mlp workload split at the given layer boundaries
// into consecutive stages: stage k runs layers [cuts[k-1], cuts[k]) (from
// 0, to the last layer), reading the previous stage's output h<from> as
// an input and writing h<to> (y for the last) as its output. The weights
// and the first input are the mlp's own (same names, same seed), so the
// last stage's y equals the whole mlp's.
func MLPStages(s Shape, cuts ...int) ([]*Graph, error) {
	w, err := Lookup("mlp")
	if err != nil {
		return nil, err
	}
	s = w.Resolve(s)
	L, W, B := s.Layers, s.Width, s.Batch
	switch {
	case L < 1 || L > 1<<16 || W < 4 || W%4 != 0 || W > 1<<16 || B < 1 || B > 1<<16:
		return nil, fmt.Errorf("graphexec: mlp stages: shape layers=%d width=%d batch=%d out of range", L, W, B)
	}
	bounds := append([]int{0}, cuts...)
	bounds = append(bounds, L)
	for i := 1; i < len(bounds); i++ {
		if bounds[i] <= bounds[i-1] {
			return nil, fmt.Errorf("graphexec: mlp stages: cuts %v must increase strictly inside (0, %d)", cuts, L)
		}
	}
	a := float32(math.Sqrt(6.5 / float64(W)))
	wd, bb := int64(W), int64(B)
	var graphs []*Graph
	for k := 1; k < len(bounds); k++ {
		from, to := bounds[k-1], bounds[k]
		b := NewBuilder("mlp-stage")
		b.Dim("layers", int64(L))
		b.Dim("width", wd)
		b.Dim("batch", bb)
		b.Dim("from", int64(from))
		b.Dim("to", int64(to))
		b.Module(kernels.PTX)
		var x *Tensor
		if from == 0 {
			x = b.Tensor("x", F32, Input, bb, wd).SetInit(uniform(s.Seed, "x", 0, 1))
		} else {
			x = b.Tensor(fmt.Sprintf("h%d", from), F32, Input, bb, wd)
		}
		for i := from; i < to; i++ {
			p := fmt.Sprintf("l%d.", i)
			wt := b.Tensor(p+"w", F32, Weight, wd, wd).SetInit(uniform(s.Seed, p+"w", 0, a))
			bias := b.Tensor(p+"b", F32, Weight, wd).SetInit(uniform(s.Seed, p+"b", 0, 0.1))
			role, name := Intermediate, fmt.Sprintf("h%d", i+1)
			if i == to-1 {
				role = Output
				if i == L-1 {
					name = "y"
				}
			}
			y := b.Tensor(name, F32, role, bb, wd)
			b.Launch(linearLaunch(p+"linear+gelu", y, x, wt, bias, nil, nil, nil, W, W, B, kernels.ModeGELU))
			x = y
		}
		g, err := b.Build()
		if err != nil {
			return nil, err
		}
		graphs = append(graphs, g)
	}
	return graphs, nil
}

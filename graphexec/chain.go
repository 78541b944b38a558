package graphexec

import (
	"fmt"

	"github.com/arenaplan/arenaplan/arena"
	"github.com/arenaplan/arenaplan/cuda"
	"github.com/arenaplan/arenaplan/graph"
	"github.com/arenaplan/arenaplan/lifetime"
	"github.com/arenaplan/arenaplan/planner"
)

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
func NewChain(dev cuda.Device, graphs []*graph.Graph, links []graph.ChainLink, cp *planner.ChainPlan, opt Options) (*Chain, error) {
	c := &Chain{group: group{what: "chain"}, dev: dev, plan: cp}
	if err := c.setup(graphs, links, opt); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func (c *Chain) setup(graphs []*graph.Graph, links []graph.ChainLink, opt Options) error {
	stages, pl, dry, err := graph.ChainStages(graphs, links)
	if err != nil {
		return err
	}
	cp := c.plan
	if err := planner.CheckChain(stages, pl, cp); err != nil {
		return fmt.Errorf("graphexec: chain: %w", err)
	}
	for _, g := range graphs {
		if cp.Plan.Align < g.Align {
			return &graph.AlignError{Workload: g.Label(), Plan: cp.Plan.Align, Need: g.Align}
		}
	}
	// The stages' weights and state are kept across a Pause, their
	// activations dropped, as an Executor's.
	traces := make([]*lifetime.Trace, len(graphs))
	plans := make([]*planner.Plan, len(graphs))
	for s := range graphs {
		traces[s] = dry[s].Trace
		plans[s] = &planner.Plan{Algo: cp.Plan.Algo, Align: cp.Plan.Align, Offsets: cp.Stages[s].Offsets, Arena: cp.Plan.Arena}
	}
	lay, err := arena.NewChainLayout(c.dev, cp.Joint, cp.Plan, traces, plans, kept(graphs...)...)
	if err != nil {
		return fmt.Errorf("graphexec: chain: %w", err)
	}
	c.arena = lay.Arena
	if c.stream, err = c.dev.NewStream(); err != nil {
		return fmt.Errorf("graphexec: chain: %w", err)
	}
	all, mods, ptxs, err := groupModules(c.dev, graphs)
	c.mods = all
	if err != nil {
		return fmt.Errorf("graphexec: chain: %w", err)
	}
	for s, g := range graphs {
		e := &Executor{dev: c.dev, opt: opt, lay: lay.Members[s], group: "chain", stream: c.stream, mods: mods[s], modPTX: ptxs[s]}
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

package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/arenaplan/arenaplan/graph"
	"github.com/arenaplan/arenaplan/graphexec"
	"github.com/arenaplan/arenaplan/planner"
	"github.com/arenaplan/arenaplan/workloads"
)

// ChainRun is what a chain run (--stages) adds to the report.
type ChainRun struct {
	// Stages are the stages' layer ranges [from, to).
	Stages [][2]int64 `json:"stages"`
	// Links is how many tensors a stage reads in place from an earlier one.
	Links int `json:"links"`
	// MatchesWhole: the last stage's output equals the whole mlp's, run
	// eagerly on its own arena, bit for bit.
	MatchesWhole bool `json:"chain_matches_whole"`
}

// parseCuts reads --stages: the layers at which the mlp is cut, strictly
// increasing.
func parseCuts(s string) ([]int, error) {
	var cuts []int
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || v < 1 {
			return nil, fmt.Errorf("--stages %q: %q is not a positive layer number", s, f)
		}
		cuts = append(cuts, v)
	}
	return cuts, nil
}

// executeChain runs the mlp split at --stages into graphs that read each
// other's outputs in place from one arena (planner.PlanChain): every step
// runs the stages in order, eagerly, then the same steps are replayed from
// one captured graph per stage and compared bit for bit; the chain's guard
// refuses any order that would read a value not yet produced or
// overwrite one not yet read.
func executeChain(ctx context.Context, c *config) (*report, error) {
	switch {
	case c.workload != "mlp":
		return nil, usageError{fmt.Errorf("--stages splits the mlp workload, not %q", c.workload)}
	case c.pause || c.check || c.sequence != "":
		return nil, usageError{errors.New("--stages runs a chain: --pause, --check and --sequence do not apply")}
	case c.profile:
		return nil, usageError{fmt.Errorf("--stages runs a chain: %s's profile does not apply", workloads.TuneEnv)}
	}
	cuts, err := parseCuts(c.stages)
	if err != nil {
		return nil, usageError{err}
	}
	if err := c.shape.Check(c.workload); err != nil {
		return nil, usageError{err}
	}
	shape := c.shape.Shape()
	// The flags' shape and cuts are checked before a device is opened.
	if _, err := workloads.MLPStagesWith(shape, c.kernels, cuts...); err != nil {
		return nil, usageError{err}
	}
	dev, choice, err := c.open()
	if err != nil {
		return nil, err
	}
	defer dev.Close()
	gs, err := workloads.MLPStagesWith(shape, c.kernels, cuts...)
	if err != nil {
		return nil, err
	}
	whole, err := workloads.BuildWith("mlp", shape, c.kernels)
	if err != nil {
		return nil, err
	}
	links, err := graph.LinkByName(gs)
	if err != nil {
		return nil, err
	}
	cp, err := graph.PlanChain(ctx, planner.Auto, gs, links, graph.PlanOptions{Budget: c.budget})
	if err != nil {
		return nil, err
	}
	ch, err := graphexec.NewChain(dev, gs, links, cp, graphexec.Options{NoPDL: c.noPDL})
	if err != nil {
		return nil, err
	}
	defer ch.Close()
	cr := &ChainRun{Links: len(links)}
	rep := newReport(whole, dev, choice, fmt.Sprintf("memory: a chain of %d stages", len(gs)))
	rep.PlanAlgo, rep.ArenaBytes, rep.LowerBound = cp.Plan.Algo, cp.Plan.Arena, cp.Plan.LowerBound
	rep.MappedBytes, rep.Steps, rep.ChainRun = ch.Arena().Mapped(), c.steps, cr
	for _, g := range gs {
		from, _ := g.Dim("from")
		to, _ := g.Dim("to")
		cr.Stages = append(cr.Stages, [2]int64{from, to})
		rep.Launches += len(g.Ops)
	}
	if err := ch.Init(); err != nil {
		return nil, err
	}
	// One step runs every stage in order; the chain's guard checks it.
	step := func(run func(s, step int) error) func(int) error {
		return func(i int) error {
			for s := range gs {
				if err := run(s, i); err != nil {
					return err
				}
			}
			return nil
		}
	}
	last := ch.Member(len(gs) - 1)
	l := loop{ctx: ctx, en: ch, fresh: true}
	m, err := l.eagerThenReplay(c.warmup, c.steps, step(ch.Eager), step(ch.Replay), func() ([][]byte, error) {
		out, err := outputs(last)
		return [][]byte{out}, err
	})
	if err != nil {
		return nil, err
	}
	_, rep.GraphNodes = ch.Captured()
	rep.OutputsEqual = m.equal()
	rep.setTimes(m.capture, m.eager, m.replay, c.steps)

	// The whole mlp on an arena of its own: the chain must compute it.
	e, err := graphexec.New(dev, whole, nil, graphexec.Options{Plan: graph.PlanOptions{Budget: c.budget}, NoPDL: c.noPDL})
	if err != nil {
		return nil, err
	}
	defer e.Close()
	if err := e.Init(); err != nil {
		return nil, err
	}
	if err := e.Eager(0); err != nil {
		return nil, err
	}
	wholeOut, err := outputs(e)
	if err != nil {
		return nil, err
	}
	cr.MatchesWhole = bytes.Equal(wholeOut, m.eagerOut[0])
	return rep, nil
}

package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/arenaplan/arenaplan/cmd/internal/famreport"
	"github.com/arenaplan/arenaplan/graph"
	"github.com/arenaplan/arenaplan/graphexec"
	"github.com/arenaplan/arenaplan/lifetime"
	"github.com/arenaplan/arenaplan/planner"
	"github.com/arenaplan/arenaplan/plans"
	"github.com/arenaplan/arenaplan/workloads"
)

// FamilyRun is what a family run adds to the report.
type FamilyRun struct {
	Members []famreport.MemberReport `json:"members"`
	// SeparateArenas is the planner's sum of the members' own arenas, each
	// member planned alone as it is in the family (shared tensors sized
	// for the largest member).
	SeparateArenas int64 `json:"separate_arenas_bytes"`
	// SeparateStandalone is the sum of the arenas of the same workloads
	// built alone (each with its own KV cache for its own batch, its own
	// weights): what one arena per workload would cost without a family.
	SeparateStandalone int64   `json:"separate_standalone_arenas_bytes"`
	SharedBytes        int64   `json:"shared_bytes"`
	Sequence           []int64 `json:"sequence_batches"`
	SequenceSteps      int     `json:"sequence_steps"`
	// MixedOutputsEqual: every step of the mixed replayed sequence gave
	// the eager sequence's outputs bit for bit, and the shared state
	// ended equal.
	MixedOutputsEqual bool `json:"mixed_outputs_equal"`
}

// planFor reads the --plan file once, whatever its version: a family of
// two or more members comes back as a Family, a single plan (or a family
// of one) as a File; both nil without --plan.
func planFor(ctx context.Context, c *config) (*plans.File, *plans.Family, error) {
	if c.planPath == "" {
		return nil, nil, nil
	}
	f, fam, err := plans.LoadAny(ctx, c.planPath)
	if err != nil {
		return nil, nil, err
	}
	if fam != nil && len(fam.Members) < 2 {
		m := fam.Members[0]
		return &plans.File{Trace: m.Trace, Plan: fam.Plan.Members[0].Plan, Workload: fam.Workload(0)}, nil, nil
	}
	return f, fam, nil
}

// familyGraphs builds every member's workload from the file's names and
// shapes (with --seed) and verifies each against its member's plan.
func familyGraphs(c *config, fam *plans.Family) ([]*graph.Graph, error) {
	var gs []*graph.Graph
	for i, m := range fam.Members {
		w := fam.Workload(i)
		if w == nil {
			return nil, fmt.Errorf("%s: member %q records no workload", c.planPath, m.Name)
		}
		s, err := workloads.PlanShape(w.Name, w.Shape)
		if err != nil {
			return nil, fmt.Errorf("%s: member %q: %w", c.planPath, m.Name, err)
		}
		s.Seed = c.shape.Shape().Seed
		g, err := workloads.BuildWith(w.Name, s, c.kernels)
		if err != nil {
			return nil, fmt.Errorf("%s: member %q: %w", c.planPath, m.Name, err)
		}
		if err := verifyPlan(c, g, w, m.Trace, fam.Plan.Members[i].Plan); err != nil {
			return nil, fmt.Errorf("%s: member %q: %w", c.planPath, m.Name, err)
		}
		gs = append(gs, g)
	}
	return gs, nil
}

// familySequence is the members to run, in order: --sequence's batch
// sizes, or the members round robin for --steps steps.
func familySequence(c *config, fam *plans.Family) ([]int, error) {
	batchOf := make([]int64, len(fam.Members))
	for i := range fam.Members {
		batchOf[i] = -1
		if w := fam.Workload(i); w != nil {
			if b, ok := w.Dim("batch"); ok {
				batchOf[i] = b
			}
		}
	}
	if c.sequence == "" {
		seq := make([]int, c.steps)
		for i := range seq {
			seq[i] = i % len(fam.Members)
		}
		return seq, nil
	}
	var seq []int
	for _, f := range strings.Split(c.sequence, ",") {
		v, err := strconv.ParseInt(strings.TrimSpace(f), 10, 64)
		if err != nil {
			return nil, usageError{fmt.Errorf("--sequence %q: %q is not a batch size", c.sequence, f)}
		}
		m := -1
		for i, b := range batchOf {
			if b == v {
				m = i
				break
			}
		}
		if m < 0 {
			return nil, usageError{fmt.Errorf("--sequence %q: no member of %s has batch %d (have %v)", c.sequence, c.planPath, v, batchOf)}
		}
		seq = append(seq, m)
	}
	return seq, nil
}

// executeFamily runs a family plan: every member on one arena, a mixed
// sequence of members eagerly (outputs read after each step), the same
// sequence replayed from the captured graphs and compared bit for bit,
// then each member's replay timed alone and the mixed sequence timed.
func executeFamily(ctx context.Context, c *config, fam *plans.Family) (*report, error) {
	if c.check {
		return nil, usageError{fmt.Errorf("--check does not apply to a family plan yet: run it on --device sim, whose eager steps are the Go references")}
	}
	seq, err := familySequence(c, fam)
	if err != nil {
		return nil, err
	}
	dev, choice, err := c.open()
	if err != nil {
		return nil, err
	}
	defer dev.Close()
	gs, err := familyGraphs(c, fam)
	if err != nil {
		return nil, err
	}
	f, err := graphexec.NewFamily(dev, gs, fam.Members, fam.Plan, graphexec.Options{NoPDL: c.noPDL})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", c.planPath, err)
	}
	defer f.Close()
	fp := fam.Plan
	big := 0 // the member of the largest lower bound
	for i := range fp.Members {
		if fp.Members[i].Plan.LowerBound > fp.Members[big].Plan.LowerBound {
			big = i
		}
	}
	g := gs[big]
	rep := newReport(g, dev, choice, "family file "+c.planPath)
	rep.PlanAlgo, rep.ArenaBytes, rep.LowerBound, rep.MappedBytes = fp.Algo, fp.Arena, fp.LowerBound, f.Arena().Mapped()
	rep.Launches, rep.Steps = len(g.Ops), len(seq)
	rep.setLaunch(f.Member(big).LaunchMode(), c.noPDL)
	fr := &FamilyRun{SharedBytes: fp.SharedRegion.Hi, SeparateArenas: fp.SeparateArenas, SequenceSteps: len(seq)}
	rep.FamilyRun = fr
	regionBytes(rep, fam, gs)
	if fr.SeparateStandalone, err = standaloneArenas(ctx, gs, c.kernels, fp.Align, c.budget); err != nil {
		return nil, err
	}
	fr.Members = famreport.NewFamilyReport(fam).Members
	for _, m := range seq {
		if b := fr.Members[m].Batch; b != nil {
			fr.Sequence = append(fr.Sequence, *b)
		}
	}

	if err := f.Init(); err != nil {
		return nil, err
	}
	// Correctness: eager sequence, then the same replayed, outputs read
	// after every step.
	runSeq := func(step func(m, i int) error) ([][]byte, error) {
		out := make([][]byte, len(seq))
		for i, m := range seq {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if err := step(m, i); err != nil {
				return nil, err
			}
			var err error
			if out[i], err = outputs(f.Member(m)); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	eager, err := runSeq(f.Eager)
	if err != nil {
		return nil, err
	}
	eagerState, err := state(f.Member(big))
	if err != nil {
		return nil, err
	}
	if err := f.ResetState(); err != nil {
		return nil, err
	}
	capture, err := f.Capture()
	if err != nil {
		return nil, err
	}
	_, rep.GraphNodes = f.Captured()
	replayed, err := runSeq(f.Replay)
	if err != nil {
		return nil, err
	}
	st, err := state(f.Member(big))
	if err != nil {
		return nil, err
	}
	fr.MixedOutputsEqual = equalAll(eager, replayed) && bytes.Equal(st, eagerState)
	rep.OutputsEqual = fr.MixedOutputsEqual

	// Timing: the mixed sequence eagerly and replayed (inputs staged),
	// then each member's replay alone for --steps steps.
	for i := range gs {
		if err := f.Member(i).Stage(0, max(len(seq), c.warmup+c.steps)); err != nil {
			return nil, err
		}
		rep.StagingBytes += f.Member(i).StagingBytes()
	}
	// The state is not reset between timed runs: positions are the same
	// whatever the cache holds, and rewriting a KV cache sized for the
	// largest batch would take longer than the runs.
	l := loop{ctx: ctx, en: f}
	warmup := min(c.warmup, len(seq))
	el, err := l.time(warmup, len(seq), func(s int) error { return f.Eager(seq[s], s) })
	if err != nil {
		return nil, err
	}
	rl, err := l.time(warmup, len(seq), func(s int) error { return f.Replay(seq[s], s) })
	if err != nil {
		return nil, err
	}
	rep.setTimes(capture, el, rl, len(seq))
	for m := range gs {
		d, err := l.time(min(c.warmup, c.steps), c.steps, func(s int) error { return f.Replay(m, s) })
		if err != nil {
			return nil, err
		}
		fr.Members[m].ReplayUSPerStep = usPerStep(d, c.steps)
	}
	return rep, nil
}

// outputs reads a member's output tensors.
func outputs(e *graphexec.Executor) ([]byte, error) { return readRole(e, graph.Output) }

// state reads a member's state tensors (the shared KV cache).
func state(e *graphexec.Executor) ([]byte, error) { return readRole(e, graph.State) }

func readRole(e *graphexec.Executor, r graph.Role) ([]byte, error) {
	var out []byte
	for _, t := range e.Graph().TensorsWith(r) {
		b, err := e.Read(t)
		if err != nil {
			return nil, err
		}
		out = append(out, b...)
	}
	return out, nil
}

// regionBytes fills the report's per-role bytes for a family: weights and
// KV from the shared region; inputs and outputs the most any member has;
// intermediates what is left of the arena for them: the arena less the
// shared region and the inputs and outputs of the member that needs the
// most of those.
func regionBytes(rep *report, fam *plans.Family, gs []*graph.Graph) {
	fp := fam.Plan
	align := fp.Align
	var io, maxIn int64
	for i, g := range gs {
		var in, out int64
		for _, t := range g.Tensors {
			n := lifetime.RoundUp(t.Bytes(), align)
			key := t.SharedKey()
			switch {
			case key != "" && i == 0:
				switch t.Role {
				case graph.Weight:
					rep.WeightBytes += n
				case graph.State:
					rep.KVBytes += n
				case graph.Input:
					rep.InputBytes += n
				}
			case key != "":
			case t.Role == graph.Input:
				in += n
			case t.Role == graph.Output:
				out += n
			}
		}
		io = max(io, in+out)
		maxIn = max(maxIn, in)
		rep.OutputBytes = max(rep.OutputBytes, out)
	}
	rep.InputBytes += maxIn
	rep.Intermediate = max(0, fp.Arena-fp.SharedRegion.Hi-io)
}

// standaloneArenas plans each member's workload built alone (shared
// tensors sized for its own batch) and sums the arenas.
func standaloneArenas(ctx context.Context, gs []*graph.Graph, k workloads.Kernels, align int64, budget time.Duration) (int64, error) {
	var sum int64
	for _, g := range gs {
		s, err := workloads.ShapeOf(g.Shape)
		if err != nil {
			return 0, err
		}
		s.MaxBatch = 0
		alone, err := workloads.BuildWith(g.Name, s, k)
		if err != nil {
			return 0, err
		}
		d, err := alone.DryRun()
		if err != nil {
			return 0, err
		}
		p, err := planner.Run(ctx, planner.Auto, d.Trace, planner.Options{Align: align, Budget: budget})
		if err != nil {
			return 0, fmt.Errorf("standalone %s: %w", alone.Label(), err)
		}
		sum += p.Arena
	}
	return sum, nil
}

func printFamily(w io.Writer, r *report) {
	fr := r.FamilyRun
	fmt.Fprintf(w, "family\t%d members; mixed sequence of %d steps (batches %v...) replayed equal to eager: %v\n",
		len(fr.Members), fr.SequenceSteps, head(fr.Sequence, 16), fr.MixedOutputsEqual)
	fam := &famreport.FamilyReport{Algo: r.PlanAlgo, Arena: r.ArenaBytes, LowerBound: r.LowerBound, Shared: fr.SharedBytes,
		SeparateArenas: fr.SeparateArenas, Members: fr.Members}
	if r.LowerBound > 0 {
		fam.Ratio = float64(r.ArenaBytes) / float64(r.LowerBound)
	}
	fam.WriteText(w)
	fmt.Fprintf(w, "standalone arenas (each workload alone, its own KV cache and weights): %s in all, %.2fx the family arena\n",
		bytesStr(fr.SeparateStandalone), float64(fr.SeparateStandalone)/float64(max(r.ArenaBytes, 1)))
}

func head(s []int64, n int) []int64 { return s[:min(n, len(s))] }

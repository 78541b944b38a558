package graphexec

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"time"

	"github.com/arenaplan/arenaplan/arena"
	"github.com/arenaplan/arenaplan/cuda"
	"github.com/arenaplan/arenaplan/graph"
	"github.com/arenaplan/arenaplan/lifetime"
	"github.com/arenaplan/arenaplan/planner"
)

// Group runs several graphs, its members, laid on one joint timeline in
// one arena (arena.GroupLayout), on one stream with one set of loaded
// modules; each member is an Executor of its own (Member) with its own
// captured graph, which owns none of them. There are two kinds:
//
//   - a family (NewFamily): alternatives replayed one at a time (batch
//     sizes), shared tensors (weights, the KV cache) at one address for
//     every member, each member's private buffers overlapping the
//     others'. A member's private buffers are whatever the previous step
//     left, and its fed inputs are written before each of its steps.
//   - a chain (NewChain): members, its stages, that run in turn and
//     consume each other's outputs in place. Before every step of a stage
//     the group asks the plan's guard (planner.ChainGuard) whether the
//     step may run: a stage whose input has not been produced, or was
//     overwritten since, and a stage that would overwrite a value another
//     stage has not yet read, are refused with a *planner.OrderError, and
//     nothing runs.
//
// A Group is not safe for concurrent use; on the driver, call it from the
// goroutine bound to the device.
type Group struct {
	what   string // "family" or "chain", for errors
	dev    cuda.Device
	arena  *arena.Arena
	stream cuda.Stream
	mods   []cuda.Module
	execs  []*Executor
	// keys[i] holds member i's shared key per buffer (a family's); Init
	// writes a shared key once.
	keys [][]string
	// initial holds the initial bytes of shared state and constant inputs
	// after Init, so that ResetState copies instead of regenerating them
	// (a KV cache for the largest batch is gigabytes of random numbers).
	initial map[string][]byte
	guard   *planner.ChainGuard // a chain's; nil in a family
}

// NewFamily builds the family arena for plan and one executor per graph:
// graphs[i] must be the workload members[i] was recorded from (same dry
// run trace, same shared keys) and plan must pass planner.CheckFamily for
// members. Modules with the same PTX are loaded once. It uploads nothing:
// call Init.
func NewFamily(dev cuda.Device, graphs []*graph.Graph, members []planner.Member, plan *planner.GroupPlan, opt Options) (*Group, error) {
	g := &Group{what: "family", dev: dev}
	dry, lay, err := g.familyLayout(graphs, members, plan)
	if err == nil {
		err = g.setup(graphs, dry, lay, opt, func(i int) string { return fmt.Sprintf("member %q", members[i].Name) })
	}
	if err != nil {
		g.Close()
		return nil, err
	}
	return g, nil
}

// familyLayout maps the family arena (and sets it, so that Close frees it
// on any later error) and verifies graphs against their members: the members' shared tensors (weights, KV caches, inputs) in
// regions a Pause backs up, their private memory in one it drops, as the
// PyTorch bridge's family arena (arena.NewFamilyLayout).
func (g *Group) familyLayout(graphs []*graph.Graph, members []planner.Member, fp *planner.GroupPlan) ([]*graph.DryRun, *arena.GroupLayout, error) {
	if len(graphs) != len(members) {
		return nil, nil, fmt.Errorf("graphexec: family: %d graphs for %d members", len(graphs), len(members))
	}
	lay, err := arena.NewFamilyLayout(g.dev, members, fp)
	if err != nil {
		return nil, nil, fmt.Errorf("graphexec: family: %w", err)
	}
	g.arena = lay.Arena
	dry := make([]*graph.DryRun, len(graphs))
	for i, gr := range graphs {
		m := members[i]
		if err := graph.CheckShared(gr, len(graphs) > 1); err != nil {
			return nil, nil, fmt.Errorf("graphexec: family: member %q: %w", m.Name, err)
		}
		if fp.Align < gr.Align {
			return nil, nil, &graph.AlignError{Workload: gr.Label(), Plan: fp.Align, Need: gr.Align}
		}
		d, err := gr.DryRun()
		if err != nil {
			return nil, nil, err
		}
		if a, b := d.Trace.Fingerprint(), m.Trace.Fingerprint(); a != b {
			return nil, nil, fmt.Errorf("graphexec: family: member %q: its trace (fingerprint %x) is not the dry run of %s (fingerprint %x)", m.Name, b[:8], gr.Label(), a[:8])
		}
		keys := graph.FamilyKeys(gr, d)
		for j, k := range keys {
			if mk := memberKey(m, j); mk != k {
				return nil, nil, fmt.Errorf("graphexec: family: member %q: buffer %d (%s) has shared key %q in the plan, %q in %s",
					m.Name, j, d.Trace.Buffers[j].Name, mk, k, gr.Label())
			}
		}
		dry[i] = d
		g.keys = append(g.keys, keys)
	}
	return dry, lay, nil
}

func memberKey(m planner.Member, i int) string {
	if m.Keys == nil {
		return ""
	}
	return m.Keys[i]
}

// NewChain builds the chain's arena from cp (verified against graphs and
// links with planner.CheckChain) and one executor per stage. It uploads
// nothing: call Init.
func NewChain(dev cuda.Device, graphs []*graph.Graph, links []graph.ChainLink, cp *planner.GroupPlan, opt Options) (*Group, error) {
	g := &Group{what: "chain", dev: dev}
	dry, lay, err := g.chainLayout(graphs, links, cp)
	if err == nil {
		err = g.setup(graphs, dry, lay, opt, func(s int) string { return fmt.Sprintf("stage %d", s) })
	}
	if err != nil {
		g.Close()
		return nil, err
	}
	g.guard = cp.Guard()
	return g, nil
}

// chainLayout verifies cp against graphs and links and maps the chain's
// arena (and sets it): the stages' weights and state are kept across a Pause, their
// activations dropped, as an Executor's.
func (g *Group) chainLayout(graphs []*graph.Graph, links []graph.ChainLink, cp *planner.GroupPlan) ([]*graph.DryRun, *arena.GroupLayout, error) {
	stages, pl, dry, err := graph.ChainStages(graphs, links)
	if err != nil {
		return nil, nil, err
	}
	if err := planner.CheckChain(stages, pl, cp); err != nil {
		return nil, nil, fmt.Errorf("graphexec: chain: %w", err)
	}
	for _, gr := range graphs {
		if cp.Align < gr.Align {
			return nil, nil, &graph.AlignError{Workload: gr.Label(), Plan: cp.Align, Need: gr.Align}
		}
	}
	traces := make([]*lifetime.Trace, len(graphs))
	for s := range graphs {
		traces[s] = dry[s].Trace
	}
	lay, err := arena.NewGroupLayout(g.dev, traces, cp, kept(graphs...)...)
	if err != nil {
		return nil, nil, fmt.Errorf("graphexec: chain: %w", err)
	}
	g.arena = lay.Arena
	return dry, lay, nil
}

// setup opens the group's stream, loads its modules and binds one
// executor per graph, over its dry run dry[i], to its member's layout in
// lay; name(i) names member i in errors.
func (g *Group) setup(graphs []*graph.Graph, dry []*graph.DryRun, lay *arena.GroupLayout, opt Options, name func(int) string) error {
	var err error
	if g.stream, err = g.dev.NewStream(); err != nil {
		return fmt.Errorf("graphexec: %s: %w", g.what, err)
	}
	all, mods, ptxs, err := groupModules(g.dev, graphs)
	g.mods = all
	if err != nil {
		return fmt.Errorf("graphexec: %s: %w", g.what, err)
	}
	for i, gr := range graphs {
		e := &Executor{dev: g.dev, opt: opt, lay: lay.Members[i], group: g.what, stream: g.stream, mods: mods[i], modPTX: ptxs[i]}
		g.execs = append(g.execs, e)
		if err := e.bind(gr, dry[i], true); err != nil {
			return fmt.Errorf("graphexec: %s: %s: %w", g.what, name(i), err)
		}
	}
	return nil
}

// groupModules loads the modules of a group's graphs, each distinct one
// once, built for the device (Graph.ModulePTX: compute_90 with
// programmatic dependent launch on 9.0 and later, as Executor.New does).
// It returns every module loaded (the group's to close, also on error)
// and, per graph, its modules and the PTX each was loaded from.
func groupModules(dev cuda.Device, graphs []*graph.Graph) (all []cuda.Module, mods [][]cuda.Module, ptxs [][][]byte, err error) {
	major, _, err := dev.ComputeCapability()
	if err != nil {
		return nil, nil, nil, err
	}
	loaded := map[[32]byte]int{}
	for _, g := range graphs {
		gm := make([]cuda.Module, len(g.Modules))
		gp := make([][]byte, len(g.Modules))
		for j := range g.Modules {
			ptx := g.ModulePTX(j, major)
			sum := sha256.Sum256(ptx)
			k, ok := loaded[sum]
			if !ok {
				m, err := dev.LoadModule(ptx)
				if err != nil {
					return all, nil, nil, fmt.Errorf("%s: module %d: %w", g.Label(), j, err)
				}
				k = len(all)
				all = append(all, m)
				loaded[sum] = k
			}
			gm[j], gp[j] = all[k], ptx
		}
		mods, ptxs = append(mods, gm), append(ptxs, gp)
	}
	return all, mods, ptxs, nil
}

// Len is the number of members.
func (g *Group) Len() int { return len(g.execs) }

// Member returns member i's executor: its Eager, Capture, Replay, Read
// and Stage work as an Executor's, on the group's arena and stream. Its
// Init and ResetState write the shared tensors again, as the family's do
// once; its Eager and Replay bypass a chain's guard: use the group's.
func (g *Group) Member(i int) *Executor { return g.execs[i] }

// Arena returns the group's arena.
func (g *Group) Arena() *arena.Arena { return g.arena }

// Init writes the initial bytes of every tensor with an init function
// (weights, state, constant inputs), each shared key once (from the first
// member that has it), and forgets every value a chain's stages produced.
func (g *Group) Init() error { return g.initRoles(graph.Weight, graph.State, graph.Input) }

// ResetState rewrites the initial bytes of state tensors and constant
// inputs, shared ones once, and forgets every value a chain's stages
// produced: a chain starts again from its first stage.
func (g *Group) ResetState() error { return g.initRoles(graph.State, graph.Input) }

func (g *Group) initRoles(roles ...graph.Role) error {
	if err := g.Synchronize(); err != nil {
		return err
	}
	done := map[string]bool{}
	if g.initial == nil {
		g.initial = map[string][]byte{}
	}
	for i, e := range g.execs {
		for _, t := range e.g.Tensors {
			if t.InitFunc() == nil || !hasRole(roles, t.Role) {
				continue
			}
			k := ""
			if g.keys != nil {
				k = g.keys[i][e.dry.Tensor[t.Index()]]
			}
			if k != "" {
				if done[k] {
					continue
				}
				done[k] = true
			}
			buf := g.initial[k]
			if k == "" || buf == nil {
				buf = make([]byte, t.Bytes())
				t.InitFunc()(buf)
				if k != "" && t.Role != graph.Weight {
					g.initial[k] = buf
				}
			}
			if err := g.dev.CopyHtoD(e.ptr[t.Index()], buf); err != nil {
				return fmt.Errorf("graphexec: %s: %s: init %s: %w", g.what, e.g.Label(), t.Name, err)
			}
		}
	}
	if g.guard != nil {
		g.guard.Reset()
	}
	return nil
}

// Eager runs step of member m kernel by kernel (in a chain, if the guard
// allows it).
func (g *Group) Eager(m, step int) error { return g.run(m, step, (*Executor).Eager) }

// Replay replays step of member m (in a chain, if the guard allows it).
func (g *Group) Replay(m, step int) error { return g.run(m, step, (*Executor).Replay) }

func (g *Group) run(m, step int, f func(*Executor, int) error) error {
	if g.guard == nil {
		if m < 0 || m >= len(g.execs) {
			return fmt.Errorf("graphexec: %s: no member %d (have %d)", g.what, m, len(g.execs))
		}
		return f(g.execs[m], step)
	}
	if err := g.guard.Allow(m); err != nil {
		return fmt.Errorf("graphexec: %w", err)
	}
	if err := f(g.execs[m], step); err != nil {
		return err
	}
	if err := g.guard.Next(m); err != nil {
		return fmt.Errorf("graphexec: %w", err)
	}
	return nil
}

// Synchronize waits for the group's stream.
func (g *Group) Synchronize() error {
	if g.stream == nil {
		return nil
	}
	if err := g.stream.Synchronize(); err != nil {
		return fmt.Errorf("graphexec: %s: %w", g.what, err)
	}
	return nil
}

// Capture captures every member's step into its own graph and returns the
// total capture and instantiation time.
func (g *Group) Capture() (time.Duration, error) {
	var total time.Duration
	for _, e := range g.execs {
		d, err := e.Capture()
		if err != nil {
			return 0, err
		}
		total += d
	}
	return total, nil
}

// Captured reports whether every member has a captured graph, and the
// node count of their graphs in all.
func (g *Group) Captured() (bool, int) {
	all, nodes := len(g.execs) > 0, 0
	for _, e := range g.execs {
		ok, n := e.Captured()
		all, nodes = all && ok, nodes+n
	}
	return all, nodes
}

// Close releases every member's graph and staging memory, the modules,
// the stream and the arena.
func (g *Group) Close() error {
	var errs []error
	errs = append(errs, g.Synchronize())
	for _, e := range g.execs {
		e.stream, e.mods = nil, nil // the group's, closed below
		errs = append(errs, e.Close())
	}
	g.execs = nil
	for _, m := range g.mods {
		errs = append(errs, m.Close())
	}
	g.mods = nil
	if g.stream != nil {
		errs = append(errs, g.stream.Close())
		g.stream = nil
	}
	if g.arena != nil {
		errs = append(errs, g.arena.Close())
		g.arena = nil
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("graphexec: %s: close: %w", g.what, err)
	}
	return nil
}

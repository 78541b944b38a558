package graphexec

import (
	"crypto/sha256"
	"fmt"

	"github.com/arenaplan/arenaplan/arena"
	"github.com/arenaplan/arenaplan/cuda"
	"github.com/arenaplan/arenaplan/graph"
	"github.com/arenaplan/arenaplan/planner"
)

// Family runs several graphs, its members, from one arena laid out by a
// family plan: shared tensors (weights, the KV cache) at one address for
// every member, each member's private buffers overlapping the others'.
// Members share one stream, so their steps never run concurrently: a
// member's private buffers are whatever the previous step left, and its
// fed inputs are written before each of its steps. Each member is an
// Executor of its own (Member) with its own captured graph.
//
// A Family is not safe for concurrent use; on the driver, call it from
// the goroutine bound to the device.
type Family struct {
	group // arena, stream, modules, and the members' executors (execs)
	dev   cuda.Device
	plan  *planner.FamilyPlan
	keys  [][]string
	// initial holds the initial bytes of shared state and constant inputs
	// after Init, so that ResetState copies instead of regenerating them
	// (a KV cache for the largest batch is gigabytes of random numbers).
	initial map[string][]byte
}

// NewFamily builds the family arena for plan and one executor per graph:
// graphs[i] must be the workload members[i] was recorded from (same dry
// run trace, same shared keys) and plan must pass planner.CheckFamily for
// members. Modules with the same PTX are loaded once. It uploads nothing:
// call Init.
func NewFamily(dev cuda.Device, graphs []*graph.Graph, members []planner.Member, plan *planner.FamilyPlan, opt Options) (*Family, error) {
	f := &Family{group: group{what: "family"}, dev: dev, plan: plan}
	if err := f.setup(graphs, members, opt); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

func (f *Family) setup(graphs []*graph.Graph, members []planner.Member, opt Options) error {
	fp := f.plan
	if len(graphs) != len(members) {
		return fmt.Errorf("graphexec: family: %d graphs for %d members", len(graphs), len(members))
	}
	// The family arena: the members' shared tensors (weights, KV caches,
	// inputs) in regions a Pause backs up, their private memory in one it
	// drops, as the PyTorch bridge's family arena (arena.NewFamilyLayout).
	lay, err := arena.NewFamilyLayout(f.dev, members, fp)
	if err != nil {
		return fmt.Errorf("graphexec: family: %w", err)
	}
	f.arena = lay.Arena
	dry := make([]*graph.DryRun, len(graphs))
	for i, g := range graphs {
		m := members[i]
		if err := graph.CheckShared(g, len(graphs) > 1); err != nil {
			return fmt.Errorf("graphexec: family: member %q: %w", m.Name, err)
		}
		if fp.Align < g.Align {
			return &graph.AlignError{Workload: g.Label(), Plan: fp.Align, Need: g.Align}
		}
		d, err := g.DryRun()
		if err != nil {
			return err
		}
		if a, b := d.Trace.Fingerprint(), m.Trace.Fingerprint(); a != b {
			return fmt.Errorf("graphexec: family: member %q: its trace (fingerprint %x) is not the dry run of %s (fingerprint %x)", m.Name, b[:8], g.Label(), a[:8])
		}
		keys := graph.FamilyKeys(g, d)
		for j, k := range keys {
			if mk := memberKey(m, j); mk != k {
				return fmt.Errorf("graphexec: family: member %q: buffer %d (%s) has shared key %q in the plan, %q in %s",
					m.Name, j, d.Trace.Buffers[j].Name, mk, k, g.Label())
			}
		}
		dry[i] = d
		f.keys = append(f.keys, keys)
	}
	if f.stream, err = f.dev.NewStream(); err != nil {
		return fmt.Errorf("graphexec: family: %w", err)
	}
	all, mods, ptxs, err := groupModules(f.dev, graphs)
	f.mods = all
	if err != nil {
		return fmt.Errorf("graphexec: family: %w", err)
	}
	for i, g := range graphs {
		e := &Executor{dev: f.dev, opt: opt, lay: lay.Members[i], group: "family", stream: f.stream, mods: mods[i], modPTX: ptxs[i]}
		f.execs = append(f.execs, e)
		if err := e.bind(g, dry[i], true); err != nil {
			return fmt.Errorf("graphexec: family: member %q: %w", members[i].Name, err)
		}
	}
	return nil
}

// groupModules loads the modules of a family's or a chain's graphs, each
// distinct one once, built for the device (Graph.ModulePTX: compute_90
// with programmatic dependent launch on 9.0 and later, as Executor.New
// does). It returns every module loaded (the group's to close, also on
// error) and, per graph, its modules and the PTX each was loaded from.
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

func memberKey(m planner.Member, i int) string {
	if m.Keys == nil {
		return ""
	}
	return m.Keys[i]
}

// Len is the number of members.
func (f *Family) Len() int { return len(f.execs) }

// Member returns member i's executor: its Eager, Capture, Replay, Read
// and Stage work as an Executor's, on the family's arena and stream. Its
// Init and ResetState write the shared tensors again, as the family's do
// once.
func (f *Family) Member(i int) *Executor { return f.execs[i] }

// Plan returns the family plan.
func (f *Family) Plan() *planner.FamilyPlan { return f.plan }

// Arena returns the family arena.
func (f *Family) Arena() *arena.Arena { return f.arena }

// Init writes the initial bytes of every tensor with an init function,
// each shared key once (from the first member that has it).
func (f *Family) Init() error { return f.initRoles(graph.Weight, graph.State, graph.Input) }

// ResetState rewrites the initial bytes of state tensors and constant
// inputs, shared ones once.
func (f *Family) ResetState() error { return f.initRoles(graph.State, graph.Input) }

func (f *Family) initRoles(roles ...graph.Role) error {
	if err := f.Synchronize(); err != nil {
		return err
	}
	done := map[string]bool{}
	if f.initial == nil {
		f.initial = map[string][]byte{}
	}
	for i, e := range f.execs {
		for _, t := range e.g.Tensors {
			if t.InitFunc() == nil || !hasRole(roles, t.Role) {
				continue
			}
			k := f.keys[i][e.dry.Tensor[t.Index()]]
			if k != "" {
				if done[k] {
					continue
				}
				done[k] = true
			}
			buf := f.initial[k]
			if k == "" || buf == nil {
				buf = make([]byte, t.Bytes())
				t.InitFunc()(buf)
				if k != "" && t.Role != graph.Weight {
					f.initial[k] = buf
				}
			}
			if err := f.dev.CopyHtoD(e.ptr[t.Index()], buf); err != nil {
				return fmt.Errorf("graphexec: family: %s: init %s: %w", e.g.Label(), t.Name, err)
			}
		}
	}
	return nil
}

// Eager runs step of member m kernel by kernel.
func (f *Family) Eager(m, step int) error {
	if m < 0 || m >= len(f.execs) {
		return fmt.Errorf("graphexec: family: no member %d (have %d)", m, len(f.execs))
	}
	return f.execs[m].Eager(step)
}

// Replay replays step of member m.
func (f *Family) Replay(m, step int) error {
	if m < 0 || m >= len(f.execs) {
		return fmt.Errorf("graphexec: family: no member %d (have %d)", m, len(f.execs))
	}
	return f.execs[m].Replay(step)
}

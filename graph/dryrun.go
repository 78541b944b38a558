package graph

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/arenaplan/arenaplan/lifetime"
	"github.com/arenaplan/arenaplan/planner"
	"github.com/arenaplan/arenaplan/plans"
)

// DryRun is the lifetime trace of one step of a graph, and which buffer of
// it is which tensor or workspace.
type DryRun struct {
	Trace *lifetime.Trace
	// Tensor[i] is the buffer of Graph.Tensors[i].
	Tensor []lifetime.ID
	// Workspace[j] is the buffer of Graph.Ops[j]'s workspace, -1 if none.
	Workspace []lifetime.ID
}

// DryRun walks the graph with a lifetime.Recorder, one tick per op: inputs,
// weights, state and outputs are born at time 0 and live to the end; an
// intermediate is born at the op that first writes it and dies after the
// last op that uses it; a workspace lives for its op alone. Nothing runs.
func (g *Graph) DryRun() (*DryRun, error) {
	last := make([]int, len(g.Tensors))
	first := make([]int, len(g.Tensors))
	for i := range first {
		first[i], last[i] = -1, -1
	}
	for _, op := range g.Ops {
		for _, a := range op.Args {
			if t := a.tensor; t != nil {
				if first[t.index] < 0 {
					first[t.index] = op.index
				}
				last[t.index] = op.index
			}
		}
	}
	r := lifetime.NewRecorder(g.Label())
	d := &DryRun{Tensor: make([]lifetime.ID, len(g.Tensors)), Workspace: make([]lifetime.ID, len(g.Ops))}
	alloc := func(t *Tensor) {
		d.Tensor[t.index] = r.Alloc(t.Bytes(), lifetime.Name(t.Name), lifetime.Tag(t.Role.Tag()), lifetime.Align(g.Align))
	}
	for _, t := range g.Tensors {
		switch {
		case t.unplanned:
			d.Tensor[t.index] = -1 // the spillover allocator serves it
		case t.Role != Intermediate:
			alloc(t)
		}
	}
	for _, op := range g.Ops {
		if op.index > 0 {
			r.Tick()
		}
		for _, a := range op.Args {
			if t := a.tensor; t != nil && t.Role == Intermediate && !t.unplanned && first[t.index] == op.index {
				alloc(t)
				first[t.index] = -2 // allocated; an op may name a tensor twice
			}
		}
		d.Workspace[op.index] = -1
		if op.Workspace > 0 && !op.SpillWorkspace {
			id := r.Alloc(op.Workspace, lifetime.Name(fmt.Sprintf("%s.workspace#%d", op.Name, op.index)),
				lifetime.Tag(Intermediate.Tag()), lifetime.Align(g.Align))
			d.Workspace[op.index] = id
			if err := r.Free(id); err != nil {
				return nil, fmt.Errorf("graph: %s: dry run: %w", g.Name, err)
			}
		}
		for _, a := range op.Args {
			if t := a.tensor; t != nil && t.Role == Intermediate && !t.unplanned && last[t.index] == op.index {
				if err := r.Free(d.Tensor[t.index]); err != nil {
					return nil, fmt.Errorf("graph: %s: dry run: %w", g.Name, err)
				}
				last[t.index] = -2
			}
		}
	}
	d.Trace = r.Trace()
	if err := d.Trace.Validate(); err != nil {
		return nil, fmt.Errorf("graph: %s: dry run: %w", g.Name, err)
	}
	return d, nil
}

// PlanOptions are what planning a dry run takes.
type PlanOptions = planner.Options

// Plan plans a dry run's trace with the "auto" planner, one region per tag
// (planner.RunByTag, in the order of Tags), so that each role's buffers
// form their own address range that the arena can map and pause alone.
// Regions are aligned only to the plan's alignment: the arena pads them to
// its granularity in virtual addresses, not in plan bytes.
func Plan(ctx context.Context, t *lifetime.Trace, opt PlanOptions) (*planner.Plan, error) {
	return PlanWith(ctx, planner.Auto, t, opt)
}

// PlanWith is Plan with the named planning algorithm for every region.
func PlanWith(ctx context.Context, algo string, t *lifetime.Trace, opt PlanOptions) (*planner.Plan, error) {
	p, _, err := planner.RunByTag(ctx, algo, t, opt)
	if err != nil {
		return nil, fmt.Errorf("graph: planning %s: %w", t.Name, err)
	}
	return p, nil
}

// Fingerprint identifies a workload: a SHA-256 over its name, shape,
// tensors (name, dtype, role, shape), ops (kernel, launch shape, workspace,
// arguments, scalars included) and the PTX of its modules. Weights' values
// are not part of it.
// (plans.Fingerprint: plan files record it.)
type Fingerprint = plans.Fingerprint

// Workload describes g as a plan file records it: name, shape and
// fingerprint.
func (g *Graph) Workload() *plans.Workload {
	return &plans.Workload{Name: g.Name, Shape: slices.Clone(g.Shape), Fingerprint: g.Fingerprint()}
}

// Fingerprint returns the workload's fingerprint.
func (g *Graph) Fingerprint() Fingerprint {
	h := sha256.New()
	var buf [8]byte
	u := func(v uint64) {
		binary.LittleEndian.PutUint64(buf[:], v)
		h.Write(buf[:])
	}
	s := func(v string) {
		u(uint64(len(v)))
		h.Write([]byte(v))
	}
	s("arenaplan/graphexec workload v1")
	s(g.Name)
	u(uint64(len(g.Shape)))
	for _, d := range g.Shape {
		s(d.Name)
		u(uint64(d.Value))
	}
	u(uint64(g.Align))
	u(uint64(len(g.Tensors)))
	for _, t := range g.Tensors {
		s(t.Name)
		u(uint64(t.DType))
		u(uint64(t.Role))
		u(uint64(len(t.Shape)))
		for _, d := range t.Shape {
			u(uint64(d))
		}
		if t.feed != nil {
			u(1)
		} else {
			u(0)
		}
	}
	u(uint64(len(g.Modules)))
	for _, m := range g.Modules {
		sum := sha256.Sum256(m)
		h.Write(sum[:])
	}
	u(uint64(len(g.Ops)))
	for _, op := range g.Ops {
		s(op.Name)
		s(op.Kernel)
		u(uint64(op.Module))
		for _, d := range []uint32{op.Grid.X, op.Grid.Y, op.Grid.Z, op.Block.X, op.Block.Y, op.Block.Z, op.Shared} {
			u(uint64(d))
		}
		u(uint64(op.Workspace))
		u(uint64(len(op.Args)))
		for _, a := range op.Args {
			u(uint64(a.kind))
			switch a.kind {
			case ArgTensor:
				u(uint64(a.tensor.index))
				u(uint64(a.access))
			case ArgScalar:
				u(uint64(a.scalar.Kind))
				u(a.scalar.Bits)
			}
		}
	}
	hashStreams(u, g)
	var f Fingerprint
	h.Sum(f[:0])
	return f
}

// Topology is what a captured graph's exec can be updated across: the
// sequence of kernels and their argument kinds. Scalars, launch shapes
// and addresses may differ.
func (g *Graph) Topology() string {
	h := sha256.New()
	for _, op := range g.Ops {
		fmt.Fprintf(h, "%d:%s:%d|", op.Module, op.Kernel, len(op.Args))
		for _, a := range op.Args {
			fmt.Fprintf(h, "%d,", a.kind)
		}
	}
	for _, m := range g.Modules {
		sum := sha256.Sum256(m)
		h.Write(sum[:])
	}
	h.Write([]byte(streamTopology(g)))
	return string(h.Sum(nil))
}

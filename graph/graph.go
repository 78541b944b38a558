package graph

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"

	"github.com/arenaplan/arenaplan/launch"
	"github.com/arenaplan/arenaplan/lifetime"
	"github.com/arenaplan/arenaplan/plans"
)

// DType is a tensor's element type.
type DType uint8

const (
	F32 DType = iota + 1 // float32
	F16                  // float16 (storage only: no built-in kernel uses it)
	U32                  // uint32 (tokens, positions)
	I32                  // int32
)

// Size is the element size in bytes.
func (d DType) Size() int64 {
	switch d {
	case F16:
		return 2
	case F32, U32, I32:
		return 4
	}
	return 0
}

func (d DType) String() string {
	switch d {
	case F32:
		return "f32"
	case F16:
		return "f16"
	case U32:
		return "u32"
	case I32:
		return "i32"
	}
	return "DType(" + strconv.Itoa(int(d)) + ")"
}

// Role says what a tensor is to the workload, and so how long it lives and
// which arena region (lifetime tag) holds it.
type Role uint8

const (
	// Input is written by the host before a step (Tensor.SetFeed every
	// step, or Tensor.SetInit once) and only read by kernels.
	Input Role = iota + 1
	// Weight is written once by the host (Tensor.SetInit) and only read.
	Weight
	// State persists across steps and kernels rewrite it (a KV cache);
	// Tensor.SetInit gives its initial contents.
	State
	// Output is written by kernels and read back by the host.
	Output
	// Intermediate is born at its first writer and dies after its last
	// reader; the plan reuses its memory.
	Intermediate
)

// Tags are the lifetime tags of the roles, one arena region each, in
// region order (lifetime.Tags).
var Tags = lifetime.Tags

// Tag is the lifetime tag of the role's buffers.
func (r Role) Tag() string {
	switch r {
	case Input:
		return "input"
	case Weight:
		return "weight"
	case State:
		return "kv"
	case Output:
		return "output"
	case Intermediate:
		return "intermediate"
	}
	return ""
}

func (r Role) String() string {
	if t := r.Tag(); t != "" {
		return t
	}
	return "Role(" + strconv.Itoa(int(r)) + ")"
}

// Tensor is one buffer of a workload. Create tensors with Builder.Tensor.
type Tensor struct {
	Name  string
	Shape []int64
	DType DType
	Role  Role

	unplanned bool // served by the spillover allocator (SetUnplanned)

	index int
	init  func(dst []byte)
	feed  func(step int, dst []byte)
	share string // family-wide key (Share), "" for none
}

// Index is the tensor's position in Graph.Tensors.
func (t *Tensor) Index() int { return t.index }

// Elems is the number of elements.
func (t *Tensor) Elems() int64 {
	n := int64(1)
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// Bytes is the tensor's size in bytes.
func (t *Tensor) Bytes() int64 { return t.Elems() * t.DType.Size() }

// SetInit sets the function that writes the tensor's initial bytes (for
// weights, state and inputs that stay the same every step). It returns t.
func (t *Tensor) SetInit(f func(dst []byte)) *Tensor { t.init = f; return t }

// SetFeed sets the function that writes an input's bytes for a step. It
// returns t. A fed input is what makes a captured graph reusable across
// steps: its bytes change, its address does not.
func (t *Tensor) SetFeed(f func(step int, dst []byte)) *Tensor { t.feed = f; return t }

// InitFunc is the function SetInit set, or nil.
func (t *Tensor) InitFunc() func(dst []byte) { return t.init }

// FeedFunc is the function SetFeed set, or nil.
func (t *Tensor) FeedFunc() func(step int, dst []byte) { return t.feed }

// HasFeed reports whether the tensor is written before every step.
func (t *Tensor) HasFeed() bool { return t.feed != nil }

// Access says how a kernel argument uses its tensor.
type Access uint8

const (
	Read Access = 1 << iota
	Write
)

// ArgKind is what an Arg passes: a tensor's address, the op's workspace
// address, a null pointer or a scalar.
type ArgKind uint8

// The kinds of Arg.
const (
	ArgTensor ArgKind = iota + 1
	ArgWorkspace
	ArgNull
	ArgScalar
)

// Arg is one kernel argument of an op: a tensor's address, the op's
// workspace address, a null pointer or a scalar.
type Arg struct {
	kind   ArgKind
	tensor *Tensor
	access Access
	scalar launch.KernelArg
}

// In passes t's address to a kernel that reads it.
func In(t *Tensor) Arg { return Arg{kind: ArgTensor, tensor: t, access: Read} }

// Out passes t's address to a kernel that writes it.
func Out(t *Tensor) Arg { return Arg{kind: ArgTensor, tensor: t, access: Write} }

// InOut passes t's address to a kernel that reads and writes it.
func InOut(t *Tensor) Arg { return Arg{kind: ArgTensor, tensor: t, access: Read | Write} }

// Workspace passes the address of the op's workspace (Launch.Workspace
// bytes, planned like an intermediate that lives for the op alone).
func Workspace() Arg { return Arg{kind: ArgWorkspace} }

// Null passes a null pointer.
func Null() Arg { return Arg{kind: ArgNull} }

// Scalar passes a scalar by value.
func Scalar(a launch.KernelArg) Arg { return Arg{kind: ArgScalar, scalar: a} }

// Kind is what the argument passes.
func (a Arg) Kind() ArgKind { return a.kind }

// Value is a scalar argument's value.
func (a Arg) Value() launch.KernelArg { return a.scalar }

// Tensor returns the argument's tensor and how the kernel uses it, or nil.
func (a Arg) Tensor() (*Tensor, Access) { return a.tensor, a.access }

// Launch describes one op: a kernel launch over tensors.
type Launch struct {
	Name   string // for errors and reports; default the kernel's name
	Kernel string // the PTX entry
	Grid   launch.Dim3
	Block  launch.Dim3
	Shared uint32 // dynamic shared memory bytes
	// Workspace is the scratch bytes the op needs (0: none); a Workspace()
	// argument receives its address.
	Workspace int64
	Args      []Arg
	// Stream is the stream the op runs on: 0 is the executor's stream,
	// 1 to MaxStreams-1 side streams, which fork from it at the start of
	// a step and join it at the end (see spill.go).
	Stream int
	// Wait lists the streams whose work enqueued so far the op waits for
	// (an event recorded there, waited on here): forks and joins.
	Wait []int
	// SpillWorkspace serves the workspace from the spillover allocator at
	// launch time instead of the plan.
	SpillWorkspace bool
}

// Op is one kernel launch of a graph.
type Op struct {
	Launch
	Module int // index into Graph.Modules
	index  int
}

// Index is the op's position in Graph.Ops.
func (o *Op) Index() int { return o.index }

// Dim is one named dimension of a workload's shape (plans.Dim: plan
// files record shapes).
type Dim = plans.Dim

// Graph is a workload: tensors and the ops over them, in execution order,
// with the PTX modules their kernels come from. Build one with a Builder;
// a built graph is immutable.
type Graph struct {
	Name    string
	Shape   []Dim
	Tensors []*Tensor
	Ops     []*Op
	Modules [][]byte
	// Variants are other builds of each module's kernels, indexed like
	// Modules (nil where none); see Builder.Variant. They are no part of
	// the fingerprint: they change how a kernel runs, not what it does.
	Variants [][]Variant
	// Align is the smallest alignment in bytes that the kernels need for
	// every tensor address; a plan of a smaller alignment is refused.
	Align int64
}

// Dim returns the value of the named shape dimension.
func (g *Graph) Dim(name string) (int64, bool) {
	for _, d := range g.Shape {
		if d.Name == name {
			return d.Value, true
		}
	}
	return 0, false
}

// Label is the graph's name with its shape, as in "mlp(layers=64,...)".
func (g *Graph) Label() string {
	s := g.Name + "("
	for i, d := range g.Shape {
		if i > 0 {
			s += ","
		}
		s += d.Name + "=" + strconv.FormatInt(d.Value, 10)
	}
	return s + ")"
}

// TensorsWith returns the graph's tensors of the given role, in order.
func (g *Graph) TensorsWith(r Role) []*Tensor {
	var out []*Tensor
	for _, t := range g.Tensors {
		if t.Role == r {
			out = append(out, t)
		}
	}
	return out
}

// Builder describes a workload. Its methods record the first error, which
// Build returns, so that a description reads as a plain sequence of calls.
// A Builder is not safe for concurrent use.
type Builder struct {
	g      *Graph
	module int
	err    error
	names  map[string]bool
}

// NewBuilder starts a workload of the given name. Kernel tensor addresses
// are aligned to 16 bytes at least (float4 access) unless RequireAlign
// raises it.
func NewBuilder(name string) *Builder {
	return &Builder{g: &Graph{Name: name, Align: 16}, module: -1, names: map[string]bool{}}
}

func (b *Builder) fail(format string, args ...any) {
	if b.err == nil {
		b.err = fmt.Errorf("graph: %s: "+format, append([]any{b.g.Name}, args...)...)
	}
}

// Dim records one dimension of the workload's shape (part of its
// fingerprint and of its plan file's metadata).
func (b *Builder) Dim(name string, value int64) {
	for _, d := range b.g.Shape {
		if d.Name == name {
			b.fail("shape dimension %q given twice", name)
			return
		}
	}
	if name == "" {
		b.fail("shape dimension without a name")
		return
	}
	b.g.Shape = append(b.g.Shape, Dim{Name: name, Value: value})
}

// RequireAlign raises the alignment the kernels need (a power of two).
func (b *Builder) RequireAlign(n int64) {
	if n <= 0 || n&(n-1) != 0 {
		b.fail("alignment %d is not a power of two", n)
		return
	}
	b.g.Align = max(b.g.Align, n)
}

// Module adds a PTX module; later launches name entries of it.
func (b *Builder) Module(ptx []byte) {
	b.g.Modules = append(b.g.Modules, ptx)
	b.g.Variants = append(b.g.Variants, nil)
	b.module = len(b.g.Modules) - 1
}

// Variant is another build of a module's kernels, with the same entries
// and parameters, for devices of compute capability MinMajor.0 and later
// (compute_90 PTX with programmatic dependent launch, say).
type Variant struct {
	MinMajor int
	PTX      []byte
}

// Variant adds a build of the last module's kernels for devices of
// compute capability minMajor.0 and later; an executor loads the variant
// of the highest MinMajor its device reaches (Graph.ModulePTX). Empty PTX
// adds nothing.
func (b *Builder) Variant(minMajor int, ptx []byte) {
	if len(ptx) == 0 {
		return
	}
	if len(b.g.Modules) == 0 {
		b.fail("graph: %s: Variant before any Module", b.g.Name)
		return
	}
	b.g.Variants[b.module] = append(b.g.Variants[b.module], Variant{MinMajor: minMajor, PTX: ptx})
}

// ModulePTX is the PTX of module i to load on a device of compute
// capability major.x: the variant of the highest MinMajor at most major,
// else the module itself.
func (g *Graph) ModulePTX(i, major int) []byte {
	ptx, best := g.Modules[i], -1
	if i < len(g.Variants) {
		for _, v := range g.Variants[i] {
			if v.MinMajor <= major && v.MinMajor > best {
				ptx, best = v.PTX, v.MinMajor
			}
		}
	}
	return ptx
}

// Tensor adds a tensor.
func (b *Builder) Tensor(name string, dt DType, role Role, shape ...int64) *Tensor {
	t := &Tensor{Name: name, Shape: append([]int64(nil), shape...), DType: dt, Role: role, index: len(b.g.Tensors)}
	switch {
	case name == "":
		b.fail("tensor %d has no name", t.index)
	case b.names[name]:
		b.fail("tensor name %q used twice", name)
	case dt.Size() == 0:
		b.fail("tensor %s: unknown dtype %v", name, dt)
	case role.Tag() == "":
		b.fail("tensor %s: unknown role %v", name, role)
	case len(shape) == 0:
		b.fail("tensor %s: no shape", name)
	}
	for _, d := range shape {
		if d <= 0 || d > 1<<40 {
			b.fail("tensor %s: dimension %d out of range", name, d)
		}
	}
	b.names[name] = true
	b.g.Tensors = append(b.g.Tensors, t)
	return t
}

// Launch adds an op running a kernel of the latest module.
func (b *Builder) Launch(l Launch) *Op {
	if l.Name == "" {
		l.Name = l.Kernel
	}
	l.Args = append([]Arg(nil), l.Args...)
	l.Wait = append([]int(nil), l.Wait...)
	op := &Op{Launch: l, Module: b.module, index: len(b.g.Ops)}
	b.g.Ops = append(b.g.Ops, op)
	if b.module < 0 {
		b.fail("op %s: no module added before it", l.Name)
		return op
	}
	if !hasEntry(b.g.Modules[b.module], l.Kernel) {
		b.fail("op %s: kernel %q is not an entry of its module", l.Name, l.Kernel)
	}
	if l.Grid.Count() == 0 || l.Block.Count() == 0 || l.Block.Count() > 1024 {
		b.fail("op %s: launch shape grid %v block %v", l.Name, l.Grid, l.Block)
	}
	if l.Workspace < 0 {
		b.fail("op %s: negative workspace", l.Name)
	}
	ws := 0
	for i, a := range l.Args {
		switch a.kind {
		case ArgTensor:
			if a.tensor == nil || a.tensor.index >= len(b.g.Tensors) || b.g.Tensors[a.tensor.index] != a.tensor {
				b.fail("op %s: argument %d is not a tensor of this builder", l.Name, i)
			}
		case ArgWorkspace:
			ws++
		case ArgNull, ArgScalar:
		default:
			b.fail("op %s: argument %d is the zero Arg", l.Name, i)
		}
	}
	b.checkStreams(l)
	if (ws > 0) != (l.Workspace > 0) {
		b.fail("op %s: %d workspace arguments for a workspace of %d bytes", l.Name, ws, l.Workspace)
	}
	return op
}

var entryRE = regexp.MustCompile(`\.entry\s+([A-Za-z_$%][\w$]*)`)

func hasEntry(ptx []byte, name string) bool {
	for _, m := range entryRE.FindAllSubmatch(ptx, -1) {
		if string(m[1]) == name {
			return true
		}
	}
	return false
}

// Build checks the description and returns the graph: every intermediate
// and output is written before it is read, weights and inputs are never
// written by a kernel, every fed or initialised tensor has the role that
// allows it.
func (b *Builder) Build() (*Graph, error) {
	if b.err != nil {
		return nil, b.err
	}
	g := b.g
	if len(g.Ops) == 0 {
		return nil, fmt.Errorf("graph: %s: no ops", g.Name)
	}
	if err := checkUnplanned(g); err != nil {
		return nil, err
	}
	written := make([]bool, len(g.Tensors))
	used := make([]bool, len(g.Tensors))
	for _, op := range g.Ops {
		for _, a := range op.Args {
			t := a.tensor
			if t == nil {
				continue
			}
			used[t.index] = true
			if a.access&Read != 0 && !written[t.index] && (t.Role == Intermediate || t.Role == Output) {
				return nil, fmt.Errorf("graph: %s: op %d (%s) reads %s %s before any op writes it", g.Name, op.index, op.Name, t.Role, t.Name)
			}
		}
		for _, a := range op.Args {
			t := a.tensor
			if t == nil || a.access&Write == 0 {
				continue
			}
			if t.Role == Weight || t.Role == Input {
				return nil, fmt.Errorf("graph: %s: op %d (%s) writes %s %s", g.Name, op.index, op.Name, t.Role, t.Name)
			}
			written[t.index] = true
		}
	}
	for _, t := range g.Tensors {
		switch {
		case !used[t.index]:
			return nil, fmt.Errorf("graph: %s: tensor %s is used by no op", g.Name, t.Name)
		case t.feed != nil && t.Role != Input:
			return nil, fmt.Errorf("graph: %s: %s %s has a feed; only inputs do", g.Name, t.Role, t.Name)
		case t.init != nil && (t.Role == Intermediate || t.Role == Output):
			return nil, fmt.Errorf("graph: %s: %s %s has an init function", g.Name, t.Role, t.Name)
		case t.feed != nil && t.init != nil:
			return nil, fmt.Errorf("graph: %s: input %s has both a feed and an init function", g.Name, t.Name)
		case (t.Role == Output) && !written[t.index]:
			return nil, fmt.Errorf("graph: %s: output %s is never written", g.Name, t.Name)
		}
	}
	b.err = errors.New("graph: Builder already built")
	return g, nil
}

package graphexec_test

import (
	"encoding/binary"
	"strings"
	"testing"

	"github.com/arenaplan/arenaplan/cuda"
	"github.com/arenaplan/arenaplan/graph"
	"github.com/arenaplan/arenaplan/graphexec"
	"github.com/arenaplan/arenaplan/workloads"
)

// A user's own module: add_u32(dst, a, b, scratch, n): dst = a + b, through
// a workspace.
const userPTX = `
.version 7.0
.target sm_52
.address_size 64
.visible .entry add_u32(
	.param .u64 p0, .param .u64 p1, .param .u64 p2, .param .u64 p3, .param .u32 p4
)
{ ret; }
`

func addU32(mem cuda.SimMemory, grid, block cuda.Dim3, args []cuda.KernelArg) error {
	n := uint64(args[4].AsU32())
	dst, err := mem.Bytes(args[0].AsPtr(), 4*n)
	if err != nil {
		return err
	}
	a, err := mem.Bytes(args[1].AsPtr(), 4*n)
	if err != nil {
		return err
	}
	b, err := mem.Bytes(args[2].AsPtr(), 4*n)
	if err != nil {
		return err
	}
	ws, err := mem.Bytes(args[3].AsPtr(), 4*n)
	if err != nil {
		return err
	}
	for i := uint64(0); i < n; i++ {
		binary.LittleEndian.PutUint32(ws[4*i:], binary.LittleEndian.Uint32(a[4*i:])+binary.LittleEndian.Uint32(b[4*i:]))
	}
	copy(dst, ws)
	return nil
}

// userGraph: in (fed) -> t1 = in+w -> t2 = t1+t1 -> out = t2+in.
func userGraph(t testing.TB) (*graph.Graph, error) {
	t.Helper()
	b := graph.NewBuilder("user")
	b.Dim("n", 64)
	b.Module([]byte(userPTX))
	in := b.Tensor("in", graph.U32, graph.Input, 64).SetFeed(func(step int, dst []byte) {
		for i := 0; i+4 <= len(dst); i += 4 {
			binary.LittleEndian.PutUint32(dst[i:], uint32(step*1000+i))
		}
	})
	w := b.Tensor("w", graph.U32, graph.Weight, 64).SetInit(func(dst []byte) {
		for i := 0; i+4 <= len(dst); i += 4 {
			binary.LittleEndian.PutUint32(dst[i:], 7)
		}
	})
	t1 := b.Tensor("t1", graph.U32, graph.Intermediate, 64)
	t2 := b.Tensor("t2", graph.U32, graph.Intermediate, 64)
	out := b.Tensor("out", graph.U32, graph.Output, 64)
	add := func(dst, x, y *graph.Tensor) {
		b.Launch(graph.Launch{
			Kernel: "add_u32", Grid: cuda.D1(1), Block: cuda.D1(64), Workspace: 256,
			Args: []graph.Arg{graph.Out(dst), graph.In(x), graph.In(y), graph.Workspace(), graph.Scalar(cuda.U32(64))},
		})
	}
	add(t1, in, w)
	add(t2, t1, t1)
	add(out, t2, in)
	return b.Build()
}

func TestUserWorkload(t *testing.T) {
	g, err := userGraph(t)
	if err != nil {
		t.Fatal(err)
	}
	d, err := g.DryRun()
	if err != nil {
		t.Fatal(err)
	}
	// Lifetimes: persistent tensors live throughout; t1 is born at op 0 and
	// dies after op 1, t2 lives through ops 1 and 2; each workspace lives
	// for its op alone.
	want := map[string][2]int64{"in": {0, 3}, "w": {0, 3}, "out": {0, 3}, "t1": {0, 2}, "t2": {1, 3}}
	for i, x := range g.Tensors {
		b := d.Trace.Buffers[d.Tensor[i]]
		if w := want[x.Name]; b.Start != w[0] || b.End != w[1] || b.Tag != x.Role.Tag() {
			t.Errorf("%s: [%d, %d) tag %q, want [%d, %d) tag %q", x.Name, b.Start, b.End, b.Tag, w[0], w[1], x.Role.Tag())
		}
	}
	for j, id := range d.Workspace {
		if b := d.Trace.Buffers[id]; b.Start != int64(j) || b.End != int64(j)+1 || b.Size != 256 {
			t.Errorf("workspace %d: [%d, %d) %d bytes", j, b.Start, b.End, b.Size)
		}
	}
	s, err := cuda.OpenSim(cuda.SimConfig{Kernels: map[string]cuda.KernelFunc{"add_u32": addU32}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	e, err := graphexec.New(s, g, nil, graphexec.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if err := e.Init(); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Capture(); err != nil {
		t.Fatal(err)
	}
	for step := 0; step < 3; step++ {
		if err := e.Replay(step); err != nil {
			t.Fatal(err)
		}
		out, err := e.Read(g.TensorsWith(graph.Output)[0])
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 64; i++ {
			in := uint32(step*1000 + 4*i)
			if got, want := binary.LittleEndian.Uint32(out[4*i:]), 2*(in+7)+in; got != want {
				t.Fatalf("step %d element %d: %d, want %d", step, i, got, want)
			}
		}
	}
}

func TestBuilderErrors(t *testing.T) {
	ptx := []byte(userPTX)
	for _, tc := range []struct {
		name, want string
		build      func(b *graph.Builder)
	}{
		{"no module", "no module", func(b *graph.Builder) {
			x := b.Tensor("x", graph.F32, graph.Output, 4)
			b.Launch(graph.Launch{Kernel: "add_u32", Grid: cuda.D1(1), Block: cuda.D1(1), Args: []graph.Arg{graph.Out(x)}})
		}},
		{"unknown kernel", "not an entry", func(b *graph.Builder) {
			b.Module(ptx)
			x := b.Tensor("x", graph.F32, graph.Output, 4)
			b.Launch(graph.Launch{Kernel: "nope", Grid: cuda.D1(1), Block: cuda.D1(1), Args: []graph.Arg{graph.Out(x)}})
		}},
		{"read before write", "before any op writes it", func(b *graph.Builder) {
			b.Module(ptx)
			x := b.Tensor("x", graph.F32, graph.Intermediate, 4)
			y := b.Tensor("y", graph.F32, graph.Output, 4)
			b.Launch(graph.Launch{Kernel: "add_u32", Grid: cuda.D1(1), Block: cuda.D1(1), Args: []graph.Arg{graph.Out(y), graph.In(x)}})
		}},
		{"writes a weight", "writes weight", func(b *graph.Builder) {
			b.Module(ptx)
			x := b.Tensor("x", graph.F32, graph.Weight, 4)
			b.Launch(graph.Launch{Kernel: "add_u32", Grid: cuda.D1(1), Block: cuda.D1(1), Args: []graph.Arg{graph.Out(x)}})
		}},
		{"duplicate name", "used twice", func(b *graph.Builder) {
			b.Tensor("x", graph.F32, graph.Weight, 4)
			b.Tensor("x", graph.F32, graph.Weight, 4)
		}},
		{"workspace without argument", "workspace arguments", func(b *graph.Builder) {
			b.Module(ptx)
			x := b.Tensor("x", graph.F32, graph.Output, 4)
			b.Launch(graph.Launch{Kernel: "add_u32", Grid: cuda.D1(1), Block: cuda.D1(1), Workspace: 64, Args: []graph.Arg{graph.Out(x)}})
		}},
		{"unused tensor", "used by no op", func(b *graph.Builder) {
			b.Module(ptx)
			b.Tensor("idle", graph.F32, graph.Weight, 4)
			x := b.Tensor("x", graph.F32, graph.Output, 4)
			b.Launch(graph.Launch{Kernel: "add_u32", Grid: cuda.D1(1), Block: cuda.D1(1), Args: []graph.Arg{graph.Out(x)}})
		}},
		{"feed on a weight", "has a feed", func(b *graph.Builder) {
			b.Module(ptx)
			w := b.Tensor("w", graph.F32, graph.Weight, 4).SetFeed(func(int, []byte) {})
			x := b.Tensor("x", graph.F32, graph.Output, 4)
			b.Launch(graph.Launch{Kernel: "add_u32", Grid: cuda.D1(1), Block: cuda.D1(1), Args: []graph.Arg{graph.Out(x), graph.In(w)}})
		}},
		{"bad launch shape", "launch shape", func(b *graph.Builder) {
			b.Module(ptx)
			x := b.Tensor("x", graph.F32, graph.Output, 4)
			b.Launch(graph.Launch{Kernel: "add_u32", Grid: cuda.D1(1), Block: cuda.D1(2048), Args: []graph.Arg{graph.Out(x)}})
		}},
	} {
		b := graph.NewBuilder("bad")
		tc.build(b)
		_, err := b.Build()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
}

func TestFingerprint(t *testing.T) {
	a := build(t, "mlp", workloads.Shape{Layers: 3, Width: 32})
	if a.Fingerprint() != build(t, "mlp", workloads.Shape{Layers: 3, Width: 32, Seed: 9}).Fingerprint() {
		t.Error("the seed changed the fingerprint; weights' values are not part of it")
	}
	seen := map[graph.Fingerprint]string{a.Fingerprint(): "a"}
	for name, s := range map[string]workloads.Shape{
		"layers": {Layers: 4, Width: 32}, "width": {Layers: 3, Width: 64}, "batch": {Layers: 3, Width: 32, Batch: 2},
	} {
		f := build(t, "mlp", s).Fingerprint()
		if prev, dup := seen[f]; dup {
			t.Errorf("%s: same fingerprint as %s", name, prev)
		}
		seen[f] = name
	}
}

func TestShapeErrors(t *testing.T) {
	for _, tc := range []struct {
		wl string
		s  workloads.Shape
	}{
		{"gpt2-decode", workloads.Shape{Width: 100, Heads: 3}},
		{"gpt2-decode", workloads.Shape{KVLen: 100000}},
		{"gpt2-decode", workloads.Shape{Width: 6}},
		{"mlp", workloads.Shape{Width: 30}},
		{"nope", workloads.Shape{}},
	} {
		if _, err := workloads.Build(tc.wl, tc.s); err == nil {
			t.Errorf("%s %+v: built", tc.wl, tc.s)
		}
	}
}

package graphexec_test

import (
	"encoding/binary"
	"maps"
	"math"
	"strings"
	"testing"

	"github.com/arenaplan/arenaplan/cuda"
	"github.com/arenaplan/arenaplan/graph"
	"github.com/arenaplan/arenaplan/graphexec"
	"github.com/arenaplan/arenaplan/kernels"
	"github.com/arenaplan/arenaplan/workloads"
)

func spillSim(t testing.TB) *cuda.Sim {
	t.Helper()
	refs := kernels.Reference()
	maps.Copy(refs, kernels.SpillReference())
	s, err := cuda.OpenSim(cuda.SimConfig{Kernels: refs, TotalMemory: 4 << 30})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// spillDemoWant computes spill-demo's output for one step in Go: the sum
// over iterations of x*(i+1)+i, rounded as the kernels round.
func spillDemoWant(x []float32, iters int) []float32 {
	acc := make([]float32, len(x))
	for i := 0; i < iters; i++ {
		a, b := float32(i+1), float32(i)
		for j, v := range x {
			p := float32(v * a)
			blk := float32(p + b)
			if i == 0 {
				acc[j] = blk
			} else {
				acc[j] = float32(acc[j] + blk)
			}
		}
	}
	return acc
}

func f32s(b []byte) []float32 {
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

// TestSpillDemo runs spill-demo eagerly and replayed, with and without
// capture-time reuse: outputs equal bit for bit and equal the Go model;
// with reuse the capture holds join-every blocks (one more while the
// next is allocated before the join proves the earlier ones free),
// without it every iteration's block.
func TestSpillDemo(t *testing.T) {
	const width = 4096 // 16 KiB blocks
	block := uint64(width * 4)
	for _, tc := range []struct {
		name        string
		iters, join int
		reuse       bool
		wantHeld    uint64 // capture's peak bytes held
		wantReuses  uint64
	}{
		{"join-every-1", 40, 1, true, 1 * block, 39},
		{"join-every-4", 40, 4, true, 4 * block, 36},
		{"join-every-1-no-reuse", 40, 1, false, 40 * block, 0},
		{"join-every-4-no-reuse", 40, 4, false, 40 * block, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := build(t, "spill-demo", workloads.Shape{Iters: tc.iters, JoinEvery: tc.join, Width: width})
			e, err := graphexec.New(spillSim(t), g, nil, graphexec.Options{NoCaptureReuse: !tc.reuse})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			if err := e.Init(); err != nil {
				t.Fatal(err)
			}
			// The plan holds x and acc; the blocks are spillover.
			if n := len(e.Trace().Buffers); n != 2 {
				t.Errorf("dry run has %d buffers, want 2 (x, acc)", n)
			}
			const steps = 3
			eager, replay := eagerThenReplay(t, e, steps)
			if !equal(eager, replay) {
				t.Fatal("replayed outputs differ from eager outputs")
			}
			x, err := e.Read(g.Tensors[0]) // the last step's input
			if err != nil {
				t.Fatal(err)
			}
			want := spillDemoWant(f32s(x), tc.iters)
			got := f32s(replay[0])
			for j := range want {
				if got[j] != want[j] {
					t.Fatalf("acc[%d] = %v, Go model %v", j, got[j], want[j])
				}
			}
			r := e.SpillReport()
			if !r.Used || r.CaptureReuse != tc.reuse {
				t.Errorf("report %+v", r)
			}
			if r.CapturePeakHeld != tc.wantHeld {
				t.Errorf("capture held at most %d bytes, want %d (%d blocks)", r.CapturePeakHeld, tc.wantHeld, tc.wantHeld/block)
			}
			if r.CaptureReuses != tc.wantReuses {
				t.Errorf("%d capture-time reuses, want %d", r.CaptureReuses, tc.wantReuses)
			}
			if r.GraphReserved == 0 || r.GraphReserved != r.CaptureReserved {
				t.Errorf("graph keeps %d bytes, capture mapped %d", r.GraphReserved, r.CaptureReserved)
			}
			if r.Stats.InUse != 0 || r.Stats.Waiting != 0 {
				t.Errorf("after the run %d bytes in use, %d waiting", r.Stats.InUse, r.Stats.Waiting)
			}
			t.Logf("held %d B, capture held %d B, reserved %d B, capture reserved %d B, reuses %d",
				r.PeakHeld, r.CapturePeakHeld, r.PeakReserved, r.CaptureReserved, r.CaptureReuses)
		})
	}
}

// TestSpillDemoRecapture: a second capture adopts a new pool and releases
// the first graph's; closing the executor gives everything back.
func TestSpillDemoRecapture(t *testing.T) {
	dev := spillSim(t)
	g := build(t, "spill-demo", workloads.Shape{Iters: 8, Width: 1 << 19}) // 2 MiB blocks
	e, err := graphexec.New(dev, g, nil, graphexec.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Init(); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := e.Capture(); err != nil {
			t.Fatal(err)
		}
		if err := e.Replay(0); err != nil {
			t.Fatal(err)
		}
	}
	r := e.SpillReport()
	if r.GraphReserved != 2<<20 || r.Reserved != 2<<20 {
		t.Errorf("after three captures: graph %d bytes, mapped %d, want one 2 MiB block each", r.GraphReserved, r.Reserved)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	free, total, err := dev.MemGetInfo()
	if err != nil || free != total {
		t.Errorf("after Close %d of %d bytes free (%v)", free, total, err)
	}
}

// TestSpillWorkspace: an op's workspace from the spillover allocator is
// allocated for its launch alone, left out of the plan, and the result is
// the same as with a planned workspace.
func TestSpillWorkspace(t *testing.T) {
	mk := func(spill bool) *graph.Graph {
		b := graph.NewBuilder("ws")
		b.Module(kernels.SpillPTX)
		x := b.Tensor("x", graph.F32, graph.Input, 1024).SetInit(func(d []byte) {
			for i := 0; i < len(d); i += 4 {
				binary.LittleEndian.PutUint32(d[i:], math.Float32bits(float32(i)))
			}
		})
		y := b.Tensor("y", graph.F32, graph.Output, 1024)
		for i := 0; i < 3; i++ {
			b.Launch(graph.Launch{Name: "fill-ws", Kernel: kernels.SpillFill, Grid: cuda.D1(4), Block: cuda.D1(256),
				Workspace: 4096, SpillWorkspace: spill,
				Args: []graph.Arg{graph.Workspace(), graph.In(x), graph.Scalar(cuda.U32(1024)),
					graph.Scalar(cuda.F32(2)), graph.Scalar(cuda.F32(1))}})
		}
		b.Launch(graph.Launch{Kernel: kernels.SpillFill, Grid: cuda.D1(4), Block: cuda.D1(256),
			Args: []graph.Arg{graph.Out(y), graph.In(x), graph.Scalar(cuda.U32(1024)),
				graph.Scalar(cuda.F32(3)), graph.Scalar(cuda.F32(0))}})
		g, err := b.Build()
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	planned, spilled := mk(false), mk(true)
	if planned.Fingerprint() == spilled.Fingerprint() {
		t.Error("spilling the workspace leaves the fingerprint unchanged")
	}
	var outs [][][]byte
	for _, g := range []*graph.Graph{planned, spilled} {
		e, err := graphexec.New(spillSim(t), g, nil, graphexec.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		if err := e.Init(); err != nil {
			t.Fatal(err)
		}
		eager, replay := eagerThenReplay(t, e, 2)
		if !equal(eager, replay) {
			t.Fatal("replay differs from eager")
		}
		outs = append(outs, replay)
		r := e.SpillReport()
		bufs := len(e.Trace().Buffers)
		if g == spilled {
			if bufs != 2 || r.PeakHeld != 4096 || r.CapturePeakHeld != 4096 {
				t.Errorf("spilled workspace: %d planned buffers, peak held %d, in capture %d; want 2, 4096, 4096", bufs, r.PeakHeld, r.CapturePeakHeld)
			}
		} else if bufs != 5 || r.Used {
			t.Errorf("planned workspace: %d buffers (want 5), spillover used %v", bufs, r.Used)
		}
	}
	if !equal(outs[0], outs[1]) {
		t.Error("spilled and planned workspaces give different outputs")
	}
}

// TestSpillBuilderErrors: bad streams, waits and unplanned roles.
func TestSpillBuilderErrors(t *testing.T) {
	for _, tc := range []struct {
		name, want string
		edit       func(l *graph.Launch, out *graph.Tensor)
	}{
		{"stream", "stream 8", func(l *graph.Launch, _ *graph.Tensor) { l.Stream = graph.MaxStreams }},
		{"wait-self", "waits for stream 1", func(l *graph.Launch, _ *graph.Tensor) { l.Stream, l.Wait = 1, []int{1} }},
		{"wait-range", "waits for stream -1", func(l *graph.Launch, _ *graph.Tensor) { l.Wait = []int{-1} }},
		{"spill-no-ws", "SpillWorkspace without a workspace", func(l *graph.Launch, _ *graph.Tensor) { l.SpillWorkspace = true }},
		{"unplanned-output", "output y is unplanned", func(_ *graph.Launch, out *graph.Tensor) { out.SetUnplanned() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := graph.NewBuilder("bad")
			b.Module(kernels.SpillPTX)
			x := b.Tensor("x", graph.F32, graph.Input, 16)
			y := b.Tensor("y", graph.F32, graph.Output, 16)
			l := graph.Launch{Kernel: kernels.SpillFill, Grid: cuda.D1(1), Block: cuda.D1(16),
				Args: []graph.Arg{graph.Out(y), graph.In(x), graph.Scalar(cuda.U32(16)),
					graph.Scalar(cuda.F32(1)), graph.Scalar(cuda.F32(0))}}
			tc.edit(&l, y)
			b.Launch(l)
			_, err := b.Build()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// fpGraph is a small graph without spillover or side streams, on a PTX
// text of its own so that kernel work elsewhere leaves it alone.
func fpGraph(t *testing.T) *graph.Graph {
	t.Helper()
	b := graph.NewBuilder("fp")
	b.Dim("width", 16)
	b.Module([]byte(".visible .entry k(\n.param .u64 a,\n.param .u64 b,\n.param .u32 n\n)\n{ ret; }\n"))
	x := b.Tensor("x", graph.F32, graph.Input, 16)
	h := b.Tensor("h", graph.F32, graph.Intermediate, 16)
	y := b.Tensor("y", graph.F32, graph.Output, 16)
	b.Launch(graph.Launch{Kernel: "k", Grid: cuda.D1(1), Block: cuda.D1(16), Workspace: 64,
		Args: []graph.Arg{graph.Out(h), graph.In(x), graph.Workspace()}})
	b.Launch(graph.Launch{Kernel: "k", Grid: cuda.D1(1), Block: cuda.D1(16),
		Args: []graph.Arg{graph.Out(y), graph.In(h), graph.Scalar(cuda.U32(16))}})
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// Graphs without spillover or streams keep the fingerprints they had
// before streams existed (so do their plan files); using them changes it.
func TestSpillFingerprintUnchanged(t *testing.T) {
	const before = "913a6dad9988f83e7a07a4e11ced92c7a0b7f44b66451f80af776de10a733d87"
	if got := fpGraph(t).Fingerprint().String(); got != before {
		t.Errorf("fingerprint %s, was %s before spillover and streams", got, before)
	}
}

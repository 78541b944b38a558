package graphexec_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/arenaplan/arenaplan/cuda"
	"github.com/arenaplan/arenaplan/graph"
	"github.com/arenaplan/arenaplan/graphexec"
	"github.com/arenaplan/arenaplan/kernels"
	"github.com/arenaplan/arenaplan/planner"
	"github.com/arenaplan/arenaplan/workloads"
)

func sim(t testing.TB) *cuda.Sim {
	t.Helper()
	s, err := cuda.OpenSim(cuda.SimConfig{Kernels: kernels.Reference(), TotalMemory: 4 << 30})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// onDevices runs f on the simulated device and, where a CUDA driver is
// present, on GPU 0 (opened and closed on the subtest's goroutine, as the
// driver requires); without a driver that half is skipped with a note.
func onDevices(t *testing.T, f func(t *testing.T, dev cuda.Device)) {
	t.Run("sim", func(t *testing.T) { f(t, sim(t)) })
	t.Run("cuda", func(t *testing.T) {
		d, err := cuda.Open(0)
		if errors.Is(err, cuda.ErrNoDriver) {
			t.Skipf("no CUDA driver: %v", err)
		}
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		f(t, d)
	})
}

func build(t testing.TB, name string, s workloads.Shape) *graph.Graph {
	t.Helper()
	g, err := workloads.Build(name, s)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// results reads every output and state tensor.
func results(t testing.TB, e *graphexec.Executor) [][]byte {
	t.Helper()
	var out [][]byte
	for _, x := range e.Graph().Tensors {
		if x.Role == graph.Output || x.Role == graph.State {
			b, err := e.Read(x)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, b)
		}
	}
	return out
}

// eagerThenReplay runs steps eagerly, resets the state, captures and
// replays the same steps, and returns both results.
func eagerThenReplay(t testing.TB, e *graphexec.Executor, steps int) (eager, replay [][]byte) {
	t.Helper()
	if err := e.Stage(0, steps); err != nil {
		t.Fatal(err)
	}
	for s := 0; s < steps; s++ {
		if err := e.Eager(s); err != nil {
			t.Fatal(err)
		}
	}
	eager = results(t, e)
	if err := e.ResetState(); err != nil {
		t.Fatal(err)
	}
	if ok, _ := e.Captured(); !ok {
		if _, err := e.Capture(); err != nil {
			t.Fatal(err)
		}
	}
	for s := 0; s < steps; s++ {
		if err := e.Replay(s); err != nil {
			t.Fatal(err)
		}
	}
	return eager, results(t, e)
}

func equal(a, b [][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !bytes.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}

var smallGPT2 = workloads.Shape{Layers: 2, Width: 128, Heads: 4, KVLen: 64, Vocab: 500, Batch: 1}

func TestWorkloadsEndToEndSim(t *testing.T) {
	for _, tc := range []struct {
		name  string
		wl    string
		shape workloads.Shape
	}{
		{"gpt2-b1", "gpt2-decode", smallGPT2},
		{"gpt2-b3", "gpt2-decode", workloads.Shape{Layers: 2, Width: 64, Heads: 2, KVLen: 40, Vocab: 300, Batch: 3}},
		{"gpt2-b9-wraps", "gpt2-decode", workloads.Shape{Layers: 1, Width: 32, Heads: 1, KVLen: 8, Vocab: 50, Batch: 9}},
		{"mlp", "mlp", workloads.Shape{Layers: 8, Width: 64, Batch: 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := build(t, tc.wl, tc.shape)
			e, err := graphexec.New(sim(t), g, nil, graphexec.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			if err := e.Init(); err != nil {
				t.Fatal(err)
			}
			eager, replay := eagerThenReplay(t, e, 6)
			if !equal(eager, replay) {
				t.Fatal("replayed outputs differ from eager outputs")
			}
			if p := e.Plan(); p.Arena != p.LowerBound {
				t.Errorf("arena %d, lower bound %d", p.Arena, p.LowerBound)
			}
			if ok, n := e.Captured(); !ok || n != len(g.Ops) {
				t.Errorf("captured %v with %d nodes, want %d", ok, n, len(g.Ops))
			}
		})
	}
}

func TestDefaultGPT2Sim(t *testing.T) {
	if testing.Short() {
		t.Skip("GPT-2 small on the simulated device takes seconds")
	}
	g := build(t, "gpt2-decode", workloads.Shape{})
	s, err := cuda.OpenSim(cuda.SimConfig{Kernels: kernels.Reference()})
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
	eager, replay := eagerThenReplay(t, e, 1)
	if !equal(eager, replay) {
		t.Fatal("replayed outputs differ from eager outputs")
	}
	if p := e.Plan(); p.Arena != p.LowerBound {
		t.Errorf("arena %d, lower bound %d", p.Arena, p.LowerBound)
	}
}

func f32(b []byte) []float64 {
	out := make([]float64, len(b)/4)
	for i := range out {
		out[i] = float64(math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])))
	}
	return out
}

// TestGPT2MatchesNaiveModel compares the workload, run by the kernels' Go
// references, with a plain float64 GPT-2 decode loop written here from the
// weights alone: it catches indexing and fusion mistakes that a reference
// sharing the kernels' structure could repeat.
func TestGPT2MatchesNaiveModel(t *testing.T) {
	sh := workloads.Shape{Layers: 2, Width: 32, Heads: 4, KVLen: 16, Vocab: 40, Batch: 2, Seed: 7}
	g := build(t, "gpt2-decode", sh)
	e, err := graphexec.New(sim(t), g, nil, graphexec.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if err := e.Init(); err != nil {
		t.Fatal(err)
	}
	byName := map[string][]float64{}
	for _, x := range g.Tensors {
		if x.Role == graph.Weight || x.Role == graph.State {
			b, err := e.Read(x)
			if err != nil {
				t.Fatal(err)
			}
			byName[x.Name] = f32(b)
		}
	}
	W, H, T, B, V, L := sh.Width, sh.Heads, sh.KVLen, sh.Batch, sh.Vocab, sh.Layers
	hd := W / H
	ln := func(x []float64, gn, bn string) []float64 {
		var m, v float64
		for _, a := range x {
			m += a
		}
		m /= float64(len(x))
		for _, a := range x {
			v += (a - m) * (a - m)
		}
		r := 1 / math.Sqrt(v/float64(len(x))+1e-5)
		out := make([]float64, len(x))
		for i, a := range x {
			out[i] = (a-m)*r*byName[gn][i] + byName[bn][i]
		}
		return out
	}
	lin := func(x []float64, wn, bn string, out int) []float64 {
		w := byName[wn]
		y := make([]float64, out)
		for o := range y {
			for i, a := range x {
				y[o] += w[o*len(x)+i] * a
			}
			if bn != "" {
				y[o] += byName[bn][o]
			}
		}
		return y
	}
	const steps = 5
	var want []float64
	for s := 0; s < steps; s++ {
		if err := e.Eager(s); err != nil {
			t.Fatal(err)
		}
		pos := workloads.DecodePosition(T, s)
		want = want[:0]
		for b := 0; b < B; b++ {
			tok := int(workloads.DecodeToken(sh.Seed, V, B, s, b))
			x := make([]float64, W)
			for i := range x {
				x[i] = byName["wte"][tok*W+i] + byName["wpe"][pos*W+i]
			}
			for l := 0; l < L; l++ {
				p := "h" + string(rune('0'+l)) + "."
				qkv := lin(ln(x, p+"ln1.g", p+"ln1.b"), p+"attn.w_qkv", p+"attn.b_qkv", 3*W)
				kc, vc := byName[p+"k_cache"], byName[p+"v_cache"]
				copy(kc[(b*T+pos)*W:], qkv[W:2*W])
				copy(vc[(b*T+pos)*W:], qkv[2*W:])
				att := make([]float64, W)
				for h := 0; h < H; h++ {
					sc := make([]float64, pos+1)
					mx := math.Inf(-1)
					for tt := range sc {
						for d := 0; d < hd; d++ {
							sc[tt] += qkv[h*hd+d] * kc[(b*T+tt)*W+h*hd+d]
						}
						sc[tt] /= math.Sqrt(float64(hd))
						mx = max(mx, sc[tt])
					}
					var sum float64
					for tt := range sc {
						sc[tt] = math.Exp(sc[tt] - mx)
						sum += sc[tt]
					}
					for tt := range sc {
						for d := 0; d < hd; d++ {
							att[h*hd+d] += sc[tt] / sum * vc[(b*T+tt)*W+h*hd+d]
						}
					}
				}
				pr := lin(att, p+"attn.w_proj", p+"attn.b_proj", W)
				for i := range x {
					x[i] += pr[i]
				}
				hid := lin(ln(x, p+"ln2.g", p+"ln2.b"), p+"mlp.w_fc", p+"mlp.b_fc", 4*W)
				for i := range hid {
					hid[i] = kernels.GELU(hid[i])
				}
				pr = lin(hid, p+"mlp.w_proj", p+"mlp.b_proj", W)
				for i := range x {
					x[i] += pr[i]
				}
			}
			want = append(want, lin(ln(x, "ln_f.g", "ln_f.b"), "wte", "", V)...)
		}
	}
	got, err := e.Read(g.TensorsWith(graph.Output)[0])
	if err != nil {
		t.Fatal(err)
	}
	var maxDiff float64
	for i, v := range f32(got) {
		maxDiff = max(maxDiff, math.Abs(v-want[i]))
	}
	if maxDiff > 1e-4 {
		t.Fatalf("logits differ from the naive model by %g", maxDiff)
	}
}

func TestMLPMatchesNaiveModel(t *testing.T) {
	sh := workloads.Shape{Layers: 5, Width: 16, Batch: 3}
	g := build(t, "mlp", sh)
	e, err := graphexec.New(sim(t), g, nil, graphexec.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if err := e.Init(); err != nil {
		t.Fatal(err)
	}
	read := func(name string) []float64 {
		for _, x := range g.Tensors {
			if x.Name == name {
				b, err := e.Read(x)
				if err != nil {
					t.Fatal(err)
				}
				return f32(b)
			}
		}
		t.Fatalf("no tensor %s", name)
		return nil
	}
	x := read("x")
	for l := 0; l < sh.Layers; l++ {
		w, bias := read("l"+string(rune('0'+l))+".w"), read("l"+string(rune('0'+l))+".b")
		y := make([]float64, len(x))
		for b := 0; b < sh.Batch; b++ {
			for o := 0; o < sh.Width; o++ {
				acc := bias[o]
				for i := 0; i < sh.Width; i++ {
					acc += w[o*sh.Width+i] * x[b*sh.Width+i]
				}
				y[b*sh.Width+o] = kernels.GELU(acc)
			}
		}
		x = y
	}
	if err := e.Eager(0); err != nil {
		t.Fatal(err)
	}
	got := read("y")
	for i := range got {
		if math.Abs(got[i]-x[i]) > 1e-5 {
			t.Fatalf("element %d: %g, want %g", i, got[i], x[i])
		}
	}
}

func TestVerifyPlanRefusesAnotherWorkload(t *testing.T) {
	g := build(t, "mlp", workloads.Shape{Layers: 4, Width: 32})
	other := build(t, "mlp", workloads.Shape{Layers: 4, Width: 64})
	d, err := other.DryRun()
	if err != nil {
		t.Fatal(err)
	}
	p, err := graph.Plan(context.Background(), d.Trace, graph.PlanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	err = graph.VerifyPlan(g, other.Label(), other.Fingerprint(), d.Trace, p)
	var fe *graph.FingerprintError
	if !errors.As(err, &fe) {
		t.Fatalf("got %v, want a FingerprintError", err)
	}
	for _, s := range []string{g.Fingerprint().Short(), other.Fingerprint().Short(), "width=64", "width=32"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not name %s", err, s)
		}
	}
	// The right workload passes; a trace that is not its dry run does not.
	if err := graph.VerifyPlan(other, other.Label(), other.Fingerprint(), d.Trace, p); err != nil {
		t.Fatal(err)
	}
	gd, _ := g.DryRun()
	if err := graph.VerifyPlan(other, other.Label(), other.Fingerprint(), gd.Trace, p); err == nil {
		t.Fatal("a foreign trace passed")
	}
}

func TestAlignmentRefused(t *testing.T) {
	g := build(t, "mlp", workloads.Shape{Layers: 3, Width: 32})
	d, err := g.DryRun()
	if err != nil {
		t.Fatal(err)
	}
	// Buffers ask for the kernels' alignment themselves, so plan a copy
	// without it to get a plan that honours only 8 bytes.
	tr := *d.Trace
	tr.Buffers = append(tr.Buffers[:0:0], d.Trace.Buffers...)
	for i := range tr.Buffers {
		tr.Buffers[i].Align = 0
	}
	p, err := planner.Run(context.Background(), "bestfit", &tr, planner.Options{Align: 8})
	if err != nil {
		t.Fatal(err)
	}
	var ae *graph.AlignError
	if err := graph.VerifyPlan(g, g.Label(), g.Fingerprint(), d.Trace, p); !errors.As(err, &ae) || ae.Need != 16 || ae.Plan != 8 {
		t.Fatalf("VerifyPlan: got %v, want an AlignError (8 < 16)", err)
	}
	if _, err := graphexec.New(sim(t), g, p, graphexec.Options{}); !errors.As(err, &ae) {
		t.Fatalf("New: got %v, want an AlignError", err)
	}
}

func TestReplayBeforeCapture(t *testing.T) {
	g := build(t, "mlp", workloads.Shape{Layers: 2, Width: 16})
	e, err := graphexec.New(sim(t), g, nil, graphexec.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if err := e.Replay(0); !errors.Is(err, graphexec.ErrNotCaptured) {
		t.Fatalf("got %v, want ErrNotCaptured", err)
	}
}

func TestRebindDecisions(t *testing.T) {
	dev := sim(t)
	start := build(t, "gpt2-decode", workloads.Shape{Layers: 2, Width: 64, Heads: 2, KVLen: 32, Vocab: 100, Batch: 2})
	e, err := graphexec.New(dev, start, nil, graphexec.Options{})
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
	for _, tc := range []struct {
		name  string
		shape workloads.Shape
		want  graphexec.Decision
	}{
		{"same workload", workloads.Shape{Layers: 2, Width: 64, Heads: 2, KVLen: 32, Vocab: 100, Batch: 2}, graphexec.Reused},
		{"smaller vocabulary fits the plan", workloads.Shape{Layers: 2, Width: 64, Heads: 2, KVLen: 32, Vocab: 60, Batch: 2}, graphexec.Updated},
		// At batch 1 the plain linears are linear_few (another kernel).
		{"batch 1 changes the kernels", workloads.Shape{Layers: 2, Width: 64, Heads: 2, KVLen: 32, Vocab: 60, Batch: 1}, graphexec.Recaptured},
		{"a smaller vocabulary at batch 1 fits", workloads.Shape{Layers: 2, Width: 64, Heads: 2, KVLen: 32, Vocab: 50, Batch: 1}, graphexec.Updated},
		{"larger vocabulary does not fit", workloads.Shape{Layers: 2, Width: 64, Heads: 2, KVLen: 32, Vocab: 200, Batch: 1}, graphexec.Recaptured},
		{"more layers change the topology", workloads.Shape{Layers: 3, Width: 64, Heads: 2, KVLen: 32, Vocab: 200, Batch: 1}, graphexec.Recaptured},
		// From 3 batch rows on the linears stage their weights (another
		// kernel): the graph is captured again, not updated.
		{"a batch that stages its linears changes the kernels", workloads.Shape{Layers: 3, Width: 64, Heads: 2, KVLen: 32, Vocab: 200, Batch: 4}, graphexec.Recaptured},
		{"a smaller batch that stages them too fits the plan", workloads.Shape{Layers: 3, Width: 64, Heads: 2, KVLen: 32, Vocab: 200, Batch: 3}, graphexec.Updated},
	} {
		g := build(t, "gpt2-decode", tc.shape)
		r, err := e.Rebind(g)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if r.Decision != tc.want {
			t.Fatalf("%s: %v (%s), want %v", tc.name, r.Decision, r.Reason, tc.want)
		}
		eager, replay := eagerThenReplay(t, e, 3)
		if !equal(eager, replay) {
			t.Fatalf("%s: after %v, replay differs from eager", tc.name, r.Decision)
		}
		// The replayed graph computes what a fresh executor computes.
		f, err := graphexec.New(dev, g, nil, graphexec.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Init(); err != nil {
			t.Fatal(err)
		}
		fresh, _ := eagerThenReplay(t, f, 3)
		f.Close()
		if !equal(fresh, replay) {
			t.Fatalf("%s: after %v, replay differs from a fresh executor", tc.name, r.Decision)
		}
		// A changed workload replays only after Rebind.
		if tc.want != graphexec.Reused {
			if r.Reason == "" {
				t.Errorf("%s: no reason given", tc.name)
			}
		}
	}
}

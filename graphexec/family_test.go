package graphexec_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/arenaplan/arenaplan/cuda"
	"github.com/arenaplan/arenaplan/graph"
	"github.com/arenaplan/arenaplan/graphexec"
	"github.com/arenaplan/arenaplan/kernels"
	"github.com/arenaplan/arenaplan/planner"
	"github.com/arenaplan/arenaplan/workloads"
)

var familyShape = workloads.Shape{Layers: 2, Width: 64, Heads: 4, KVLen: 32, Vocab: 97}

// familyGraphs builds gpt2-decode at each batch size, shared tensors sized
// for the largest.
func familyGraphs(t testing.TB, base workloads.Shape, batches ...int) []*graph.Graph {
	t.Helper()
	mb := 0
	for _, b := range batches {
		mb = max(mb, b)
	}
	var gs []*graph.Graph
	for _, b := range batches {
		s := base
		s.Batch, s.MaxBatch = b, mb
		gs = append(gs, build(t, "gpt2-decode", s))
	}
	return gs
}

func newFamily(t testing.TB, graphs []*graph.Graph) (*graphexec.Group, *planner.GroupPlan) {
	t.Helper()
	fp, members, err := graph.PlanFamily(context.Background(), "auto", graphs, graph.PlanOptions{Budget: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	f, err := graphexec.NewFamily(sim(t), graphs, members, fp, graphexec.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.Close(); err != nil {
			t.Error(err)
		}
	})
	if err := f.Init(); err != nil {
		t.Fatal(err)
	}
	return f, fp
}

func output(t testing.TB, e *graphexec.Executor) []byte {
	t.Helper()
	out := e.Graph().TensorsWith(graph.Output)
	b, err := e.Read(out[0])
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestFamilyMixedSequence plans gpt2-decode at batch 1, 2, 4 and 8 into
// one arena, runs a mixed sequence of members eagerly, then captures every
// member and replays the same sequence: each step's logits and the final
// KV cache must equal the eager ones bit for bit.
func TestFamilyMixedSequence(t *testing.T) {
	gs := familyGraphs(t, familyShape, 1, 2, 4, 8)
	f, fp := newFamily(t, gs)

	if lb := fp.LowerBound; float64(fp.Arena) > 1.05*float64(lb) {
		t.Errorf("family arena %d is above 1.05x the largest lower bound %d", fp.Arena, lb)
	}
	if fp.SeparateArenas <= fp.Arena {
		t.Errorf("separate arenas %d are not above the family arena %d", fp.SeparateArenas, fp.Arena)
	}
	// Shared tensors sit at one address in every member.
	for _, name := range []string{"wte", "h0.k_cache", "h1.v_cache"} {
		var at []uint64
		for i := range gs {
			e := f.Member(i)
			at = append(at, uint64(e.Ptr(tensor(t, e.Graph(), name))))
		}
		for _, a := range at[1:] {
			if a != at[0] {
				t.Errorf("%s is at %x in the members", name, at)
				break
			}
		}
	}

	seq := []int{3, 0, 1, 3, 2, 0, 0, 2, 1, 3, 1, 2}
	eager := make([][]byte, len(seq))
	for s, m := range seq {
		if err := f.Eager(m, s); err != nil {
			t.Fatal(err)
		}
		eager[s] = output(t, f.Member(m))
	}
	kv := results(t, f.Member(3))
	if err := f.ResetState(); err != nil {
		t.Fatal(err)
	}
	if ok, _ := f.Captured(); ok {
		t.Fatal("Captured before Capture: true")
	}
	if _, err := f.Capture(); err != nil {
		t.Fatal(err)
	}
	want := 0
	for i := range f.Len() {
		_, n := f.Member(i).Captured()
		want += n
	}
	if ok, n := f.Captured(); !ok || n != want || n == 0 {
		t.Fatalf("Captured() = %v, %d nodes; want true, the members' %d", ok, n, want)
	}
	for s, m := range seq {
		if err := f.Replay(m, s); err != nil {
			t.Fatal(err)
		}
		if got := output(t, f.Member(m)); !bytes.Equal(got, eager[s]) {
			t.Fatalf("step %d (member %d): replayed logits differ from eager", s, m)
		}
	}
	for i, b := range results(t, f.Member(3)) {
		if !bytes.Equal(b, kv[i]) {
			t.Fatalf("state/output %d after the replayed sequence differs from eager", i)
		}
	}
}

// TestFamilyPDL: on compute capability 9.0 the members of a family load
// the compute_90 kernels and launch with programmatic serialization, like
// a lone executor; a mixed sequence, eager and replayed, gives the bytes
// of the same family on an 8.0 device, which launches plainly.
func TestFamilyPDL(t *testing.T) {
	if len(kernels.PTX90) == 0 {
		t.Skip("kernels_90.ptx is empty")
	}
	gs := familyGraphs(t, familyShape, 1, 2, 4)
	fp, members, err := graph.PlanFamily(context.Background(), "auto", gs, graph.PlanOptions{Budget: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	seq := []int{2, 0, 1, 2, 0}
	run := func(cc [2]int) (outs [][]byte, pdl int) {
		s, err := cuda.OpenSim(cuda.SimConfig{Kernels: kernels.Reference(), ComputeCapability: cc})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		dev := &countingDev{Device: s}
		f, err := graphexec.NewFamily(dev, gs, members, fp, graphexec.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		for i := range gs {
			if m := f.Member(i).LaunchMode(); m.PDL != (cc[0] >= 9) {
				t.Errorf("cc %d.%d: member %d launch mode %+v", cc[0], cc[1], i, m)
			}
		}
		if err := f.Init(); err != nil {
			t.Fatal(err)
		}
		for st, m := range seq {
			if err := f.Eager(m, st); err != nil {
				t.Fatal(err)
			}
			outs = append(outs, output(t, f.Member(m)))
		}
		if err := f.ResetState(); err != nil {
			t.Fatal(err)
		}
		if _, err := f.Capture(); err != nil {
			t.Fatal(err)
		}
		for st, m := range seq {
			if err := f.Replay(m, st); err != nil {
				t.Fatal(err)
			}
			if got := output(t, f.Member(m)); !bytes.Equal(got, outs[st]) {
				t.Fatalf("cc %d.%d step %d: replay differs from eager", cc[0], cc[1], st)
			}
		}
		return outs, dev.pdl
	}
	plain, n80 := run([2]int{8, 0})
	pdl, n90 := run([2]int{9, 0})
	if n80 != 0 || n90 == 0 {
		t.Errorf("PDL launches: %d on 8.0, %d on 9.0", n80, n90)
	}
	for st := range seq {
		if !bytes.Equal(plain[st], pdl[st]) {
			t.Fatalf("step %d: 9.0 (PDL) and 8.0 (plain) outputs differ", st)
		}
	}
}

// TestFamilyMemberEqualsAlone: from the initial state, each member's first
// step gives the logits of the same workload run alone (the shared KV
// cache's first rows are a batch's own cache).
func TestFamilyMemberEqualsAlone(t *testing.T) {
	gs := familyGraphs(t, familyShape, 1, 3, 5)
	f, _ := newFamily(t, gs)
	for i, b := range []int{1, 3, 5} {
		if err := f.ResetState(); err != nil {
			t.Fatal(err)
		}
		if err := f.Eager(i, 0); err != nil {
			t.Fatal(err)
		}
		got := output(t, f.Member(i))
		s := familyShape
		s.Batch = b
		alone, err := graphexec.New(sim(t), build(t, "gpt2-decode", s), nil, graphexec.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if err := alone.Init(); err != nil {
			t.Fatal(err)
		}
		if err := alone.Eager(0); err != nil {
			t.Fatal(err)
		}
		if want := output(t, alone); !bytes.Equal(got, want) {
			t.Errorf("batch %d: family member's logits differ from the workload run alone", b)
		}
		alone.Close()
	}
}

func TestFamilyMLP(t *testing.T) {
	var mgs []*graph.Graph
	for _, b := range []int{1, 2, 4} {
		mgs = append(mgs, build(t, "mlp", workloads.Shape{Layers: 4, Width: 32, Batch: b, MaxBatch: 4}))
	}
	f, _ := newFamily(t, mgs)
	seq := []int{2, 0, 1, 2, 0}
	var eager [][]byte
	for s, m := range seq {
		if err := f.Eager(m, s); err != nil {
			t.Fatal(err)
		}
		eager = append(eager, output(t, f.Member(m)))
	}
	if _, err := f.Capture(); err != nil {
		t.Fatal(err)
	}
	for s, m := range seq {
		if err := f.Replay(m, s); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(output(t, f.Member(m)), eager[s]) {
			t.Fatalf("step %d: replay differs from eager", s)
		}
	}
}

func TestFamilyErrors(t *testing.T) {
	gs := familyGraphs(t, familyShape, 1, 2)
	fp, members, err := graph.PlanFamily(context.Background(), "bestfit", gs, graph.PlanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Graphs swapped: each trace belongs to the other member.
	_, err = graphexec.NewFamily(sim(t), []*graph.Graph{gs[1], gs[0]}, members, fp, graphexec.Options{})
	if err == nil || !strings.Contains(err.Error(), "is not the dry run") {
		t.Errorf("swapped graphs: %v", err)
	}
	// Without a common max batch the KV caches differ in size.
	s1, s2 := familyShape, familyShape
	s1.Batch, s2.Batch = 1, 2
	_, _, err = graph.PlanFamily(context.Background(), "bestfit",
		[]*graph.Graph{build(t, "gpt2-decode", s1), build(t, "gpt2-decode", s2)}, graph.PlanOptions{})
	if err == nil || !strings.Contains(err.Error(), "invalid family: shared key") {
		t.Errorf("KV caches of different sizes: %v", err)
	}
	// A state tensor that is not shared cannot live in a family.
	if _, _, err := graph.FamilyMembers([]*graph.Graph{tinyGraph(t, false), tinyGraph(t, false)}); err == nil ||
		!strings.Contains(err.Error(), "share it") {
		t.Errorf("private state: %v", err)
	}
	// Spillover and side streams are not for families.
	spill := build(t, "spill-demo", workloads.Shape{})
	if _, _, err := graph.FamilyMembers([]*graph.Graph{spill}); err == nil || !strings.Contains(err.Error(), "spillover") {
		t.Errorf("spill-demo in a family: %v", err)
	}
	if _, _, _, err := graph.ChainStages([]*graph.Graph{spill}, nil); err == nil || !strings.Contains(err.Error(), "spillover") {
		t.Errorf("spill-demo in a chain: %v", err)
	}
	// Shared intermediates are refused.
	if _, _, err := graph.FamilyMembers([]*graph.Graph{tinyGraph(t, true)}); err == nil ||
		!strings.Contains(err.Error(), "only weights, state and inputs") {
		t.Errorf("shared intermediate: %v", err)
	}
}

// tinyGraph is y = linear(linear(st)) over a private state st; with
// sharedMid its intermediate is (wrongly) shared.
func tinyGraph(t testing.TB, sharedMid bool) *graph.Graph {
	t.Helper()
	b := graph.NewBuilder("tiny")
	b.Module(kernels.PTX)
	st := b.Tensor("st", graph.F32, graph.State, 4).SetInit(func([]byte) {})
	w := b.Tensor("w", graph.F32, graph.Weight, 4, 4).SetInit(func([]byte) {})
	h := b.Tensor("h", graph.F32, graph.Intermediate, 4)
	if sharedMid {
		h.Share("h")
		st.Share("st")
	}
	y := b.Tensor("y", graph.F32, graph.Output, 4)
	lin := func(out, in *graph.Tensor) graph.Launch {
		return graph.Launch{Kernel: kernels.Linear, Grid: cuda.D1(1), Block: cuda.D1(128), Args: []graph.Arg{
			graph.Out(out), graph.In(in), graph.In(w), graph.Null(), graph.Null(), graph.Null(), graph.Null(),
			graph.Scalar(cuda.U32(4)), graph.Scalar(cuda.U32(4)), graph.Scalar(cuda.U32(1)), graph.Scalar(cuda.U32(0)), graph.Scalar(cuda.F32(1e-5)),
		}}
	}
	b.Launch(lin(h, st))
	b.Launch(lin(y, h))
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func tensor(t testing.TB, g *graph.Graph, name string) *graph.Tensor {
	t.Helper()
	for _, x := range g.Tensors {
		if x.Name == name {
			return x
		}
	}
	t.Fatalf("%s has no tensor %s", g.Label(), name)
	return nil
}

// TestFamilyPauseKeepsShared: pausing the family arena drops the members'
// private memory and backs up what they share; after resuming, replays
// give the bytes they gave before the pause (the weights and the KV cache
// survived).
func TestFamilyPauseKeepsShared(t *testing.T) {
	gs := familyGraphs(t, familyShape, 1, 4)
	f, _ := newFamily(t, gs)
	if err := f.Init(); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Capture(); err != nil {
		t.Fatal(err)
	}
	seq := []int{1, 0, 1, 0}
	run := func(from int) [][]byte {
		var outs [][]byte
		for s, m := range seq {
			if err := f.Replay(m, from+s); err != nil {
				t.Fatal(err)
			}
			outs = append(outs, output(t, f.Member(m)))
		}
		return outs
	}
	if err := f.ResetState(); err != nil {
		t.Fatal(err)
	}
	before := run(0)
	if err := f.ResetState(); err != nil {
		t.Fatal(err)
	}
	mapped := f.Arena().Mapped()
	if err := f.Arena().Pause(); err != nil {
		t.Fatal(err)
	}
	if f.Arena().Mapped() >= mapped {
		t.Fatalf("paused family arena maps %d bytes, %d before: the private memory was not given back", f.Arena().Mapped(), mapped)
	}
	if err := f.Arena().Resume(); err != nil {
		t.Fatal(err)
	}
	after := run(0)
	for s := range before {
		if !bytes.Equal(before[s], after[s]) {
			t.Fatalf("step %d after pause and resume differs: the shared memory (weights, KV cache) was lost", s)
		}
	}
}

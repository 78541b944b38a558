package graphexec_test

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/arenaplan/arenaplan/cuda"
	"github.com/arenaplan/arenaplan/graph"
	"github.com/arenaplan/arenaplan/graphexec"
	"github.com/arenaplan/arenaplan/planner"
	"github.com/arenaplan/arenaplan/workloads"
)

// TestChainOrder splits the mlp into three stages that consume each
// other's outputs in place: a replay order that reads a value not yet
// produced, or overwrites one a later stage has not read, is refused
// before anything runs; the planned order gives the whole mlp's output.
func TestChainOrder(t *testing.T) { onDevices(t, testChainOrder) }

func testChainOrder(t *testing.T, dev cuda.Device) {
	shape := workloads.Shape{Layers: 6, Width: 64, Batch: 2}
	gs, err := workloads.MLPStages(shape, 2, 4)
	if err != nil {
		t.Fatal(err)
	}
	links, err := graph.LinkByName(gs)
	if err != nil {
		t.Fatal(err)
	}
	if len(links) != 2 {
		t.Fatalf("links %+v, want h2 and h4", links)
	}
	cp, err := graph.PlanChain(context.Background(), "auto", gs, links, graph.PlanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := graphexec.NewChain(dev, gs, links, cp, graphexec.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Init(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Capture(); err != nil {
		t.Fatal(err)
	}
	// Nothing is copied: the consumer's input is the producer's output.
	for _, l := range links {
		from, to := c.Member(l.From), c.Member(l.To)
		if a, b := from.Ptr(tensor(t, from.Graph(), l.FromTensor)), to.Ptr(tensor(t, to.Graph(), l.ToTensor)); a != b {
			t.Errorf("%s: producer at %x, consumer reads %x", l.FromTensor, a, b)
		}
	}

	// The whole mlp, eagerly, on its own arena.
	whole, err := graphexec.New(dev, build(t, "mlp", shape), nil, graphexec.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer whole.Close()
	if err := whole.Init(); err != nil {
		t.Fatal(err)
	}
	if err := whole.Eager(0); err != nil {
		t.Fatal(err)
	}
	want := output(t, whole)

	refused := func(stage int, missing bool) {
		t.Helper()
		err := c.Replay(stage, 0)
		var oe *planner.OrderError
		if !errors.As(err, &oe) || oe.Stage != stage || oe.Missing != missing {
			t.Fatalf("replay of stage %d: got %v, want an order error (missing %v)", stage, err, missing)
		}
		t.Logf("refused: %v", err)
	}
	ok := func(stages ...int) {
		t.Helper()
		for _, s := range stages {
			if err := c.Replay(s, 0); err != nil {
				t.Fatalf("replay of stage %d: %v", s, err)
			}
		}
	}
	refused(1, true) // h2 not produced yet
	refused(2, true)
	ok(0)
	refused(0, false) // would overwrite h2 before stage 1 read it
	// Stage 2 both lacks h4 and, in this plan, reuses h2's bytes: the
	// overwrite is reported first.
	refused(2, false)
	ok(1, 2)
	if got := output(t, c.Member(2)); !bytes.Equal(got, want) {
		t.Fatal("chained replay's y differs from the whole mlp's eager y")
	}
	// A consumer may run again on the same input; the next round is fine.
	ok(2, 0, 1, 2)
	if got := output(t, c.Member(2)); !bytes.Equal(got, want) {
		t.Fatal("second round: y differs")
	}
	// A Pause keeps the stages' weights and constant input, as an
	// Executor's: after Resume the chain replays to the same y.
	if err := c.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if err := c.Arena().Pause(); err != nil {
		t.Fatal(err)
	}
	if err := c.Arena().Resume(); err != nil {
		t.Fatal(err)
	}
	ok(0, 1, 2)
	if got := output(t, c.Member(2)); !bytes.Equal(got, want) {
		t.Fatal("after Pause and Resume: y differs")
	}
	// Eager steps go through the same guard: stage 2 reused h2's bytes,
	// so stage 1 cannot run again until stage 0 has.
	err = c.Eager(1, 0)
	var oe *planner.OrderError
	if !errors.As(err, &oe) || !oe.Missing || oe.OverwrittenBy != 2 {
		t.Fatalf("eager stage 1 after stage 2: got %v, want its input overwritten by stage 2", err)
	}
	for _, s := range []int{0, 1, 2} {
		if err := c.Eager(s, 0); err != nil {
			t.Fatal(err)
		}
	}
	if got := output(t, c.Member(2)); !bytes.Equal(got, want) {
		t.Fatal("eager chain: y differs")
	}
	if err := c.ResetState(); err != nil {
		t.Fatal(err)
	}
	refused(1, true)
}

func TestChainErrors(t *testing.T) {
	gs, err := workloads.MLPStages(workloads.Shape{Layers: 4, Width: 32, Batch: 1}, 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := graph.LinkByName(gs[1:]); err == nil {
		t.Error("a stage whose input nobody produces was linked")
	}
	bad := []graph.ChainLink{{From: 0, FromTensor: "l0.w", To: 1, ToTensor: "h2"}}
	if _, err := graph.PlanChain(context.Background(), "bestfit", gs, bad, graph.PlanOptions{}); err == nil {
		t.Error("a link from a weight was accepted")
	}
	links, _ := graph.LinkByName(gs)
	cp, err := graph.PlanChain(context.Background(), "bestfit", gs, links, graph.PlanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	other, err := workloads.MLPStages(workloads.Shape{Layers: 4, Width: 32, Batch: 2}, 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := graphexec.NewChain(sim(t), other, links, cp, graphexec.Options{}); err == nil {
		t.Error("a chain plan was accepted for other stages")
	}
	if _, err := workloads.MLPStages(workloads.Shape{Layers: 4}, 3, 2); err == nil {
		t.Error("decreasing cuts accepted")
	}
}

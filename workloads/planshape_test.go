package workloads

import (
	"strings"
	"testing"

	"github.com/arenaplan/arenaplan/graph"
	"github.com/arenaplan/arenaplan/plans"
)

// TestPlanShape: a plan of a built-in workload gives its shape back; a
// plan the PyTorch bridge saved, or of an unknown workload, is refused
// with what it is.
func TestPlanShape(t *testing.T) {
	g, err := Build("gpt2-decode", Shape{Layers: 2})
	if err != nil {
		t.Fatal(err)
	}
	w := g.Workload()
	s, err := PlanShape(w.Name, w.Shape)
	if err != nil || s.Layers != 2 {
		t.Fatalf("PlanShape(%s) = %+v, %v", w.Name, s, err)
	}
	for _, c := range []struct {
		name string
		dims []graph.Dim
		want string
	}{
		{plans.TorchStep, []graph.Dim{{Name: "rank", Value: 0}, {Name: "world_size", Value: 1}},
			`saved by arenaplan.torch for a PyTorch step (workload "torch-step", rank=0 world_size=1)`},
		{"nosuch", nil, `unknown workload "nosuch"`},
		{"gpt2-decode", []graph.Dim{{Name: "layers", Value: 0}}, "shape dimension layers=0 out of range"},
	} {
		if _, err := PlanShape(c.name, c.dims); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("PlanShape(%q, %v): %v, want %q", c.name, c.dims, err, c.want)
		}
	}
}

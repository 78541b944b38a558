package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/arenaplan/arenaplan/plans"
	"github.com/arenaplan/arenaplan/workloads"
)

func TestPlanWorkload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "mlp.plan")
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"--workload", "mlp", "--layers", "4", "--width", "32", "-o", path}, &out, &errb, false); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	f, err := plans.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	g, err := workloads.Build("mlp", workloads.Shape{Layers: 4, Width: 32})
	if err != nil {
		t.Fatal(err)
	}
	w := f.Workload
	if w == nil || w.Name != "mlp" || w.Fingerprint != g.Fingerprint() {
		t.Fatalf("workload %+v, want mlp with fingerprint %s", w, g.Fingerprint())
	}
	if v, _ := w.Dim("layers"); v != 4 {
		t.Errorf("layers %d", v)
	}
	if f.Plan.Arena != f.Plan.LowerBound {
		t.Errorf("arena %d, lower bound %d", f.Plan.Arena, f.Plan.LowerBound)
	}
	if !strings.Contains(out.String(), g.Fingerprint().String()) {
		t.Errorf("output does not name the fingerprint: %s", out.String())
	}
	for _, args := range [][]string{
		{"--layers", "4", "x.csv"},
		{"--workload", "mlp", "x.csv"},
		{"--workload", "mlp", "--heads", "2"},
	} {
		if code := run(context.Background(), args, &out, &errb, false); code != 2 {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
	}
}

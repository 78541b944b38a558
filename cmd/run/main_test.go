package main

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/arenaplan/arenaplan/graph"
	"github.com/arenaplan/arenaplan/plans"
	"github.com/arenaplan/arenaplan/workloads"
)

var small = []string{"--workload", "gpt2-decode", "--layers", "2", "--width", "64", "--heads", "2", "--kv-len", "32", "--vocab", "100"}

func runJSON(t *testing.T, args ...string) (report, int, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(context.Background(), append(args, "--json", "--device", "sim"), &out, &errb)
	var r report
	if code == 0 {
		if err := json.Unmarshal(out.Bytes(), &r); err != nil {
			t.Fatalf("%v: %s", err, out.String())
		}
	}
	return r, code, errb.String()
}

func TestRunSim(t *testing.T) {
	for _, args := range [][]string{
		append(append([]string{}, small...), "--batch", "2", "--steps", "4", "--check"),
		{"--workload", "mlp", "--layers", "6", "--width", "32", "--steps", "4", "--check"},
	} {
		r, code, stderr := runJSON(t, args...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, stderr)
		}
		if !r.OutputsEqual || r.CheckOK == nil || !*r.CheckOK {
			t.Errorf("%v: outputs equal %v, check %v", args, r.OutputsEqual, r.CheckOK)
		}
		if r.ArenaBytes != r.LowerBound || r.ArenaBytes == 0 {
			t.Errorf("%v: arena %d, lower bound %d", args, r.ArenaBytes, r.LowerBound)
		}
		if r.Device != "sim" || r.GraphNodes != r.Launches {
			t.Errorf("%v: device %q, %d nodes for %d launches", args, r.Device, r.GraphNodes, r.Launches)
		}
	}
}

// savePlan writes a plan of a built workload, as plan --workload does.
func savePlan(t *testing.T, g *graph.Graph, align int64) string {
	t.Helper()
	d, err := g.DryRun()
	if err != nil {
		t.Fatal(err)
	}
	p, err := graph.Plan(context.Background(), d.Trace, graph.PlanOptions{Align: align})
	if err != nil {
		t.Fatal(err)
	}
	w := g.Workload()
	path := filepath.Join(t.TempDir(), "w.plan")
	if err := plans.Save(path, &plans.File{Trace: d.Trace, Plan: p, Workload: w}); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestRunPlanFile(t *testing.T) {
	g, err := workloads.Build("mlp", workloads.Shape{Layers: 5, Width: 32, Batch: 2})
	if err != nil {
		t.Fatal(err)
	}
	path := savePlan(t, g, 256)
	r, code, stderr := runJSON(t, "--plan", path, "--steps", "3")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if r.Fingerprint != g.Fingerprint().String() || !strings.HasPrefix(r.PlanSource, "file ") || !r.OutputsEqual {
		t.Errorf("ran %s from %q, outputs equal %v", r.Fingerprint, r.PlanSource, r.OutputsEqual)
	}
	if r.Shape["layers"] != 5 || r.Shape["batch"] != 2 {
		t.Errorf("shape %v, want the plan's", r.Shape)
	}

	// Another shape or workload on the command line conflicts with the
	// plan's: a usage error (conflicting flags exit 2, never one silently
	// preferred), before any file is read.
	_, code, stderr = runJSON(t, "--plan", path, "--width", "64", "--steps", "1")
	if code != 2 || !strings.Contains(stderr, "do not apply beside it: --width") {
		t.Errorf("foreign shape: exit %d, %q", code, stderr)
	}
	_, code, stderr = runJSON(t, "--plan", path, "--workload", "mlp", "--steps", "1")
	if code != 2 || !strings.Contains(stderr, "do not apply beside it: --workload") {
		t.Errorf("--workload beside --plan: exit %d, %q", code, stderr)
	}
}

func TestRunRefusesLowAlignment(t *testing.T) {
	g, err := workloads.Build("mlp", workloads.Shape{Layers: 3, Width: 32})
	if err != nil {
		t.Fatal(err)
	}
	// Plan with alignment 8 (buffers ask for none): below the kernels' 16.
	d, _ := g.DryRun()
	for i := range d.Trace.Buffers {
		d.Trace.Buffers[i].Align = 0
	}
	p, err := graph.Plan(context.Background(), d.Trace, graph.PlanOptions{Align: 8})
	if err != nil {
		t.Fatal(err)
	}
	w := g.Workload()
	path := filepath.Join(t.TempDir(), "a.plan")
	if err := plans.Save(path, &plans.File{Trace: d.Trace, Plan: p, Workload: w}); err != nil {
		t.Fatal(err)
	}
	_, code, stderr := runJSON(t, "--plan", path, "--steps", "1")
	if code != 1 || !strings.Contains(stderr, "plan alignment 8 bytes is below the 16 bytes") {
		t.Errorf("exit %d, %q", code, stderr)
	}
}

func TestRunUsage(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"--workload", "mlp", "--steps", "0"},
		{"--workload", "mlp", "--heads", "4"},
		{"--workload", "mlp", "--device", "tpu"},
		{"--workload", "mlp", "--layers", "-4"}, // a bad shape value, as --steps 0 is
	} {
		var out, errb bytes.Buffer
		if code := run(context.Background(), args, &out, &errb); code != 2 {
			t.Errorf("%v: exit %d, want 2 (%s)", args, code, errb.String())
		}
	}
}

func TestRunHelp(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"--help"}, &out, &errb); code != 0 || errb.Len() != 0 || !strings.Contains(out.String(), "usage: run") {
		t.Errorf("--help: exit %d, stdout %q, stderr %q; want 0 and the usage on stdout", code, out.String(), errb.String())
	}
}

package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/arenaplan/arenaplan/graph"
	"github.com/arenaplan/arenaplan/plans"
	"github.com/arenaplan/arenaplan/workloads"
)

// Launch shapes are no flags: ARENAPLAN_TUNE sets them, and refuses what
// it does not know as a usage error.
func TestRunTune(t *testing.T) {
	base, code, stderr := runJSON(t, "--workload", "gpt2-decode", "--layers", "1", "--width", "64", "--heads", "2", "--kv-len", "64", "--vocab", "100", "--steps", "2")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	t.Setenv(workloads.TuneEnv, "ln_grid=3, attention_threads=64")
	tuned, code, stderr := runJSON(t, "--workload", "gpt2-decode", "--layers", "1", "--width", "64", "--heads", "2", "--kv-len", "64", "--vocab", "100", "--steps", "2")
	if code != 0 || !tuned.OutputsEqual {
		t.Fatalf("tuned: exit %d, outputs equal %v: %s", code, tuned.OutputsEqual, stderr)
	}
	if tuned.Fingerprint == base.Fingerprint {
		t.Error("tuned launch shapes kept the fingerprint")
	}
	for _, tc := range []struct{ spec, want string }{
		{"grid=3", `unknown key "grid" (have attention_blocks, attention_threads, linear_grid, ln_grid, staged_from_batch, staged_grid, ptx, spill_ptx, profile)`},
		{"ln_grid=0", "ln_grid=\"0\": want 1..1048576"},
		{"profile=maybe", "profile=\"maybe\": want 1 or 0"},
		{"ptx=", "want ptx=FILE"},
		{"ptx=a,ptx=b", "ptx given twice"},
	} {
		t.Setenv(workloads.TuneEnv, tc.spec)
		var out, errb bytes.Buffer
		if code := run(context.Background(), []string{"--workload", "mlp", "--device", "sim"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%s=%s: exit %d, %q; want 2 and %q", workloads.TuneEnv, tc.spec, code, errb.String(), tc.want)
		}
	}
}

// On a device of another multiprocessor count the launch grids follow it
// (the outputs still match the Go references), and a plan file sized for 132 is refused
// with the reason.
func TestRunOtherDevice(t *testing.T) {
	shape := []string{"--workload", "gpt2-decode", "--layers", "1", "--width", "64", "--heads", "2", "--kv-len", "64", "--vocab", "100", "--batch", "3", "--steps", "2"}
	h100, code, stderr := runJSON(t, shape...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	g, err := workloads.Build("gpt2-decode", workloads.Shape{Layers: 1, Width: 64, Heads: 2, KVLen: 64, Vocab: 100, Batch: 3})
	if err != nil {
		t.Fatal(err)
	}
	d, err := g.DryRun()
	if err != nil {
		t.Fatal(err)
	}
	p, err := graph.Plan(context.Background(), d.Trace, graph.PlanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "h100.plan")
	if err := plans.Save(path, &plans.File{Trace: d.Trace, Plan: p, Workload: g.Workload()}); err != nil {
		t.Fatal(err)
	}

	simMultiprocessors = 20
	defer func() { simMultiprocessors = 0 }()
	small, code, stderr := runJSON(t, append(shape, "--check")...)
	if code != 0 || !small.OutputsEqual || small.CheckOK == nil || !*small.CheckOK {
		t.Fatalf("20 multiprocessors: exit %d, outputs equal %v, check %v: %s", code, small.OutputsEqual, small.CheckOK, stderr)
	}
	if small.Fingerprint == h100.Fingerprint {
		t.Error("the launch grids did not follow the device")
	}
	_, code, stderr = runJSON(t, "--plan", path, "--steps", "1")
	if code != 1 || !strings.Contains(stderr, "sized for this device's 20 multiprocessors; plan --workload sizes them for 132") {
		t.Errorf("a 132-multiprocessor plan on 20: exit %d, %q", code, stderr)
	}
}

package main

import "testing"

// The simulated device reports compute capability 9.0: run loads the
// compute_90 kernels and launches all but the first linear with PDL;
// --no-pdl launches plainly. Both replay eager's bytes.
func TestRunPDL(t *testing.T) {
	r, code, stderr := runJSON(t, "--workload", "mlp", "--layers", "4", "--width", "32", "--steps", "2")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if !r.PDL || r.PTXTarget != 90 || r.PDLLaunches != 3 || !r.OutputsEqual {
		t.Errorf("pdl %v, target %d, %d PDL launches, outputs equal %v; want true, 90, 3, true", r.PDL, r.PTXTarget, r.PDLLaunches, r.OutputsEqual)
	}
	if s := launchStr(&r); s != "PDL (compute_90), 3 of 4 kernels with programmatic serialization" {
		t.Errorf("launch line %q", s)
	}
	r, code, stderr = runJSON(t, "--workload", "mlp", "--layers", "4", "--width", "32", "--steps", "2", "--no-pdl")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if r.PDL || r.PDLLaunches != 0 || !r.OutputsEqual || launchStr(&r) != "plain (compute_90, --no-pdl)" {
		t.Errorf("--no-pdl: pdl %v, %d PDL launches, outputs equal %v, %q", r.PDL, r.PDLLaunches, r.OutputsEqual, launchStr(&r))
	}
}

package main

import (
	"strings"
	"testing"
)

// TestRunSpillDemo: run --workload spill-demo reports the spillover
// figures; capture-time reuse holds one block (or join-every blocks),
// --no-capture-reuse every iteration's; replay equals eager and the Go
// references compute the kernels' bits exactly.
func TestRunSpillDemo(t *testing.T) {
	const block = 4096 * 4
	for _, tc := range []struct {
		args       []string
		peak       uint64
		reuses     uint64
		reuseShown bool
	}{
		{[]string{"--iters", "30"}, block, 29, true},
		{[]string{"--iters", "30", "--join-every", "5"}, 5 * block, 25, true},
		{[]string{"--iters", "30", "--no-capture-reuse"}, 30 * block, 0, false},
	} {
		args := append([]string{"--workload", "spill-demo", "--width", "4096", "--steps", "3", "--check"}, tc.args...)
		r, code, stderr := runJSON(t, args...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", tc.args, code, stderr)
		}
		if !r.OutputsEqual || r.CheckOK == nil || !*r.CheckOK || *r.CheckMaxAbsDiff != 0 {
			t.Errorf("%v: outputs equal %v, check %v diff %v", tc.args, r.OutputsEqual, r.CheckOK, r.CheckMaxAbsDiff)
		}
		if r.SpillCapPeak != tc.peak || r.SpillPeak < tc.peak || r.SpillCapReuses != tc.reuses || r.SpillReuse != tc.reuseShown {
			t.Errorf("%v: capture peak %d (want %d), run peak %d, reuses %d (want %d), reuse %v",
				tc.args, r.SpillCapPeak, tc.peak, r.SpillPeak, r.SpillCapReuses, tc.reuses, r.SpillReuse)
		}
		if r.SpillReserved == 0 || r.SpilloverBytes == 0 {
			t.Errorf("%v: reserved %d, spillover %d", tc.args, r.SpillReserved, r.SpilloverBytes)
		}
	}
	// Shape flags of other workloads are refused, and --iters elsewhere.
	if _, code, stderr := runJSON(t, "--workload", "spill-demo", "--layers", "3"); code != 2 || !strings.Contains(stderr, "--layers") {
		t.Errorf("--layers on spill-demo: exit %d: %s", code, stderr)
	}
	if _, code, _ := runJSON(t, "--workload", "mlp", "--iters", "3"); code != 2 {
		t.Errorf("--iters on mlp: exit %d", code)
	}
	// Workloads without spillover report none.
	r, code, stderr := runJSON(t, "--workload", "mlp", "--layers", "2", "--width", "16", "--steps", "2")
	if code != 0 || r.SpillPeak != 0 || r.SpillReserved != 0 || r.SpilloverBytes != 0 {
		t.Errorf("mlp: exit %d (%s), spill %d/%d/%d", code, stderr, r.SpillPeak, r.SpillReserved, r.SpilloverBytes)
	}
}

package main

import (
	"strings"
	"testing"
)

// TestRunChain: the mlp split into three graphs that read each other's
// outputs in place from one arena replays to the eager outputs and to the
// whole mlp's output, bit for bit.
func TestRunChain(t *testing.T) {
	r, code, stderr := runJSON(t, "--workload", "mlp", "--layers", "6", "--width", "32", "--batch", "2", "--stages", "2,4", "--steps", "3")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if r.ChainRun == nil || len(r.Stages) != 3 || r.Links != 2 || !r.OutputsEqual || !r.MatchesWhole {
		t.Errorf("chain run %+v (outputs equal %v)", r.ChainRun, r.OutputsEqual)
	}
	if r.GraphNodes != 6 || r.Launches != 6 || r.ArenaBytes <= 0 {
		t.Errorf("graph nodes %d, launches %d, arena %d; want 6, 6, > 0", r.GraphNodes, r.Launches, r.ArenaBytes)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--workload", "gpt2-decode", "--stages", "2"}, "splits the mlp"},
		{[]string{"--workload", "mlp", "--layers", "6", "--stages", "2,x"}, "not a positive layer number"},
		{[]string{"--workload", "mlp", "--layers", "6", "--stages", "4,2"}, "increase"},
		{[]string{"--workload", "mlp", "--stages", "2", "--pause"}, "do not apply"},
	} {
		_, code, stderr := runJSON(t, tc.args...)
		if code != 2 || !strings.Contains(stderr, tc.want) {
			t.Errorf("%v: exit %d, %q; want 2 and %q", tc.args, code, stderr, tc.want)
		}
	}
}

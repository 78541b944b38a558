package main

import (
	"testing"

	"github.com/arenaplan/arenaplan/graph"
	"github.com/arenaplan/arenaplan/workloads"
)

// pauseArgs are small shapes of every built-in workload for --pause.
var pauseArgs = map[string][]string{
	"gpt2-decode": small,
	"mlp":         {"--workload", "mlp", "--layers", "4", "--width", "32", "--batch", "2"},
	"spill-demo":  {"--workload", "spill-demo", "--width", "1024", "--iters", "6"},
}

// --pause: the arena gives back every mapped byte halfway through a
// replayed sequence and takes it again; the weights, the KV cache and
// constant inputs (written once, read by every step: mlp's x) are kept in
// page-locked host memory, and the sequence ends with eager's outputs and
// state bit for bit, for every built-in workload and an odd and an even
// number of steps. (With a family plan it is a usage error:
// TestRunFamilyUsage.)
func TestRunPause(t *testing.T) {
	for _, name := range workloads.Workloads() {
		base, ok := pauseArgs[name]
		if !ok {
			t.Errorf("workload %s: no --pause case", name)
			continue
		}
		for _, steps := range []string{"5", "6"} {
			args := append(append([]string{}, base...), "--steps", steps, "--pause")
			r, code, stderr := runJSON(t, args...)
			if code != 0 {
				t.Errorf("%s --steps %s: exit %d: %s", name, steps, code, stderr)
				continue
			}
			p := r.Pause
			if p == nil {
				t.Errorf("%s: no pause report", name)
				continue
			}
			if !p.OutputsEqual {
				t.Errorf("%s --steps %s: outputs after pause and resume differ from eager's", name, steps)
			}
			if p.ReturnedBytes != int64(r.MappedBytes) {
				t.Errorf("%s: pause returned %d bytes, the arena maps %d", name, p.ReturnedBytes, r.MappedBytes)
			}
			want := uint64(r.WeightBytes + r.KVBytes)
			if constantInput(t, name, r.Shape) {
				want += uint64(r.InputBytes)
			}
			if p.HostBytes != want || (want > 0 && !p.Pinned) {
				t.Errorf("%s: host memory kept %d (pinned %v), want %d (weights, KV cache, constant inputs), pinned", name, p.HostBytes, p.Pinned, want)
			}
		}
	}
}

// constantInput reports whether the workload has an input written once
// rather than fed each step.
func constantInput(t *testing.T, name string, shape map[string]int64) bool {
	t.Helper()
	w, err := workloads.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	var dims []graph.Dim
	for k, v := range shape {
		dims = append(dims, graph.Dim{Name: k, Value: v})
	}
	s, err := workloads.ShapeOf(dims)
	if err != nil {
		t.Fatal(err)
	}
	g, err := w.Build(s)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range g.Tensors {
		if x.Role == graph.Input && !x.HasFeed() {
			return true
		}
	}
	return false
}

package lifetime

import (
	"encoding/json"
	"os"
	"testing"
)

// TestArenaplanSnapshot: a snapshot arenaplan's Python package dumped
// (pickled by Python's pickle as torch.cuda.memory._dump_snapshot does)
// while a step was recorded reads back with the step's lower bound
// (testdata/arenaplan_snapshot.json, the step's report). Regenerate both
// with ARENAPLAN_SNAPSHOT_FIXTURE=lifetime/testdata and
// python/tests/test_snapshot.py.
func TestArenaplanSnapshot(t *testing.T) {
	f, err := os.Open("testdata/arenaplan_snapshot.pickle")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	traces, err := ReadTorchSnapshot(f, "arenaplan")
	if err != nil {
		t.Fatal(err)
	}
	js, err := os.ReadFile("testdata/arenaplan_snapshot.json")
	if err != nil {
		t.Fatal(err)
	}
	var want struct {
		LowerBound int64 `json:"lower_bound"`
	}
	if err := json.Unmarshal(js, &want); err != nil {
		t.Fatal(err)
	}
	if len(traces) != 1 {
		t.Fatalf("%d traces, want 1", len(traces))
	}
	tr := traces[0]
	if len(tr.Buffers) != 17 {
		t.Errorf("%d buffers, want the step's 17 allocations", len(tr.Buffers))
	}
	if lb, _ := tr.LowerBound(256); lb != want.LowerBound || lb == 0 {
		t.Errorf("lower bound %d, the step's report says %d", lb, want.LowerBound)
	}
	if tr.Torch == nil || !tr.Torch.HasSegments || tr.Torch.ReservedPeak <= 0 {
		t.Errorf("segments not read: %+v", tr.Torch)
	}
}

package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/arenaplan/arenaplan/cmd/internal/famreport"
	"github.com/arenaplan/arenaplan/plans"
)

func TestPlanBatchSizes(t *testing.T) {
	out := filepath.Join(t.TempDir(), "fam.plan")
	shape := []string{"--workload", "gpt2-decode", "--layers", "2", "--width", "64", "--heads", "2", "--kv-len", "32", "--vocab", "100"}
	code, stdout, stderr := runPlan(t, append(shape, "--batch", "3", "--batch-sizes", "1,2,8,4", "-o", out)...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if !strings.Contains(stdout, "separate arenas") || !strings.Contains(stdout, "batch=8") {
		t.Errorf("report:\n%s", stdout)
	}
	fam, err := plans.LoadFamily(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(fam.Members) != 4 {
		t.Fatalf("%d members", len(fam.Members))
	}
	for i, want := range []int64{1, 2, 8, 4} {
		if b, _ := fam.Workload(i).Dim("batch"); b != want {
			t.Errorf("member %d: batch %d, want %d (--batch-sizes overrides --batch)", i, b, want)
		}
	}
	if fp := fam.Plan; float64(fp.Arena) > 1.05*float64(fp.LowerBound) {
		t.Errorf("family arena %d, largest lower bound %d", fp.Arena, fp.LowerBound)
	}
	code, stdout, stderr = runPlan(t, "inspect", "--json", out)
	if code != 0 {
		t.Fatalf("inspect: exit %d: %s", code, stderr)
	}
	var r famreport.FamilyReport
	if err := json.Unmarshal([]byte(stdout), &r); err != nil || len(r.Members) != 4 || r.SeparateArenas <= r.Arena {
		t.Errorf("inspect --json: %v: %s", err, stdout)
	}
	for _, bad := range [][]string{
		append(append([]string{}, shape...), "--batch-sizes", "1,0"),
		append(append([]string{}, shape...), "--batch-sizes", "2,2"),
		{"--batch-sizes", "1,2", "x.csv"},
	} {
		if code, _, stderr := runPlan(t, bad...); code != 2 {
			t.Errorf("%v: exit %d (%s), want 2", bad, code, stderr)
		}
	}
}

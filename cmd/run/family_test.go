package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/arenaplan/arenaplan/graph"
	"github.com/arenaplan/arenaplan/plans"
	"github.com/arenaplan/arenaplan/workloads"
)

// saveFamily writes a family plan of gpt2-decode at the given batch
// sizes, as plan --batch-sizes does.
func saveFamily(t *testing.T, batches ...int) string {
	t.Helper()
	mb := 0
	for _, b := range batches {
		mb = max(mb, b)
	}
	var gs []*graph.Graph
	fam := &plans.Family{}
	for _, b := range batches {
		g, err := workloads.Build("gpt2-decode", workloads.Shape{Layers: 2, Width: 64, Heads: 2, KVLen: 32, Vocab: 100, Batch: b, MaxBatch: mb})
		if err != nil {
			t.Fatal(err)
		}
		gs = append(gs, g)
		w := g.Workload()
		fam.Workloads = append(fam.Workloads, w)
	}
	fp, members, err := graph.PlanFamily(context.Background(), "bestfit", gs, graph.PlanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fam.Members, fam.Plan = members, fp
	path := filepath.Join(t.TempDir(), "fam.plan")
	if err := plans.SaveFamily(path, fam); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestRunFamily(t *testing.T) {
	path := saveFamily(t, 1, 2, 4)
	r, code, stderr := runJSON(t, "--plan", path, "--steps", "3", "--sequence", "4,1,1,2,4,2,1")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if r.FamilyRun == nil || len(r.Members) != 3 || !r.MixedOutputsEqual || !r.OutputsEqual {
		t.Fatalf("family report %+v", r.FamilyRun)
	}
	if float64(r.ArenaBytes) > 1.05*float64(r.LowerBound) {
		t.Errorf("family arena %d above 1.05x the largest lower bound %d", r.ArenaBytes, r.LowerBound)
	}
	if r.SeparateArenas <= r.ArenaBytes || r.SeparateStandalone <= r.ArenaBytes {
		t.Errorf("separate arenas %d, standalone %d, family %d", r.SeparateArenas, r.SeparateStandalone, r.ArenaBytes)
	}
	for i, m := range r.Members {
		if m.Batch == nil || *m.Batch != []int64{1, 2, 4}[i] || m.LowerBound <= 0 || m.ReplayUSPerStep <= 0 {
			t.Errorf("member %d: %+v", i, m)
		}
	}
	if got := r.Sequence; len(got) != 7 || got[0] != 4 || got[1] != 1 {
		t.Errorf("sequence %v", got)
	}
	// Round robin by default, text report.
	var out, errb strings.Builder
	if code := run(context.Background(), []string{"--plan", path, "--steps", "4", "--device", "sim"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, want := range []string{"replayed equal to eager: true", "separate arenas", "standalone arenas", "batch=4"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("text report lacks %q:\n%s", want, out.String())
		}
	}
}

func TestRunFamilyUsage(t *testing.T) {
	path := saveFamily(t, 1, 2)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--plan", path, "--sequence", "1,3"}, "no member"},
		{[]string{"--plan", path, "--sequence", "1,x"}, "not a batch size"},
		{[]string{"--plan", path, "--batch", "2"}, "do not apply"},
		{[]string{"--plan", path, "--check"}, "--check"},
		{[]string{"--workload", "mlp", "--sequence", "1"}, "needs a family plan"},
		{[]string{"--plan", path, "--pause"}, "--pause runs a single workload"},
	} {
		_, code, stderr := runJSON(t, tc.args...)
		if code != 2 || !strings.Contains(stderr, tc.want) {
			t.Errorf("%v: exit %d, %q; want 2 and %q", tc.args, code, stderr, tc.want)
		}
	}
}

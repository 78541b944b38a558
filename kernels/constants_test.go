package kernels_test

import (
	"os"
	"regexp"
	"strconv"
	"testing"

	"github.com/arenaplan/arenaplan/kernels"
)

// The Go constants that launches are sized by agree with the #defines of
// kernels.cu that the kernels use.
func TestSourceConstants(t *testing.T) {
	src, err := os.ReadFile("kernels.cu")
	if err != nil {
		t.Fatal(err)
	}
	define := func(name string) int {
		m := regexp.MustCompile(`(?m)^#define ` + name + `\s+(\d+)`).FindSubmatch(src)
		if m == nil {
			t.Fatalf("kernels.cu has no #define %s", name)
		}
		v, err := strconv.Atoi(string(m[1]))
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, c := range []struct {
		name     string
		def, got int
	}{
		{"MAXB (MaxBatchRows)", define("MAXB"), kernels.MaxBatchRows},
		{"APART (MaxAttentionPartBlock)", define("APART"), kernels.MaxAttentionPartBlock},
		{"APRE (AttentionRound of one lane a key)", define("APRE"), kernels.AttentionRound(4, 1)},
		{"LINEAR_SK_R (LinearSplitKRows)", define("LINEAR_SK_R"), kernels.LinearSplitKRows},
		{"ST_MAXR (LinearStagedMaxRows)", define("ST_MAXR"), kernels.LinearStagedMaxRows},
		{"ST_THREADS (LinearStagedMaxBlock)", define("ST_THREADS"), kernels.LinearStagedMaxBlock},
	} {
		if c.def != c.got {
			t.Errorf("%s: kernels.cu %d, Go %d", c.name, c.def, c.got)
		}
	}
}

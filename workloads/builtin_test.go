package workloads_test

import (
	"testing"

	"github.com/arenaplan/arenaplan/kernels"
	"github.com/arenaplan/arenaplan/workloads"
)

// gpt2-decode's layer-norm linears (QKV, MLP in, logits) run as linear_ln
// with room in shared memory for min(batch, 8) normalised rows, within its
// block limit, when those rows fit in 48 KiB; otherwise as linear.
func TestGPT2LayerNormLaunches(t *testing.T) {
	for _, tc := range []struct {
		width, batch int
		staged       bool
	}{
		{64, 1, true}, {64, 3, true}, {768, 8, true}, {768, 20, true}, {1536, 8, true}, {2048, 8, false}, {2048, 4, true},
	} {
		s := workloads.Shape{Layers: 2, Width: tc.width, Heads: tc.width / 64, KVLen: 16, Vocab: 50, Batch: tc.batch}
		g, err := workloads.Build("gpt2-decode", s)
		if err != nil {
			t.Fatal(err)
		}
		ln, plain := 0, 0
		for _, op := range g.Ops {
			switch op.Kernel {
			case kernels.LinearLN:
				ln++
				if want := uint32(4 * min(tc.batch, kernels.MaxBatchRows) * tc.width); op.Shared != want {
					t.Errorf("width %d batch %d: %s has %d bytes of shared memory, want %d", tc.width, tc.batch, op.Name, op.Shared, want)
				}
				if op.Block.X > kernels.LinearLNMaxBlock {
					t.Errorf("%s: block %d", op.Name, op.Block.X)
				}
				// One wave: at most four blocks for each of an
				// H100/H200's 132 multiprocessors (one block per 4
				// output rows where that is fewer).
				if op.Grid.X == 0 || op.Grid.X > 4*132 {
					t.Errorf("%s: linear_ln grid %d, want 1 to %d blocks", op.Name, op.Grid.X, 4*132)
				}
			case kernels.Linear:
				plain++
				if op.Shared != 0 {
					t.Errorf("%s: linear with %d bytes of shared memory", op.Name, op.Shared)
				}
			}
		}
		want := 2*2 + 1 // QKV and MLP-in per layer, logits
		if !tc.staged {
			want = 0
		}
		if ln != want || ln+plain != 4*2+1 {
			t.Errorf("width %d batch %d: %d linear_ln and %d linear launches, want %d of %d", tc.width, tc.batch, ln, plain, want, 4*2+1)
		}
	}
}

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

// gpt2-decode's attention splits the cache positions into as many chunks
// as fit four blocks a multiprocessor, but none shorter than one round of
// attention_part (the positions it loads before it waits); a plain linear
// from 3 batch rows on has a block per kernels.LinearSplitKRows output
// rows, below that a warp per row.
func TestGPT2LaunchShapes(t *testing.T) {
	for _, tc := range []struct {
		width, heads, kvLen, batch int
	}{
		{768, 12, 1024, 1}, {768, 12, 1024, 8}, {768, 12, 64, 1}, {256, 4, 4096, 2}, {128, 1, 8192, 1}, {512, 4, 1, 3},
	} {
		s := workloads.Shape{Layers: 1, Width: tc.width, Heads: tc.heads, KVLen: tc.kvLen, Vocab: 50, Batch: tc.batch}
		g, err := workloads.Build("gpt2-decode", s)
		if err != nil {
			t.Fatal(err)
		}
		hd := tc.width / tc.heads
		round := kernels.AttentionRound(hd, 128)
		for _, op := range g.Ops {
			switch op.Kernel {
			case kernels.AttentionPart:
				splits := int(op.Grid.Z)
				chunk := (tc.kvLen + splits - 1) / splits
				switch {
				case splits < 1 || (splits > 1 && tc.heads*tc.batch*splits > 4*132):
					t.Errorf("%+v: %d splits of %d heads and %d rows: more than one wave", tc, splits, tc.heads, tc.batch)
				case splits > 1 && chunk < round:
					t.Errorf("%+v: %d splits: chunks of %d positions, shorter than a round of %d", tc, splits, chunk, round)
				case splits < (tc.kvLen+round-1)/round && tc.heads*tc.batch*(splits+1) <= 4*132:
					t.Errorf("%+v: %d splits where %d fit", tc, splits, splits+1)
				}
			case kernels.Linear:
				rows := 4 // a warp each
				if tc.batch >= 3 {
					rows = kernels.LinearSplitKRows
				}
				if want := uint32(tc.width+rows-1) / uint32(rows); op.Grid.X != want {
					t.Errorf("%+v: %s: grid %d, want %d", tc, op.Name, op.Grid.X, want)
				}
			}
		}
	}
	// Round: 8 positions for every group of lanes that reads a key (a
	// float4 a lane, a power of two of them).
	for _, tc := range []struct{ hd, block, want int }{{64, 128, 64}, {128, 128, 32}, {60, 128, 64}, {4, 128, 1024}, {128, 32, 8}} {
		if got := kernels.AttentionRound(tc.hd, tc.block); got != tc.want {
			t.Errorf("AttentionRound(%d, %d) = %d, want %d", tc.hd, tc.block, got, tc.want)
		}
	}
}

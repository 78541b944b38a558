package workloads_test

import (
	"testing"

	"github.com/arenaplan/arenaplan/graph"
	"github.com/arenaplan/arenaplan/kernels"
	"github.com/arenaplan/arenaplan/workloads"
)

// linearDims returns a linear launch's in_dim and out_dim (its 8th and 9th
// parameters, shared by linear, linear_ln and linear_st).
func linearDims(op *graph.Op) (in, out uint32) {
	return op.Args[7].Value().AsU32(), op.Args[8].Value().AsU32()
}

// gpt2-decode's linears from 3 batch rows on stage their weights in
// shared memory (linear_st) where a block's share fits: about two blocks a
// multiprocessor of an H100/H200, at most LinearStagedMaxRows rows and 40
// KiB a block. The others, and every linear below 3 batch rows, run as
// before: a layer-norm linear as linear_ln with room in shared memory for
// min(batch, 8) normalised rows, within its block limit, when those rows
// fit in 48 KiB; otherwise as linear, or as linear_few at one and two
// batch rows.
func TestGPT2LinearLaunches(t *testing.T) {
	for _, tc := range []struct {
		width, batch int
		lnStaged     bool // linear_ln's rows fit its shared memory
	}{
		{64, 1, true}, {64, 3, true}, {768, 1, true}, {768, 2, true}, {768, 8, true}, {768, 20, true},
		{1536, 8, true}, {2048, 8, false}, {2048, 4, true}, {3072, 1, true},
	} {
		s := workloads.Shape{Layers: 2, Width: tc.width, Heads: tc.width / 64, KVLen: 16, Vocab: 5000, Batch: tc.batch}
		g, err := workloads.Build("gpt2-decode", s)
		if err != nil {
			t.Fatal(err)
		}
		linears := 0
		for _, op := range g.Ops {
			if op.Kernel != kernels.LinearStaged && op.Kernel != kernels.LinearLN && op.Kernel != kernels.Linear && op.Kernel != kernels.LinearFew {
				continue
			}
			in, out := linearDims(op)
			// What linear_st would take of this linear: the rows of one of
			// about 264 blocks.
			rows := (out + 263) / 264
			fits := rows <= kernels.LinearStagedMaxRows && rows*in*4 <= 40<<10
			ln := op.Args[5].Kind() != graph.ArgNull
			switch op.Kernel {
			case kernels.LinearStaged:
				linears++
				if tc.batch < 3 || !fits {
					t.Errorf("width %d batch %d: %s (%dx%d) is staged", tc.width, tc.batch, op.Name, out, in)
				}
				r := (out + op.Grid.X - 1) / op.Grid.X
				if r > kernels.LinearStagedMaxRows || op.Shared < r*in*4 || op.Shared > 48<<10 || op.Block.X > kernels.LinearStagedMaxBlock || op.Grid.X > 264 {
					t.Errorf("width %d batch %d: %s: grid %d, block %d, %d bytes of shared memory for %d rows of %d inputs a block",
						tc.width, tc.batch, op.Name, op.Grid.X, op.Block.X, op.Shared, r, in)
				}
			case kernels.LinearLN:
				linears++
				if tc.batch >= 3 && fits {
					t.Errorf("width %d batch %d: %s (%dx%d) is not staged", tc.width, tc.batch, op.Name, out, in)
				}
				if !ln || !tc.lnStaged {
					t.Errorf("width %d batch %d: %s runs linear_ln", tc.width, tc.batch, op.Name)
				}
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
			case kernels.LinearFew:
				linears++
				if tc.batch > 2 || ln || op.Shared != 0 || op.Block.X > kernels.LinearFewMaxBlock {
					t.Errorf("width %d batch %d: %s (layer norm %v) as linear_few, %d bytes of shared memory, block %d",
						tc.width, tc.batch, op.Name, ln, op.Shared, op.Block.X)
				}
			case kernels.Linear:
				linears++
				if tc.batch >= 3 && fits {
					t.Errorf("width %d batch %d: %s (%dx%d) is not staged", tc.width, tc.batch, op.Name, out, in)
				}
				if tc.batch <= 2 && !ln {
					t.Errorf("width %d batch %d: %s as linear, not linear_few", tc.width, tc.batch, op.Name)
				}
				if ln && tc.lnStaged {
					t.Errorf("width %d batch %d: %s: a layer-norm linear as linear", tc.width, tc.batch, op.Name)
				}
				if op.Shared != 0 {
					t.Errorf("%s: linear with %d bytes of shared memory", op.Name, op.Shared)
				}
			}
		}
		if linears != 4*2+1 {
			t.Errorf("width %d batch %d: %d linears, want %d", tc.width, tc.batch, linears, 4*2+1)
		}
	}
}

// Staging is a choice the development knobs can take back: --unstaged
// launches no linear_st; --staged-from-batch 1 stages at batch 1.
func TestGPT2StagedKnobs(t *testing.T) {
	count := func(k workloads.Kernels, batch int) int {
		g, err := workloads.BuildWith("gpt2-decode", workloads.Shape{Layers: 1, Batch: batch}, k)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, op := range g.Ops {
			if op.Kernel == kernels.LinearStaged {
				n++
			}
		}
		return n
	}
	k := workloads.EmbeddedKernels()
	if n := count(k, 8); n != 4 {
		t.Errorf("batch 8: %d linear_st launches, want 4 (QKV, projection, MLP in and out)", n)
	}
	if n := count(k, 1); n != 0 {
		t.Errorf("batch 1: %d linear_st launches, want 0", n)
	}
	k.Unstaged = true
	if n := count(k, 8); n != 0 {
		t.Errorf("--unstaged, batch 8: %d linear_st launches", n)
	}
	k = workloads.EmbeddedKernels()
	k.StagedFromBatch = 1
	if n := count(k, 1); n != 4 {
		t.Errorf("--staged-from-batch 1, batch 1: %d linear_st launches, want 4", n)
	}
	k.StagedOnly = []string{"qkv"}
	if n := count(k, 1); n != 1 {
		t.Errorf("--staged-only qkv: %d linear_st launches, want 1", n)
	}
	k.StagedOnly = []string{".proj", "fc_proj"}
	if n := count(k, 1); n != 2 {
		t.Errorf("--staged-only .proj,fc_proj: %d linear_st launches, want 2", n)
	}
}

// --no-linear-few and --no-attention-cluster take back linear_few and
// attention_cl: the kernels of before them, two attention launches a layer.
func TestGPT2FewAndClusterKnobs(t *testing.T) {
	kinds := func(k workloads.Kernels, batch int) map[string]int {
		g, err := workloads.BuildWith("gpt2-decode", workloads.Shape{Layers: 2, Batch: batch}, k)
		if err != nil {
			t.Fatal(err)
		}
		n := map[string]int{}
		for _, op := range g.Ops {
			n[op.Kernel]++
		}
		return n
	}
	k := workloads.EmbeddedKernels()
	n := kinds(k, 1)
	if n[kernels.LinearFew] != 4 || n[kernels.Linear] != 0 || n[kernels.AttentionCluster] != 2 || n[kernels.AttentionPart]+n[kernels.AttentionCombine] != 0 {
		t.Errorf("batch 1: %v, want 4 linear_few, 2 attention_cl", n)
	}
	if n := kinds(k, 8); n[kernels.LinearFew]+n[kernels.AttentionCluster] != 0 || n[kernels.AttentionPart] != 2 {
		t.Errorf("batch 8: %v, want neither linear_few nor attention_cl", n)
	}
	k.NoLinearFew, k.NoAttentionCluster = true, true
	n = kinds(k, 1)
	if n[kernels.LinearFew]+n[kernels.AttentionCluster] != 0 || n[kernels.Linear] != 4 || n[kernels.AttentionPart] != 2 || n[kernels.AttentionCombine] != 2 {
		t.Errorf("batch 1 with the knobs: %v", n)
	}
}

// gpt2-decode's attention splits the cache positions into as many chunks
// as fit four blocks a multiprocessor, but none shorter than one round of
// attention_part (the positions it loads before it waits); where that is
// at least a cluster's worth, it is attention_cl with
// AttentionClusterSplits splits instead. A plain linear from 3 batch rows
// on has a block per kernels.LinearSplitKRows output rows, below that a
// warp per row.
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
		// The splits by the rule above.
		want := max(1, min(4*132/(tc.heads*tc.batch), (tc.kvLen+round-1)/round))
		for _, op := range g.Ops {
			switch op.Kernel {
			case kernels.AttentionCluster:
				if want < kernels.AttentionClusterSplits || op.Grid.Z != kernels.AttentionClusterSplits {
					t.Errorf("%+v: attention_cl with grid %v where the rule gives %d splits", tc, op.Grid, want)
				}
			case kernels.AttentionPart:
				if want >= kernels.AttentionClusterSplits {
					t.Errorf("%+v: attention_part with %d splits, not attention_cl", tc, op.Grid.Z)
				}
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
			case kernels.Linear, kernels.LinearFew: // (not staged; see TestGPT2LinearLaunches)
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

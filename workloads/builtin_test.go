package workloads_test

import (
	"strings"
	"testing"

	"github.com/arenaplan/arenaplan/graph"
	"github.com/arenaplan/arenaplan/kernels"
	"github.com/arenaplan/arenaplan/workloads"
)

// linearDims returns a linear launch's in_dim and out_dim (its 8th and 9th
// parameters, shared by linear, linear_ln, linear_ln1, linear_few and
// linear_st).
func linearDims(op *graph.Op) (in, out uint32) {
	return op.Args[7].Value().AsU32(), op.Args[8].Value().AsU32()
}

// gpt2-decode's linears from 3 batch rows on stage their weights in
// shared memory (linear_st) where a block's share fits: about two blocks a
// multiprocessor of an H100/H200, at most LinearStagedMaxRows rows and 40
// KiB a block. The others, and every linear below 3 batch rows, run as
// before: a layer-norm linear as linear_ln with room in shared memory for
// min(batch, 8) normalised rows, within its block limit, when those rows
// fit in 48 KiB; otherwise as linear, which at batch 1 is linear_few. At
// batch 1 a layer-norm linear of rows up to LinearLN1MaxIn is linear_ln1
// (no shared memory, one wave at most).
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
			if few := op.Kernel == kernels.LinearFew; (few || op.Kernel == kernels.Linear) && few != (tc.batch == 1) {
				t.Errorf("width %d batch %d: %s runs %s", tc.width, tc.batch, op.Name, op.Kernel)
			}
			if op.Kernel == kernels.LinearFew {
				op.Kernel = kernels.Linear
			}
			switch op.Kernel {
			case kernels.Embed, kernels.AttentionPart, kernels.AttentionCombine:
				continue
			}
			in, _ := linearDims(op)
			ln1 := tc.batch == 1 && op.Args[5].Kind() != graph.ArgNull && in <= kernels.LinearLN1MaxIn
			if (op.Kernel == kernels.LinearLN1) != ln1 {
				t.Errorf("width %d batch %d: %s runs %s", tc.width, tc.batch, op.Name, op.Kernel)
			}
			if op.Kernel == kernels.LinearLN1 {
				linears++
				if op.Shared != 0 || op.Block.X > kernels.LinearLN1MaxBlock || op.Grid.X == 0 || op.Grid.X > 462 {
					t.Errorf("%s: linear_ln1 grid %d, block %d, %d bytes of shared memory", op.Name, op.Grid.X, op.Block.X, op.Shared)
				}
				continue
			}
			if op.Kernel != kernels.LinearStaged && op.Kernel != kernels.LinearLN && op.Kernel != kernels.Linear {
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
				// Within one wave: at most 3.5 blocks for each of an
				// H100/H200's 132 multiprocessors (one block per 4
				// output rows where that is fewer).
				if op.Grid.X == 0 || op.Grid.X > 462 {
					t.Errorf("%s: linear_ln grid %d, want 1 to %d blocks", op.Name, op.Grid.X, 462)
				}
			case kernels.Linear:
				linears++
				if tc.batch >= 3 && fits {
					t.Errorf("width %d batch %d: %s (%dx%d) is not staged", tc.width, tc.batch, op.Name, out, in)
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

// gpt2Ops builds a one-layer gpt2-decode with k and returns its launches by
// op name.
func gpt2Ops(t *testing.T, k workloads.Kernels, batch int) map[string]*graph.Op {
	t.Helper()
	g, err := workloads.BuildWith("gpt2-decode", workloads.Shape{Layers: 1, Batch: batch}, k)
	if err != nil {
		t.Fatal(err)
	}
	ops := map[string]*graph.Op{}
	for _, op := range g.Ops {
		ops[op.Name] = op
	}
	return ops
}

// The launch grids follow the device's multiprocessor count: layer-norm
// linears at most 3.5 blocks a multiprocessor, attention_part at most 4,
// linear_st about 2; on a 132-multiprocessor H100 or H200 (the default)
// 462, 528 and 264 blocks.
func TestGPT2GridsFollowDevice(t *testing.T) {
	for _, tc := range []struct {
		sms, want            int // Kernels.Multiprocessors; 0: 132
		ln, attention, stage uint32
	}{
		{0, 132, 462, 528, 264}, {132, 132, 462, 528, 264}, {108, 108, 378, 432, 216}, {78, 78, 273, 312, 156},
	} {
		k := workloads.EmbeddedKernels()
		k.Multiprocessors = tc.sms
		b1, b8 := gpt2Ops(t, k, 1), gpt2Ops(t, k, 8)
		for _, name := range []string{"h0.ln1+qkv", "h0.ln2+fc+gelu", "ln_f+logits"} {
			if g := b1[name].Grid.X; g != tc.ln {
				t.Errorf("%d multiprocessors, batch 1: %s has %d blocks, want %d", tc.want, name, g, tc.ln)
			}
		}
		// Batch 1 of the default 12 heads and 1024 positions: the splits
		// stop at rounds of 32 positions before they reach the block
		// count; batch 8: as many as fit it.
		att := b8["h0.attention"]
		if blocks := att.Grid.X * att.Grid.Y * att.Grid.Z; blocks > tc.attention || blocks+att.Grid.X*att.Grid.Y <= tc.attention {
			t.Errorf("%d multiprocessors, batch 8: attention_part has %d blocks (%d splits), want the most splits within %d", tc.want, blocks, att.Grid.Z, tc.attention)
		}
		// The projection (768 rows of 768 inputs) stages
		// ceil(768/stage) rows a block: 3 on 256 blocks of the 264 an
		// H100 aims for.
		st := b8["h0.proj+residual"]
		rows := (768 + tc.stage - 1) / tc.stage
		if st.Kernel != kernels.LinearStaged || st.Grid.X != (768+rows-1)/rows {
			t.Errorf("%d multiprocessors, batch 8: the projection runs %s on %d blocks, want linear_st on %d", tc.want, st.Kernel, st.Grid.X, (768+rows-1)/rows)
		}
	}
	k := workloads.EmbeddedKernels()
	k.Multiprocessors = -1
	if _, err := workloads.BuildWith("mlp", workloads.Shape{}, k); err == nil {
		t.Error("-1 multiprocessors: no error")
	}
}

// Tune overrides launch shapes and refuses what it cannot take.
func TestTune(t *testing.T) {
	k, err := workloads.EmbeddedKernels().Tune(" ln_grid=100 , attention_threads=64,staged_from_batch=1")
	if err != nil {
		t.Fatal(err)
	}
	ops := gpt2Ops(t, k, 1)
	if g := ops["h0.ln1+qkv"]; g.Kernel != kernels.LinearStaged {
		// staged_from_batch=1 stages QKV at batch 1; the logits do not fit.
		t.Errorf("staged_from_batch=1: QKV runs %s", g.Kernel)
	}
	if g := ops["ln_f+logits"].Grid.X; g != 100 {
		t.Errorf("ln_grid=100: logits on %d blocks", g)
	}
	// 1024 positions in rounds of 4 groups of 8 (64 threads, 16 a key).
	if a := ops["h0.attention"]; a.Block.X != 64 || a.Grid.Z != 32 {
		t.Errorf("attention_threads=64: block %d, %d splits", a.Block.X, a.Grid.Z)
	}
	k, err = workloads.EmbeddedKernels().Tune("staged_from_batch=9")
	if err != nil {
		t.Fatal(err)
	}
	for name, op := range gpt2Ops(t, k, 8) {
		if op.Kernel == kernels.LinearStaged {
			t.Errorf("staged_from_batch=9, batch 8: %s is staged", name)
		}
	}
	if k, err := workloads.EmbeddedKernels().Tune(""); err != nil || k.Multiprocessors != 0 {
		t.Errorf("empty spec: %v", err)
	}
	for _, bad := range []struct{ spec, want string }{
		{"ln_grid", "want key=value"},
		{"grid=4", `unknown key "grid"`},
		{"ln_grid=4,ln_grid=5", "given twice"},
		{"ln_grid=0", "want 1..1048576"},
		{"ln_grid=-1", "want 1..1048576"},
		{"attention_threads=100", "a multiple of 32"},
		{"attention_threads=512", "a multiple of 32, 32..256"},
	} {
		_, err := workloads.EmbeddedKernels().Tune(bad.spec)
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("Tune(%q): %v, want an error with %q", bad.spec, err, bad.want)
		}
	}
	if len(workloads.TuneKeys()) != 6 {
		t.Errorf("TuneKeys: %v", workloads.TuneKeys())
	}
}

package workloads_test

import (
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
				if op.Shared != 0 || op.Block.X > kernels.LinearLN1MaxBlock || op.Grid.X == 0 || op.Grid.X > 4*132 {
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
				// One wave: at most four blocks for each of an
				// H100/H200's 132 multiprocessors (one block per 4
				// output rows where that is fewer).
				if op.Grid.X == 0 || op.Grid.X > 4*132 {
					t.Errorf("%s: linear_ln grid %d, want 1 to %d blocks", op.Name, op.Grid.X, 4*132)
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

// --no-linear-few takes linear_few back: linear at batch 1, as before it.
func TestGPT2FewKnob(t *testing.T) {
	kinds := func(k workloads.Kernels) map[string]int {
		g, err := workloads.BuildWith("gpt2-decode", workloads.Shape{Layers: 2, Batch: 1}, k)
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
	if n := kinds(k); n[kernels.LinearFew] != 4 || n[kernels.Linear] != 0 {
		t.Errorf("batch 1: %v, want 4 linear_few", n)
	}
	k.NoLinearFew = true
	if n := kinds(k); n[kernels.LinearFew] != 0 || n[kernels.Linear] != 4 {
		t.Errorf("batch 1, --no-linear-few: %v, want 4 linear", n)
	}
}

// --no-linear-ln1 takes linear_ln1 back (linear_ln at batch 1, as before
// it); --ln1-only keeps it for the named layer-norm linears.
func TestGPT2LN1Knobs(t *testing.T) {
	kinds := func(k workloads.Kernels) map[string]string {
		g, err := workloads.BuildWith("gpt2-decode", workloads.Shape{Layers: 1, Batch: 1}, k)
		if err != nil {
			t.Fatal(err)
		}
		n := map[string]string{}
		for _, op := range g.Ops {
			n[op.Name] = op.Kernel
		}
		return n
	}
	names := []string{"h0.ln1+qkv", "h0.ln2+fc+gelu", "ln_f+logits"}
	for _, tc := range []struct {
		k    workloads.Kernels
		want []string
	}{
		{workloads.EmbeddedKernels(), []string{kernels.LinearLN1, kernels.LinearLN1, kernels.LinearLN1}},
		{workloads.Kernels{NoLinearLN1: true}, []string{kernels.LinearLN, kernels.LinearLN, kernels.LinearLN}},
		{workloads.Kernels{LN1Only: []string{"qkv", "fc+"}}, []string{kernels.LinearLN1, kernels.LinearLN1, kernels.LinearLN}},
		{workloads.Kernels{LN1Only: []string{"logits"}}, []string{kernels.LinearLN, kernels.LinearLN, kernels.LinearLN1}},
	} {
		tc.k.PTX, tc.k.PTX90 = kernels.PTX, kernels.PTX90
		got := kinds(tc.k)
		for i, name := range names {
			if got[name] != tc.want[i] {
				t.Errorf("%+v: %s runs %s, want %s", tc.k.LN1Only, name, got[name], tc.want[i])
			}
		}
	}
}

// --few-block and --attention-block set those kernels' block sizes (the
// grid and the attention's splits follow), and refuse what the kernels
// cannot run.
func TestGPT2BlockKnobs(t *testing.T) {
	k := workloads.EmbeddedKernels()
	k.FewBlock, k.AttentionBlock = 64, 64
	g, err := workloads.BuildWith("gpt2-decode", workloads.Shape{Layers: 1, Batch: 1}, k)
	if err != nil {
		t.Fatal(err)
	}
	for _, op := range g.Ops {
		switch op.Kernel {
		case kernels.LinearFew:
			if _, out := linearDims(op); op.Block.X != 64 || op.Grid.X != out/2 {
				t.Errorf("%s: block %d, grid %d for %d rows", op.Name, op.Block.X, op.Grid.X, out)
			}
		case kernels.AttentionPart:
			// 1024 positions in rounds of 4 groups of 8 (64 threads, 16 a key).
			if op.Block.X != 64 || op.Grid.Z != 32 {
				t.Errorf("%s: block %d, %d splits", op.Name, op.Block.X, op.Grid.Z)
			}
		}
	}
	// --qkv-grid and --fc-grid bound those two linear_ln launches only.
	k = workloads.EmbeddedKernels()
	k.QKVGrid, k.FCGrid = 100, 200
	g, err = workloads.BuildWith("gpt2-decode", workloads.Shape{Layers: 1, Batch: 1}, k)
	if err != nil {
		t.Fatal(err)
	}
	grids := map[string]uint32{}
	for _, op := range g.Ops {
		grids[op.Name] = op.Grid.X
	}
	if grids["h0.ln1+qkv"] != 100 || grids["h0.ln2+fc+gelu"] != 200 || grids["ln_f+logits"] <= 200 {
		t.Errorf("--qkv-grid 100 --fc-grid 200: grids %v", grids)
	}
	// By default every layer-norm linear takes at most 462 blocks
	// (linear_ln1 at batch 1, linear_ln at 2).
	for _, tc := range []struct {
		batch int
		want  uint32
	}{{1, 462}, {2, 462}} {
		g, err := workloads.Build("gpt2-decode", workloads.Shape{Layers: 1, Batch: tc.batch})
		if err != nil {
			t.Fatal(err)
		}
		for _, op := range g.Ops {
			if op.Name == "h0.ln2+fc+gelu" && op.Grid.X != tc.want {
				t.Errorf("batch %d: %s has %d blocks, want %d", tc.batch, op.Name, op.Grid.X, tc.want)
			}
			if op.Name == "h0.ln1+qkv" && op.Grid.X != 462 {
				t.Errorf("batch %d: %s has %d blocks, want 462", tc.batch, op.Name, op.Grid.X)
			}
		}
	}
	for _, bad := range []workloads.Kernels{{FewBlock: 48}, {FewBlock: 256}, {AttentionBlock: 100}, {AttentionBlock: 512}} {
		if _, err := workloads.BuildWith("gpt2-decode", workloads.Shape{Layers: 1}, bad); err == nil {
			t.Errorf("%+v: no error", bad)
		}
	}
}

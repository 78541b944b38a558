package workloads

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/arenaplan/arenaplan/graph"
	"github.com/arenaplan/arenaplan/kernels"
	"github.com/arenaplan/arenaplan/launch"
)

func init() {
	register(&Workload{
		Name: "gpt2-decode",
		Doc: "one decode step of a GPT-2-shaped transformer, fp32 storage: embedding, per layer " +
			"(layer norm fused into the QKV projection, attention over the KV cache, output projection " +
			"with the residual add, layer norm fused into the MLP's first linear with GELU, second " +
			"linear with the residual add), final norm fused into the tied-embedding logits",
		Defaults: Shape{Layers: 12, Width: 768, Heads: 12, KVLen: 1024, Batch: 1, Vocab: 50257},
		Dims:     []string{"layers", "width", "heads", "kv_len", "batch", "vocab"},
		build:    buildGPT2,
	})
	register(&Workload{
		Name:     "mlp",
		Doc:      "a chain of small linear+GELU layers (fp32), launch-bound by design",
		Defaults: Shape{Layers: 64, Width: 256, Batch: 1},
		Dims:     []string{"layers", "width", "batch"},
		build:    buildMLP,
	})
}

const (
	linearBlock   = 128  // threads: 4 warps, one output row each
	linearMaxGrid = 1024 // blocks; warps stride over the rows beyond
	// defaultMultiprocessors sizes the grids when Kernels names no device:
	// an H100 SXM or H200.
	defaultMultiprocessors = 132
	attentionBlock         = 128
	// lnStageMax is the most dynamic shared memory a layer-norm linear
	// gets for its normalised input rows (the default limit of a block).
	lnStageMax = 48 << 10
	// stagedMax is the most weight bytes a linear_st block stages: under
	// the 48 KiB a block gets without opting in, with room for its static
	// shared memory.
	stagedMax = 40 << 10
	// stagedFromBatch is the fewest batch rows at which the linears stage
	// their weights.
	stagedFromBatch = 3
	layerNormEps    = 1e-5
	maxKVLen        = 8192
)

// multiprocessors is the device's multiprocessor count the grids are
// sized for.
func (k Kernels) multiprocessors() uint32 {
	if k.Multiprocessors > 0 {
		return uint32(k.Multiprocessors)
	}
	return defaultMultiprocessors
}

// lnGrid bounds linear_ln's and linear_ln1's grid: one wave (both are
// bounded for four blocks of 128 threads a multiprocessor), so that a
// block normalises its input rows once for more weight rows (8.7% faster
// at batch 8 than 768 to 1024 blocks), and 3.5 a multiprocessor rather
// than 4, so that the next kernel's blocks (the attention after QKV, the
// MLP's second linear) find room to load before it ends. H100 (132
// multiprocessors), gpt2-decode replayed, µs a step at batch 1 / 8: 528
// blocks 342.1 / 654.8, 462 331.6 / 657.2, 396 336.5 / 662.9, 330 347.1;
// with linear_ln1 at batch 1, 462 against 528 blocks: 302.2 / 304.9.
func (k Kernels) lnGrid() uint32 {
	if k.tune.lnGrid > 0 {
		return k.tune.lnGrid
	}
	return k.multiprocessors() * 7 / 2
}

// attentionBlocks is the most blocks attention_part aims for by splitting
// the cache positions (in chunks of at least one round): four a
// multiprocessor, as many as are resident at once, so that no block waits
// for a second wave.
func (k Kernels) attentionBlocks() int {
	if k.tune.attentionBlocks > 0 {
		return int(k.tune.attentionBlocks)
	}
	return int(4 * k.multiprocessors())
}

// stagedBlocks is how many blocks linear_st aims for: two a
// multiprocessor, so that with its 128 threads of at most 128 registers
// and at most stagedMax bytes of weights a block, the blocks of two
// consecutive linears fit on a multiprocessor together (the next one's
// weight copies overlap this one's work).
func (k Kernels) stagedBlocks() uint32 {
	if k.tune.stagedGrid > 0 {
		return k.tune.stagedGrid
	}
	return 2 * k.multiprocessors()
}

// linearLaunch is one launch of a linear (kernels.LinearStaged, LinearLN,
// LinearLN1, LinearFew or Linear: one function, several launch shapes);
// see kernels.cu.
func (k Kernels) linearLaunch(name string, out, in, w, bias, resid, lnG, lnB *graph.Tensor, inDim, outDim, batch int, mode uint32) graph.Launch {
	// From 3 batch rows on, where a block's share of the weight rows fits
	// in shared memory, the rows are staged there before the kernel waits
	// (linear_st), so the whole weight read overlaps the previous kernel.
	// Below that the other kernels already load nearly all their rows
	// into registers before the wait, and staging measured slower. (So a
	// graph rebound across 3 batch rows changes kernels and is captured
	// again, not updated in place.)
	from := stagedFromBatch
	if k.tune.stagedFromBatch > 0 {
		from = int(k.tune.stagedFromBatch)
	}
	if min(batch, kernels.MaxBatchRows) >= from {
		blocks := k.stagedBlocks()
		rows := (uint32(outDim) + blocks - 1) / blocks
		if rows <= kernels.LinearStagedMaxRows && uint64(rows)*uint64(inDim)*4 <= stagedMax {
			return linearOf(name, kernels.LinearStaged, (uint32(outDim)+rows-1)/rows, linearBlock, rows*uint32(inDim)*4,
				out, in, w, bias, resid, lnG, lnB, inDim, outDim, batch, mode)
		}
	}
	kernel, shared, maxGrid := kernels.Linear, uint32(0), uint32(linearMaxGrid)
	if k.tune.linearGrid > 0 {
		maxGrid = k.tune.linearGrid
	}
	// At batch 1 a plain linear is linear_few: linear's code for one
	// row at fewer registers (at batch 2 two rows at a time measured
	// slower than linear: H100, gpt2-decode replayed, 420 vs 381 µs).
	if lnG == nil && batch == 1 {
		kernel = kernels.LinearFew
	}
	// Rows a block takes at once: one a warp; from 3 batch rows on, a
	// plain linear's block takes LinearSplitKRows, its warps splitting
	// their inputs.
	rows := uint32(linearBlock / 32)
	if lnG == nil && min(batch, kernels.MaxBatchRows) >= 3 {
		rows = kernels.LinearSplitKRows
	}
	// A layer-norm linear that is not staged (every one below 3 batch
	// rows, the logits at any batch) normalises its batch rows once per
	// block into shared memory (linear_ln) when they fit there.
	if st := 4 * min(batch, kernels.MaxBatchRows) * inDim; lnG != nil && st <= lnStageMax {
		kernel, shared, maxGrid, rows = kernels.LinearLN, uint32(st), k.lnGrid(), linearBlock/32
	}
	// At batch 1 a layer-norm linear of rows up to LinearLN1MaxIn is
	// linear_ln1: each warp normalises the input row itself, in
	// registers, one round trip after its wait (linear_ln: a warp's
	// statistics, a barrier, the row staged, a second barrier). H100,
	// gpt2-decode replayed at batch 1: 309.5 -> 302.2 µs a step.
	if lnG != nil && batch == 1 && inDim <= kernels.LinearLN1MaxIn {
		kernel, shared, maxGrid, rows = kernels.LinearLN1, 0, k.lnGrid(), linearBlock/32
	}
	grid := min((uint32(outDim)+rows-1)/rows, maxGrid)
	return linearOf(name, kernel, grid, linearBlock, shared, out, in, w, bias, resid, lnG, lnB, inDim, outDim, batch, mode)
}

// linearOf is a launch of one of the linear kernels (they share their
// parameters).
func linearOf(name, kernel string, grid, block, shared uint32, out, in, w, bias, resid, lnG, lnB *graph.Tensor, inDim, outDim, batch int, mode uint32) graph.Launch {
	opt := func(t *graph.Tensor) graph.Arg {
		if t == nil {
			return graph.Null()
		}
		return graph.In(t)
	}
	return graph.Launch{
		Name: name, Kernel: kernel,
		Grid: launch.D1(grid), Block: launch.D1(block), Shared: shared,
		Args: []graph.Arg{
			graph.Out(out), graph.In(in), graph.In(w), opt(bias), opt(resid), opt(lnG), opt(lnB),
			graph.Scalar(launch.U32(uint32(inDim))), graph.Scalar(launch.U32(uint32(outDim))), graph.Scalar(launch.U32(uint32(batch))),
			graph.Scalar(launch.U32(mode)), graph.Scalar(launch.F32(layerNormEps)),
		},
	}
}

// DecodePosition is the KV cache position that gpt2-decode's step s
// writes and attends up to: steps start at 7/8 of the cache (which is
// initialised with random keys and values, as after a prompt) and wrap.
func DecodePosition(kvLen, step int) int { return (kvLen*7/8 + step) % kvLen }

// DecodeToken is the token of batch row b at step s.
func DecodeToken(seed uint64, vocab, batch, step, b int) uint32 {
	return uint32(splitmix(seed^uint64(step*batch+b)*0x2545f4914f6cdd1d) % uint64(vocab))
}

func buildGPT2(s Shape, k Kernels) (*graph.Graph, error) {
	L, W, H, T, B, V := s.Layers, s.Width, s.Heads, s.KVLen, s.Batch, s.Vocab
	switch {
	case L < 1 || L > 1024:
		return nil, fmt.Errorf("workloads: gpt2-decode: --layers %d: want 1..1024", L)
	case W < 4 || W%4 != 0 || W > 1<<16:
		return nil, fmt.Errorf("workloads: gpt2-decode: --width %d: want a multiple of 4, at most 65536", W)
	case H < 1 || W%H != 0 || (W/H)%4 != 0 || W/H > kernels.MaxAttentionHead:
		return nil, fmt.Errorf("workloads: gpt2-decode: --heads %d: the head size width/heads must be a whole multiple of 4, at most %d", H, kernels.MaxAttentionHead)
	case T < 1 || T > maxKVLen:
		return nil, fmt.Errorf("workloads: gpt2-decode: --kv-len %d: want 1..%d", T, maxKVLen)
	case B < 1 || B > 1024:
		return nil, fmt.Errorf("workloads: gpt2-decode: --batch %d: want 1..1024", B)
	case V < 1 || V > 1<<24:
		return nil, fmt.Errorf("workloads: gpt2-decode: --vocab %d: want 1..2^24", V)
	case s.MaxBatch > 1024:
		return nil, fmt.Errorf("workloads: gpt2-decode: max batch %d: want at most 1024", s.MaxBatch)
	}
	hd := W / H
	seed := s.Seed
	b := graph.NewBuilder("gpt2-decode")
	for _, d := range []graph.Dim{{Name: "layers", Value: int64(L)}, {Name: "width", Value: int64(W)}, {Name: "heads", Value: int64(H)}, {Name: "kv_len", Value: int64(T)}, {Name: "batch", Value: int64(B)}, {Name: "vocab", Value: int64(V)}} {
		b.Dim(d.Name, d.Value)
	}
	// The KV cache and the attention counters are sized for the family's
	// largest batch and shared by key: a member uses their first B rows.
	mb := int64(max(s.MaxBatch, B))
	if mb > int64(B) {
		b.Dim("max_batch", mb)
	}
	k.module(b)
	w, bb, l := int64(W), int64(B), int64(T)
	const std = 0.0346 // uniform half-width for GPT-2's N(0, 0.02) init
	weight := func(name string, a float32, shape ...int64) *graph.Tensor {
		return b.Tensor(name, graph.F32, graph.Weight, shape...).SetInit(uniform(seed, name, 0, a))
	}
	gain := func(name string) *graph.Tensor {
		return b.Tensor(name, graph.F32, graph.Weight, w).SetInit(uniform(seed, name, 1, 0.1))
	}
	step := b.Tensor("step", graph.U32, graph.Input, 1+bb).SetFeed(func(s int, dst []byte) {
		binary.LittleEndian.PutUint32(dst, uint32(DecodePosition(T, s)))
		for r := 0; r < B; r++ {
			binary.LittleEndian.PutUint32(dst[4+4*r:], DecodeToken(seed, V, B, s, r))
		}
	})
	wte := weight("wte", std, int64(V), w)
	wpe := weight("wpe", std/2, l, w)
	x := b.Tensor("x0", graph.F32, graph.Intermediate, bb, w)
	b.Launch(graph.Launch{
		Name: "embed", Kernel: kernels.Embed,
		Grid: launch.Dim3{X: uint32((W + 255) / 256), Y: uint32(B), Z: 1}, Block: launch.D1(256),
		Args: []graph.Arg{graph.Out(x), graph.In(wte), graph.In(wpe), graph.In(step), graph.Scalar(launch.U32(uint32(W))), graph.Scalar(launch.U32(uint32(V))), graph.Scalar(launch.U32(uint32(T)))},
	})
	projStd := float32(std / math.Sqrt(float64(2*L)))
	ab := k.attentionBlocks()
	// As many splits of the cache positions as fit ab blocks, but no chunk
	// shorter than one round of attention_part (the positions it loads
	// before it waits): on an H100 at batch 1, 16 splits of 64 positions
	// replay in 355 µs a step, 32 of 32 in 373.
	ablock := attentionBlock
	if k.tune.attentionThreads > 0 {
		ablock = int(k.tune.attentionThreads)
	}
	round := kernels.AttentionRound(hd, ablock)
	splits := max(1, min(ab/(H*B), (T+round-1)/round))
	combineBlock := uint32((hd/4 + 31) &^ 31)
	scale := float32(1 / math.Sqrt(float64(hd)))
	for i := 0; i < L; i++ {
		p := fmt.Sprintf("h%d.", i)
		ln1g, ln1b := gain(p+"ln1.g"), weight(p+"ln1.b", 0.05, w)
		wqkv, bqkv := weight(p+"attn.w_qkv", std, 3*w, w), weight(p+"attn.b_qkv", 0.01, 3*w)
		wo, bo := weight(p+"attn.w_proj", projStd, w, w), weight(p+"attn.b_proj", 0.01, w)
		ln2g, ln2b := gain(p+"ln2.g"), weight(p+"ln2.b", 0.05, w)
		wfc, bfc := weight(p+"mlp.w_fc", std, 4*w, w), weight(p+"mlp.b_fc", 0.01, 4*w)
		wpr, bpr := weight(p+"mlp.w_proj", projStd, w, 4*w), weight(p+"mlp.b_proj", 0.01, w)
		kc := b.Tensor(p+"k_cache", graph.F32, graph.State, mb, l, w).SetInit(uniform(seed, p+"k_cache", 0, 1)).Share(p + "k_cache")
		vc := b.Tensor(p+"v_cache", graph.F32, graph.State, mb, l, w).SetInit(uniform(seed, p+"v_cache", 0, 1)).Share(p + "v_cache")

		qkv := b.Tensor(p+"qkv", graph.F32, graph.Intermediate, bb, 3*w)
		part := b.Tensor(p+"attn.part", graph.F32, graph.Intermediate, bb*int64(H*splits*kernels.AttentionPartStride(hd)))
		att := b.Tensor(p+"attn", graph.F32, graph.Intermediate, bb, w)
		xm := b.Tensor(p+"x_mid", graph.F32, graph.Intermediate, bb, w)
		hid := b.Tensor(p+"mlp.h", graph.F32, graph.Intermediate, bb, 4*w)
		xn := b.Tensor(fmt.Sprintf("x%d", i+1), graph.F32, graph.Intermediate, bb, w)

		b.Launch(k.linearLaunch(p+"ln1+qkv", qkv, x, wqkv, bqkv, nil, ln1g, ln1b, W, 3*W, B, 0))
		b.Launch(graph.Launch{
			Name: p + "attention", Kernel: kernels.AttentionPart,
			Grid: launch.Dim3{X: uint32(H), Y: uint32(B), Z: uint32(splits)}, Block: launch.D1(uint32(ablock)),
			Args: []graph.Arg{graph.Out(part), graph.In(qkv), graph.InOut(kc), graph.InOut(vc), graph.In(step),
				graph.Scalar(launch.U32(uint32(W))), graph.Scalar(launch.U32(uint32(H))), graph.Scalar(launch.U32(uint32(T))),
				graph.Scalar(launch.U32(uint32(splits))), graph.Scalar(launch.F32(scale))},
		})
		b.Launch(graph.Launch{
			Name: p + "attention_combine", Kernel: kernels.AttentionCombine,
			Grid: launch.Dim3{X: uint32(H), Y: uint32(B), Z: 1}, Block: launch.D1(combineBlock),
			Args: []graph.Arg{graph.Out(att), graph.In(part), graph.Scalar(launch.U32(uint32(W))), graph.Scalar(launch.U32(uint32(H))), graph.Scalar(launch.U32(uint32(splits)))},
		})
		b.Launch(k.linearLaunch(p+"proj+residual", xm, att, wo, bo, x, nil, nil, W, W, B, kernels.ModeResidual))
		b.Launch(k.linearLaunch(p+"ln2+fc+gelu", hid, xm, wfc, bfc, nil, ln2g, ln2b, W, 4*W, B, kernels.ModeGELU))
		b.Launch(k.linearLaunch(p+"fc_proj+residual", xn, hid, wpr, bpr, xm, nil, nil, 4*W, W, B, kernels.ModeResidual))
		x = xn
	}
	lnfg, lnfb := gain("ln_f.g"), weight("ln_f.b", 0.05, w)
	logits := b.Tensor("logits", graph.F32, graph.Output, bb, int64(V))
	b.Launch(k.linearLaunch("ln_f+logits", logits, x, wte, nil, nil, lnfg, lnfb, W, V, B, 0))
	return b.Build()
}

func buildMLP(s Shape, k Kernels) (*graph.Graph, error) {
	L, W, B := s.Layers, s.Width, s.Batch
	switch {
	case L < 1 || L > 1<<16:
		return nil, fmt.Errorf("workloads: mlp: --layers %d: want 1..65536", L)
	case W < 4 || W%4 != 0 || W > 1<<16:
		return nil, fmt.Errorf("workloads: mlp: --width %d: want a multiple of 4, at most 65536", W)
	case B < 1 || B > 1<<16:
		return nil, fmt.Errorf("workloads: mlp: --batch %d: want 1..65536", B)
	case s.MaxBatch > 1<<16:
		return nil, fmt.Errorf("workloads: mlp: max batch %d: want at most 65536", s.MaxBatch)
	}
	seed := s.Seed
	b := graph.NewBuilder("mlp")
	b.Dim("layers", int64(L))
	b.Dim("width", int64(W))
	b.Dim("batch", int64(B))
	// The constant input is sized for the family's largest batch and
	// shared: a member reads its first B rows.
	mb := int64(max(s.MaxBatch, B))
	if mb > int64(B) {
		b.Dim("max_batch", mb)
	}
	k.module(b)
	w, bb := int64(W), int64(B)
	a := float32(math.Sqrt(6.5 / float64(W))) // He-like variance 2.2/W keeps activations near unit scale through GELU
	x := b.Tensor("x", graph.F32, graph.Input, mb, w).SetInit(uniform(seed, "x", 0, 1)).Share("x")
	for i := 0; i < L; i++ {
		p := fmt.Sprintf("l%d.", i)
		wt := b.Tensor(p+"w", graph.F32, graph.Weight, w, w).SetInit(uniform(seed, p+"w", 0, a))
		bias := b.Tensor(p+"b", graph.F32, graph.Weight, w).SetInit(uniform(seed, p+"b", 0, 0.1))
		role, name := graph.Intermediate, fmt.Sprintf("h%d", i+1)
		if i == L-1 {
			role, name = graph.Output, "y"
		}
		y := b.Tensor(name, graph.F32, role, bb, w)
		b.Launch(k.linearLaunch(p+"linear+gelu", y, x, wt, bias, nil, nil, nil, W, W, B, kernels.ModeGELU))
		x = y
	}
	return b.Build()
}

// Package kernels holds the CUDA kernels of the built-in workloads of
// package workloads (gpt2-decode, mlp, spill-demo): their CUDA C sources
// (kernels.cu, spill.cu), the PTX that nvcc built from them (committed and
// embedded; ptx.sum records each source's SHA-256 as nvcc saw it, and a
// test fails when a source changes without its PTX: scripts/gpu-ptx.sh
// rebuilds both), and a Go reference for every PTX entry, which the
// simulated device runs. It makes no device call and links no driver
// binding.
//
// Storage is fp32. The references compute the same functions as the CUDA
// kernels but not the same bits (float64 accumulation, Go's math
// functions): compare a GPU run with them under a tolerance. Each kernel is
// deterministic, so GPU runs of the same inputs (eager or replayed) agree
// bit for bit.
package kernels

import (
	_ "embed"

	"github.com/arenaplan/arenaplan/launch"
)

// PTX is nvcc's PTX of kernels.cu (compute_80: the driver JIT-compiles it
// for the GPU it runs on, H100 and H200 included).
//
//go:embed kernels.ptx
var PTX []byte

// PTX90 is nvcc's PTX of the same kernels.cu for compute_90 (nvcc -ptx
// -arch=compute_90): the same entries and parameters as PTX, plus the
// programmatic-dependent-launch instructions (griddepcontrol) that
// kernels.cu emits for sm_90 and later. ForDevice picks it on compute
// capability 9.0 and later.
//
//go:embed kernels_90.ptx
var PTX90 []byte

// Entry names of the kernels in PTX.
const (
	Embed  = "embed"
	Linear = "linear"
	// Attention is split attention in one kernel (the last block of a
	// head combines); gpt2-decode launches AttentionPart and
	// AttentionCombine instead. Its reference is the one-pass attention
	// that split attention is tested against.
	Attention = "attention"
	// LinearLN is linear with the layer norm applied once per block to
	// rows staged in shared memory (see kernels.cu); the same function.
	// The launch gives 4*min(batch, MaxBatchRows)*in_dim bytes of dynamic
	// shared memory and at most LinearLNMaxBlock threads a block.
	LinearLN = "linear_ln"
	// AttentionPart and AttentionCombine are split-KV attention in two
	// launches (flash-decoding): per-chunk partials, then their combination.
	AttentionPart    = "attention_part"
	AttentionCombine = "attention_combine"
	// LinearStaged is linear with each block's weight rows copied into
	// shared memory before the kernel waits for its predecessor (see
	// kernels.cu); the same function and parameters. Block i takes output
	// rows [i*r, i*r+r), r = ceil(out_dim/grid) <= LinearStagedMaxRows; the
	// launch gives r*in_dim*4 bytes of dynamic shared memory and at most
	// LinearStagedMaxBlock threads a block.
	LinearStaged = "linear_st"
	// LinearFew is linear without a layer norm in a kernel of its own,
	// one batch row at a time (see kernels.cu): the same function and
	// parameters (ln_g and ln_b null), at most LinearFewMaxBlock threads a
	// block, its registers bounded so that more of its blocks, and the
	// next kernel's, are resident than linear's.
	LinearFew = "linear_few"
	// LinearLN1 is linear_ln's function (the layer norm always applied)
	// for rows of at most LinearLN1MaxIn floats, one batch row at a time,
	// each warp normalising the input row itself in registers (see
	// kernels.cu): no dynamic shared memory, at most LinearLN1MaxBlock
	// threads a block.
	LinearLN1 = "linear_ln1"
)

// LinearLN1MaxIn is the widest input row of linear_ln1 (6 float4s a lane).
const LinearLN1MaxIn = 768

// LinearLN1MaxBlock is the most threads of a linear_ln1 block (its launch
// bounds).
const LinearLN1MaxBlock = 128

// LinearFewMaxBlock is the most threads of a linear_few block (its launch
// bounds).
const LinearFewMaxBlock = 128

// LinearStagedMaxRows is the most output rows a block of linear_st takes
// (ST_MAXR in kernels.cu).
const LinearStagedMaxRows = 16

// LinearStagedMaxBlock is the most threads of a linear_st block (its
// launch bounds, ST_THREADS in kernels.cu).
const LinearStagedMaxBlock = 128

// LinearLNMaxBlock is the most threads of a linear_ln block (its launch
// bounds).
const LinearLNMaxBlock = 128

// MaxAttentionHead is the largest head size (width/heads) of
// attention_part and attention_combine: a key is read by at most one warp,
// a float4 a lane.
const MaxAttentionHead = 128

// MaxAttentionPartBlock is the most threads of an attention_part block.
const MaxAttentionPartBlock = 256

// AttentionRound is how many cache positions a block of attention_part
// with the given threads reads in one round for head size hd: each group of
// lanes (the power of two at least hd/4) reads 8 keys and values (APRE in
// kernels.cu). The first round is loaded before the kernel waits for its
// predecessor.
func AttentionRound(hd, block int) int {
	return max(1, block/attentionLanes(hd)) * 8
}

// attentionLanes is how many threads of attention_part read one key: the
// power of two at least hd/4 (a float4 each).
func attentionLanes(hd int) int {
	lanes := 1
	for lanes < hd/4 {
		lanes <<= 1
	}
	return lanes
}

// LinearSplitKRows is how many output rows a block of linear takes at once
// from 3 batch rows on (its warps split the rows' inputs; see kernels.cu):
// a launch wants ceil(out_dim/LinearSplitKRows) blocks.
const LinearSplitKRows = 4

// Linear's mode bits.
const (
	ModeGELU     = 1 // apply GELU (tanh approximation) after the bias
	ModeResidual = 2 // add resid[b][o] after the activation
)

// MaxBatchRows is how many batch rows one warp of linear accumulates at
// once; larger batches are handled MaxBatchRows rows at a time.
const MaxBatchRows = 8

// Reference returns the Go references of PTX's entries, by entry name, for
// cuda.SimConfig.Kernels. Each call returns a new map.
func Reference() map[string]launch.KernelFunc {
	return map[string]launch.KernelFunc{
		Embed:            embed,
		Linear:           linear,
		Attention:        attention,
		AttentionPart:    attentionPart,
		AttentionCombine: attentionCombine,
		LinearLN:         linearLN,
		LinearStaged:     linearStaged,
		LinearFew:        linearFew,
		LinearLN1:        linearLN1,
	}
}

// Package kernels holds the CUDA kernels of the built-in workloads of
// package graphexec (gpt2-decode, mlp): their CUDA C source (kernels.cu),
// the PTX that nvcc built from it (kernels.ptx, committed and embedded), and
// a Go reference for every PTX entry, which the simulated device runs.
//
// Storage is fp32. The references compute the same functions as the CUDA
// kernels but not the same bits (float64 accumulation, Go's math
// functions): compare a GPU run with them under a tolerance. Each kernel is
// deterministic, so GPU runs of the same inputs (eager or replayed) agree
// bit for bit.
package kernels

import (
	"bytes"
	_ "embed"
	"regexp"

	"github.com/arenaplan/arenaplan/cuda"
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

// ptx80 is the embedded compute_80 PTX, kept apart from PTX, which a
// development build may replace (cmd/run --ptx).
var ptx80 = bytes.Clone(PTX)

// ForDevice returns the PTX to load in place of ptx on a device of compute
// capability major.minor: PTX90 when ptx is the embedded compute_80 PTX and
// the device is 9.0 or later; ptx itself otherwise (other modules, PTX
// replaced for development, older devices).
func ForDevice(ptx []byte, major, minor int) []byte {
	if major >= 9 && len(PTX90) > 0 && bytes.Equal(ptx, ptx80) {
		return PTX90
	}
	return ptx
}

var (
	entryRE  = regexp.MustCompile(`(?m)^(?:\.visible\s+)?\.entry\s+([A-Za-z_$][\w$]*)\s*\(`)
	targetRE = regexp.MustCompile(`(?m)^\.target\s+sm_(\d+)`)
)

// Target returns the sm_NN number of ptx's .target directive (80 for
// compute_80 PTX, 90 for compute_90), or 0 when there is none.
func Target(ptx []byte) int {
	m := targetRE.FindSubmatch(ptx)
	if m == nil {
		return 0
	}
	n := 0
	for _, c := range m[1] {
		n = 10*n + int(c-'0')
	}
	return n
}

// PDLEntries returns the entries of ptx whose body executes
// griddepcontrol.wait: kernels that may be launched with programmatic
// serialization (cuda.LaunchConfig.ProgrammaticSerialization), because
// kernels.cu has them wait for the previous kernel before they touch
// memory it writes or reads. Empty for compute_80 PTX, which has no such
// instruction.
func PDLEntries(ptx []byte) map[string]bool {
	out := map[string]bool{}
	locs := entryRE.FindAllSubmatchIndex(ptx, -1)
	for i, loc := range locs {
		end := len(ptx)
		if i+1 < len(locs) {
			end = locs[i+1][0]
		}
		if bytes.Contains(ptx[loc[1]:end], []byte("griddepcontrol.wait")) {
			out[string(ptx[loc[2]:loc[3]])] = true
		}
	}
	return out
}

// Entry names of the kernels in PTX.
const (
	Embed  = "embed"
	Linear = "linear"
	// Attention is split attention in one kernel (the last block of a
	// head combines); gpt2-decode now launches AttentionPart and
	// AttentionCombine instead. Kept, with its reference, for
	// kernels/bench and as the one-pass reference that split attention
	// is tested against.
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
)

// LinearLNMaxBlock is the most threads of a linear_ln block (its launch
// bounds).
const LinearLNMaxBlock = 128

// MaxAttentionHead is the largest head size (width/heads) of
// attention_part and attention_combine: a key is read by at most one warp,
// a float4 a lane.
const MaxAttentionHead = 128

// MaxAttentionPartBlock is the most threads of an attention_part block.
const MaxAttentionPartBlock = 256

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
func Reference() map[string]cuda.KernelFunc {
	return map[string]cuda.KernelFunc{
		Embed:            embed,
		Linear:           linear,
		Attention:        attention,
		AttentionPart:    attentionPart,
		AttentionCombine: attentionCombine,
		LinearLN:         linearLN,
	}
}

package kernels_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/arenaplan/arenaplan/cuda"
	"github.com/arenaplan/arenaplan/kernels"
)

// flat is a simulated device memory of one range starting at flatBase.
type flat []byte

const flatBase = 1 << 20

func (m flat) Bytes(p cuda.DevicePtr, n uint64) ([]byte, error) {
	if uint64(p) < flatBase || uint64(p)-flatBase+n > uint64(len(m)) {
		return nil, fmt.Errorf("%#x+%d out of range", uint64(p), n)
	}
	return m[uint64(p)-flatBase:][:n], nil
}

// alloc hands out 16-byte aligned ranges of a flat memory.
type alloc struct {
	mem  flat
	next uint64
}

func (a *alloc) f32(n int) (cuda.DevicePtr, []float32) {
	p := flatBase + a.next
	a.next += (4*uint64(n) + 15) &^ 15
	b := a.mem[p-flatBase:][:4*n]
	return cuda.DevicePtr(p), unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), n)
}

// Split-KV attention (attention_part, then attention_combine) computes the
// function of the one-pass attention reference for any split of the cache
// positions, empty chunks included, and leaves the caches as it does.
func TestSplitAttentionMatchesOnePass(t *testing.T) {
	refs := kernels.Reference()
	r := rand.New(rand.NewPCG(15, 1))
	for it := 0; it < 60; it++ {
		hd := 4 * (1 + r.IntN(kernels.MaxAttentionHead/4))
		heads := 1 + r.IntN(4)
		width := hd * heads
		kvLen := 1 + r.IntN(70)
		batch := 1 + r.IntN(3)
		splits := 1 + r.IntN(kvLen+3) // more splits than positions too: empty chunks
		pos := r.IntN(kvLen + 2)      // past the end: clamped
		scale := float32(1 / math.Sqrt(float64(hd)))
		name := fmt.Sprintf("hd%d/h%d/T%d/b%d/s%d/pos%d", hd, heads, kvLen, batch, splits, pos)

		run := func(split bool) (out, kc, vc []float32) {
			a := &alloc{mem: make(flat, 4*(4*batch*kvLen*width+batch*width*(6+splits*2)+heads*batch*splits*8+1024)+4096)}
			po, out := a.f32(batch * width)
			pq, qkv := a.f32(batch * 3 * width)
			pk, kc := a.f32(batch * kvLen * width)
			pv, vc := a.f32(batch * kvLen * width)
			ps, step := a.f32(1)
			step[0] = math.Float32frombits(uint32(pos))
			seed := rand.New(rand.NewPCG(uint64(it), 2))
			for _, s := range [][]float32{qkv, kc, vc} {
				for i := range s {
					s[i] = 2*seed.Float32() - 1
				}
			}
			for i := range out {
				out[i] = float32(math.NaN())
			}
			grid := cuda.Dim3{X: uint32(heads), Y: uint32(batch), Z: uint32(splits)}
			if !split {
				pw, _ := a.f32(batch * heads * splits * (hd + 2))
				pc, _ := a.f32(batch * heads)
				err := refs[kernels.Attention](a.mem, grid, cuda.D1(128), []cuda.KernelArg{
					cuda.Ptr(po), cuda.Ptr(pq), cuda.Ptr(pk), cuda.Ptr(pv), cuda.Ptr(ps), cuda.Ptr(pw), cuda.Ptr(pc),
					cuda.U32(uint32(width)), cuda.U32(uint32(heads)), cuda.U32(uint32(kvLen)), cuda.U32(uint32(splits)), cuda.F32(scale)})
				if err != nil {
					t.Fatalf("%s: attention: %v", name, err)
				}
				return out, kc, vc
			}
			pp, part := a.f32(batch * heads * splits * kernels.AttentionPartStride(hd))
			for i := range part {
				part[i] = float32(math.NaN())
			}
			err := refs[kernels.AttentionPart](a.mem, grid, cuda.D1(128), []cuda.KernelArg{
				cuda.Ptr(pp), cuda.Ptr(pq), cuda.Ptr(pk), cuda.Ptr(pv), cuda.Ptr(ps),
				cuda.U32(uint32(width)), cuda.U32(uint32(heads)), cuda.U32(uint32(kvLen)), cuda.U32(uint32(splits)), cuda.F32(scale)})
			if err != nil {
				t.Fatalf("%s: attention_part: %v", name, err)
			}
			for i, v := range part {
				if math.IsNaN(float64(v)) {
					t.Fatalf("%s: partial float %d not written", name, i)
				}
			}
			err = refs[kernels.AttentionCombine](a.mem, cuda.Dim3{X: uint32(heads), Y: uint32(batch), Z: 1}, cuda.D1(32), []cuda.KernelArg{
				cuda.Ptr(po), cuda.Ptr(pp), cuda.U32(uint32(width)), cuda.U32(uint32(heads)), cuda.U32(uint32(splits))})
			if err != nil {
				t.Fatalf("%s: attention_combine: %v", name, err)
			}
			return out, kc, vc
		}
		want, wk, wv := run(false)
		got, gk, gv := run(true)
		for i := range want {
			if d := math.Abs(float64(got[i] - want[i])); !(d <= 1e-5*(1+math.Abs(float64(want[i])))) {
				t.Fatalf("%s: out[%d] = %g, one pass %g", name, i, got[i], want[i])
			}
		}
		for i := range wk {
			if gk[i] != wk[i] || gv[i] != wv[i] {
				t.Fatalf("%s: caches differ at %d", name, i)
			}
		}
	}
}

// The references reject shapes the CUDA kernels do not handle.
func TestSplitAttentionShapes(t *testing.T) {
	refs := kernels.Reference()
	a := &alloc{mem: make(flat, 1<<16)}
	p, _ := a.f32(1024)
	args := func(width, heads, splits uint32) []cuda.KernelArg {
		return []cuda.KernelArg{cuda.Ptr(p), cuda.Ptr(p), cuda.Ptr(p), cuda.Ptr(p), cuda.Ptr(p),
			cuda.U32(width), cuda.U32(heads), cuda.U32(4), cuda.U32(splits), cuda.F32(1)}
	}
	for _, tc := range []struct {
		name                 string
		width, heads, splits uint32
		gridZ, block         uint32
	}{
		{"head too large", 2 * (kernels.MaxAttentionHead + 4), 2, 1, 1, 128},
		{"head not a multiple of 4", 12, 2, 1, 1, 128},
		{"grid z is not splits", 16, 2, 2, 1, 128},
		{"no splits", 16, 2, 0, 0, 128},
		{"block too large", 16, 2, 1, 1, kernels.MaxAttentionPartBlock + 32},
		{"block not whole warps", 16, 2, 1, 1, 48},
	} {
		err := refs[kernels.AttentionPart](a.mem, cuda.Dim3{X: 2, Y: 1, Z: tc.gridZ}, cuda.D1(tc.block), args(tc.width, tc.heads, tc.splits))
		if err == nil {
			t.Errorf("%s: no error", tc.name)
		}
	}
}

// linear_ln's reference refuses what the kernel cannot do: no layer norm,
// blocks above its launch bounds.
func TestLinearLNShapes(t *testing.T) {
	refs := kernels.Reference()
	a := &alloc{mem: make(flat, 1<<16)}
	p, _ := a.f32(1024)
	args := func(g cuda.DevicePtr) []cuda.KernelArg {
		return []cuda.KernelArg{cuda.Ptr(p), cuda.Ptr(p), cuda.Ptr(p), cuda.Ptr(0), cuda.Ptr(0), cuda.Ptr(g), cuda.Ptr(g),
			cuda.U32(8), cuda.U32(8), cuda.U32(1), cuda.U32(0), cuda.F32(1e-5)}
	}
	if err := refs[kernels.LinearLN](a.mem, cuda.D1(1), cuda.D1(128), args(p)); err != nil {
		t.Errorf("valid launch: %v", err)
	}
	if err := refs[kernels.LinearLN](a.mem, cuda.D1(1), cuda.D1(128), args(0)); err == nil {
		t.Error("no layer norm: no error")
	}
	if err := refs[kernels.LinearLN](a.mem, cuda.D1(1), cuda.D1(kernels.LinearLNMaxBlock+32), args(p)); err == nil {
		t.Error("block above the launch bounds: no error")
	}
}

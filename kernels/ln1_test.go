package kernels_test

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/arenaplan/arenaplan/cuda"
	"github.com/arenaplan/arenaplan/kernels"
)

// linear_ln1 computes linear's function with a layer norm, and its
// reference refuses what the kernel does not do: no layer norm, rows wider
// than LinearLN1MaxIn, blocks above its launch bounds.
func TestLinearLN1Reference(t *testing.T) {
	refs := kernels.Reference()
	r := rand.New(rand.NewPCG(22, 1))
	const out = 13
	for _, tc := range []struct{ in, batch int }{{24, 1}, {24, 3}, {kernels.LinearLN1MaxIn, 1}} {
		in, batch := tc.in, tc.batch
		a := &alloc{mem: make(flat, 1<<18)}
		px, x := a.f32(batch * in)
		pw, w := a.f32(out * in)
		pb, bias := a.f32(out)
		pr, resid := a.f32(batch * out)
		pg, g := a.f32(in)
		pbeta, beta := a.f32(in)
		py1, y1 := a.f32(batch * out)
		py2, y2 := a.f32(batch * out)
		for _, v := range [][]float32{x, w, bias, resid, g, beta} {
			for i := range v {
				v[i] = r.Float32()*2 - 1
			}
		}
		args := func(y, g, beta cuda.DevicePtr, in int) []cuda.KernelArg {
			return []cuda.KernelArg{cuda.Ptr(y), cuda.Ptr(px), cuda.Ptr(pw), cuda.Ptr(pb), cuda.Ptr(pr), cuda.Ptr(g), cuda.Ptr(beta),
				cuda.U32(uint32(in)), cuda.U32(out), cuda.U32(uint32(batch)), cuda.U32(kernels.ModeGELU | kernels.ModeResidual), cuda.F32(1e-5)}
		}
		if err := refs[kernels.LinearLN1](a.mem, cuda.D1(2), cuda.D1(128), args(py1, pg, pbeta, in)); err != nil {
			t.Fatalf("in %d batch %d: %v", in, batch, err)
		}
		if err := refs[kernels.LinearLN](a.mem, cuda.D1(2), cuda.D1(128), args(py2, pg, pbeta, in)); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(y1, y2) || slices.Equal(y1, make([]float32, len(y1))) {
			t.Errorf("in %d batch %d: linear_ln1 %v, linear_ln %v", in, batch, y1, y2)
		}
		if err := refs[kernels.LinearLN1](a.mem, cuda.D1(2), cuda.D1(128), args(py1, 0, 0, in)); err == nil || !strings.Contains(err.Error(), "layer-norm") {
			t.Errorf("no layer norm: %v, want an error", err)
		}
		if err := refs[kernels.LinearLN1](a.mem, cuda.D1(2), cuda.D1(kernels.LinearLN1MaxBlock+32), args(py1, pg, pbeta, in)); err == nil {
			t.Error("a block above the launch bounds: no error")
		}
		if err := refs[kernels.LinearLN1](a.mem, cuda.D1(2), cuda.D1(128), args(py1, pg, pbeta, kernels.LinearLN1MaxIn+4)); err == nil || !strings.Contains(err.Error(), "in_dim") {
			t.Errorf("in_dim %d: %v, want an error", kernels.LinearLN1MaxIn+4, err)
		}
	}
}

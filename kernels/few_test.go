package kernels_test

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/arenaplan/arenaplan/cuda"
	"github.com/arenaplan/arenaplan/kernels"
)

// linear_few and linear_ln_few compute linear's function (two batch rows
// at a time, any batch), and their references refuse what the kernels do
// not do: linear_few applies no layer norm, linear_ln_few always does,
// and neither takes blocks above its launch bounds.
func TestLinearFewReferences(t *testing.T) {
	refs := kernels.Reference()
	r := rand.New(rand.NewPCG(21, 1))
	const in, out = 24, 13
	for _, batch := range []int{1, 2, 3} {
		a := &alloc{mem: make(flat, 1<<16)}
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
		args := func(y, g, beta cuda.DevicePtr) []cuda.KernelArg {
			return []cuda.KernelArg{cuda.Ptr(y), cuda.Ptr(px), cuda.Ptr(pw), cuda.Ptr(pb), cuda.Ptr(pr), cuda.Ptr(g), cuda.Ptr(beta),
				cuda.U32(in), cuda.U32(out), cuda.U32(uint32(batch)), cuda.U32(kernels.ModeGELU | kernels.ModeResidual), cuda.F32(1e-5)}
		}
		for _, tc := range []struct {
			few      string
			g, beta  cuda.DevicePtr
			maxBlock uint32
		}{
			{kernels.LinearFew, 0, 0, kernels.LinearFewMaxBlock},
			{kernels.LinearLNFew, pg, pbeta, kernels.LinearLNMaxBlock},
		} {
			clear(y1)
			clear(y2)
			if err := refs[tc.few](a.mem, cuda.D1(2), cuda.D1(128), args(py1, tc.g, tc.beta)); err != nil {
				t.Fatalf("%s, batch %d: %v", tc.few, batch, err)
			}
			if err := refs[kernels.Linear](a.mem, cuda.D1(2), cuda.D1(128), args(py2, tc.g, tc.beta)); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(y1, y2) || slices.Equal(y1, make([]float32, len(y1))) {
				t.Errorf("%s, batch %d: %v, linear %v", tc.few, batch, y1, y2)
			}
			if err := refs[tc.few](a.mem, cuda.D1(2), cuda.D1(tc.maxBlock+32), args(py1, tc.g, tc.beta)); err == nil {
				t.Errorf("%s: a block above the launch bounds: no error", tc.few)
			}
		}
		if err := refs[kernels.LinearFew](a.mem, cuda.D1(2), cuda.D1(128), args(py1, pg, pbeta)); err == nil || !strings.Contains(err.Error(), "layer norm") {
			t.Errorf("linear_few with a layer norm: %v, want an error", err)
		}
		if err := refs[kernels.LinearLNFew](a.mem, cuda.D1(2), cuda.D1(128), args(py1, 0, 0)); err == nil {
			t.Error("linear_ln_few without a layer norm: no error")
		}
	}
}

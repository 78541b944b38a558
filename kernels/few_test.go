package kernels_test

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/arenaplan/arenaplan/cuda"
	"github.com/arenaplan/arenaplan/kernels"
)

// linear_few computes linear's function (one batch row at a time, any
// batch), and its reference refuses what the kernel does not do: a layer
// norm, blocks above its launch bounds.
func TestLinearFewReference(t *testing.T) {
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
		py1, y1 := a.f32(batch * out)
		py2, y2 := a.f32(batch * out)
		for _, v := range [][]float32{x, w, bias, resid, g} {
			for i := range v {
				v[i] = r.Float32()*2 - 1
			}
		}
		args := func(y, g cuda.DevicePtr) []cuda.KernelArg {
			return []cuda.KernelArg{cuda.Ptr(y), cuda.Ptr(px), cuda.Ptr(pw), cuda.Ptr(pb), cuda.Ptr(pr), cuda.Ptr(g), cuda.Ptr(g),
				cuda.U32(in), cuda.U32(out), cuda.U32(uint32(batch)), cuda.U32(kernels.ModeGELU | kernels.ModeResidual), cuda.F32(1e-5)}
		}
		if err := refs[kernels.LinearFew](a.mem, cuda.D1(2), cuda.D1(128), args(py1, 0)); err != nil {
			t.Fatalf("batch %d: %v", batch, err)
		}
		if err := refs[kernels.Linear](a.mem, cuda.D1(2), cuda.D1(128), args(py2, 0)); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(y1, y2) || slices.Equal(y1, make([]float32, len(y1))) {
			t.Errorf("batch %d: linear_few %v, linear %v", batch, y1, y2)
		}
		if err := refs[kernels.LinearFew](a.mem, cuda.D1(2), cuda.D1(128), args(py1, pg)); err == nil || !strings.Contains(err.Error(), "layer norm") {
			t.Errorf("a layer norm: %v, want an error", err)
		}
		if err := refs[kernels.LinearFew](a.mem, cuda.D1(2), cuda.D1(kernels.LinearFewMaxBlock+32), args(py1, 0)); err == nil {
			t.Error("a block above the launch bounds: no error")
		}
	}
}

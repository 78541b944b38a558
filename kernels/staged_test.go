package kernels_test

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/arenaplan/arenaplan/cuda"
	"github.com/arenaplan/arenaplan/kernels"
	"github.com/arenaplan/arenaplan/launch"
)

// linear_st computes linear's function in its own launch shape, and its
// reference rejects launches outside that shape (more than
// LinearStagedMaxRows rows a block, blocks past LinearStagedMaxBlock
// threads, a layer norm's gain without its bias).
func TestLinearStagedReference(t *testing.T) {
	refs := kernels.Reference()
	r := rand.New(rand.NewPCG(9, 1))
	const in, out, batch = 12, 40, 3
	a := &alloc{mem: make(flat, 1<<16)}
	px, x := a.f32(batch * in)
	pw, w := a.f32(out * in)
	pb, bias := a.f32(out)
	pg, g := a.f32(in)
	pbeta, beta := a.f32(in)
	py1, y1 := a.f32(batch * out)
	py2, y2 := a.f32(batch * out)
	for _, v := range [][]float32{x, w, bias, g, beta} {
		for i := range v {
			v[i] = r.Float32()*2 - 1
		}
	}
	args := func(y cuda.DevicePtr, lnG, lnB cuda.DevicePtr) []launch.KernelArg {
		return []launch.KernelArg{
			launch.Ptr(y), launch.Ptr(px), launch.Ptr(pw), launch.Ptr(pb), launch.Ptr(0), launch.Ptr(lnG), launch.Ptr(lnB),
			launch.U32(in), launch.U32(out), launch.U32(batch), launch.U32(kernels.ModeGELU), launch.F32(1e-5),
		}
	}
	// ceil(40/3) = 14 rows a block.
	if err := refs[kernels.LinearStaged](a.mem, launch.D1(3), launch.D1(128), args(py1, pg, pbeta)); err != nil {
		t.Fatal(err)
	}
	if err := refs[kernels.Linear](a.mem, launch.D1(10), launch.D1(128), args(py2, pg, pbeta)); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(y1, y2) {
		t.Error("linear_st and linear differ")
	}
	for _, tc := range []struct {
		grid, block uint32
		lnG, lnB    cuda.DevicePtr
		want        string
	}{
		{2, 128, pg, pbeta, "20 a block"},         // ceil(40/2) rows
		{3, 256, pg, pbeta, "at most 128"},        // threads
		{3, 96 + 16, pg, pbeta, "multiple of 32"}, // threads
		{3, 128, pg, 0, "both"},                   // gain without bias
	} {
		err := refs[kernels.LinearStaged](a.mem, launch.D1(tc.grid), launch.D1(tc.block), args(py1, tc.lnG, tc.lnB))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("grid %d block %d: %v, want an error with %q", tc.grid, tc.block, err, tc.want)
		}
	}
}

package workloads_test

import (
	"bytes"
	"testing"

	"github.com/arenaplan/arenaplan/kernels"
	"github.com/arenaplan/arenaplan/workloads"
)

// TestModuleVariants: a built-in graph carries its kernels' compute_90
// build, which a device of 9.0 and later loads; PTX given without a
// compute_90 build (a modified kernels.cu) is loaded as given on every
// device.
func TestModuleVariants(t *testing.T) {
	if len(kernels.PTX90) == 0 {
		t.Skip("kernels_90.ptx is empty")
	}
	g, err := workloads.Build("mlp", workloads.Shape{Layers: 2, Width: 32})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(g.ModulePTX(0, 9), kernels.PTX90) {
		t.Error("ModulePTX(0, 9) is not PTX90")
	}
	if !bytes.Equal(g.ModulePTX(0, 8), kernels.PTX) {
		t.Error("ModulePTX(0, 8) is not PTX")
	}
	dev := bytes.Clone(kernels.PTX)
	g, err = workloads.BuildWith("mlp", workloads.Shape{Layers: 2, Width: 32}, workloads.Kernels{PTX: dev})
	if err != nil {
		t.Fatal(err)
	}
	if got := g.ModulePTX(0, 9); &got[0] != &dev[0] {
		t.Error("the given PTX replaced on a 9.0 device")
	}
	// The fingerprint is the compute_80 PTX's: the same workload whichever
	// build a device loads.
	a, _ := workloads.Build("mlp", workloads.Shape{Layers: 2, Width: 32})
	if a.Fingerprint() != g.Fingerprint() {
		t.Error("a variant changed the fingerprint")
	}
}

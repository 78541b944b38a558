package graphexec_test

import (
	"testing"

	"github.com/arenaplan/arenaplan/cuda"
	"github.com/arenaplan/arenaplan/graphexec"
	"github.com/arenaplan/arenaplan/kernels"
)

// countingDev counts LaunchEx calls with programmatic serialization.
type countingDev struct {
	cuda.Device
	pdl, plain int
}

func (d *countingDev) LaunchEx(fn cuda.Function, cfg cuda.LaunchConfig, args ...cuda.KernelArg) error {
	if cfg.ProgrammaticSerialization {
		d.pdl++
	}
	return d.Device.LaunchEx(fn, cfg, args...)
}

func (d *countingDev) Launch(fn cuda.Function, grid, block cuda.Dim3, sharedMem uint32, s cuda.Stream, args ...cuda.KernelArg) error {
	d.plain++
	return d.Device.Launch(fn, grid, block, sharedMem, s, args...)
}

// On compute capability 9.0 the executor loads the compute_90 PTX and
// launches every op but the first (embed) with programmatic serialization
// (linear and both attention kernels wait for their predecessor),
// eagerly and in the capture; NoPDL and an 8.0 device launch plainly. The
// outputs are the same bytes in every mode, eager and replayed.
func TestProgrammaticDependentLaunch(t *testing.T) {
	if len(kernels.PTX90) == 0 {
		t.Skip("kernels_90.ptx is empty")
	}
	g := build(t, "gpt2-decode", smallGPT2)
	wantPDL := 0
	for i, op := range g.Ops {
		if i > 0 && op.Kernel != kernels.Embed {
			wantPDL++
		}
	}
	const steps = 3
	var first [][]byte
	for _, tc := range []struct {
		name   string
		cc     [2]int
		noPDL  bool
		target int
		pdl    int
	}{
		{"cc9.0", [2]int{9, 0}, false, 90, wantPDL},
		{"cc9.0-no-pdl", [2]int{9, 0}, true, 90, 0},
		{"cc8.0", [2]int{8, 0}, false, 80, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := cuda.OpenSim(cuda.SimConfig{Kernels: kernels.Reference(), ComputeCapability: tc.cc})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			dev := &countingDev{Device: s}
			e, err := graphexec.New(dev, g, nil, graphexec.Options{NoPDL: tc.noPDL})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			m := e.LaunchMode()
			if m.Target != tc.target || m.PDLLaunches != tc.pdl || m.PDL != (tc.pdl > 0) {
				t.Errorf("launch mode %+v, want target %d and %d PDL launches", m, tc.target, tc.pdl)
			}
			if err := e.Init(); err != nil {
				t.Fatal(err)
			}
			eager, replay := eagerThenReplay(t, e, steps)
			if !equal(eager, replay) {
				t.Fatal("replayed outputs differ from eager outputs")
			}
			// steps eager steps and one capture.
			if want := (steps + 1) * tc.pdl; dev.pdl != want {
				t.Errorf("%d launches with programmatic serialization, want %d", dev.pdl, want)
			}
			if first == nil {
				first = eager
			} else if !equal(first, eager) {
				t.Error("outputs differ from the first mode's")
			}
		})
	}
}

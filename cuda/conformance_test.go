package cuda_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/arenaplan/arenaplan/cuda"
	"github.com/arenaplan/arenaplan/cuda/cudatest"
)

func openSim(t *testing.T) *cuda.Sim {
	t.Helper()
	sim, err := cuda.OpenSim(cuda.SimConfig{Kernels: cudatest.Kernels()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	return sim
}

// openDriver opens device 0, or skips the test on a machine without a
// CUDA driver. Close is left to the caller: it must run on this goroutine.
func openDriver(t *testing.T) *cuda.Driver {
	t.Helper()
	d, err := cuda.Open(0)
	if errors.Is(err, cuda.ErrNoDriver) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestConformance runs the suite on the simulation and, where a driver is
// present, on device 0, and requires the two to print the same lines.
func TestConformance(t *testing.T) {
	simLines := cudatest.Run(t, "sim", openSim(t))
	d, err := cuda.Open(0)
	if errors.Is(err, cuda.ErrNoDriver) {
		t.Logf("driver half skipped: %v", err)
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	t.Logf("driver: %s, version %d", d.Name(), d.Version())
	drvLines := cudatest.Run(t, "driver", d)
	if !slices.Equal(simLines, drvLines) {
		for i := range max(len(simLines), len(drvLines)) {
			var a, b string
			if i < len(simLines) {
				a = simLines[i]
			}
			if i < len(drvLines) {
				b = drvLines[i]
			}
			if a != b {
				t.Errorf("simulation and driver disagree:\n  sim:    %s\n  driver: %s", a, b)
			}
		}
	} else {
		t.Logf("%s AGREE %d cases", cudatest.Prefix, len(simLines))
	}
}

func TestOpenMissingLibrary(t *testing.T) {
	_, err := cuda.OpenLibrary("libcuda-arenaplan-missing.so.1", 0)
	if !errors.Is(err, cuda.ErrNoDriver) {
		t.Fatalf("want ErrNoDriver, got %v", err)
	}
	if !strings.HasPrefix(err.Error(), "cuda: no CUDA driver: ") || strings.Contains(err.Error(), "\n") {
		t.Errorf("want one line starting with %q, got %q", "cuda: no CUDA driver: ", err)
	}
	t.Log(err)
}

func TestOpenReportsEveryMissingSymbol(t *testing.T) {
	_, err := cuda.OpenLibrary("libc.so.6", 0)
	if err == nil {
		t.Fatal("libc opened as a CUDA driver")
	}
	for _, name := range []string{"cuInit", "cuMemAlloc_v2", "cuStreamGetCaptureInfo_v3", "cuGraphInstantiateWithFlags", "cuMemSetAccess"} {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("error does not name %s: %v", name, err)
		}
	}
	if errors.Is(err, cuda.ErrNoDriver) {
		t.Errorf("missing symbols reported as a missing library: %v", err)
	}
}

func TestErrorNamesAndIs(t *testing.T) {
	err := error(&cuda.Error{Op: "cuMemAlloc_v2", Code: cuda.ErrorStreamCaptureUnsupported})
	if got, want := err.Error(), "cuda: cuMemAlloc_v2: CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (900)"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	wrapped := errors.Join(errors.New("context"), err)
	if !errors.Is(wrapped, cuda.ErrorStreamCaptureUnsupported) || errors.Is(wrapped, cuda.ErrorOutOfMemory) {
		t.Error("errors.Is against Result codes")
	}
	for code, want := range map[cuda.Result]string{
		0: "CUDA_SUCCESS", 2: "CUDA_ERROR_OUT_OF_MEMORY", 901: "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
		907: "CUDA_ERROR_CAPTURED_EVENT", 910: "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE", 12345: "CUDA_ERROR_12345",
	} {
		if code.String() != want {
			t.Errorf("%d: got %s, want %s", code, code, want)
		}
	}
	if cuda.Code(nil) != cuda.Success || cuda.Code(errors.New("x")) != cuda.ErrorUnknown {
		t.Error("Code")
	}
}

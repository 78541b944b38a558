package cuda_test

import (
	"errors"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/arenaplan/arenaplan/cuda"
	"github.com/arenaplan/arenaplan/cuda/cudatest"
)

func TestSimOverrunIsIllegalAddress(t *testing.T) {
	sim := openSim(t)
	m, err := sim.LoadModule(cudatest.PTX)
	if err != nil {
		t.Fatal(err)
	}
	fill, err := m.Function("fill_u32")
	if err != nil {
		t.Fatal(err)
	}
	s, _ := sim.NewStream()
	p, err := sim.Alloc(1000)
	if err != nil {
		t.Fatal(err)
	}
	// 251 words = 1004 bytes: one word past the allocation.
	err = sim.Launch(fill, cuda.D1(1), cuda.D1(256), 0, s, cuda.Ptr(p), cuda.U32(1), cuda.U32(251))
	if !errors.Is(err, cuda.ErrorIllegalAddress) {
		t.Fatalf("overrun: got %v", err)
	}
	if err := sim.Launch(fill, cuda.D1(1), cuda.D1(256), 0, s, cuda.Ptr(p), cuda.U32(1)); !errors.Is(err, cuda.ErrorInvalidValue) {
		t.Errorf("wrong parameter count: got %v", err)
	}
	if err := sim.CopyHtoD(p.Add(996), make([]byte, 8)); !errors.Is(err, cuda.ErrorInvalidValue) {
		t.Errorf("copy past the end: got %v", err)
	}
}

func TestSimModuleNeedsGoReferences(t *testing.T) {
	sim, err := cuda.OpenSim(cuda.SimConfig{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = sim.LoadModule(cudatest.PTX)
	if !errors.Is(err, cuda.ErrorNotFound) || !strings.Contains(err.Error(), "fill_u32, saxpy") {
		t.Fatalf("got %v", err)
	}
	if _, err := sim.LoadModule([]byte("not ptx")); !errors.Is(err, cuda.ErrorInvalidPTX) {
		t.Errorf("garbage PTX: got %v", err)
	}
	if err := sim.RegisterKernel("fill_u32", cudatest.Kernels()["fill_u32"]); err != nil {
		t.Fatal(err)
	}
	if err := sim.RegisterKernel("fill_u32", cudatest.Kernels()["fill_u32"]); err == nil {
		t.Error("duplicate registration accepted")
	}
}

func TestSimVMMPauseResume(t *testing.T) {
	sim := openSim(t)
	g, _ := sim.Granularity(false)
	va, err := sim.AddressReserve(4*g, 0)
	if err != nil {
		t.Fatal(err)
	}
	s, _ := sim.NewStream()
	var hs [2]cuda.MemHandle
	for i := range hs {
		if hs[i], err = sim.MemCreate(2 * g); err != nil {
			t.Fatal(err)
		}
		if err := sim.MemMap(va.Add(uint64(i)*2*g), 2*g, hs[i]); err != nil {
			t.Fatal(err)
		}
	}
	// Mapped but without access: work fails when it runs.
	if err := sim.Memset32(va, 7, 1, s); !errors.Is(err, cuda.ErrorIllegalAddress) {
		t.Errorf("memset without access: %v", err)
	}
	if err := sim.MemSetAccess(va, 4*g); err != nil {
		t.Fatal(err)
	}
	// One memset across both handles: the reservation is contiguous.
	if err := sim.Memset32(va.Add(2*g-8), 0x55, 4, s); err != nil {
		t.Fatal(err)
	}
	free0, _, _ := sim.MemGetInfo()
	// Release while mapped: memory comes back only at unmap.
	if err := sim.MemRelease(hs[1]); err != nil {
		t.Fatal(err)
	}
	if f, _, _ := sim.MemGetInfo(); f != free0 {
		t.Errorf("release while mapped returned memory early")
	}
	if err := sim.MemUnmap(va.Add(g), g); err == nil {
		t.Error("unmapping half a mapping accepted")
	}
	if err := sim.MemUnmap(va, 4*g); err != nil {
		t.Fatal(err)
	}
	if f, _, _ := sim.MemGetInfo(); f != free0+2*g {
		t.Errorf("free after unmap %d, want %d", f, free0+2*g)
	}
	if err := sim.CopyDtoH(make([]byte, 4), va); !errors.Is(err, cuda.ErrorInvalidValue) {
		t.Errorf("read of unmapped memory: %v", err)
	}
	// Remapping the kept handle keeps its bytes (physical memory).
	if err := sim.MemMap(va, 2*g, hs[0]); err != nil {
		t.Fatal(err)
	}
	if err := sim.MemSetAccess(va, 2*g); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 8)
	if err := sim.CopyDtoH(b, va.Add(2*g-8)); err != nil || b[0] != 0x55 || b[4] != 0x55 {
		t.Errorf("bytes after remap %v, %v", b, err)
	}
	if err := sim.AddressFree(va, 4*g); err == nil {
		t.Error("freeing a reservation with a mapping accepted")
	}
	if err := sim.MemUnmap(va, 2*g); err != nil {
		t.Fatal(err)
	}
	if err := sim.MemRelease(hs[0]); err != nil {
		t.Fatal(err)
	}
	if err := sim.AddressFree(va, 4*g); err != nil {
		t.Fatal(err)
	}
}

// TestSimConcurrent drives one Sim from several goroutines (run it with
// -race), each bound to the context first, as the driver needs.
func TestSimConcurrent(t *testing.T) {
	sim := openSim(t)
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := sim.BindThread(); err != nil {
				t.Error(err)
				return
			}
			s, err := sim.NewStream()
			if err != nil {
				t.Error(err)
				return
			}
			for j := 0; j < 50; j++ {
				p, err := sim.Alloc(4096)
				if err != nil {
					t.Error(err)
					return
				}
				sim.Memset32(p, uint32(j), 1024, s)
				b := make([]byte, 4)
				sim.CopyDtoH(b, p)
				if b[0] != byte(j) {
					t.Errorf("read %d, want %d", b[0], j)
				}
				sim.Free(p)
			}
		}()
	}
	wg.Wait()
}

// TestSimThreads: the simulation refuses what the driver refuses about
// threads: a goroutine on a thread where the context is not current (it
// neither opened the device nor called BindThread) gets
// CUDA_ERROR_INVALID_CONTEXT, for device calls and handle calls alike,
// and BindThread makes its calls succeed. A Guest simulation, like
// OpenGuest's driver, accepts any thread.
func TestSimThreads(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the simulation tells threads apart on Linux only")
	}
	sim := openSim(t)
	st, err := sim.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	p, err := sim.Alloc(64)
	if err != nil {
		t.Fatal(err)
	}
	calls := map[string]func() error{
		"Alloc":              func() error { _, err := sim.Alloc(64); return err },
		"CopyDtoH":           func() error { return sim.CopyDtoH(make([]byte, 4), p) },
		"NewStream":          func() error { _, err := sim.NewStream(); return err },
		"Stream.Synchronize": st.Synchronize,
		"MemGetInfo":         func() error { _, _, err := sim.MemGetInfo(); return err },
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // a thread of its own, never the test's
		defer runtime.UnlockOSThread()
		for name, call := range calls {
			if err := call(); !errors.Is(err, cuda.ErrorInvalidContext) {
				t.Errorf("%s from an unbound thread: %v, want CUDA_ERROR_INVALID_CONTEXT", name, err)
			}
		}
		if err := sim.BindThread(); err != nil {
			t.Error(err)
			return
		}
		for name, call := range calls {
			if err := call(); err != nil {
				t.Errorf("%s after BindThread: %v", name, err)
			}
		}
	}()
	<-done

	guest, err := cuda.OpenSim(cuda.SimConfig{Guest: true})
	if err != nil {
		t.Fatal(err)
	}
	defer guest.Close()
	errc := make(chan error)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		_, err := guest.Alloc(64)
		errc <- err
	}()
	if err := <-errc; err != nil {
		t.Errorf("a guest simulation refused another thread: %v", err)
	}
}

// TestSimThreadLocalCapture: as on the driver, a thread-local capture
// forbids unsafe calls (Alloc) on the thread that began it only, a global
// one on every thread.
func TestSimThreadLocalCapture(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the simulation tells threads apart on Linux only")
	}
	sim := openSim(t)
	other := func() error { // Alloc from another bound thread
		errc := make(chan error)
		go func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			if err := sim.BindThread(); err != nil {
				errc <- err
				return
			}
			_, err := sim.Alloc(64)
			errc <- err
		}()
		return <-errc
	}
	for _, tc := range []struct {
		mode      cuda.CaptureMode
		otherFail bool
	}{{cuda.CaptureModeThreadLocal, false}, {cuda.CaptureModeGlobal, true}} {
		st, err := sim.NewStream()
		if err != nil {
			t.Fatal(err)
		}
		if err := sim.BeginCapture(st, tc.mode); err != nil {
			t.Fatal(err)
		}
		if err := other(); (err != nil) != tc.otherFail || (err != nil && !errors.Is(err, cuda.ErrorStreamCaptureUnsupported)) {
			t.Errorf("mode %v: Alloc on another thread: %v, want failure %v", tc.mode, err, tc.otherFail)
		}
		if _, err := sim.Alloc(64); !errors.Is(err, cuda.ErrorStreamCaptureUnsupported) {
			t.Errorf("mode %v: Alloc on the capturing thread: %v, want CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", tc.mode, err)
		}
		sim.EndCapture(st) // invalidated: an error, and the capture is over
	}
}

// The simulation reports the multiprocessor count it was given (132, an
// H100 SXM or H200, by default), so that launch shapes sized by the device
// can be tested for other devices; a negative count is refused.
func TestSimMultiprocessors(t *testing.T) {
	for _, tc := range []struct{ give, want int }{{0, 132}, {108, 108}} {
		sim, err := cuda.OpenSim(cuda.SimConfig{Multiprocessors: tc.give})
		if err != nil {
			t.Fatal(err)
		}
		got, err := sim.Multiprocessors()
		sim.Close()
		if err != nil || got != tc.want {
			t.Errorf("Multiprocessors %d: got %d, %v; want %d", tc.give, got, err, tc.want)
		}
	}
	if sim, err := cuda.OpenSim(cuda.SimConfig{Multiprocessors: -1}); err == nil {
		sim.Close()
		t.Error("OpenSim with -1 multiprocessors: no error")
	}
}

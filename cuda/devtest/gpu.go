package devtest

import (
	"os"
	"sync"
	"testing"

	"github.com/arenaplan/arenaplan/cuda"
)

// The driver, opened once per test binary and closed by Main.
var gpu struct {
	once sync.Once
	dev  *cuda.Driver
	err  error
}

// GPU returns the driver bound to the calling goroutine's thread, or
// skips the test.
func GPU(t testing.TB) *Env {
	t.Helper()
	gpu.once.Do(func() { gpu.dev, gpu.err = cuda.Open(0) })
	if gpu.err != nil {
		t.Skipf("no CUDA device: %v", gpu.err)
	}
	BindGPU(t)
	e := &Env{Dev: gpu.dev}
	e.load(t)
	t.Cleanup(func() { e.Mod.Close() })
	return e
}

// BindGPU binds the driver's context to the calling goroutine's thread:
// every subtest runs on a goroutine of its own.
func BindGPU(t testing.TB) {
	t.Helper()
	if err := gpu.dev.BindThread(); err != nil {
		t.Fatal(err)
	}
}

// Main runs a package's tests and then closes the driver if GPU opened
// it: the package's TestMain.
func Main(m *testing.M) {
	code := m.Run()
	if gpu.dev != nil {
		gpu.dev.Close()
	}
	os.Exit(code)
}

package spill

import (
	"fmt"
	"testing"

	"github.com/arenaplan/arenaplan/cuda/devtest"
)

// The tests in this file run on the CUDA driver when cuda.Open(0)
// succeeds and skip with a message otherwise. Build them here and run them
// on a GPU machine:
//
//	CGO_ENABLED=0 go test -c -o .dev/spill.test ./spill
//	.dev/spill.test -test.run 'GPU' -test.v

func TestMain(m *testing.M) { devtest.Main(m) }

// TestGPUSpill runs the spillover allocator's capture cases, pools and
// growth inside a global-mode capture on the driver: the same code walks
// the driver's capture graph.
func TestGPUSpill(t *testing.T) {
	e := devtest.GPU(t)
	for _, reuse := range []bool{true, false} {
		for _, cc := range captureCases {
			t.Run(fmt.Sprintf("%s/reuse=%v", cc.name, reuse), func(t *testing.T) {
				devtest.BindGPU(t)
				runCaptureCase(t, e, cc.run, cc.reuse, cc.off, reuse)
			})
		}
	}
	t.Run("private-pools", func(t *testing.T) { devtest.BindGPU(t); testPrivatePools(t, e) })
	t.Run("grow-in-capture", func(t *testing.T) { devtest.BindGPU(t); testGrowInCapture(t, e) })
	t.Run("capture-walk-cost", func(t *testing.T) {
		devtest.BindGPU(t)
		for _, n := range []int{256, 2048} {
			for _, mode := range []string{"off", "on", "fresh"} {
				d, st := captureSteps(t, e, n, mode)
				t.Logf("SPILL capture n=%d reuse=%s ns_per_alloc=%d nodes_visited=%d reused=%d mapped_MiB=%d",
					n, mode, d.Nanoseconds()/int64(n), st.NodesVisited, st.CaptureReuses, st.PeakMapped>>20)
			}
		}
	})
}

package tracegen

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/arenaplan/arenaplan/lifetime"
)

// WindowOptions shape a sliding-window trace: buffer i lives for Live
// consecutive steps from step i, so that Live buffers are live at every
// step but the first and last few, each of a size drawn uniformly from
// [MinSize, MaxSize] and rounded up to 256 bytes. It is the shape of a
// pipeline that keeps its last few stages' outputs (a rolling cache of
// activations, a ring of prefetched blocks) with sizes that do not
// repeat: the peak of live bytes is easy to compute and hard to reach,
// since each new buffer must fit in one piece of what the oldest left.
// The zero value of every field but Buffers picks the default.
type WindowOptions struct {
	Buffers int    // how many buffers (required, > 0)
	Live    int    // steps each buffer lives (default 4)
	MinSize int64  // default 1 KiB
	MaxSize int64  // default 1 MiB
	Seed    uint64 // the random seed: the same options give the same trace
	// LogUniform draws sizes uniformly on a log scale instead, so that
	// small buffers are as common as large ones in every octave.
	LogUniform bool
}

// Window draws a sliding-window trace (see WindowOptions).
func Window(opt WindowOptions) (*lifetime.Trace, error) {
	if opt.Buffers <= 0 {
		return nil, fmt.Errorf("tracegen: %d buffers: need at least one", opt.Buffers)
	}
	if opt.Live <= 0 {
		opt.Live = 4
	}
	if opt.MinSize <= 0 {
		opt.MinSize = 1 << 10
	}
	if opt.MaxSize <= 0 {
		opt.MaxSize = 1 << 20
	}
	if opt.MaxSize < opt.MinSize {
		return nil, fmt.Errorf("tracegen: sizes from %d to %d: the largest is below the smallest", opt.MinSize, opt.MaxSize)
	}
	rng := rand.New(rand.NewPCG(opt.Seed, 0x77696e646f77))
	t := &lifetime.Trace{Name: fmt.Sprintf("window-%d-live%d-seed%d", opt.Buffers, opt.Live, opt.Seed)}
	t.Buffers = make([]lifetime.Buffer, opt.Buffers)
	for i := range t.Buffers {
		size := opt.MinSize + rng.Int64N(opt.MaxSize-opt.MinSize+1)
		if opt.LogUniform {
			size = int64(float64(opt.MinSize) * math.Pow(float64(opt.MaxSize)/float64(opt.MinSize), rng.Float64()))
		}
		size = (size + 255) / 256 * 256
		t.Buffers[i] = lifetime.Buffer{
			ID: lifetime.ID(i), Name: fmt.Sprintf("w%d", i), Size: size,
			Start: int64(i), End: int64(i + opt.Live),
		}
	}
	return t, nil
}

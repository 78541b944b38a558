package bridge

import (
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/arenaplan/arenaplan/cuda"
	"github.com/arenaplan/arenaplan/lifetime"
)

// BenchmarkEagerReplay replays the steps PyTorch recorded of real models
// (../shared/data/torch/*.pickle) as eager steps through the bridge on
// the simulated device: the blocks the step found allocated and left
// alone (weights, optimizer state) first, then every buffer of the step
// allocated at its start and freed at its end, three steps one after
// another. It reports the spill's peak mapped bytes (MiB-ours) beside
// what PyTorch's caching allocator reserved at its peak during the same
// step (MiB-torch, from the snapshot's segments, with what it had cached
// before the step) and their ratio (x-torch), and against the step's peak
// of live bytes with the kept blocks (x-live).
func BenchmarkEagerReplay(b *testing.B) {
	dir := filepath.Join("..", "..", "shared", "data", "torch")
	files, _ := filepath.Glob(filepath.Join(dir, "*.pickle"))
	if len(files) == 0 {
		b.Skipf("no recorded steps under %s (the shared data is absent)", dir)
	}
	for _, path := range files {
		ts, err := lifetime.Load(path, "torch")
		if err != nil {
			b.Fatal(err)
		}
		tr := ts[0]
		if tr.Torch == nil || !tr.Torch.HasSegments {
			continue
		}
		b.Run(strings.TrimSuffix(filepath.Base(path), ".pickle"), func(b *testing.B) {
			var peak uint64
			for b.Loop() {
				peak = replaySteps(b, tr, 3)
			}
			var kept int64
			for _, n := range tr.Torch.Kept {
				kept += n
			}
			lb, _ := tr.LowerBound(512)
			b.ReportMetric(float64(peak)/(1<<20), "MiB-ours")
			b.ReportMetric(float64(tr.Torch.ReservedPeak)/(1<<20), "MiB-torch")
			b.ReportMetric(float64(peak)/float64(tr.Torch.ReservedPeak), "x-torch")
			b.ReportMetric(float64(peak)/float64(lb+kept), "x-live")
		})
	}
}

// replaySteps allocates trace's kept blocks, runs its allocations and
// frees steps times on a new simulated bridge, one stream, and returns the
// spill's peak mapped bytes.
func replaySteps(tb testing.TB, tr *lifetime.Trace, steps int) uint64 {
	tb.Helper()
	b := New(Config{Sim: true, SimMemory: 64 << 30, SpillAddressSpace: 64 << 30})
	defer b.Close()
	for _, n := range tr.Torch.Kept {
		if _, err := b.Alloc(uint64(n), 0, 0); err != nil {
			tb.Fatal(err)
		}
	}
	type event struct {
		t    int64
		free bool
		i    int
	}
	evs := make([]event, 0, 2*len(tr.Buffers))
	for i, buf := range tr.Buffers {
		evs = append(evs, event{buf.Start, false, i}, event{buf.End, true, i})
	}
	// At one time, frees first: a buffer's end is half-open.
	sort.Slice(evs, func(x, y int) bool {
		if evs[x].t != evs[y].t {
			return evs[x].t < evs[y].t
		}
		return evs[x].free && !evs[y].free
	})
	ptrs := make([]cuda.DevicePtr, len(tr.Buffers))
	for range steps {
		for _, e := range evs {
			if e.free {
				if err := b.Free(ptrs[e.i], 0); err != nil {
					tb.Fatal(err)
				}
				continue
			}
			p, err := b.Alloc(uint64(tr.Buffers[e.i].Size), 0, 0)
			if err != nil {
				tb.Fatal(err)
			}
			ptrs[e.i] = p
		}
	}
	st, err := b.Stats(0)
	if err != nil {
		tb.Fatal(err)
	}
	return st.Spill.PeakMapped
}

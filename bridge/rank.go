package bridge

import (
	"fmt"

	"github.com/arenaplan/arenaplan/plans"
)

// workloadName names a PyTorch step in plan files.
const workloadName = plans.TorchStep

// rank returns the process's rank and world size (Config.Rank and
// WorldSize; a single process is rank 0 of 1).
func (b *Bridge) rank() (rank, world int64) {
	return int64(b.cfg.Rank), int64(max(b.cfg.WorldSize, 1))
}

// workload describes a step of this process in a plan file: which rank of
// how many made it (a tensor-parallel rank's step holds its shard's
// tensors: another rank's plan would fit it by chance only).
func (b *Bridge) workload() *plans.Workload {
	r, w := b.rank()
	return &plans.Workload{Name: workloadName, Shape: []plans.Dim{{Name: "rank", Value: r}, {Name: "world_size", Value: w}}}
}

// checkRank refuses a plan file made by another rank or world size. Files
// that do not say (made by one process) count as rank 0 of 1.
func (b *Bridge) checkRank(path string, w *plans.Workload) error {
	fr, fw := int64(0), int64(1)
	if w != nil {
		if v, ok := w.Dim("rank"); ok {
			fr = v
		}
		if v, ok := w.Dim("world_size"); ok {
			fw = v
		}
	}
	r, world := b.rank()
	if fr != r || fw != world {
		return fmt.Errorf("plan %s was made by rank %d of %d; this process is rank %d of %d", path, fr, fw, r, world)
	}
	return nil
}

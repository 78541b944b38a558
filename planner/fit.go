package planner

import (
	"fmt"

	"github.com/arenaplan/arenaplan/lifetime"
)

// SameRun says how run differs from planned, the trace a plan was made
// for, or nil when a plan of planned holds run as it is: as many buffers,
// each with the same tag and lifetime, and the same size (exact) or no
// larger. The Go executor and the PyTorch bridge both ask it whether a
// later run of a step still fits its plan.
func SameRun(planned, run *lifetime.Trace, exact bool) error {
	for i := range min(len(planned.Buffers), len(run.Buffers)) {
		p, r := &planned.Buffers[i], &run.Buffers[i]
		switch {
		case p.Tag != r.Tag:
			return fmt.Errorf("buffer %d (%s) is tagged %q in the plan, %q in this run", i, r.Name, p.Tag, r.Tag)
		case p.Start != r.Start || p.End != r.End:
			return fmt.Errorf("buffer %d (%s) lives [%d, %d) in the plan, [%d, %d) in this run", i, r.Name, p.Start, p.End, r.Start, r.End)
		case r.Size > p.Size:
			return fmt.Errorf("buffer %d (%s) grew from %d to %d bytes: the plan no longer holds it", i, r.Name, p.Size, r.Size)
		case exact && r.Size != p.Size:
			return fmt.Errorf("buffer %d (%s) is %d bytes in the plan, %d in this run", i, r.Name, p.Size, r.Size)
		}
	}
	if len(planned.Buffers) != len(run.Buffers) {
		return fmt.Errorf("the plan has %d buffers, this run %d", len(planned.Buffers), len(run.Buffers))
	}
	return nil
}

// Fits says whether plan p, made for planned, holds run: SameRun (sizes
// may shrink), and p passes Check on run.
func Fits(planned, run *lifetime.Trace, p *Plan) error {
	if err := SameRun(planned, run, false); err != nil {
		return err
	}
	if err := Check(run, p); err != nil {
		return fmt.Errorf("plan check failed: %w", err)
	}
	return nil
}

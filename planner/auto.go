package planner

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/arenaplan/arenaplan/lifetime"
)

// bestOf (the first "auto", now replaced by the anytime search in
// anytime.go) runs the named algorithms in turn and returns the plan with the
// smallest arena, its Algo set to the winner's name. Plans that Check
// rejects are dropped; it fails only when none is left. It stops early when
// ctx is done or a plan reaches the lower bound.
func bestOf(ctx context.Context, t *lifetime.Trace, opt Options, names []string) (*Plan, error) {
	start := time.Now()
	lb, _ := t.LowerBound(opt.Align)
	var (
		best *Plan
		errs []error
	)
	for _, name := range names {
		if ctx.Err() != nil && best != nil {
			break
		}
		f, ok := registry[name]
		if !ok {
			errs = append(errs, fmt.Errorf("unknown algorithm %q", name))
			continue
		}
		p, err := f(ctx, t, opt)
		if err == nil {
			p.Algo = name
			p.Align = opt.Align
			p.Arena = ArenaSize(t, p.Offsets, opt.Align)
			err = Check(t, p)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
			continue
		}
		if best == nil || p.Arena < best.Arena {
			best = p
			best.ToBest = time.Since(start)
		}
		if best.Arena <= lb {
			break
		}
	}
	if best == nil {
		if len(errs) == 0 {
			return nil, fmt.Errorf("auto: no algorithm to run")
		}
		return nil, fmt.Errorf("auto: %w", errors.Join(errs...))
	}
	return best, nil
}

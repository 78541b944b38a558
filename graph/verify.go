package graph

import (
	"fmt"

	"github.com/arenaplan/arenaplan/lifetime"
	"github.com/arenaplan/arenaplan/planner"
)

// FingerprintError refuses a plan made for another workload.
type FingerprintError struct {
	Workload string      // the workload about to run, with its shape
	Have     Fingerprint // the workload's fingerprint
	Plan     Fingerprint // the fingerprint recorded with the plan
	PlanFor  string      // the workload the plan was made for
}

func (e *FingerprintError) Error() string {
	return fmt.Sprintf("graph: plan was made for workload %s (fingerprint %s), not for %s (fingerprint %s)",
		e.PlanFor, e.Plan.Short(), e.Workload, e.Have.Short())
}

// AlignError refuses a plan whose alignment is below what the kernels need.
type AlignError struct {
	Workload   string
	Plan, Need int64
}

func (e *AlignError) Error() string {
	return fmt.Sprintf("graph: plan alignment %d bytes is below the %d bytes the kernels of %s need", e.Plan, e.Need, e.Workload)
}

// VerifyPlan checks that a plan read from a file fits graph g: the plan
// was recorded for a workload with g's fingerprint (planFP, planFor as the
// file names it), its alignment meets g's, and its trace is g's dry run.
func VerifyPlan(g *Graph, planFor string, planFP Fingerprint, t *lifetime.Trace, p *planner.Plan) error {
	if fp := g.Fingerprint(); fp != planFP {
		return &FingerprintError{Workload: g.Label(), Have: fp, Plan: planFP, PlanFor: planFor}
	}
	if p.Align < g.Align {
		return &AlignError{Workload: g.Label(), Plan: p.Align, Need: g.Align}
	}
	d, err := g.DryRun()
	if err != nil {
		return err
	}
	if a, b := d.Trace.Fingerprint(), t.Fingerprint(); a != b {
		return fmt.Errorf("graph: the plan's trace (fingerprint %x) is not the dry run of %s (fingerprint %x)", b[:8], g.Label(), a[:8])
	}
	return nil
}

package bridge

import (
	"context"
	"fmt"
	"time"

	"github.com/arenaplan/arenaplan/lifetime"
	"github.com/arenaplan/arenaplan/planner"
)

// aheadPlan is a member's plan made in the background (Family.PlanAhead).
type aheadPlan struct {
	trace  *lifetime.Trace
	budget time.Duration
	cancel context.CancelFunc
	done   chan struct{}
	plan   *planner.Plan // once done; nil where planning failed
}

// PlanAhead starts planning member s's finished recording in the
// background ("auto" within budget; 0 means planner.DefaultBudget), so
// that the plan is made while the program records the family's other
// members, and Plan with the same budget takes it instead of planning s
// again (it waits for it there). Its goal (planner.Options.Goal) is the
// largest peak of the members planned ahead so far: record the largest
// member first, as engines capture, and the others stop at their first
// plan under it, as in Plan. The plan is checked with the family's in Plan.
// Close stops a plan still running. Costs one goroutine per call; an
// error only for a step that is not a recorded member of an unplanned
// family.
func (f *Family) PlanAhead(s *Step, budget time.Duration) error {
	if err := checkBudget(fmt.Sprintf("family %d (%s): PlanAhead", f.id, f.name), budget); err != nil {
		return err
	}
	d := f.d
	d.mu.Lock()
	t := s.trace
	recorded := s.fam == f && s.state == stepIdle && t != nil
	d.mu.Unlock()
	var peak int64
	if recorded { // outside the lock: allocations wait on it
		peak, _ = t.LowerBound(planner.DefaultAlign)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	var why string
	switch {
	case f.chained || f.plan != nil || f.closing:
		why = "needs a family not planned yet, not a chain, not closed"
	case s.fam != f:
		why = fmt.Sprintf("step %d is not a member", s.id)
	case !recorded || s.state != stepIdle || s.trace != t:
		why = fmt.Sprintf("member %q needs a finished recording", s.name)
	case f.ahead[s] != nil:
		why = fmt.Sprintf("member %q is planned ahead already", s.name)
	}
	if why != "" {
		return f.errorf("PlanAhead: %s", why)
	}
	f.aheadGoal = max(f.aheadGoal, peak)
	goal := f.aheadGoal
	ctx, cancel := context.WithCancel(context.Background())
	a := &aheadPlan{trace: s.trace, budget: budget, cancel: cancel, done: make(chan struct{})}
	if f.ahead == nil {
		f.ahead = map[*Step]*aheadPlan{}
	}
	f.ahead[s] = a
	go func() {
		defer close(a.done)
		// A goroutine of its own: a panic here would end the program
		// whose allocator this is. Recovered, the plan is not made, and
		// Plan plans the member itself, where errors reach the caller.
		defer func() { _ = recover() }()
		p, err := planner.Run(ctx, planner.Auto, a.trace, planner.Options{Budget: budget, Goal: goal})
		if err == nil && ctx.Err() == nil {
			a.plan = p
		}
	}()
	return nil
}

// takeAhead returns members with the plans made ahead for them with
// budget, waiting for those still running, and stops and forgets every
// plan made ahead (those of another budget are not used).
func (f *Family) takeAhead(members []planner.Member, budget time.Duration) []planner.Member {
	f.d.mu.Lock()
	ahead := f.ahead
	f.ahead = nil
	steps := append([]*Step(nil), f.members...)
	f.d.mu.Unlock()
	for i, s := range steps {
		a := ahead[s]
		if a == nil {
			continue
		}
		use := i < len(members) && a.budget == budget && a.trace == members[i].Trace
		if !use {
			a.cancel()
		}
		<-a.done
		a.cancel()
		if use && a.plan != nil {
			members[i].Ahead = a.plan
		}
	}
	return members
}

// stopAhead stops the plans made ahead and waits for them (Close).
func (f *Family) stopAhead() {
	f.d.mu.Lock()
	ahead := f.ahead
	f.ahead = nil
	f.d.mu.Unlock()
	for _, a := range ahead {
		a.cancel()
		<-a.done
	}
}

package bridge

// A step's plan: planning, replanning a diverged run, plan files, and the
// arena that serves it.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/arenaplan/arenaplan/arena"
	"github.com/arenaplan/arenaplan/cuda"
	"github.com/arenaplan/arenaplan/lifetime"
	"github.com/arenaplan/arenaplan/planner"
	"github.com/arenaplan/arenaplan/plans"
	"github.com/google/btree"
)

// Plan plans the recorded run at the lower bound ("auto" within budget;
// 0 means planner.DefaultBudget), checks the plan and maps its arena.
func (s *Step) Plan(budget time.Duration) error {
	if err := checkBudget(fmt.Sprintf("step %d (%s): Plan", s.id, s.name), budget); err != nil {
		return err
	}
	s.d.mu.Lock()
	t := s.trace
	ok := s.state == stepIdle && s.plan == nil && !s.closing
	s.d.mu.Unlock()
	if !ok || t == nil {
		return s.errorf("Plan needs a finished recording and no plan yet")
	}
	if s.fam != nil {
		return s.errorf("is a member of family %d: plan the family", s.fam.id)
	}
	p, _, err := planner.RunByTag(context.Background(), planner.Auto, t, planner.Options{Budget: budget})
	if err != nil {
		return fmt.Errorf("bridge: step %d (%s): planning: %w", s.id, s.name, err)
	}
	return s.install(t, p, "")
}

// Replan plans the step again from its last served run when that run
// diverged from the plan: a capture whose allocations differ from the
// eager run the plan was recorded from (code that tests whether it is
// being captured) is itself a recording of what every later capture
// makes. Destroy the graph captured in that run first: Replan releases
// the step's capture pools and replaces its plan. Buffers of the old plan
// still live (outputs the program holds, such as a training step's
// gradients) stay where they are until freed, and the new plan is served
// around them; the arena is then kept, and the new plan must fit in it. A
// family member's new plan must fit in the family's arena. When it does
// not fit, Replan fails and the step keeps its plan. Not for steps whose
// plan came from a file (their plan is what the file says).
func (s *Step) Replan(budget time.Duration) error {
	if err := checkBudget(fmt.Sprintf("step %d (%s): Replan", s.id, s.name), budget); err != nil {
		return err
	}
	d := s.d
	d.mu.Lock()
	t, err := s.replanReady()
	around := s.around
	var goal int64 // a member's plan fits its family's arena as it is
	if s.fam != nil {
		goal = arenaGoal(s.fam.plan)
	}
	d.mu.Unlock()
	if err != nil {
		return err
	}
	p, err := planAround(t, around, budget, goal) // a family member planned around held memory keeps leaving it alone
	if err != nil {
		return fmt.Errorf("bridge: step %d (%s): planning its served run: %w", s.id, s.name, err)
	}
	if s.fam != nil {
		if len(around) > 0 {
			s.fam.beforeGrow(p.Arena) // only a member planned around held memory grows the arena
		}
		return s.fam.replan(s, t, p)
	}
	d.mu.Lock()
	if _, err := s.replanReady(); err != nil {
		d.mu.Unlock()
		return err
	}
	restore, err := makeCurrent(d.dev)
	if err != nil {
		d.mu.Unlock()
		return err
	}
	if s.live.Len() > 0 {
		// Outputs are live in the arena. Plan inside it if the new plan
		// fits; else in a new arena, the old one retired until its last
		// orphan is freed.
		defer restore()
		defer d.mu.Unlock()
		if err := s.dropCaptures(); err != nil {
			return fmt.Errorf("bridge: step %d (%s): replan: %w", s.id, s.name, err)
		}
		if l, err := s.ar.Place(t, p); err == nil {
			s.replace(l, nil)
			return nil
		}
		d.notePeak()
		l, err := arenaOn(d, p.Arena, func(dev cuda.Device) (*arena.Layout, error) { return arena.NewLayout(dev, t, p) })
		if err != nil {
			return fmt.Errorf("bridge: step %d (%s): replan: arena of %s (%d of its buffers still live in the old one of %s): %w",
				s.id, s.name, fmtBytes(uint64(p.Arena)), s.live.Len(), fmtBytes(uint64(s.ar.Size())), err)
		}
		old := &retired{ar: s.ar, live: s.live.Len()}
		s.retired = append(s.retired, old)
		s.replace(l, old)
		return nil
	}
	errs := []error{s.dropCaptures()}
	old := s.ar
	s.ar, s.addrs, s.plan = nil, nil, nil
	s.replanned()
	if old != nil {
		errs = append(errs, old.Close())
	}
	restore()
	d.mu.Unlock()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("bridge: step %d (%s): replan: %w", s.id, s.name, err)
	}
	return s.install(t, p, "")
}

// replace gives the step the layout l of its new plan; d.mu is held.
// Buffers of the old plan still live become
// orphans: their frees are bookkeeping. In the same arena (old is nil)
// their ranges stay taken until they are freed; in a retired arena (old)
// that arena closes once the last of them is freed.
func (s *Step) replace(l *arena.Layout, old *retired) {
	d := s.d
	for k, live := range s.isLive {
		if live {
			d.planned[s.addrs[k]] = slot{s, orphan, old}
		}
	}
	spans := s.live
	if old != nil {
		spans = nil // the new arena is clear of them
	}
	s.setPlan(l, "")
	if spans != nil {
		s.live = spans
	}
	s.replanned()
}

// retired is an arena a Replan moved away from while some of its buffers
// were live: it closes when the last of them is freed.
type retired struct {
	ar   *arena.Arena
	live int
}

// releaseOrphan: the orphan at p (of retired arena old, or of the step's
// own arena when old is nil) was freed; d.mu is held.
func (s *Step) releaseOrphan(p cuda.DevicePtr, old *retired) error {
	if old == nil {
		s.live.Delete(span{lo: uint64(p)})
		if s.closing && s.live.Len() == 0 {
			return s.closeArena()
		}
		return nil
	}
	if old.live--; old.live > 0 {
		return nil
	}
	s.retired = slices.DeleteFunc(s.retired, func(r *retired) bool { return r == old })
	return s.d.closeArena(old.ar)
}

// replanned counts a replan: the counters start again under the new plan;
// d.mu is held.
func (s *Step) replanned() {
	s.replans++
	s.replanReason = fmt.Sprintf("%d divergences, the first: %s", s.lastRunDivergences, s.firstDivergence)
	s.rerun = nil
	s.runs, s.served, s.divergences, s.lastRunDivergences, s.firstDivergence = 0, 0, 0, 0, ""
}

// replanReady returns the served run to plan from, or why Replan cannot
// run now; d.mu is held.
func (s *Step) replanReady() (*lifetime.Trace, error) {
	switch {
	case s.closing:
		return nil, s.errorf("closed")
	case s.state != stepIdle:
		return nil, s.errorf("Replan while %s", s.state)
	case s.loaded != "":
		return nil, s.errorf("its plan came from %s: Replan plans only what the step recorded", s.loaded)
	case s.rerun == nil:
		return nil, s.errorf("Replan needs a served run that diverged from the plan (the last one did not)")
	}
	return s.rerun, nil
}

// DropCaptures gives back the spill pools of the step's earlier captures,
// so that a member captured again on its plan (its parameters replaced by
// others of the same shapes) holds no pool per capture: destroy the graphs
// captured from it first. It refuses while a run is underway.
func (s *Step) DropCaptures() error {
	d := s.d
	d.mu.Lock()
	defer d.mu.Unlock()
	if s.state != stepIdle {
		return s.errorf("DropCaptures while %s", s.state)
	}
	restore, err := makeCurrent(d.dev)
	if err != nil {
		return err
	}
	defer restore()
	if err := s.dropCaptures(); err != nil {
		return fmt.Errorf("bridge: step %d (%s): dropping its captures: %w", s.id, s.name, err)
	}
	return nil
}

// dropCaptures releases the step's capture pools (the graphs captured
// through them are destroyed); d.mu is held and the device current.
func (s *Step) dropCaptures() error {
	var errs []error
	for _, c := range s.captures {
		errs = append(errs, c.Release())
	}
	s.captures = nil
	if s.pool != nil {
		errs = append(errs, s.pool.Release())
		s.pool = nil
	}
	return errors.Join(errs...)
}

// Load takes a plan from a plan file (plans.Load verifies it) instead of
// recording one. The first run served from it must make the allocations
// the plan was made for, or End refuses the plan.
func (s *Step) Load(path string) error {
	if s.fam != nil {
		return s.errorf("is a member of family %d: load the family's plan", s.fam.id)
	}
	f, err := plans.Load(path)
	if err != nil {
		return fmt.Errorf("bridge: step %d (%s): %w", s.id, s.name, err)
	}
	if err := s.b.checkRank(path, f.Workload); err != nil {
		return s.errorf("%v", err)
	}
	s.d.mu.Lock()
	ok := s.state == stepIdle && s.plan == nil && !s.closing
	s.d.mu.Unlock()
	if !ok {
		return s.errorf("Load needs an idle step without a plan")
	}
	return s.install(f.Trace, f.Plan, path)
}

// Save writes the step's trace and plan to path.
func (s *Step) Save(path string) error {
	s.d.mu.Lock()
	t, p := s.trace, s.plan
	s.d.mu.Unlock()
	if p == nil {
		return s.errorf("has no plan to save")
	}
	f := &plans.File{Trace: t, Plan: p, Workload: s.b.workload()}
	if err := plans.Save(path, f); err != nil {
		return fmt.Errorf("bridge: step %d (%s): %w", s.id, s.name, err)
	}
	return nil
}

// install maps the arena for plan p of trace t (arena.NewLayout: checked,
// every region dropped on Pause, since a replay rewrites it all).
func (s *Step) install(t *lifetime.Trace, p *planner.Plan, from string) error {
	d := s.d
	restore, err := makeCurrent(d.dev)
	if err != nil {
		return err
	}
	defer restore()
	d.beforeArena()
	l, err := arenaOn(d, p.Arena, func(dev cuda.Device) (*arena.Layout, error) { return arena.NewLayout(dev, t, p) })
	if err != nil {
		return fmt.Errorf("bridge: step %d (%s): arena of %s for %d buffers: %w", s.id, s.name, fmtBytes(uint64(p.Arena)), len(t.Buffers), err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	s.setPlan(l, from)
	return nil
}

// setPlan serves the step from layout l (its arena may be shared: a
// family's, or the one a Replan kept); d.mu is held.
func (s *Step) setPlan(l *arena.Layout, from string) {
	s.trace, s.plan, s.loaded, s.ar, s.addrs, s.need = l.Trace(), l.Plan(), from, l.Arena(), l.Addrs(), l.Needs()
	s.live = btree.NewG[span](16, lessSpan)
	s.isLive = make([]bool, len(s.addrs))
	s.taken = make([]bool, len(s.addrs))
}

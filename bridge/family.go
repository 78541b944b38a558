package bridge

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
)

// Family is several steps (one model's decode step at batch sizes 1, 2, 4,
// ..., say) planned jointly into one arena (planner.PlanFamily): the
// arena is as large as the largest member needs, and the smaller members
// cost nothing more. Members replay one at a time, never concurrently:
// their buffers overlap by design, so a member's outputs are overwritten
// by the next run of any member. Tensors the members share (weights,
// static inputs at the largest size, a KV cache) are made outside the
// steps and served by the spill allocator, at the same addresses for
// every member.
//
// Each member is a Step: Record and End it (inside a capture for graphs),
// then Plan the family (or Load a family plan file), then Serve each
// member. A Family's methods are safe for concurrent use with the
// Bridge's allocation calls; call them from one goroutine at a time.
type Family struct {
	b    *Bridge
	d    *Device
	id   int
	name string

	// Guarded by d.mu.
	members []*Step
	plan    *planner.GroupPlan

	chained bool                       // a chain (see NewChain)
	handed  map[cuda.DevicePtr]handOff // recorded members' outputs, by address
	frees   []chainFree                // hand-offs freed by later members' recordings
	ar      *arena.Arena
	loaded  string
	closing bool
	ahead   map[*Step]*aheadPlan // members planned ahead (PlanAhead), until Plan
	// aheadGoal is the largest peak of the members planned ahead.
	aheadGoal int64
}

// NewFamily makes an empty family on device ordinal.
func (b *Bridge) NewFamily(ordinal int, name string) (*Family, error) {
	return newHandle(b, ordinal, b.families, func(d *Device, id int) *Family { return &Family{b: b, d: d, id: id, name: name} })
}

// Family returns the family with the given ID.
func (b *Bridge) Family(id int) (*Family, error) { return lookup(b, b.families, "family", id) }

// ID is the family's handle for the C ABI.
func (f *Family) ID() int { return f.id }

func (f *Family) errorf(format string, args ...any) error {
	return fmt.Errorf("bridge: family %d (%s): "+format, append([]any{f.id, f.name}, args...)...)
}

// NewMember adds a member step; members are planned in the order they
// were added. A member added to a family already planned (not a chain's)
// is recorded, then planned into the family's arena with PlanMember.
//
// A name must differ from every other member's: plans and plan files name
// members, so a repeated name is refused here (ErrDuplicateMember) rather
// than by every later plan of the family.
func (f *Family) NewMember(name string) (*Step, error) {
	f.d.mu.Lock()
	bad := f.closing || (f.plan != nil && f.chained)
	dup := f.memberLocked(name)
	f.d.mu.Unlock()
	if bad {
		return nil, f.errorf("NewMember after Close, or after a chain's Plan")
	}
	if dup >= 0 {
		return nil, f.errorf("member %q: %w (member %d has it)", name, ErrDuplicateMember, dup)
	}
	s, err := f.b.NewStep(f.d.ordinal, name)
	if err != nil {
		return nil, err
	}
	f.d.mu.Lock()
	defer f.d.mu.Unlock()
	s.fam = f
	f.members = append(f.members, s)
	return s, nil
}

// ErrDuplicateMember: a family already has a member of that name.
var ErrDuplicateMember = errors.New("a member of that name exists")

// memberLocked returns the index of the member called name, or -1; d.mu
// is held.
func (f *Family) memberLocked(name string) int {
	for i, m := range f.members {
		if m.name == name {
			return i
		}
	}
	return -1
}

// membersLocked returns the members as planner members, each with its
// trace so far; d.mu is held.
func (f *Family) membersLocked() []planner.Member {
	ms := make([]planner.Member, len(f.members))
	for i, s := range f.members {
		ms[i] = planner.Member{Name: s.name, Trace: s.trace}
	}
	return ms
}

// Members returns the member steps in order.
func (f *Family) Members() []*Step {
	f.d.mu.Lock()
	defer f.d.mu.Unlock()
	return append([]*Step(nil), f.members...)
}

// Plan plans the members' recorded runs into one arena ("auto" within
// budget for each member; 0 means planner.DefaultBudget), checks the
// family plan (planner.CheckFamily) and maps the arena.
func (f *Family) Plan(budget time.Duration) error {
	if err := checkBudget(fmt.Sprintf("family %d (%s): Plan", f.id, f.name), budget); err != nil {
		return err
	}
	if f.chained {
		return f.planChain(budget)
	}
	members, err := f.recorded()
	if err != nil {
		return err
	}
	members = f.takeAhead(members, budget)
	fp, err := planner.PlanFamily(context.Background(), "auto", members, planner.Options{Budget: budget})
	if err != nil {
		return f.errorf("planning: %w", err)
	}
	return f.installFamily(members, fp, "")
}

// recorded returns the members as planner members, each with its trace.
func (f *Family) recorded() ([]planner.Member, error) {
	f.d.mu.Lock()
	defer f.d.mu.Unlock()
	if f.plan != nil || f.closing {
		return nil, f.errorf("Plan after Plan, Load or Close")
	}
	if len(f.members) == 0 {
		return nil, f.errorf("has no members")
	}
	ms := make([]planner.Member, len(f.members))
	for i, s := range f.members {
		if s.state != stepIdle || s.trace == nil {
			return nil, f.errorf("member %q has no finished recording", s.name)
		}
		ms[i] = planner.Member{Name: s.name, Trace: s.trace}
	}
	return ms, nil
}

// Save writes the family's members and plan to a family plan file.
func (f *Family) Save(path string) error {
	f.d.mu.Lock()
	fp := f.plan
	ms := f.membersLocked()
	f.d.mu.Unlock()
	if fp == nil {
		return f.errorf("has no plan to save")
	}
	if f.chained {
		return f.errorf("is a chain: chains are not written to plan files")
	}
	if len(fp.Members) != len(ms) {
		return f.errorf("has a member added since its plan and not planned (PlanMember)")
	}
	ws := make([]*plans.Workload, len(ms))
	for i := range ws {
		ws[i] = f.b.workload()
	}
	if err := plans.SaveFamily(path, &plans.Family{Members: ms, Plan: fp, Workloads: ws}); err != nil {
		return f.errorf("%w", err)
	}
	return nil
}

// Load takes a family plan from a file (plans.LoadFamily verifies it)
// instead of recording: the family must have as many members as the file,
// none recorded, named alike. Each member's first run served from it must
// make the allocations its plan was made for, or that member's End
// refuses the plan.
func (f *Family) Load(path string) error {
	if f.chained {
		return f.errorf("is a chain: chains are not read from plan files")
	}
	ff, err := plans.LoadFamily(path)
	if err != nil {
		return f.errorf("%w", err)
	}
	for i := range ff.Members {
		if err := f.b.checkRank(path, ff.Workload(i)); err != nil {
			return f.errorf("%v", err)
		}
	}
	f.d.mu.Lock()
	n := len(f.members)
	var names []string
	for _, s := range f.members {
		names = append(names, s.name)
		if s.trace != nil {
			f.d.mu.Unlock()
			return f.errorf("Load: member %q has a recording already", s.name)
		}
	}
	f.d.mu.Unlock()
	if n != len(ff.Members) {
		return f.errorf("plan %s was made for another family: it has %d members, this family %d", path, len(ff.Members), n)
	}
	for i, m := range ff.Members {
		if shares(m.Keys) {
			return f.errorf("plan %s shares buffers between members by key, which a PyTorch family never does", path)
		}
		if m.Name != names[i] {
			return f.errorf("plan %s was made for another family: member %d is %q there, %q here", path, i, m.Name, names[i])
		}
	}
	return f.installFamily(ff.Members, ff.Plan, path)
}

func shares(keys []string) bool {
	for _, k := range keys {
		if k != "" {
			return true
		}
	}
	return false
}

// installFamily maps one arena for family plan fp
// (arena.NewFamilyLayout, which checks it) and gives each member its
// layout in it.
func (f *Family) installFamily(ms []planner.Member, fp *planner.GroupPlan, from string) error {
	return f.install(fp, from, func(dev cuda.Device) (*arena.GroupLayout, error) { return arena.NewFamilyLayout(dev, ms, fp) })
}

// install maps the arena of fp with build and gives each member its
// layout in it. Every region is dropped on Pause: a PyTorch family
// shares nothing between its members, and a replay rewrites the rest.
func (f *Family) install(fp *planner.GroupPlan, from string, build func(cuda.Device) (*arena.GroupLayout, error)) error {
	d := f.d
	restore, err := makeCurrent(d.dev)
	if err != nil {
		return err
	}
	defer restore()
	d.beforeArena()
	lay, err := arenaOn(d, fp.Arena, build)
	if err != nil {
		return f.errorf("arena of %s: %w", fmtBytes(uint64(fp.Arena)), err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if f.plan != nil || f.closing {
		lay.Close()
		return f.errorf("planned twice")
	}
	for i, s := range f.members {
		s.setPlan(lay.Members[i], from)
	}
	f.plan, f.ar, f.loaded = fp, lay.Arena, from
	return nil
}

// replan gives member s the plan p of its served run t, inside the
// family arena (Step.Replan).
func (f *Family) replan(s *Step, t *lifetime.Trace, p *planner.Plan) error {
	d := f.d
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, err := s.replanReady(); err != nil {
		return err
	}
	if f.chained {
		return f.errorf("member %q of a chain keeps its plan", s.name)
	}
	if f.plan == nil || f.ar == nil || f.closing {
		return f.errorf("replan of member %q: the family has no arena", s.name)
	}
	if p.Arena > f.plan.Arena {
		// A member planned around held memory grows the arena, as
		// PlanMemberAround does; any other keeps its plan.
		err := errors.New("it keeps its plan")
		if len(s.around) > 0 {
			err = f.growLocked(p.Arena)
		}
		if err != nil {
			return f.errorf("member %q: its served run needs an arena of %s, more than the family's %s: %w",
				s.name, fmtBytes(uint64(p.Arena)), fmtBytes(uint64(f.plan.Arena)), err)
		}
	}
	return f.installMemberLocked(s, slices.Index(f.members, s), t, p, "replanned")
}

// installMemberLocked makes p, a plan of trace t, member i's (s) in the
// family plan: checked with the others' (planner.CheckFamily), placed in
// the arena, the step's capture pools released (its graphs destroyed
// first) and its layout replaced; what names the change in errors. d.mu
// is held.
func (f *Family) installMemberLocked(s *Step, i int, t *lifetime.Trace, p *planner.Plan, what string) error {
	fp := f.plan.WithMember(i, p)
	ms := f.membersLocked()
	ms[i].Trace = t
	if err := planner.CheckFamily(ms, fp); err != nil {
		return f.errorf("member %q %s: %w", s.name, what, err)
	}
	l, err := f.ar.Place(t, p)
	if err != nil {
		return f.errorf("member %q %s: %w", s.name, what, err)
	}
	restore, err := makeCurrent(f.d.dev)
	if err != nil {
		return err
	}
	defer restore()
	if err := s.dropCaptures(); err != nil {
		return f.errorf("member %q: %w", s.name, err)
	}
	s.replace(l, nil)
	f.plan = fp
	return nil
}

// beforeGrow readies the device for the family arena growing to size
// bytes, where it would: what the spill keeps wholly free goes back first,
// as before a new arena (Device.beforeArena). d.mu is not held.
func (f *Family) beforeGrow(size int64) {
	f.d.mu.Lock()
	grows := f.plan != nil && size > f.plan.Arena
	f.d.mu.Unlock()
	if grows {
		f.d.beforeArena()
	}
}

// ErrDoesNotFit says that a member added after Plan needs more memory than
// the family's arena has: plan the family again, with it, instead.
var ErrDoesNotFit = errors.New("does not fit in the family's arena")

// PlanMember plans member s, added after the family was planned and since
// recorded, on its own into the family's arena: the other members keep
// their plans and addresses (their graphs stay valid). Its plan must fit
// in the arena (else ErrDoesNotFit) and pass planner.CheckFamily with the
// others'. A family with buffers its members share cannot grow. When its
// planning or placing fails, the member is closed and leaves the family.
// (PlanMemberAround plans one around memory the program holds, growing
// the arena instead of ErrDoesNotFit.)
func (f *Family) PlanMember(s *Step, budget time.Duration) error {
	return f.planMember(s, budget, nil, "PlanMember")
}

// planMember is PlanMember and PlanMemberAround: the member's plan leaves
// the held ranges alone, and where it needs more than the arena and
// held is not empty, the arena grows in place.
func (f *Family) planMember(s *Step, budget time.Duration, held []Range, op string) (err error) {
	if err := checkBudget(fmt.Sprintf("family %d (%s): %s", f.id, f.name, op), budget); err != nil {
		return err
	}
	d := f.d
	d.mu.Lock()
	i := slices.Index(f.members, s)
	t := s.trace
	var why string
	switch {
	case f.chained || f.plan == nil || f.ar == nil || f.closing:
		why = "needs a planned family, not a chain, not closed"
	case i < 0:
		why = fmt.Sprintf("step %d is not a member", s.id)
	case i != len(f.plan.Members):
		why = fmt.Sprintf("member %q is not the one added after the plan", s.name)
	case s.state != stepIdle || t == nil || s.plan != nil:
		why = fmt.Sprintf("member %q needs a finished recording and no plan", s.name)
	case len(f.plan.Shared) > 0 || f.plan.SharedRegion.Hi > 0:
		why = "its members share buffers: plan the family again"
	}
	ar, goal := f.ar, arenaGoal(f.plan)
	d.mu.Unlock()
	if why != "" {
		return f.errorf("%s: %s", op, why)
	}
	defer func() {
		if err != nil {
			_ = s.Close() // not planned: it leaves the family
		}
	}()
	around := heldOffsets(ar, held)
	p, err := planAround(t, around, budget, goal)
	if err != nil {
		return f.errorf("member %q: planning: %w", s.name, err)
	}
	if len(around) > 0 {
		f.beforeGrow(p.Arena) // the warm-up's and recorded run's cache goes back first
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if p.Arena > f.plan.Arena {
		if len(around) == 0 {
			return f.errorf("member %q needs %s: %w (%s)", s.name, fmtBytes(uint64(p.Arena)), ErrDoesNotFit, fmtBytes(uint64(f.plan.Arena)))
		}
		if err := f.growLocked(p.Arena); err != nil {
			return f.errorf("member %q needs %s around %d held ranges: %w", s.name, fmtBytes(uint64(p.Arena)), len(around), err)
		}
	}
	fp := f.plan.WithAdded(s.name, p)
	ms := f.membersLocked()
	if err := planner.CheckFamily(ms, fp); err != nil {
		return f.errorf("member %q: %w", s.name, err)
	}
	l, err := f.ar.Place(t, p)
	if err != nil {
		return f.errorf("member %q: %w", s.name, err)
	}
	s.setPlan(l, "")
	s.around = around
	f.plan = fp
	return nil
}

// Report describes the family plan: the arena against the largest
// member's lower bound and each member's own figures.
type FamilyReport struct {
	Name       string   `json:"name"`
	Members    []Report `json:"members"`
	Arena      int64    `json:"arena"`
	LowerBound int64    `json:"lower_bound"` // the largest member's
	Ratio      float64  `json:"ratio"`
	ArenaMap   uint64   `json:"arena_mapped"` // as Report.ArenaMapped
	PlanFile   string   `json:"plan_file,omitempty"`
	// Chain: the members run in turn and hand buffers on (NewChain);
	// LowerBound is then the peak of live bytes of their joint timeline.
	Chain bool `json:"chain,omitempty"`
}

// Report returns the family's report.
func (f *Family) Report() FamilyReport {
	ms := f.Members()
	r := FamilyReport{Name: f.name}
	for _, s := range ms {
		mr := s.Report()
		r.Members = append(r.Members, mr)
		r.LowerBound = max(r.LowerBound, mr.LowerBound)
	}
	f.d.mu.Lock()
	defer f.d.mu.Unlock()
	if f.plan != nil {
		r.Arena = f.plan.Arena
		if f.chained {
			r.LowerBound = f.plan.LowerBound // the chain's peak, not a member's
		}
	}
	r.Chain = f.chained
	if f.ar != nil {
		r.ArenaMap = f.ar.Mapped()
	}
	r.Ratio = 1 // nothing to place (members that allocate nothing), as Plan.Ratio says
	if r.LowerBound > 0 {
		r.Ratio = float64(r.Arena) / float64(r.LowerBound)
	}
	r.PlanFile = f.loaded
	return r
}

// Close closes every member (see Step.Close) and gives the arena back once
// no member's planned buffer is live any more.
func (f *Family) Close() error {
	var errs []error
	f.d.mu.Lock()
	if f.closing {
		f.d.mu.Unlock()
		return f.errorf("closed already")
	}
	f.closing = true
	var open []*Step
	for _, s := range f.members {
		if !s.closing {
			open = append(open, s)
		}
	}
	f.d.mu.Unlock()
	f.stopAhead()
	for _, s := range open {
		if err := s.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	f.d.mu.Lock()
	errs = append(errs, f.maybeCloseArena())
	f.d.mu.Unlock()
	f.b.mu.Lock()
	delete(f.b.families, f.id)
	f.b.mu.Unlock()
	return errors.Join(errs...)
}

// maybeCloseArena closes the arena once the family is closing and no
// member holds its share any more; d.mu is held.
func (f *Family) maybeCloseArena() error {
	if !f.closing || f.ar == nil {
		return nil
	}
	for _, s := range f.members {
		if s.ar != nil {
			return nil
		}
	}
	err := f.d.closeArena(f.ar)
	f.ar = nil
	return err
}

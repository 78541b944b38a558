package bridge

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/google/btree"

	"github.com/arenaplan/arenaplan/arena"
	"github.com/arenaplan/arenaplan/cuda"
	"github.com/arenaplan/arenaplan/lifetime"
	"github.com/arenaplan/arenaplan/planner"
	"github.com/arenaplan/arenaplan/plans"
)

// Step is one step of a program (a model's forward, a decode step, a
// training step) whose allocations are recorded once, planned into an
// arena, and served from it on every later run. See the package
// documentation for the rules of serving.
//
// A Step's methods are safe for concurrent use with the Bridge's
// allocation calls; call them from one goroutine at a time.
type Step struct {
	b    *Bridge
	d    *Device
	id   int
	name string

	// All below is guarded by d.mu.
	state  stepState
	stream uintptr
	cursor int    // the next planned buffer while serving
	run    runLog // the run underway (recording or serving)
	strict bool

	trace  *lifetime.Trace // recorded, or loaded with the plan
	plan   *planner.Plan
	loaded string // the plan file it came from, if any
	ar     *arena.Arena
	addrs  []cuda.DevicePtr
	need   []uint64 // planned range length per buffer
	live   *btree.BTreeG[span]
	isLive []bool
	taken  []bool // planned buffers served in the run underway
	held   []int  // freed slots that another stream used: taken until End

	capture  *arena.Capture // the capture of the run underway, if joined
	pool     *arena.Pool    // private pool of the serving captures' spills
	captures []*arena.Capture

	runs, served, divergences uint64
	firstDivergence           string
	closing                   bool

	// runDivergences counts the divergences of the run underway; rerun
	// is the last served run's trace when it diverged (for Replan).
	runDivergences     uint64
	lastRunDivergences uint64
	rerun              *lifetime.Trace
	replans            int
	replanReason       string

	fam *Family // the family whose arena it shares, if any

	retired []*retired // arenas of replaced plans with orphans live
}

type stepState int

const (
	stepIdle stepState = iota
	stepRecording
	stepServing
	stepClosed
)

func (s stepState) String() string {
	return [...]string{"idle", "recording", "serving", "closed"}[s]
}

// span is a live planned range [lo, hi) of device addresses.
type span struct{ lo, hi uint64 }

func lessSpan(a, b span) bool { return a.lo < b.lo }

// runLog is what one run of the step did, in the order it did it: every
// allocation on the step's stream, when it was freed, and whether another
// stream used it. Time advances by one per event.
type runLog struct {
	now   int64
	sizes []int64
	start []int64
	end   []int64 // -1 while live
	other []bool  // record_stream on another stream
	ids   map[cuda.DevicePtr]int
}

func (r *runLog) reset() {
	*r = runLog{ids: map[cuda.DevicePtr]int{}}
}

func (r *runLog) alloc(p cuda.DevicePtr, size uint64) {
	r.ids[p] = len(r.sizes)
	r.sizes = append(r.sizes, int64(size))
	r.start = append(r.start, r.now)
	r.end = append(r.end, -1)
	r.other = append(r.other, false)
	r.now++
}

func (r *runLog) free(p cuda.DevicePtr) {
	if i, ok := r.ids[p]; ok {
		delete(r.ids, p)
		r.end[i] = r.now + 1 // live through the free's tick
		r.now++
	}
}

// trace is the run as a lifetime.Trace: buffers never freed, or used on
// another stream, live to the end.
func (r *runLog) trace(name string) *lifetime.Trace {
	t := &lifetime.Trace{Name: name, Buffers: make([]lifetime.Buffer, len(r.sizes))}
	for i := range r.sizes {
		end := r.end[i]
		if end < 0 || r.other[i] {
			end = r.now + 1
		}
		t.Buffers[i] = lifetime.Buffer{ID: lifetime.ID(i), Name: "t" + strconv.Itoa(i), Size: r.sizes[i],
			Start: r.start[i], End: end}
	}
	return t
}

// subTrace is the trace of the run's allocations that keep selects, times
// renumbered as if the others had not happened.
func (r *runLog) subTrace(name string, keep []bool) *lifetime.Trace {
	var ticks []int64
	for i := range r.sizes {
		if keep[i] {
			ticks = append(ticks, r.start[i])
			if r.end[i] >= 0 {
				ticks = append(ticks, r.end[i]-1)
			}
		}
	}
	slices.Sort(ticks)
	rank := make(map[int64]int64, len(ticks))
	for _, t := range ticks {
		rank[t] = int64(len(rank))
	}
	now := int64(len(rank))
	t := &lifetime.Trace{Name: name}
	for i := range r.sizes {
		if !keep[i] {
			continue
		}
		end := now + 1
		if r.end[i] >= 0 && !r.other[i] {
			end = rank[r.end[i]-1] + 1
		}
		t.Buffers = append(t.Buffers, lifetime.Buffer{ID: lifetime.ID(len(t.Buffers)), Name: "t" + strconv.Itoa(len(t.Buffers)),
			Size: r.sizes[i], Start: rank[r.start[i]], End: end})
	}
	return t
}

// embeds says whether the run made the plan's step: the plan's buffers,
// matched in order by size to the run's allocations (skipping extra ones,
// such as a workspace PyTorch makes lazily in one capture), live as in the
// plan once the extras are taken out. nil: it did; else what differs.
func (r *runLog) embeds(name string, plan *lifetime.Trace) error {
	keep := make([]bool, len(r.sizes))
	j := 0
	for i := range plan.Buffers {
		for j < len(r.sizes) && r.sizes[j] != plan.Buffers[i].Size {
			j++
		}
		if j == len(r.sizes) {
			return fmt.Errorf("the plan's allocation %d (%d bytes) never came: the step made %d allocations", i, plan.Buffers[i].Size, len(r.sizes))
		}
		keep[j] = true
		j++
	}
	return sameSteps(plan, r.subTrace(name, keep))
}

// NewStep makes an empty step on device ordinal.
func (b *Bridge) NewStep(ordinal int, name string) (*Step, error) {
	d, err := b.device(ordinal)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.nextID++
	s := &Step{b: b, d: d, id: b.nextID, name: name}
	b.steps[s.id] = s
	return s, nil
}

// Step returns the step with the given ID.
func (b *Bridge) Step(id int) (*Step, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.steps[id]
	if s == nil {
		return nil, fmt.Errorf("bridge: no step %d (never made, or closed)", id)
	}
	return s, nil
}

// ID is the step's handle for the C ABI.
func (s *Step) ID() int { return s.id }

func (s *Step) errorf(format string, args ...any) error {
	return fmt.Errorf("bridge: step %d (%s): %s", s.id, s.name, fmt.Sprintf(format, args...))
}

// begin makes s the active step on stream.
func (s *Step) begin(stream uintptr, state stepState) error {
	d := s.d
	if s.state != stepIdle {
		return s.errorf("is %s already", s.state)
	}
	if o := d.active[stream]; o != nil {
		return s.errorf("stream %#x is taken by step %d (%s)", stream, o.id, o.name)
	}
	d.active[stream] = s
	s.state, s.stream, s.cursor = state, stream, 0
	s.runDivergences = 0
	if s.taken != nil {
		clear(s.taken)
	}
	s.run.reset()
	return nil
}

// Record starts recording a run of the step on stream: allocations on it
// are served by the spill allocator and logged until End.
func (s *Step) Record(stream uintptr) error {
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	if s.closing {
		return s.errorf("closed")
	}
	if s.plan != nil {
		return s.errorf("has a plan already; make a new step to record again")
	}
	return s.begin(stream, stepRecording)
}

// Serve starts a run of the step on stream served from its plan. With
// strict, an allocation the plan cannot serve fails instead of spilling.
func (s *Step) Serve(stream uintptr, strict bool) error {
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	if s.closing {
		return s.errorf("closed")
	}
	if s.ar == nil {
		return s.errorf("has no plan: record and Plan, or Load, first")
	}
	if s.d.graphs != nil {
		return s.errorf("the graphs' memory is paused: Resume it first")
	}
	if err := s.begin(stream, stepServing); err != nil {
		return err
	}
	s.strict = strict
	return nil
}

// JoinCapture says that the step's stream is being captured now by its
// owner (PyTorch's torch.cuda.graph): spilled allocations of this run go
// to a private pool. A recording run's pool is given back at End (that
// graph is never replayed); a serving run's pool lives as long as the
// step.
func (s *Step) JoinCapture() error {
	d := s.d
	d.mu.Lock()
	defer d.mu.Unlock()
	if s.state != stepRecording && s.state != stepServing {
		return s.errorf("JoinCapture while %s", s.state)
	}
	if s.capture != nil {
		return s.errorf("JoinCapture twice in one run")
	}
	restore, err := makeCurrent(d.dev)
	if err != nil {
		return err
	}
	defer restore()
	st, err := d.dev.Foreign(s.stream)
	if err != nil {
		return err
	}
	var pool *arena.Pool
	if s.state == stepServing {
		if s.pool == nil {
			if s.pool, err = d.spill.NewSharedPool(); err != nil {
				return err
			}
		}
		pool = s.pool
	}
	c, err := d.spill.JoinCapture(st, pool)
	if err != nil {
		return fmt.Errorf("bridge: step %d (%s): %w", s.id, s.name, err)
	}
	s.capture = c
	return nil
}

// End ends the run underway. failed says the run's capture failed (then
// its spill pool is dropped). After a recording, the step holds its trace;
// after serving a loaded plan, the run must have made the plan's
// allocations: if not, the plan is refused (an error saying what differs)
// and the step has no plan any more.
func (s *Step) End(failed bool) error {
	d := s.d
	d.mu.Lock()
	defer d.mu.Unlock()
	if s.state != stepRecording && s.state != stepServing {
		return s.errorf("End while %s", s.state)
	}
	restore, err := makeCurrent(d.dev)
	if err != nil {
		return err
	}
	defer restore()
	delete(d.active, s.stream)
	state := s.state
	s.state = stepIdle
	var errs []error
	if c := s.capture; c != nil {
		s.capture = nil
		errs = append(errs, c.Ended(failed))
		if state == stepRecording && !failed {
			errs = append(errs, c.Release())
		} else if !failed {
			s.captures = append(s.captures, c)
		}
	}
	run := s.run.trace(s.name)
	var embedded error
	if state == stepServing && s.loaded != "" && !failed {
		embedded = s.run.embeds(s.name, s.trace)
	}
	if state == stepRecording && !failed && s.fam != nil && s.fam.chained {
		s.fam.recordedOutputs(s, &s.run)
	}
	s.run.reset()
	switch state {
	case stepRecording:
		if failed {
			break
		}
		if len(run.Buffers) == 0 {
			errs = append(errs, s.errorf("recorded no allocation on stream %#x", s.stream))
			break
		}
		s.trace = run
	case stepServing:
		s.runs++
		s.rerun, s.lastRunDivergences = nil, s.runDivergences
		if s.runDivergences > 0 && !failed {
			s.rerun = run
		}
		for _, k := range s.held {
			s.release(k)
		}
		s.held = s.held[:0]
		if embedded != nil {
			// An extra allocation (a workspace made lazily in this
			// capture, say) spills and counts as a divergence without
			// refusing the plan; a plan the run does not contain is
			// refused.
			why := sameSteps(s.trace, run)
			if why == nil {
				why = embedded
			}
			errs = append(errs, s.errorf("plan %s was made for another step: %v", s.loaded, why))
		}
	}
	return errors.Join(errs...)
}

// sameSteps says how run differs from the plan's trace, or nil.
func sameSteps(plan, run *lifetime.Trace) error {
	for i := range min(len(plan.Buffers), len(run.Buffers)) {
		p, r := &plan.Buffers[i], &run.Buffers[i]
		switch {
		case p.Size != r.Size:
			return fmt.Errorf("allocation %d is %d bytes in the plan, %d in this step", i, p.Size, r.Size)
		case p.Start != r.Start || p.End != r.End:
			return fmt.Errorf("allocation %d lives [%d, %d) in the plan, [%d, %d) in this step", i, p.Start, p.End, r.Start, r.End)
		}
	}
	if len(plan.Buffers) != len(run.Buffers) {
		return fmt.Errorf("the plan has %d allocations, this step made %d", len(plan.Buffers), len(run.Buffers))
	}
	return nil
}

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
	d.mu.Unlock()
	if err != nil {
		return err
	}
	p, _, err := planner.RunByTag(context.Background(), planner.Auto, t, planner.Options{Budget: budget})
	if err != nil {
		return fmt.Errorf("bridge: step %d (%s): planning its served run: %w", s.id, s.name, err)
	}
	if s.fam != nil {
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
		if p.Arena <= s.ar.Size() {
			p0, err := s.ar.Ptr(0)
			if err != nil {
				return err
			}
			off, err := s.ar.Offset(0)
			if err != nil {
				return err
			}
			s.replace(t, p, s.ar, offsetAddrs(p0-cuda.DevicePtr(off), p), nil)
			return nil
		}
		a, err := arena.New(d.dev, t, p)
		if err != nil {
			return fmt.Errorf("bridge: step %d (%s): replan: arena of %s (%d of its buffers still live in the old one of %s): %w",
				s.id, s.name, fmtBytes(uint64(p.Arena)), s.live.Len(), fmtBytes(uint64(s.ar.Size())), err)
		}
		addrs, err := arenaAddrs(a, len(t.Buffers))
		if err != nil {
			a.Close()
			return err
		}
		old := &retired{ar: s.ar, live: s.live.Len()}
		s.retired = append(s.retired, old)
		s.replace(t, p, a, addrs, old)
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

// replace gives the step plan p of trace t in arena a at addrs; d.mu is
// held. Buffers of the old plan still live become
// orphans: their frees are bookkeeping. In the same arena (old is nil)
// their ranges stay taken until they are freed; in a retired arena (old)
// that arena closes once the last of them is freed.
func (s *Step) replace(t *lifetime.Trace, p *planner.Plan, a *arena.Arena, addrs []cuda.DevicePtr, old *retired) {
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
	s.setPlan(t, p, "", a, addrs)
	if spans != nil {
		s.live = spans
	}
	s.replanned()
}

// orphan is the slot index of a live buffer of a plan since replaced.
const orphan = -1

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

// install maps the arena for plan p of trace t.
func (s *Step) install(t *lifetime.Trace, p *planner.Plan, from string) error {
	d := s.d
	restore, err := makeCurrent(d.dev)
	if err != nil {
		return err
	}
	defer restore()
	a, err := arena.New(d.dev, t, p)
	if err != nil {
		return fmt.Errorf("bridge: step %d (%s): arena of %s for %d buffers: %w", s.id, s.name, fmtBytes(uint64(p.Arena)), len(t.Buffers), err)
	}
	addrs, err := arenaAddrs(a, len(t.Buffers))
	if err != nil {
		a.Close()
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	s.setPlan(t, p, from, a, addrs)
	return nil
}

// arenaAddrs returns the addresses of the n buffers of arena a.
func arenaAddrs(a *arena.Arena, n int) ([]cuda.DevicePtr, error) {
	addrs := make([]cuda.DevicePtr, n)
	for i := range addrs {
		var err error
		if addrs[i], err = a.Ptr(lifetime.ID(i)); err != nil {
			return nil, err
		}
	}
	return addrs, nil
}

// offsetAddrs returns the addresses of p's buffers in an arena whose
// offset 0 is at base.
func offsetAddrs(base cuda.DevicePtr, p *planner.Plan) []cuda.DevicePtr {
	addrs := make([]cuda.DevicePtr, len(p.Offsets))
	for j, off := range p.Offsets {
		addrs[j] = base.Add(uint64(off))
	}
	return addrs
}

// setPlan gives the step its plan and addresses; d.mu is held.
func (s *Step) setPlan(t *lifetime.Trace, p *planner.Plan, from string, a *arena.Arena, addrs []cuda.DevicePtr) {
	need := make([]uint64, len(t.Buffers))
	for i := range t.Buffers {
		n, _ := planner.Need(&t.Buffers[i], p.Align)
		need[i] = uint64(n)
	}
	s.trace, s.plan, s.loaded, s.ar, s.addrs, s.need = t, p, from, a, addrs, need
	s.live = btree.NewG[span](16, lessSpan)
	s.isLive = make([]bool, len(t.Buffers))
	s.taken = make([]bool, len(t.Buffers))
}

// alloc serves an allocation on the step's stream; d.mu is held.
func (s *Step) alloc(size uint64) (cuda.DevicePtr, error) {
	d := s.d
	if s.state == stepRecording {
		p, err := d.spillAllocLocked(size, s.stream)
		if err != nil {
			return 0, err
		}
		s.run.alloc(p, size)
		if s.fam != nil && s.fam.chained {
			delete(s.fam.handed, p) // its address is reused: an earlier output was freed
		}
		return p, nil
	}
	if d.graphs != nil {
		// Serve and Pause refuse each other; this keeps an unmapped
		// address from ever being handed out should that change.
		return 0, s.errorf("allocating %d bytes: the graphs' memory is paused: Resume it first", size)
	}
	n := len(s.run.sizes)
	if k, ok := s.match(size); ok {
		p := s.addrs[k]
		s.live.ReplaceOrInsert(span{uint64(p), uint64(p) + s.need[k]})
		s.isLive[k] = true
		s.taken[k] = true
		s.cursor = max(s.cursor, k+1)
		d.planned[p] = slot{s, k, nil}
		d.st.Planned++
		s.served++
		s.run.alloc(p, size)
		return p, nil
	}
	why := s.divergence(n, size)
	d.st.Divergences++
	s.divergences++
	s.runDivergences++
	if s.firstDivergence == "" {
		s.firstDivergence = why
	}
	if s.strict {
		s.run.alloc(0, size) // keep the count: the next allocation is n+1
		delete(s.run.ids, 0)
		return 0, s.errorf("strict: %s", why)
	}
	p, err := d.spillAllocLocked(size, s.stream)
	if err != nil {
		return 0, err
	}
	s.run.alloc(p, size)
	return p, nil
}

// lookahead is how far from the cursor an allocation may find its planned
// buffer: forward, past recorded allocations this run lacks; backward, to
// buffers skipped when an extra allocation (a workspace PyTorch makes
// lazily in one capture, say) took a buffer ahead of its turn.
const lookahead = 8

// match finds the planned buffer for an allocation of size: the one at the
// cursor; else the first untaken one of that size among the few behind it;
// else among the few ahead. It must be untaken in this run, not live, and
// its range clear of every live buffer.
func (s *Step) match(size uint64) (int, bool) {
	fits := func(k int) bool {
		return uint64(s.trace.Buffers[k].Size) == size && !s.taken[k] && !s.isLive[k] && !s.overlaps(k)
	}
	if s.cursor < len(s.addrs) && fits(s.cursor) {
		return s.cursor, true
	}
	for k := max(0, s.cursor-lookahead); k < s.cursor; k++ {
		if fits(k) {
			return k, true
		}
	}
	for k := s.cursor + 1; k < len(s.addrs) && k <= s.cursor+lookahead; k++ {
		if fits(k) {
			return k, true
		}
	}
	return 0, false
}

func (s *Step) divergence(n int, size uint64) string {
	k := s.cursor
	switch {
	case k >= len(s.addrs):
		return fmt.Sprintf("allocation %d (%d bytes) is beyond the plan's %d", n, size, len(s.addrs))
	case uint64(s.trace.Buffers[k].Size) != size:
		return fmt.Sprintf("allocation %d is %d bytes, the plan has %d next", n, size, s.trace.Buffers[k].Size)
	}
	return fmt.Sprintf("allocation %d: its planned range is still taken (a buffer freed later than recorded, or kept from an earlier run)", n)
}

// overlaps says whether a live planned buffer overlaps buffer k's range.
// Live ranges never overlap each other, so only the last one starting
// below k's end can.
func (s *Step) overlaps(k int) bool {
	lo := uint64(s.addrs[k])
	hi := lo + s.need[k]
	hit := false
	s.live.DescendLessOrEqual(span{lo: hi - 1}, func(o span) bool {
		hit = o.hi > lo
		return false
	})
	return hit
}

// freePlanned: planned buffer k was freed; d.mu is held.
func (s *Step) freePlanned(k int) {
	p := s.addrs[k]
	if s.state == stepServing {
		if i, ok := s.run.ids[p]; ok && s.run.other[i] {
			s.run.free(p)
			s.held = append(s.held, k)
			return
		}
		s.run.free(p)
	}
	s.release(k)
}

// release takes buffer k out of the live set.
func (s *Step) release(k int) {
	p := uint64(s.addrs[k])
	s.live.Delete(span{lo: p})
	s.isLive[k] = false
	if s.closing && s.live.Len() == 0 {
		s.closeArena()
	}
}

// freeRecorded logs the free of p if this run allocated it; d.mu is held.
func (s *Step) freeRecorded(p cuda.DevicePtr) {
	if _, ok := s.run.ids[p]; !ok && s.state == stepRecording && s.fam != nil && s.fam.chained && s.fam.handedFree(s, p) {
		return
	}
	s.run.free(p)
}

// usedElsewhere: planned buffer k is used on another stream.
func (s *Step) usedElsewhere(k int) {
	if s.state == stepServing {
		if i, ok := s.run.ids[s.addrs[k]]; ok {
			s.run.other[i] = true
		}
	}
}

// recordStreamRecorded marks p, if this run allocated it, as used on
// another stream; d.mu is held.
func (s *Step) recordStreamRecorded(p cuda.DevicePtr) {
	if i, ok := s.run.ids[p]; ok {
		s.run.other[i] = true
	}
}

// Close gives the step's memory back: its capture pools at once (destroy
// the graphs captured through it first), its arena once no planned buffer
// is live any more (outputs a program still holds keep it).
func (s *Step) Close() error {
	d := s.d
	d.mu.Lock()
	defer d.mu.Unlock()
	if s.closing {
		return s.errorf("closed already")
	}
	if s.state == stepRecording || s.state == stepServing {
		return s.errorf("Close while %s: End the run first", s.state)
	}
	restore, err := makeCurrent(d.dev)
	if err != nil {
		return err
	}
	defer restore()
	s.closing = true
	errs := []error{s.dropCaptures()}
	if s.live == nil || s.live.Len() == 0 {
		errs = append(errs, s.closeArena())
	}
	s.b.mu.Lock()
	delete(s.b.steps, s.id)
	s.b.mu.Unlock()
	return errors.Join(errs...)
}

func (s *Step) closeArena() error {
	if s.ar == nil {
		return nil
	}
	if s.fam != nil {
		s.ar, s.addrs = nil, nil
		return s.fam.maybeCloseArena()
	}
	err := s.d.closeArena(s.ar)
	s.ar, s.addrs = nil, nil
	return err
}

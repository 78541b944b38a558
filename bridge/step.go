package bridge

import (
	"errors"
	"fmt"
	"slices"

	"github.com/google/btree"

	"github.com/arenaplan/arenaplan/arena"
	"github.com/arenaplan/arenaplan/cuda"
	"github.com/arenaplan/arenaplan/lifetime"
	"github.com/arenaplan/arenaplan/planner"
	"github.com/arenaplan/arenaplan/spill"
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

	capture  *spill.Capture // the capture of the run underway, if joined
	pool     *spill.Pool    // private pool of the serving captures' spills
	captures []*spill.Capture

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

	fam    *Family    // the family whose arena it shares, if any
	around []offRange // plan ranges of the family arena its plans leave alone (PlanMemberAround)

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

// NewStep makes an empty step on device ordinal.
func (b *Bridge) NewStep(ordinal int, name string) (*Step, error) {
	return newHandle(b, ordinal, b.steps, func(d *Device, id int) *Step { return &Step{b: b, d: d, id: id, name: name} })
}

// Step returns the step with the given ID.
func (b *Bridge) Step(id int) (*Step, error) { return lookup(b, b.steps, "step", id) }

// newHandle makes a step or family on device ordinal with build and files
// it in m under the next handle.
func newHandle[T any](b *Bridge, ordinal int, m map[int]*T, build func(*Device, int) *T) (*T, error) {
	d, err := b.device(ordinal)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.nextID++
	x := build(d, b.nextID)
	m[b.nextID] = x
	return x, nil
}

// lookup returns the step or family with handle id in m.
func lookup[T any](b *Bridge, m map[int]*T, what string, id int) (*T, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	x := m[id]
	if x == nil {
		return nil, fmt.Errorf("bridge: no %s %d (never made, or closed)", what, id)
	}
	return x, nil
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
	var pool *spill.Pool
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
			why := planner.SameRun(s.trace, run, true)
			if why == nil {
				why = embedded
			}
			errs = append(errs, s.errorf("plan %s was made for another step: %v", s.loaded, why))
		}
	}
	return errors.Join(errs...)
}

// orphan is the slot index of a live buffer of a plan since replaced.
const orphan = -1

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
	if f := s.fam; f != nil && s.plan == nil {
		// A member never planned (one added after its family's plan whose
		// PlanMember failed, or never came) leaves the family.
		if i := slices.Index(f.members, s); i >= 0 {
			f.members = slices.Delete(f.members, i, i+1)
		}
	}
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

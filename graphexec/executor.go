package graphexec

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/arenaplan/arenaplan/arena"
	"github.com/arenaplan/arenaplan/cuda"
	"github.com/arenaplan/arenaplan/graph"
	"github.com/arenaplan/arenaplan/launch"
	"github.com/arenaplan/arenaplan/lifetime"
	"github.com/arenaplan/arenaplan/planner"
)

// ErrNotCaptured is returned by Replay before Capture: the executor never
// falls back to eager execution on its own.
var ErrNotCaptured = errors.New("graphexec: replay before capture")

// Options configure an Executor.
type Options struct {
	// Plan are the planner's options when the executor plans a dry run
	// itself (New without a plan, Rebind).
	Plan graph.PlanOptions
	// NoCaptureReuse turns the spillover allocator's capture-time reuse
	// off (spill.WithCaptureReuse(false)), for comparison.
	NoCaptureReuse bool
	// NoPDL launches every kernel plainly, without programmatic dependent
	// launch (see Executor.LaunchMode), for comparison.
	NoPDL bool
}

// Executor runs one graph on one device: the arena built from the plan,
// eager steps (kernel by kernel), one capture into a CUDA graph, and
// replays of it. Per-step inputs (Tensor.SetFeed) are written into their
// arena tensors before each step, so the captured graph never changes for
// them.
//
// An Executor is not safe for concurrent use; on the driver, call it from
// the goroutine bound to the device (cuda.Device.BindThread).
type Executor struct {
	dev cuda.Device
	opt Options
	g   *graph.Graph
	fp  graph.Fingerprint
	dry *graph.DryRun
	// lay is the checked plan, its arena and every buffer's address. In a
	// family or a chain (group set) the layout is the group's member or
	// stage, placed in the group's arena; the arena, stream and modules
	// then belong to the group (group.go).
	lay    *arena.Layout
	group  string
	mods   []cuda.Module
	modPTX [][]byte // the PTX each of mods was loaded from (which kernels may use PDL)
	fns    []cuda.Function
	pdl    []bool           // by op: launch with programmatic serialization (launchAll)
	ptr    []cuda.DevicePtr // by tensor
	args   [][]cuda.KernelArg
	stream cuda.Stream

	graph    cuda.Graph
	exec     cuda.Exec
	captured graph.Fingerprint // the workload the exec runs
	sp       *spillState       // spillover allocator and side streams (spill.go)

	feeds      []*graph.Tensor
	feedOff    []uint64 // offset of each feed inside one step's staging
	stride     uint64   // staging bytes per step
	stage      cuda.DevicePtr
	stageCap   uint64
	stageFirst int
	stageN     int
}

// New builds an executor for g on dev: it plans g's dry run when p is nil
// (Options.Plan), builds the arena from the plan, loads the PTX modules and
// resolves every launch's arguments. It uploads nothing: call Init.
func New(dev cuda.Device, g *graph.Graph, p *planner.Plan, opt Options) (*Executor, error) {
	e := &Executor{dev: dev, opt: opt}
	if err := e.setup(g, p); err != nil {
		e.Close()
		return nil, err
	}
	return e, nil
}

func (e *Executor) setup(g *graph.Graph, p *planner.Plan) error {
	d, err := g.DryRun()
	if err != nil {
		return err
	}
	if p == nil {
		if p, err = graph.Plan(context.Background(), d.Trace, e.opt.Plan); err != nil {
			return err
		}
	}
	if p.Align < g.Align {
		return &graph.AlignError{Workload: g.Label(), Plan: p.Align, Need: g.Align}
	}
	if e.lay, err = arena.NewLayout(e.dev, d.Trace, p, kept(g)...); err != nil {
		return fmt.Errorf("graphexec: %s: %w", g.Label(), err)
	}
	if e.stream == nil {
		if e.stream, err = e.dev.NewStream(); err != nil {
			return fmt.Errorf("graphexec: %s: %w", g.Label(), err)
		}
	}
	return e.bind(g, d, false)
}

// bind loads g's modules (or keeps the loaded ones: their PTX is the same,
// and an exec being updated still runs their functions) and resolves its
// launches against the arena.
func (e *Executor) bind(g *graph.Graph, d *graph.DryRun, keepModules bool) error {
	if !keepModules {
		for _, m := range e.mods {
			m.Close()
		}
		e.mods, e.modPTX, e.fns = nil, nil, nil
	}
	major := 0
	if !keepModules && len(g.Modules) > 0 {
		var err error
		if major, _, err = e.dev.ComputeCapability(); err != nil {
			return fmt.Errorf("graphexec: %s: %w", g.Label(), err)
		}
	}
	for i := range g.Modules {
		if keepModules {
			break
		}
		// The same kernels built for the device (compute_90 with
		// programmatic dependent launch on 9.0 and later).
		ptx := g.ModulePTX(i, major)
		m, err := e.dev.LoadModule(ptx)
		if err != nil {
			return fmt.Errorf("graphexec: %s: module %d: %w", g.Label(), i, err)
		}
		e.mods = append(e.mods, m)
		e.modPTX = append(e.modPTX, ptx)
	}
	ptr := make([]cuda.DevicePtr, len(g.Tensors))
	for i := range g.Tensors {
		if d.Tensor[i] < 0 {
			continue // unplanned: the spillover allocator serves it
		}
		p, err := e.addr(d.Tensor[i])
		if err != nil {
			return fmt.Errorf("graphexec: %s: tensor %s: %w", g.Label(), g.Tensors[i].Name, err)
		}
		if uint64(p)%uint64(g.Align) != 0 {
			return &graph.AlignError{Workload: g.Label(), Plan: int64(uint64(p) & -uint64(p)), Need: g.Align}
		}
		ptr[i] = p
	}
	fns := make([]cuda.Function, len(g.Ops))
	args := make([][]cuda.KernelArg, len(g.Ops))
	for i, op := range g.Ops {
		fn, err := e.mods[op.Module].Function(op.Kernel)
		if err != nil {
			return fmt.Errorf("graphexec: %s: op %d (%s): kernel %s: %w", g.Label(), i, op.Name, op.Kernel, err)
		}
		fns[i] = fn
		var ws cuda.DevicePtr
		if id := d.Workspace[i]; id >= 0 {
			if ws, err = e.addr(id); err != nil {
				return fmt.Errorf("graphexec: %s: op %d (%s) workspace: %w", g.Label(), i, op.Name, err)
			}
		}
		for _, a := range op.Args {
			switch a.Kind() {
			case graph.ArgTensor:
				args[i] = append(args[i], cuda.Ptr(ptr[tensorOf(a).Index()]))
			case graph.ArgWorkspace:
				args[i] = append(args[i], cuda.Ptr(ws))
			case graph.ArgNull:
				args[i] = append(args[i], cuda.Ptr(0))
			case graph.ArgScalar:
				args[i] = append(args[i], a.Value())
			}
		}
	}
	e.g, e.fp, e.dry, e.ptr, e.fns, e.args = g, g.Fingerprint(), d, ptr, fns, args
	e.pdl = e.pdlOps(g)
	e.feeds, e.feedOff, e.stride = nil, nil, 0
	for _, t := range g.Tensors {
		if t.FeedFunc() != nil {
			e.feeds = append(e.feeds, t)
			e.feedOff = append(e.feedOff, e.stride)
			e.stride += uint64(lifetime.RoundUp(t.Bytes(), 256))
		}
	}
	e.stageN = 0
	return e.bindSpill(g)
}

func (e *Executor) addr(id lifetime.ID) (cuda.DevicePtr, error) { return e.lay.Addr(id) }

// Graph returns the graph the executor runs.
func (e *Executor) Graph() *graph.Graph { return e.g }

// Fingerprint returns the fingerprint of the graph the executor runs.
func (e *Executor) Fingerprint() graph.Fingerprint { return e.fp }

// Plan returns the plan the arena was built from.
func (e *Executor) Plan() *planner.Plan { return e.lay.Plan() }

// Trace returns the dry run's trace.
func (e *Executor) Trace() *lifetime.Trace { return e.dry.Trace }

// Arena returns the arena (a family's or chain's for their members).
func (e *Executor) Arena() *arena.Arena { return e.lay.Arena() }

// kept are the tags whose regions Arena().Pause backs up (the layout's
// keep, arena.NewLayout): the weights and the KV cache (written once, or
// carried from step to step); outputs and intermediates, which every step
// writes before it reads them, are dropped. Inputs are dropped when every
// one is fed each step, and backed up when some input is constant
// (written once by Init, like mlp's x): a step reads it without writing
// it, so it is state a Resume must bring back. A graph captured before a
// Pause replays after Resume and goes on from the same state.
func kept(gs ...*graph.Graph) []string {
	keep := []string{"weight", "kv"}
	for _, g := range gs {
		for _, x := range g.Tensors {
			if x.Role == graph.Input && x.FeedFunc() == nil {
				return append(keep, "input")
			}
		}
	}
	return keep
}

// Ptr returns t's device address.
func (e *Executor) Ptr(t *graph.Tensor) cuda.DevicePtr { return e.ptr[t.Index()] }

// StagingBytes is the device memory outside the arena that holds staged
// per-step inputs (Stage).
func (e *Executor) StagingBytes() uint64 { return e.stageCap }

// RegionBytes is the plan's address range of the buffers of one tag: from
// the lowest offset to the highest end (sizes rounded to the alignment).
func (e *Executor) RegionBytes(tag string) int64 { return e.lay.TagBytes(tag) }

// Init writes the initial bytes of every tensor that has an init function
// (weights, state, constant inputs). It waits for the stream first.
func (e *Executor) Init() error { return e.initRoles(graph.Weight, graph.State, graph.Input) }

// ResetState rewrites the initial bytes of state tensors (and constant
// inputs), so that a later run of steps starts where the first did.
func (e *Executor) ResetState() error { return e.initRoles(graph.State, graph.Input) }

func (e *Executor) initRoles(roles ...graph.Role) error {
	if err := e.stream.Synchronize(); err != nil {
		return fmt.Errorf("graphexec: %s: %w", e.g.Label(), err)
	}
	for _, t := range e.g.Tensors {
		if t.InitFunc() == nil || !hasRole(roles, t.Role) {
			continue
		}
		buf := make([]byte, t.Bytes())
		t.InitFunc()(buf)
		if err := e.dev.CopyHtoD(e.ptr[t.Index()], buf); err != nil {
			return fmt.Errorf("graphexec: %s: init %s: %w", e.g.Label(), t.Name, err)
		}
	}
	return nil
}

func hasRole(rs []graph.Role, r graph.Role) bool {
	for _, x := range rs {
		if x == r {
			return true
		}
	}
	return false
}

// Stage writes the per-step inputs of steps [first, first+n) into device
// memory outside the arena, so that each step's inputs reach their arena
// tensors by a device-to-device copy on the stream, with no host
// synchronisation between steps. Steps outside the staged range are fed by
// a synchronous host copy instead.
func (e *Executor) Stage(first, n int) error {
	if len(e.feeds) == 0 || n <= 0 {
		return nil
	}
	if err := e.stream.Synchronize(); err != nil {
		return fmt.Errorf("graphexec: %s: stage: %w", e.g.Label(), err)
	}
	need := uint64(n) * e.stride
	if need > e.stageCap {
		if e.stage != 0 {
			if err := e.dev.Free(e.stage); err != nil {
				return fmt.Errorf("graphexec: %s: stage: %w", e.g.Label(), err)
			}
			e.stage, e.stageCap = 0, 0
		}
		p, err := e.dev.Alloc(need)
		if err != nil {
			return fmt.Errorf("graphexec: %s: stage %d steps: %w", e.g.Label(), n, err)
		}
		e.stage, e.stageCap = p, need
	}
	buf := make([]byte, need)
	for s := 0; s < n; s++ {
		for i, t := range e.feeds {
			at := uint64(s)*e.stride + e.feedOff[i]
			t.FeedFunc()(first+s, buf[at:at+uint64(t.Bytes())])
		}
	}
	if err := e.dev.CopyHtoD(e.stage, buf); err != nil {
		return fmt.Errorf("graphexec: %s: stage: %w", e.g.Label(), err)
	}
	e.stageFirst, e.stageN = first, n
	return nil
}

// feed writes step's inputs into their arena tensors, ahead of the step's
// work on the stream.
func (e *Executor) feed(step int) error {
	if len(e.feeds) == 0 {
		return nil
	}
	if step >= e.stageFirst && step < e.stageFirst+e.stageN {
		base := e.stage.Add(uint64(step-e.stageFirst) * e.stride)
		for i, t := range e.feeds {
			if err := e.dev.CopyDtoD(e.ptr[t.Index()], base.Add(e.feedOff[i]), uint64(t.Bytes()), e.stream); err != nil {
				return fmt.Errorf("graphexec: %s: feed %s: %w", e.g.Label(), t.Name, err)
			}
		}
		return nil
	}
	if err := e.stream.Synchronize(); err != nil {
		return fmt.Errorf("graphexec: %s: feed: %w", e.g.Label(), err)
	}
	for _, t := range e.feeds {
		buf := make([]byte, t.Bytes())
		t.FeedFunc()(step, buf)
		if err := e.dev.CopyHtoD(e.ptr[t.Index()], buf); err != nil {
			return fmt.Errorf("graphexec: %s: feed %s: %w", e.g.Label(), t.Name, err)
		}
	}
	return nil
}

// launchAll enqueues every op on the stream (or into the capture). Ops
// marked in e.pdl go through LaunchEx with programmatic serialization, in
// eager steps and captures alike.
func (e *Executor) launchAll() error {
	if e.sp != nil && e.sp.slots != nil {
		return e.launchSpill()
	}
	for i, op := range e.g.Ops {
		var err error
		if e.pdl[i] {
			err = e.dev.LaunchEx(e.fns[i], cuda.LaunchConfig{Grid: op.Grid, Block: op.Block, SharedMem: op.Shared,
				Stream: e.stream, ProgrammaticSerialization: true}, e.args[i]...)
		} else {
			err = e.dev.Launch(e.fns[i], op.Grid, op.Block, op.Shared, e.stream, e.args[i]...)
		}
		if err != nil {
			return fmt.Errorf("graphexec: %s: op %d (%s): %w", e.g.Label(), i, op.Name, err)
		}
	}
	return nil
}

// pdlOps says which ops launchAll launches with programmatic serialization
// (programmatic dependent launch): on compute capability 9.0 and later,
// unless Options.NoPDL, an op whose kernel waits for its predecessor
// (kernels.PDLEntries of the PTX its module was loaded from) and whose
// predecessor is a kernel on the same stream: every op but the first,
// which follows the step's input copies. Graphs with spillover or side
// streams (launchSpill) launch plainly.
func (e *Executor) pdlOps(g *graph.Graph) []bool {
	pdl := make([]bool, len(g.Ops))
	if e.opt.NoPDL || e.modPTX == nil {
		return pdl
	}
	entries := make([]map[string]bool, len(e.modPTX))
	for i, ptx := range e.modPTX {
		entries[i] = launch.PDLEntries(ptx)
	}
	for i, op := range g.Ops {
		pdl[i] = i > 0 && op.Stream == 0 && g.Ops[i-1].Stream == 0 && len(op.Wait) == 0 && entries[op.Module][op.Kernel]
	}
	return pdl
}

// LaunchMode says how the executor launches kernels.
type LaunchMode struct {
	// PDL is true when some launches use programmatic dependent launch
	// (cuda.LaunchConfig.ProgrammaticSerialization).
	PDL bool
	// PDLLaunches is how many ops of a step launch that way.
	PDLLaunches int
	// Target is the sm_NN of the PTX the first module was loaded from
	// (80, 90), 0 when unknown.
	Target int
}

// LaunchMode reports how the executor launches kernels.
func (e *Executor) LaunchMode() LaunchMode {
	var m LaunchMode
	for _, p := range e.pdl {
		if p {
			m.PDLLaunches++
		}
	}
	m.PDL = m.PDLLaunches > 0
	if len(e.modPTX) > 0 {
		m.Target = launch.Target(e.modPTX[0])
	}
	return m
}

// Eager enqueues one step kernel by kernel.
func (e *Executor) Eager(step int) error {
	if err := e.feed(step); err != nil {
		return err
	}
	return e.launchAll()
}

// Capture captures one step's launches on the stream in global capture
// mode and instantiates the graph, replacing any earlier capture. It
// returns the time from the start of capture to the instantiated graph.
func (e *Executor) Capture() (time.Duration, error) {
	if err := e.stream.Synchronize(); err != nil {
		return 0, fmt.Errorf("graphexec: %s: capture: %w", e.g.Label(), err)
	}
	start := time.Now()
	g, err := e.captureGraph()
	if err != nil {
		return 0, err
	}
	x, err := g.Instantiate(0)
	if err != nil {
		g.Close()
		e.dropPending()
		return 0, fmt.Errorf("graphexec: %s: instantiate: %w", e.g.Label(), err)
	}
	elapsed := time.Since(start)
	e.dropCapture()
	e.graph, e.exec, e.captured = g, x, e.fp
	if err := e.adoptCapture(); err != nil {
		return 0, fmt.Errorf("graphexec: %s: capture: %w", e.g.Label(), err)
	}
	return elapsed, nil
}

func (e *Executor) captureGraph() (cuda.Graph, error) {
	if err := e.beginCapture(); err != nil {
		return nil, fmt.Errorf("graphexec: %s: begin capture: %w", e.g.Label(), err)
	}
	lerr := e.launchAll()
	g, err := e.endCapture()
	if lerr != nil {
		if g != nil {
			g.Close()
		}
		e.dropPending()
		return nil, fmt.Errorf("graphexec: capture: %w", lerr)
	}
	if err != nil {
		return nil, fmt.Errorf("graphexec: %s: end capture: %w", e.g.Label(), err)
	}
	return g, nil
}

func (e *Executor) dropCapture() {
	if e.exec != nil {
		e.exec.Close()
		e.exec = nil
	}
	if e.graph != nil {
		e.graph.Close()
		e.graph = nil
	}
	e.releaseCapture()
}

// Captured reports whether a graph is captured, and its node count.
func (e *Executor) Captured() (bool, int) {
	if e.graph == nil {
		return false, 0
	}
	n, err := e.graph.Nodes()
	if err != nil {
		return true, 0
	}
	return true, len(n)
}

// Replay enqueues one step as one launch of the captured graph. It fails
// with ErrNotCaptured before Capture, and when the graph the executor runs
// changed since the capture (see Rebind).
func (e *Executor) Replay(step int) error {
	if e.exec == nil {
		return ErrNotCaptured
	}
	if e.captured != e.fp {
		return fmt.Errorf("graphexec: %s: the captured graph was made for another workload (fingerprint %s, now %s): %w",
			e.g.Label(), e.captured.Short(), e.fp.Short(), ErrNotCaptured)
	}
	if err := e.feed(step); err != nil {
		return err
	}
	if err := e.exec.Launch(e.stream); err != nil {
		return fmt.Errorf("graphexec: %s: replay: %w", e.g.Label(), err)
	}
	return nil
}

// Synchronize waits for the executor's stream.
func (e *Executor) Synchronize() error {
	if err := e.stream.Synchronize(); err != nil {
		return fmt.Errorf("graphexec: %s: %w", e.g.Label(), err)
	}
	return nil
}

// Read waits for the stream and copies t's bytes back.
func (e *Executor) Read(t *graph.Tensor) ([]byte, error) {
	if err := e.Synchronize(); err != nil {
		return nil, err
	}
	buf := make([]byte, t.Bytes())
	if err := e.dev.CopyDtoH(buf, e.ptr[t.Index()]); err != nil {
		return nil, fmt.Errorf("graphexec: %s: read %s: %w", e.g.Label(), t.Name, err)
	}
	return buf, nil
}

// Decision is what Rebind did with a captured graph.
type Decision int

const (
	// Reused: the workload is the same; the captured graph runs as it is.
	Reused Decision = iota + 1
	// Updated: same kernels in the same order and the plan still holds
	// every buffer, so the arena stayed and the executable graph took the
	// new launch parameters (cuGraphExecUpdate).
	Updated
	// Recaptured: the plan no longer fits or the topology changed: the
	// workload was re-planned, the arena rebuilt and the graph captured and
	// instantiated again.
	Recaptured
)

func (d Decision) String() string {
	switch d {
	case Reused:
		return "reused"
	case Updated:
		return "updated"
	case Recaptured:
		return "recaptured"
	}
	return fmt.Sprintf("Decision(%d)", int(d))
}

// Rebound reports a Rebind.
type Rebound struct {
	Decision Decision
	Reason   string        // why, in a phrase
	Elapsed  time.Duration // capture and update or instantiation time
}

// Rebind switches the executor to graph g and makes its captured graph fit
// g, saying which of three things happened: the same workload reuses the
// graph; a workload with the same kernels in the same order whose buffers
// still fit the current plan (none grows, lifetimes and roles equal) keeps
// the arena and updates the executable graph in place; anything else is
// re-planned (Options.Plan), gets a new arena, and is captured and
// instantiated again. Tensors with init functions are written again when
// g differs. Without an earlier capture, Rebind captures.
func (e *Executor) Rebind(g *graph.Graph) (Rebound, error) {
	if e.group != "" {
		return Rebound{}, fmt.Errorf("graphexec: %s: rebind: a member of a %s cannot be rebound alone; plan the group again", e.g.Label(), e.group)
	}
	fp := g.Fingerprint()
	if fp == e.fp && e.exec != nil && e.captured == fp {
		return Rebound{Decision: Reused, Reason: "same fingerprint " + fp.Short()}, nil
	}
	d, err := g.DryRun()
	if err != nil {
		return Rebound{}, err
	}
	reason := ""
	var fit *arena.Layout
	switch {
	case e.exec == nil:
		reason = "nothing captured yet"
	case g.Topology() != e.g.Topology():
		reason = "kernels or their order changed"
	default:
		if fit, err = e.lay.Fit(d.Trace); err != nil {
			reason = err.Error()
		}
	}
	if reason == "" && g.Align <= e.lay.Plan().Align {
		start := time.Now()
		if err := e.Synchronize(); err != nil {
			return Rebound{}, err
		}
		e.lay = fit // the same arena and addresses, checked against g's run
		if err := e.bind(g, d, true); err != nil {
			return Rebound{}, err
		}
		ng, err := e.captureGraph()
		if err != nil {
			return Rebound{}, err
		}
		if _, uerr := e.exec.Update(ng); uerr == nil {
			e.graph.Close()
			e.graph, e.captured = ng, fp
			if err := e.adoptCapture(); err != nil {
				return Rebound{}, fmt.Errorf("graphexec: rebind: %w", err)
			}
			elapsed := time.Since(start)
			if err := e.Init(); err != nil {
				return Rebound{}, err
			}
			return Rebound{Decision: Updated, Reason: "same kernels, buffers fit the plan", Elapsed: elapsed}, nil
		} else {
			ng.Close()
			e.dropPending()
			reason = fmt.Sprintf("exec update refused: %v", uerr)
		}
	}
	if reason == "" {
		reason = "kernels need a larger alignment"
	}
	// Re-plan and re-capture.
	if err := e.Synchronize(); err != nil {
		return Rebound{}, err
	}
	e.dropCapture()
	if e.lay != nil {
		err := e.lay.Close()
		e.lay = nil
		if err != nil {
			return Rebound{}, fmt.Errorf("graphexec: rebind: %w", err)
		}
	}
	if err := e.setup(g, nil); err != nil {
		return Rebound{}, err
	}
	if err := e.Init(); err != nil {
		return Rebound{}, err
	}
	el, err := e.Capture()
	if err != nil {
		return Rebound{}, err
	}
	return Rebound{Decision: Recaptured, Reason: reason, Elapsed: el}, nil
}

// Close releases the captured graph, the stream, the staging memory, the
// modules and the arena.
func (e *Executor) Close() error {
	var errs []error
	if e.stream != nil {
		errs = append(errs, e.stream.Synchronize())
	}
	if e.exec != nil {
		errs = append(errs, e.exec.Close())
		e.exec = nil
	}
	if e.graph != nil {
		errs = append(errs, e.graph.Close())
		e.graph = nil
	}
	errs = append(errs, e.closeSpill())
	if e.stage != 0 {
		errs = append(errs, e.dev.Free(e.stage))
		e.stage, e.stageCap = 0, 0
	}
	if e.stream != nil {
		errs = append(errs, e.stream.Close())
		e.stream = nil
	}
	for _, m := range e.mods {
		errs = append(errs, m.Close())
	}
	e.mods = nil
	if e.lay != nil {
		errs = append(errs, e.lay.Close()) // a group's member closes nothing: its arena is the group's
		e.lay = nil
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("graphexec: close: %w", err)
	}
	return nil
}

// ProfileOps runs one eager step with a timed event pair around every op,
// waiting for each, and returns each op's device time. For development:
// the waits make the step much slower than Eager's.
func (e *Executor) ProfileOps(step int) ([]time.Duration, error) {
	if e.sp != nil && e.sp.slots != nil {
		return nil, fmt.Errorf("graphexec: %s: ProfileOps does not run graphs with spillover or side streams", e.g.Label())
	}
	start, err := e.dev.NewEvent(true)
	if err != nil {
		return nil, err
	}
	defer start.Close()
	end, err := e.dev.NewEvent(true)
	if err != nil {
		return nil, err
	}
	defer end.Close()
	if err := e.feed(step); err != nil {
		return nil, err
	}
	out := make([]time.Duration, len(e.g.Ops))
	for i, op := range e.g.Ops {
		if err := start.Record(e.stream); err != nil {
			return nil, err
		}
		if err := e.dev.Launch(e.fns[i], op.Grid, op.Block, op.Shared, e.stream, e.args[i]...); err != nil {
			return nil, fmt.Errorf("graphexec: %s: op %d (%s): %w", e.g.Label(), i, op.Name, err)
		}
		if err := end.Record(e.stream); err != nil {
			return nil, err
		}
		if err := end.Synchronize(); err != nil {
			return nil, err
		}
		if out[i], err = e.dev.ElapsedTime(start, end); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// tensorOf is a's tensor, nil unless it passes one.
func tensorOf(a graph.Arg) *graph.Tensor {
	t, _ := a.Tensor()
	return t
}

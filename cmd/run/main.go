// Command run runs a workload on a planned arena: it builds the arena from
// a plan (a file from `plan --workload`, or one made in memory from the
// workload's dry run), runs the workload eagerly kernel by kernel, captures
// the same launches once into a CUDA graph, replays it, and reports arena
// bytes, capture time, eager and replay time per step, and whether the
// replayed outputs equal the eager ones bit for bit.
//
//	run [--plan FILE.plan | --workload NAME] [shape flags] [--steps N]
//	    [--device auto|sim|cuda|cuda:N] [--check] [--budget D] [--json]
//
// Exit status: 0 on success (--help included: the usage goes to stdout), 1
// on failure (also when replayed outputs differ from eager ones, or --check
// finds a difference beyond tolerance), 2 on bad usage (plan's rule: an
// unknown flag, a value out of range, a workload's shape included, a flag
// the mode does not take, or two that decide the same thing: --plan names
// the workload and shape, so --workload and shape flags beside it are
// refused), 130 when interrupted: the first Ctrl-C ends the run at
// once (the device is released by the process's exit), a second one exits
// whatever it is doing.
//
// Development settings (measuring kernels and launch shapes on a GPU, not
// for users) come from the environment variable ARENAPLAN_TUNE, a
// comma-separated list of key=value: the launch shapes of
// workloads.TuneKeys (ln_grid=528, attention_threads=64, ...), and
//
//	ptx=FILE        load this PTX (a build of a modified kernels.cu) instead of the embedded kernels
//	spill_ptx=FILE  load this PTX instead of the embedded spill-demo kernels
//	profile=1       print each kernel's device time in one eager step, by op kind, to stderr
//
// An unknown key or a bad value is a usage error (exit status 2).
package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/pflag"

	"github.com/arenaplan/arenaplan/cuda"
	"github.com/arenaplan/arenaplan/graph"
	"github.com/arenaplan/arenaplan/graphexec"
	"github.com/arenaplan/arenaplan/internal/interrupt"
	"github.com/arenaplan/arenaplan/internal/regfile"
	"github.com/arenaplan/arenaplan/lifetime"
	"github.com/arenaplan/arenaplan/planner"
	"github.com/arenaplan/arenaplan/plans"
	"github.com/arenaplan/arenaplan/workloads"
)

func main() {
	ctx, stop := interrupt.Notify(os.Stderr, "run")
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

type usageError struct{ error }

// failedError marks a run that completed but whose checks failed: the
// report is printed, then the exit status is 1.
type failedError struct{ error }

type config struct {
	planPath string
	workload string
	steps    int
	warmup   int
	device   string
	check    bool
	budget   time.Duration
	jsonOut  bool
	ptx      string
	profile  bool
	sequence string
	noReuse  bool
	noPDL    bool
	pause    bool
	spillPTX string
	stages   string
	kernels  workloads.Kernels // the embedded ones, or ARENAPLAN_TUNE's
	shape    *workloads.ShapeFlags
	fs       *pflag.FlagSet
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	err := interrupt.Run(ctx, func() error { return dispatch(ctx, args, stdout, stderr) })
	if err == nil || errors.Is(err, pflag.ErrHelp) {
		return 0
	}
	fmt.Fprintf(stderr, "run: %v\n", err)
	if errors.Is(err, interrupt.ErrInterrupted) {
		return interrupt.ExitCode
	}
	var ue usageError
	if errors.As(err, &ue) {
		return 2
	}
	return 1
}

func dispatch(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c := config{kernels: workloads.EmbeddedKernels()}
	fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	c.fs = fs
	fs.StringVar(&c.planPath, "plan", "", "run on this plan file's addresses (from plan --workload); it names the workload and shape")
	fs.StringVar(&c.workload, "workload", "", "built-in workload: "+strings.Join(workloads.Workloads(), ", "))
	c.shape = workloads.AddShapeFlags(fs)
	fs.StringVar(&c.sequence, "sequence", "", "with a family plan: the batch sizes to run, in order (8,1,64,...); default: the members round robin for --steps steps")
	fs.StringVar(&c.stages, "stages", "", "with --workload mlp: split it at these layers (16,32,...) into a chain of graphs that read each other's outputs in place from one arena, replayed in order")
	fs.IntVar(&c.steps, "steps", 100, "timed steps, eager and replayed")
	fs.IntVar(&c.warmup, "warmup", 3, "untimed steps before each timed run")
	fs.StringVar(&c.device, "device", "auto", "auto (GPU 0 when a driver is present, else sim), sim, cuda or cuda:N")
	fs.BoolVar(&c.check, "check", false, "also run the Go reference kernels on the simulated device and compare outputs")
	fs.DurationVar(&c.budget, "budget", planner.DefaultBudget, "planning budget when no --plan is given")
	fs.BoolVar(&c.jsonOut, "json", false, "print one JSON object")
	fs.BoolVar(&c.noReuse, "no-capture-reuse", false, "turn the spillover allocator's capture-time reuse off (for comparison)")
	fs.BoolVar(&c.pause, "pause", false, "also replay the sequence once more, pausing and resuming the arena twice halfway (weights and KV cache backed up, the rest dropped), and check the outputs; reports the memory returned and the times")
	fs.BoolVar(&c.noPDL, "no-pdl", false, "launch every kernel plainly, without programmatic dependent launch on compute capability 9.0 and later (for comparison)")
	usage := func(w io.Writer) {
		fmt.Fprintf(w, "usage: run [--plan FILE.plan | --workload NAME] [shape flags] [flags]\n\nflags:\n%s", fs.FlagUsages())
	}
	// --help asks for the usage: it goes to stdout and exits 0. A usage
	// error prints it to stderr.
	fs.Usage = func() { usage(stdout) }
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	switch {
	case fs.NArg() > 0:
		return usageError{fmt.Errorf("unexpected arguments %q", fs.Args())}
	case c.planPath == "" && c.workload == "":
		usage(stderr)
		return usageError{errors.New("give --plan FILE or --workload NAME")}
	case c.planPath != "" && (c.workload != "" || len(c.shape.Changed()) > 0):
		// One rule for every command: flags that decide the same thing
		// twice are a usage error, never one silently preferred.
		given := c.shape.Changed()
		if c.workload != "" {
			given = append([]string{"--workload"}, given...)
		}
		return usageError{fmt.Errorf("--plan names the workload and its shape; flags that do not apply beside it: %s", strings.Join(given, ", "))}
	case c.steps < 1:
		return usageError{fmt.Errorf("--steps %d: must be at least 1", c.steps)}
	case c.warmup < 0:
		return usageError{fmt.Errorf("--warmup %d: must not be negative", c.warmup)}
	case c.budget <= 0:
		return usageError{fmt.Errorf("--budget %v: must be positive", c.budget)}
	}
	if err := c.tuneFrom(os.Getenv(workloads.TuneEnv)); err != nil {
		return usageError{err}
	}
	if c.ptx != "" {
		data, err := readPTX(ctx, "ptx", c.ptx)
		if err != nil {
			return err
		}
		c.kernels.PTX, c.kernels.PTX90 = data, nil // loaded as given, on every device
	}
	if c.spillPTX != "" {
		data, err := readPTX(ctx, "spill_ptx", c.spillPTX)
		if err != nil {
			return err
		}
		c.kernels.SpillPTX = data
	}
	rep, err := execute(ctx, &c, stderr)
	if err != nil {
		return err
	}
	if c.jsonOut {
		line, err := json.Marshal(rep)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s\n", line)
	} else {
		printReport(stdout, rep)
	}
	switch {
	case !rep.OutputsEqual:
		return failedError{errors.New("replayed outputs differ from eager outputs")}
	case rep.ChainRun != nil && !rep.ChainRun.MatchesWhole:
		return failedError{errors.New("the chain's output differs from the whole workload's")}
	case rep.Pause != nil && !rep.Pause.OutputsEqual:
		return failedError{errors.New("outputs after pause and resume differ from eager outputs")}
	case rep.CheckOK != nil && !*rep.CheckOK:
		return failedError{fmt.Errorf("outputs differ from the Go reference by %g (tolerance %g)", *rep.CheckMaxAbsDiff, *rep.CheckTolerance)}
	}
	return nil
}

// tuneFrom reads ARENAPLAN_TUNE's spec (see the package documentation):
// cmd/run's own keys here, the launch shapes through
// workloads.Kernels.Tune.
func (c *config) tuneFrom(spec string) error {
	own := []string{"ptx", "spill_ptx", "profile"}
	var shapes []string
	for _, f := range strings.Split(spec, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		key, val, _ := strings.Cut(f, "=")
		key, val = strings.TrimSpace(key), strings.TrimSpace(val)
		switch key {
		case "ptx", "spill_ptx":
			if val == "" {
				return fmt.Errorf("%s: %s: want %s=FILE", workloads.TuneEnv, key, key)
			}
			dst := &c.ptx
			if key == "spill_ptx" {
				dst = &c.spillPTX
			}
			if *dst != "" {
				return fmt.Errorf("%s: %s given twice", workloads.TuneEnv, key)
			}
			*dst = val
		case "profile":
			v, err := strconv.ParseBool(val)
			if err != nil {
				return fmt.Errorf("%s: profile=%q: want 1 or 0", workloads.TuneEnv, val)
			}
			c.profile = v
		default:
			if _, ok := workloads.TuneKeys()[key]; !ok {
				keys := slices.Sorted(maps.Keys(workloads.TuneKeys()))
				return fmt.Errorf("%s: unknown key %q (have %s)", workloads.TuneEnv, key, strings.Join(append(keys, own...), ", "))
			}
			shapes = append(shapes, f)
		}
	}
	k, err := c.kernels.Tune(strings.Join(shapes, ","))
	if err != nil {
		return fmt.Errorf("%s: %w", workloads.TuneEnv, err)
	}
	c.kernels = k
	return nil
}

// open opens --device and sizes the launch grids for it; the caller
// closes it.
func (c *config) open() (cuda.Device, string, error) {
	dev, choice, err := openDevice(c.device)
	if err != nil {
		return nil, "", err
	}
	if err := c.sizeFor(dev); err != nil {
		dev.Close()
		return nil, "", err
	}
	return dev, choice, nil
}

// sizeFor sizes the launch grids for dev's multiprocessors.
func (c *config) sizeFor(dev cuda.Device) error {
	n, err := dev.Multiprocessors()
	if err != nil {
		return err
	}
	c.kernels.Multiprocessors = n
	return nil
}

// maxPTX bounds a PTX file given with ARENAPLAN_TUNE's ptx or spill_ptx: the embedded
// modules are 0.1 MB, so 64 MiB is generous, and a file is checked for
// being a regular file before it is opened (no FIFO hang, no /dev/zero).
const maxPTX = 64 << 20

func readPTX(ctx context.Context, key, path string) ([]byte, error) {
	data, err := regfile.Read(ctx, path, maxPTX)
	if err != nil {
		return nil, fmt.Errorf("%s: %s=%s: %w", workloads.TuneEnv, key, path, err)
	}
	return data, nil
}

// report is one run's result; its JSON keys are a stable interface.
type report struct {
	Workload        string           `json:"workload"`
	Shape           map[string]int64 `json:"shape"`
	Fingerprint     string           `json:"fingerprint"`
	Device          string           `json:"device"`
	DeviceChoice    string           `json:"device_choice"`
	Storage         string           `json:"storage"`
	PlanSource      string           `json:"plan_source"`
	PlanAlgo        string           `json:"plan_algo"`
	ArenaBytes      int64            `json:"arena_bytes"`
	LowerBound      int64            `json:"lower_bound"`
	MappedBytes     uint64           `json:"mapped_bytes"`
	WeightBytes     int64            `json:"weight_bytes"`
	KVBytes         int64            `json:"kv_bytes"`
	InputBytes      int64            `json:"input_bytes"`
	OutputBytes     int64            `json:"output_bytes"`
	Intermediate    int64            `json:"intermediate_bytes"`
	SpilloverBytes  uint64           `json:"spillover_bytes"`
	StagingBytes    uint64           `json:"staging_bytes"`
	SpillPeak       uint64           `json:"spill_peak_bytes"`
	SpillReserved   uint64           `json:"spill_reserved_bytes"`
	SpillCapPeak    uint64           `json:"spill_capture_peak_bytes"`
	SpillCapRes     uint64           `json:"spill_capture_reserved_bytes"`
	SpillCapReuses  uint64           `json:"spill_capture_reuses"`
	SpillReuse      bool             `json:"spill_capture_reuse"`
	Launches        int              `json:"launches_per_step"`
	PDL             bool             `json:"pdl"`
	PDLLaunches     int              `json:"pdl_launches_per_step"`
	PTXTarget       int              `json:"ptx_target"`
	NoPDL           bool             `json:"no_pdl,omitempty"`
	GraphNodes      int              `json:"graph_nodes"`
	Steps           int              `json:"steps"`
	CaptureMS       float64          `json:"capture_ms"`
	EagerUS         float64          `json:"eager_us_per_step"`
	ReplayUS        float64          `json:"replay_us_per_step"`
	Speedup         float64          `json:"speedup"`
	OutputsEqual    bool             `json:"outputs_equal"`
	CheckMaxAbsDiff *float64         `json:"check_max_abs_diff,omitempty"`
	CheckMaxAbsRef  *float64         `json:"check_max_abs_ref,omitempty"`
	CheckTolerance  *float64         `json:"check_tolerance,omitempty"`
	CheckOK         *bool            `json:"check_ok,omitempty"`
	// --pause adds the pause/resume cycle.
	Pause *PauseRun `json:"pause,omitempty"`
	// A family plan's run adds its members and what separate arenas cost.
	*FamilyRun
	// A chain run (--stages) adds its stages.
	*ChainRun
}

func openDevice(spec string) (cuda.Device, string, error) {
	switch {
	case spec == "sim":
		d, err := cuda.OpenSim(simConfig())
		return d, "sim", err
	case spec == "auto":
		d, why, err := cuda.OpenAuto(simConfig())
		if err != nil {
			return nil, "", fmt.Errorf("--device auto: %w", err)
		}
		return d, "auto: " + why, nil
	case spec == "cuda" || strings.HasPrefix(spec, "cuda:"):
		n := 0
		if spec != "cuda" {
			v, err := strconv.Atoi(strings.TrimPrefix(spec, "cuda:"))
			if err != nil || v < 0 {
				return nil, "", usageError{fmt.Errorf("--device %q: want cuda:N with N a device ordinal", spec)}
			}
			n = v
		}
		d, err := cuda.Open(n)
		return d, fmt.Sprintf("cuda:%d", n), err
	}
	return nil, "", usageError{fmt.Errorf("--device %q: want auto, sim, cuda or cuda:N", spec)}
}

// shapeFor decides the workload and shape: the plan file's (dispatch
// refuses --workload and shape flags beside --plan), else the flags'. It
// builds the workload once to refuse a bad shape before a device is
// opened.
func shapeFor(c *config, f *plans.File) (string, workloads.Shape, error) {
	name := c.workload
	shape := c.shape.Shape()
	if f != nil {
		if f.Workload == nil {
			return "", shape, fmt.Errorf("%s: the plan records no workload (made from a trace, not by plan --workload)", c.planPath)
		}
		name = f.Workload.Name
		ps, err := workloads.PlanShape(f.Workload.Name, f.Workload.Shape)
		if err != nil {
			return "", shape, fmt.Errorf("%s: %w", c.planPath, err)
		}
		ps.Seed = shape.Seed
		shape = ps
	} else if err := c.shape.Check(name); err != nil {
		return "", shape, usageError{err}
	}
	if _, err := workloads.BuildWith(name, shape, c.kernels); err != nil {
		if f == nil {
			return "", shape, usageError{err} // a shape the flags gave
		}
		return "", shape, fmt.Errorf("%s: %w", c.planPath, err)
	}
	return name, shape, nil
}

// workloadFor builds the workload for the device c.kernels is sized for
// and, with a plan file, verifies the plan against it.
func workloadFor(c *config, f *plans.File, name string, shape workloads.Shape) (*graph.Graph, error) {
	g, err := workloads.BuildWith(name, shape, c.kernels)
	if err != nil {
		return nil, err
	}
	if f != nil {
		if err := verifyPlan(c, g, f.Workload, f.Trace, f.Plan); err != nil {
			return nil, fmt.Errorf("%s: %w", c.planPath, err)
		}
	}
	return g, nil
}

// verifyPlan checks that a plan file's workload is g, and says why a
// fingerprint may differ on a device of another size.
func verifyPlan(c *config, g *graph.Graph, w *plans.Workload, t *lifetime.Trace, p *planner.Plan) error {
	err := graph.VerifyPlan(g, planLabel(w), w.Fingerprint, t, p)
	var fe *graph.FingerprintError
	if errors.As(err, &fe) && c.kernels.Multiprocessors != 0 && c.kernels.Multiprocessors != defaultMultiprocessors {
		return fmt.Errorf("%w (launch grids sized for this device's %d multiprocessors; plan --workload sizes them for %d)",
			err, c.kernels.Multiprocessors, defaultMultiprocessors)
	}
	return err
}

// defaultMultiprocessors is what a workload's launch grids are sized for
// without a device (workloads.Kernels.Multiprocessors 0): an H100 SXM or
// H200.
const defaultMultiprocessors = 132

func planLabel(w *plans.Workload) string {
	s := w.Name + "("
	for i, d := range w.Shape {
		if i > 0 {
			s += ","
		}
		s += d.Name + "=" + strconv.FormatInt(d.Value, 10)
	}
	return s + ")"
}

func execute(ctx context.Context, c *config, stderr io.Writer) (*report, error) {
	if c.stages != "" {
		return executeChain(ctx, c)
	}
	file, fam, err := planFor(ctx, c)
	if err != nil {
		return nil, err
	}
	if fam != nil {
		if c.pause {
			return nil, usageError{errors.New("--pause runs a single workload, not a family plan")}
		}
		return executeFamily(ctx, c, fam)
	}
	if c.sequence != "" {
		return nil, usageError{errors.New("--sequence needs a family plan (plan --batch-sizes)")}
	}
	name, shape, err := shapeFor(c, file)
	if err != nil {
		return nil, err
	}
	dev, choice, err := c.open()
	if err != nil {
		return nil, err
	}
	defer dev.Close()
	g, err := workloadFor(c, file, name, shape)
	if err != nil {
		return nil, err
	}
	opt := graphexec.Options{Plan: graph.PlanOptions{Budget: c.budget}, NoCaptureReuse: c.noReuse, NoPDL: c.noPDL}
	var plan *planner.Plan
	source := "memory"
	if file != nil {
		plan, source = file.Plan, "file "+c.planPath
	}
	e, err := graphexec.New(dev, g, plan, opt)
	if err != nil {
		return nil, err
	}
	defer e.Close()
	rep := newReport(g, dev, choice, source)
	rep.PlanAlgo, rep.ArenaBytes, rep.LowerBound = e.Plan().Algo, e.Plan().Arena, e.Plan().LowerBound
	rep.MappedBytes, rep.WeightBytes, rep.KVBytes = e.Arena().Mapped(), e.RegionBytes("weight"), e.RegionBytes("kv")
	rep.InputBytes, rep.OutputBytes = e.RegionBytes("input"), e.RegionBytes("output")
	rep.Intermediate, rep.Launches, rep.Steps = e.RegionBytes("intermediate"), len(g.Ops), c.steps
	rep.setLaunch(e.LaunchMode(), c.noPDL)
	if err := e.Init(); err != nil {
		return nil, err
	}
	if err := e.Stage(0, c.warmup+c.steps); err != nil {
		return nil, err
	}
	rep.StagingBytes = e.StagingBytes()
	if c.profile {
		if err := profile(e, g, stderr); err != nil {
			return nil, err
		}
	}

	// Eager and replayed, each warmed up and timed from the initial state.
	l := loop{ctx: ctx, en: e, fresh: true}
	m, err := l.eagerThenReplay(c.warmup, c.steps, e.Eager, e.Replay, func() ([][]byte, error) { return results(e, g) })
	if err != nil {
		return nil, err
	}
	_, rep.GraphNodes = e.Captured()
	sr := e.SpillReport()
	rep.SpilloverBytes, rep.SpillPeak, rep.SpillReserved = sr.GraphReserved, sr.PeakHeld, sr.PeakReserved
	rep.SpillCapPeak, rep.SpillCapRes, rep.SpillCapReuses, rep.SpillReuse = sr.CapturePeakHeld, sr.CaptureReserved, sr.CaptureReuses, sr.CaptureReuse
	rep.OutputsEqual = m.equal()
	rep.setTimes(m.capture, m.eager, m.replay, c.steps)
	if c.pause {
		if rep.Pause, err = pauseRun(dev, e, g, c.steps, m.eagerOut); err != nil {
			return nil, fmt.Errorf("--pause: %w", err)
		}
	}
	if c.check {
		if err := check(c, g, e.Plan(), m.replayOut, rep); err != nil {
			return nil, err
		}
	}
	return rep, nil
}

// results reads the outputs and the state tensors.
func results(e *graphexec.Executor, g *graph.Graph) ([][]byte, error) {
	var out [][]byte
	for _, t := range g.Tensors {
		if t.Role == graph.Output || t.Role == graph.State {
			b, err := e.Read(t)
			if err != nil {
				return nil, err
			}
			out = append(out, b)
		}
	}
	return out, nil
}

// check runs the same steps eagerly on a simulated device, whose kernels
// are the Go references, and compares every output and state tensor with
// the device's replayed ones.
func check(c *config, g *graph.Graph, p *planner.Plan, got [][]byte, rep *report) error {
	sim, err := cuda.OpenSim(simConfig())
	if err != nil {
		return err
	}
	defer sim.Close()
	e, err := graphexec.New(sim, g, p, graphexec.Options{})
	if err != nil {
		return fmt.Errorf("check: %w", err)
	}
	defer e.Close()
	if err := e.Init(); err != nil {
		return fmt.Errorf("check: %w", err)
	}
	for s := 0; s < c.steps; s++ {
		if err := e.Eager(s); err != nil {
			return fmt.Errorf("check: %w", err)
		}
	}
	want, err := results(e, g)
	if err != nil {
		return fmt.Errorf("check: %w", err)
	}
	var maxDiff, maxRef float64
	for i := range want {
		if len(want[i]) != len(got[i]) {
			return fmt.Errorf("check: output %d has %d bytes, the reference %d", i, len(got[i]), len(want[i]))
		}
		for j := 0; j+4 <= len(want[i]); j += 4 {
			w := float64(math.Float32frombits(binary.LittleEndian.Uint32(want[i][j:])))
			v := float64(math.Float32frombits(binary.LittleEndian.Uint32(got[i][j:])))
			d := math.Abs(w - v)
			if math.IsNaN(d) {
				d = math.Inf(1)
			}
			maxDiff = max(maxDiff, d)
			maxRef = max(maxRef, math.Abs(w))
		}
	}
	tol := 1e-3 * max(1, maxRef)
	ok := maxDiff <= tol
	rep.CheckMaxAbsDiff, rep.CheckMaxAbsRef, rep.CheckTolerance, rep.CheckOK = &maxDiff, &maxRef, &tol, &ok
	return nil
}

func printReport(w io.Writer, r *report) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	var dims []string
	for _, k := range []string{"layers", "width", "heads", "kv_len", "batch", "vocab", "iters", "join_every"} {
		if v, ok := r.Shape[k]; ok {
			dims = append(dims, fmt.Sprintf("%s=%d", k, v))
		}
	}
	fmt.Fprintf(tw, "workload\t%s (%s), %s storage\n", r.Workload, strings.Join(dims, " "), r.Storage)
	fmt.Fprintf(tw, "fingerprint\t%s\n", r.Fingerprint)
	fmt.Fprintf(tw, "device\t%s (%s)\n", r.Device, r.DeviceChoice)
	fmt.Fprintf(tw, "plan\t%s (%s)\n", r.PlanSource, r.PlanAlgo)
	ratio := 1.0
	if r.LowerBound > 0 {
		ratio = float64(r.ArenaBytes) / float64(r.LowerBound)
	}
	fmt.Fprintf(tw, "arena\t%s, lower bound %s (%.4fx); %s mapped\n", bytesStr(r.ArenaBytes), bytesStr(r.LowerBound), ratio, bytesStr(int64(r.MappedBytes)))
	fmt.Fprintf(tw, "  regions\tweights %s, kv %s, inputs %s, outputs %s, intermediates %s\n",
		bytesStr(r.WeightBytes), bytesStr(r.KVBytes), bytesStr(r.InputBytes), bytesStr(r.OutputBytes), bytesStr(r.Intermediate))
	fmt.Fprintf(tw, "spillover\t%s kept for the graph (staged per-step inputs outside the arena: %s)\n", bytesStr(int64(r.SpilloverBytes)), bytesStr(int64(r.StagingBytes)))
	if r.SpillReserved > 0 {
		fmt.Fprintf(tw, "  spill\tpeak held %s, peak reserved %s; capture: held %s, reserved %s, %d blocks reused in capture (capture-time reuse %v)\n",
			bytesStr(int64(r.SpillPeak)), bytesStr(int64(r.SpillReserved)), bytesStr(int64(r.SpillCapPeak)), bytesStr(int64(r.SpillCapRes)), r.SpillCapReuses, onOff(r.SpillReuse))
	}
	fmt.Fprintf(tw, "launches\t%d kernels per step; captured graph of %d nodes\n", r.Launches, r.GraphNodes)
	fmt.Fprintf(tw, "launch\t%s\n", launchStr(r))
	fmt.Fprintf(tw, "capture\t%.3f ms (capture and instantiate)\n", r.CaptureMS)
	fmt.Fprintf(tw, "eager\t%.1f µs/step (%d steps)\n", r.EagerUS, r.Steps)
	fmt.Fprintf(tw, "replay\t%.1f µs/step (%.2fx eager)\n", r.ReplayUS, r.Speedup)
	fmt.Fprintf(tw, "outputs\treplay equals eager bit for bit: %v\n", r.OutputsEqual)
	if r.Pause != nil {
		printPause(tw, r.Pause)
	}
	if cr := r.ChainRun; cr != nil {
		fmt.Fprintf(tw, "chain\t%d stages %v (layers [from, to)), %d tensors read in place; output equals the whole mlp's bit for bit: %v\n",
			len(cr.Stages), cr.Stages, cr.Links, cr.MatchesWhole)
	}
	if r.CheckOK != nil {
		fmt.Fprintf(tw, "check\tmax abs diff vs Go reference %.3g (max |ref| %.3g, tolerance %.3g): %v\n", *r.CheckMaxAbsDiff, *r.CheckMaxAbsRef, *r.CheckTolerance, *r.CheckOK)
	}
	tw.Flush()
	if r.FamilyRun != nil {
		printFamily(w, r)
	}
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// launchStr says how kernels were launched: "PDL (compute_90), 63 of 64
// kernels" or "plain (compute_80)".
func launchStr(r *report) string {
	target := "PTX target unknown"
	if r.PTXTarget > 0 {
		target = fmt.Sprintf("compute_%d", r.PTXTarget)
	}
	switch {
	case r.PDL:
		return fmt.Sprintf("PDL (%s), %d of %d kernels with programmatic serialization", target, r.PDLLaunches, r.Launches)
	case r.NoPDL:
		return fmt.Sprintf("plain (%s, --no-pdl)", target)
	}
	return fmt.Sprintf("plain (%s)", target)
}

// simConfig is the simulated device: sized to this host, running the
// built-in workloads' Go references, with simMultiprocessors (0: the
// simulation's default, 132).
func simConfig() cuda.SimConfig {
	cfg := cuda.SizedSimConfig(workloads.SimKernels())
	cfg.Multiprocessors = simMultiprocessors
	return cfg
}

// simMultiprocessors is the simulated device's multiprocessor count; tests
// set it to run the workloads' launch shapes for other devices.
var simMultiprocessors int

func bytesStr(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%d (%.2f GiB)", n, float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%d (%.1f MiB)", n, float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%d (%.1f KiB)", n, float64(n)/(1<<10))
	default:
		return fmt.Sprint(n)
	}
}

// profile prints the device time of each kind of op in one eager step.
func profile(e *graphexec.Executor, g *graph.Graph, w io.Writer) error {
	for range 2 { // the first step warms the caches and the JIT
		if _, err := e.ProfileOps(0); err != nil {
			return err
		}
	}
	ts, err := e.ProfileOps(0)
	if err != nil {
		return err
	}
	type agg struct {
		n   int
		sum time.Duration
	}
	kinds := map[string]*agg{}
	var order []string
	var total time.Duration
	for i, op := range g.Ops {
		k := op.Name
		if j := strings.IndexByte(k, '.'); j >= 0 {
			k = k[j+1:]
		}
		if kinds[k] == nil {
			kinds[k] = &agg{}
			order = append(order, k)
		}
		kinds[k].n++
		kinds[k].sum += ts[i]
		total += ts[i]
	}
	for _, k := range order {
		a := kinds[k]
		fmt.Fprintf(w, "profile %-20s n=%-3d total %8.1f us  avg %8.2f us\n", k, a.n, float64(a.sum.Nanoseconds())/1e3, float64(a.sum.Nanoseconds())/1e3/float64(a.n))
	}
	fmt.Fprintf(w, "profile %-20s       total %8.1f us\n", "all", float64(total.Nanoseconds())/1e3)
	return e.ResetState()
}

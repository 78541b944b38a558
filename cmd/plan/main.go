// Command plan is arenaplan's offline step: it reads allocation traces
// (MiniMalloc CSV, PyTorch memory snapshots, arenaplan JSON), gives every
// buffer a fixed offset in one arena, verifies the plan with planner.Check
// and writes it as a compressed, checksummed plan file.
//
//	plan [flags] TRACE...
//	plan inspect FILE.plan
//
// Exit status: 0 on success (--help included: the usage goes to stdout), 1
// on bad input or failure (one line on stderr; a trace without buffers is
// bad input), 2 on bad usage, 130 when interrupted. Bad usage is one rule
// for plan and run alike: an unknown flag, a flag value out of range (a
// workload's shape included), a flag the mode does not take (a trace flag
// with --workload, a workload flag with traces) or two flags that decide
// the same thing. The first Ctrl-C stops reading, decoding, validating or
// planning at once, a second one exits whatever the command is doing.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/pflag"

	"github.com/arenaplan/arenaplan/graph"
	"github.com/arenaplan/arenaplan/internal/interrupt"
	"github.com/arenaplan/arenaplan/internal/term"
	"github.com/arenaplan/arenaplan/lifetime"
	"github.com/arenaplan/arenaplan/planner"
	"github.com/arenaplan/arenaplan/plans"
	"github.com/arenaplan/arenaplan/workloads"
)

func main() {
	ctx, stop := interrupt.Notify(os.Stderr, "plan")
	// The progress line goes to standard error: it is redrawn only where
	// that is a terminal.
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr, term.IsTerminal(os.Stderr))
	stop()
	os.Exit(code)
}

// usageError marks failures that exit with status 2.
type usageError struct{ error }

type config struct {
	format      string
	algo        string
	align       int64
	out         string
	compare     bool
	jsonOut     bool
	svg         string
	keepOffsets bool
	budget      time.Duration
	workers     int
	exportCSV   string
	workload    string
	shape       *workloads.ShapeFlags
	batchSizes  string
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer, tty bool) int {
	err := interrupt.Run(ctx, func() error { return dispatch(ctx, args, stdout, stderr, tty) })
	if err == nil {
		return 0
	}
	if errors.Is(err, pflag.ErrHelp) {
		return 0
	}
	fmt.Fprintf(stderr, "plan: %v\n", err)
	if errors.Is(err, interrupt.ErrInterrupted) {
		return interrupt.ExitCode
	}
	var ue usageError
	if errors.As(err, &ue) {
		return 2
	}
	return 1
}

func dispatch(ctx context.Context, args []string, stdout, stderr io.Writer, tty bool) error {
	if len(args) > 0 && args[0] == "inspect" {
		return inspect(ctx, args[1:], stdout, stderr)
	}
	var c config
	// Three groups, shown apart by --help: flags of every plan, flags that
	// only traces take, flags that only --workload takes.
	common := pflag.NewFlagSet("plan", pflag.ContinueOnError)
	common.StringVar(&c.algo, "algo", planner.Auto, "planning algorithm: "+strings.Join(planner.Names(), ", "))
	common.Int64Var(&c.align, "align", planner.DefaultAlign, "round sizes up to and align offsets on this many bytes (a power of two)")
	common.StringVarP(&c.out, "output", "o", "", "write the plan to this file (one trace only)")
	common.BoolVar(&c.jsonOut, "json", false, "print one JSON object per trace per line")
	common.DurationVar(&c.budget, "budget", planner.DefaultBudget, "time budget per trace for searching algorithms")
	common.IntVar(&c.workers, "workers", 0, "goroutines a search may use (0: all cores; 1: deterministic)")
	traceFlags := pflag.NewFlagSet("plan", pflag.ContinueOnError)
	traceFlags.StringVar(&c.format, "format", "", "trace format: csv, torch or json (default: from the file extension)")
	traceFlags.BoolVar(&c.compare, "compare", false, "also run the baselines ("+strings.Join(planner.Baselines, ", ")+") side by side")
	traceFlags.StringVar(&c.svg, "svg", "", "draw the layout to this SVG file (one trace only)")
	traceFlags.BoolVar(&c.keepOffsets, "keep-offsets", false, "treat a CSV offset column as fixed offsets instead of an earlier solution")
	traceFlags.StringVar(&c.exportCSV, "export-csv", "", "also write the trace with an offset column to this CSV file (one trace only)")
	workloadFlags := pflag.NewFlagSet("plan", pflag.ContinueOnError)
	workloadFlags.StringVar(&c.workload, "workload", "", "plan a built-in workload's dry run instead of traces: "+strings.Join(workloads.Workloads(), ", "))
	c.shape = workloads.AddShapeFlags(workloadFlags)
	workloadFlags.StringVar(&c.batchSizes, "batch-sizes", "", "plan a family of these batch sizes (1,2,4,...) into one arena and one file; overrides --batch")
	fs := pflag.NewFlagSet("plan", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.AddFlagSet(common)
	fs.AddFlagSet(traceFlags)
	fs.AddFlagSet(workloadFlags)
	usage := func(w io.Writer) {
		fmt.Fprintf(w, "usage: plan [flags] [trace flags] TRACE...\n       plan --workload NAME [workload flags] [flags]\n       plan inspect [--json] FILE.plan\n\n"+
			"flags:\n%s\ntrace flags (TRACE...):\n%s\nworkload flags (--workload):\n%s",
			common.FlagUsages(), traceFlags.FlagUsages(), workloadFlags.FlagUsages())
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
	paths := fs.Args()
	if c.workload != "" && len(paths) > 0 {
		return usageError{errors.New("--workload takes no trace arguments")}
	}
	if c.workload == "" && c.batchSizes != "" {
		return usageError{errors.New("--batch-sizes needs --workload")}
	}
	if c.workload == "" && len(c.shape.Changed()) > 0 {
		return usageError{fmt.Errorf("%s needs --workload", strings.Join(c.shape.Changed(), ", "))}
	}
	switch {
	case c.workload == "" && len(paths) == 0:
		usage(stderr)
		return usageError{errors.New("no trace given")}
	case c.align < 1 || c.align > planner.MaxAlign || c.align&(c.align-1) != 0:
		return usageError{fmt.Errorf("--align %d: must be a power of two from 1 to 2^30", c.align)}
	case c.budget <= 0:
		return usageError{fmt.Errorf("--budget %v: must be positive", c.budget)}
	case c.workers < 0:
		return usageError{fmt.Errorf("--workers %d: must not be negative", c.workers)}
	}
	if err := c.options().Validate(); err != nil {
		return usageError{err}
	}
	if !known(c.algo) {
		return usageError{fmt.Errorf("--algo %q: unknown (have %s)", c.algo, strings.Join(planner.Names(), ", "))}
	}
	if c.format != "" && c.format != "csv" && c.format != "torch" && c.format != "json" {
		return usageError{fmt.Errorf("--format %q: want csv, torch or json", c.format)}
	}
	if c.workload != "" {
		return planWorkload(ctx, c, stdout)
	}
	var traces []*lifetime.Trace
	var sources []string
	for _, p := range paths {
		ts, err := lifetime.LoadContext(ctx, p, c.format)
		if err != nil {
			return err
		}
		if len(ts) == 0 {
			return fmt.Errorf("%s: no trace in the file", p)
		}
		for _, t := range ts {
			if len(t.Buffers) == 0 {
				return fmt.Errorf("%s: trace %q has no buffers: nothing to plan", p, t.Name)
			}
			traces = append(traces, t)
			sources = append(sources, p)
		}
	}
	if len(traces) != 1 && (c.out != "" || c.svg != "" || c.exportCSV != "") {
		return usageError{fmt.Errorf("-o, --svg and --export-csv need exactly one trace, got %d", len(traces))}
	}

	var rows []report
	for i, t := range traces {
		if c.keepOffsets {
			t.KeepPriorOffsets()
		}
		r, p, err := planOne(ctx, c, sources[i], t, stderr, tty)
		if err != nil {
			return err
		}
		if c.out != "" {
			if err := plans.Save(c.out, &plans.File{Trace: t, Plan: p}); err != nil {
				return err
			}
		}
		if c.svg != "" {
			if err := writeFile(c.svg, func(w io.Writer) error { return writeSVG(w, t, p) }); err != nil {
				return err
			}
		}
		if c.exportCSV != "" {
			if err := writeFile(c.exportCSV, func(w io.Writer) error { return lifetime.WriteCSV(w, t, p.Offsets) }); err != nil {
				return err
			}
		}
		if c.jsonOut {
			line, err := json.Marshal(r)
			if err != nil {
				return err
			}
			fmt.Fprintf(stdout, "%s\n", line)
		}
		rows = append(rows, r)
	}
	if !c.jsonOut {
		printTable(stdout, rows, c.compare)
	}
	return nil
}

// planWorkload plans a built-in workload's dry run, one region per tag,
// and writes the plan with the workload's name, shape and fingerprint.
func planWorkload(ctx context.Context, c config, stdout io.Writer) error {
	if c.svg != "" || c.exportCSV != "" || c.keepOffsets || c.compare {
		return usageError{errors.New("--svg, --export-csv, --keep-offsets and --compare take traces, not --workload")}
	}
	if err := c.shape.Check(c.workload); err != nil {
		return usageError{err}
	}
	if c.batchSizes != "" {
		return planFamily(ctx, c, stdout)
	}
	g, err := workloads.Build(c.workload, c.shape.Shape())
	if err != nil {
		return usageError{err} // a shape the flags gave
	}
	d, err := g.DryRun()
	if err != nil {
		return err
	}
	t := d.Trace
	p, err := graph.PlanWith(ctx, c.algo, t, planner.Options{Align: c.align, Budget: c.budget, Workers: c.workers})
	if err != nil {
		return err
	}
	w := g.Workload()
	if c.out != "" {
		if err := plans.Save(c.out, &plans.File{Trace: t, Plan: p, Workload: w}); err != nil {
			return err
		}
	}
	r := report{
		Trace: g.Label(), Buffers: len(t.Buffers), LowerBound: p.LowerBound, Arena: p.Arena,
		Ratio: p.Ratio(), Algo: p.Algo, Millis: millis(p.Elapsed), MillisToBest: millis(p.ToBest),
		Optimal: p.Optimal, Align: p.Align, Fingerprint: g.Fingerprint().String(),
	}
	if c.jsonOut {
		line, err := json.Marshal(r)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s\n", line)
		return nil
	}
	printTable(stdout, []report{r}, false)
	fmt.Fprintf(stdout, "workload fingerprint %s\n", r.Fingerprint)
	return nil
}

// options are the planner options the flags ask for.
func (c config) options() planner.Options {
	return planner.Options{Align: c.align, Budget: c.budget, Workers: c.workers}
}

func known(algo string) bool {
	for _, n := range planner.Names() {
		if n == algo {
			return true
		}
	}
	return false
}

// report is one trace's result; its JSON keys are a stable interface.
type report struct {
	Trace         string           `json:"trace"`
	Buffers       int              `json:"buffers"`
	LowerBound    int64            `json:"lower_bound"`
	Bound         int64            `json:"bound"`
	Arena         int64            `json:"arena"`
	Ratio         float64          `json:"ratio"`
	RatioBound    float64          `json:"ratio_bound"`
	Algo          string           `json:"algo"`
	Millis        float64          `json:"millis"`
	MillisToBest  float64          `json:"millis_to_best"`
	Optimal       bool             `json:"optimal"`
	Stop          string           `json:"stop,omitempty"`
	Align         int64            `json:"align"`
	Baselines     map[string]int64 `json:"baselines,omitempty"`
	TorchReserved int64            `json:"torch_reserved,omitempty"`
	PriorArena    int64            `json:"prior_arena,omitempty"`
	PriorError    string           `json:"prior_error,omitempty"`
	Fingerprint   string           `json:"workload_fingerprint,omitempty"`
}

func planOne(ctx context.Context, c config, source string, t *lifetime.Trace, stderr io.Writer, tty bool) (report, *planner.Plan, error) {
	opt := planner.Options{Align: c.align, Budget: c.budget, Workers: c.workers}
	if tty {
		opt.Progress = progressLine(stderr, source)
	}
	// By tag, as graphexec and the bridge plan: the file is arena-ready.
	p, _, err := planner.RunByTag(ctx, c.algo, t, opt)
	if opt.Progress != nil {
		fmt.Fprint(stderr, "\r\033[K")
	}
	if err != nil {
		return report{}, nil, fmt.Errorf("%s: %w", source, err)
	}
	r := report{
		Trace: source, Buffers: len(t.Buffers), LowerBound: p.LowerBound, Bound: max(p.Bound, p.LowerBound), Arena: p.Arena,
		Ratio: p.Ratio(), RatioBound: p.RatioBound(), Algo: p.Algo, Millis: millis(p.Elapsed), MillisToBest: millis(p.ToBest),
		Optimal: p.Optimal, Stop: string(p.Stop), Align: p.Align,
	}
	if c.compare {
		r.Baselines = map[string]int64{}
		for _, b := range planner.Baselines {
			bp, _, err := planner.RunByTag(ctx, b, t, planner.Options{Align: c.align, Workers: c.workers})
			if err != nil {
				return report{}, nil, fmt.Errorf("%s: %w", source, err)
			}
			r.Baselines[b] = bp.Arena
		}
	}
	if t.Torch != nil && t.Torch.HasSegments {
		r.TorchReserved = t.Torch.Reserved()
	}
	if t.Prior != nil && !c.keepOffsets {
		r.PriorArena, r.PriorError = priorArena(t, c.align)
	}
	return r, p, nil
}

// priorArena is the arena an earlier solution (an offset column) implies,
// and why it is invalid if Check rejects it. The earlier solution is
// judged at alignment 1, as it was made.
func priorArena(t *lifetime.Trace, align int64) (int64, string) {
	for _, o := range t.Prior {
		if o == lifetime.NoOffset {
			return 0, "offset column incomplete"
		}
	}
	p := &planner.Plan{Align: 1, Offsets: t.Prior, Arena: planner.ArenaSize(t, t.Prior, 1)}
	if err := planner.Check(t, p); err != nil {
		return p.Arena, err.Error()
	}
	return p.Arena, ""
}

func millis(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// progressLine returns a Progress callback that redraws one status line,
// starting only once a search has run for a second.
func progressLine(w io.Writer, source string) func(planner.Progress) {
	return func(p planner.Progress) {
		if p.Elapsed < time.Second {
			return
		}
		if p.Best == 0 {
			fmt.Fprintf(w, "\r\033[K%s: no plan yet, lower bound %d, %.1fs", source, p.LowerBound, p.Elapsed.Seconds())
			return
		}
		ratio := 1.0
		if p.LowerBound > 0 {
			ratio = float64(p.Best) / float64(p.LowerBound)
		}
		fmt.Fprintf(w, "\r\033[K%s: best %d vs lower bound %d (%.4fx), %.1fs", source, p.Best, p.LowerBound, ratio, p.Elapsed.Seconds())
	}
}

func printTable(w io.Writer, rows []report, compare bool) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := "trace\tbuffers\tlower bound\tarena\tarena/LB\talgo\tms\t"
	if compare {
		for _, b := range planner.Baselines {
			head += b + "/LB\t"
		}
	}
	torch, prior := false, false
	for _, r := range rows {
		torch = torch || r.TorchReserved > 0
		prior = prior || r.PriorArena > 0
	}
	if torch {
		head += "torch reserved\tsaved\t"
	}
	if prior {
		head += "prior arena\tprior/LB\t"
	}
	fmt.Fprintln(tw, head)
	for _, r := range rows {
		opt := ""
		if r.Optimal {
			opt = " (optimal)"
		}
		line := fmt.Sprintf("%s\t%d\t%s\t%s\t%.4f%s\t%s\t%.1f\t", r.Trace, r.Buffers, bytesStr(r.LowerBound), bytesStr(r.Arena), r.Ratio, opt, r.Algo, r.Millis)
		if compare {
			for _, b := range planner.Baselines {
				line += fmt.Sprintf("%.4f\t", ratio(r.Baselines[b], r.LowerBound))
			}
		}
		if torch {
			if r.TorchReserved > 0 {
				line += fmt.Sprintf("%s\t%s (%.1f%%)\t", bytesStr(r.TorchReserved), bytesStr(r.TorchReserved-r.Arena),
					100*float64(r.TorchReserved-r.Arena)/float64(r.TorchReserved))
			} else {
				line += "-\t-\t"
			}
		}
		if prior {
			switch {
			case r.PriorError != "":
				line += "invalid\t-\t"
			case r.PriorArena > 0:
				line += fmt.Sprintf("%s\t%.4f\t", bytesStr(r.PriorArena), ratio(r.PriorArena, r.LowerBound))
			default:
				line += "-\t-\t"
			}
		}
		fmt.Fprintln(tw, line)
	}
	tw.Flush()
}

func ratio(a, lb int64) float64 {
	if lb == 0 {
		return 1
	}
	return float64(a) / float64(lb)
}

// bytesStr prints a byte count exactly, with a binary-unit hint for big ones.
func bytesStr(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%d (%.2f GiB)", n, float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%d (%.1f MiB)", n, float64(n)/(1<<20))
	default:
		return fmt.Sprint(n)
	}
}

func writeFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return fmt.Errorf("%s: %w", path, err)
	}
	return f.Close()
}

func inspect(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := pflag.NewFlagSet("plan inspect", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "print the whole plan as JSON (every buffer and its offset)")
	fs.Usage = func() { fmt.Fprintf(stdout, "usage: plan inspect [--json] FILE.plan\n\nflags:\n%s", fs.FlagUsages()) }
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	if fs.NArg() != 1 {
		return usageError{errors.New("usage: plan inspect [--json] FILE.plan")}
	}
	// One read and one decompression, whatever the file's version.
	f, fam, err := plans.LoadAny(ctx, fs.Arg(0))
	if err != nil {
		return err
	}
	if fam != nil {
		return inspectFamily(fs.Arg(0), fam, *asJSON, stdout)
	}
	if *asJSON {
		return plans.WriteJSON(stdout, f)
	}
	p, t := f.Plan, f.Trace
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "file\t%s\n", fs.Arg(0))
	fmt.Fprintf(tw, "trace\t%s\n", t.Name)
	fmt.Fprintf(tw, "fingerprint\t%x\n", t.Fingerprint())
	if w := f.Workload; w != nil {
		fmt.Fprintf(tw, "workload\t%s\n", w.Name)
		for _, d := range w.Shape {
			fmt.Fprintf(tw, "  %s\t%d\n", d.Name, d.Value)
		}
		fmt.Fprintf(tw, "workload fingerprint\t%x\n", w.Fingerprint)
	}
	fmt.Fprintf(tw, "buffers\t%d\n", len(t.Buffers))
	fmt.Fprintf(tw, "algorithm\t%s\n", p.Algo)
	fmt.Fprintf(tw, "alignment\t%d\n", p.Align)
	fmt.Fprintf(tw, "lower bound\t%s\n", bytesStr(p.LowerBound))
	fmt.Fprintf(tw, "arena\t%s\n", bytesStr(p.Arena))
	fmt.Fprintf(tw, "arena/LB\t%.4f\n", p.Ratio())
	fmt.Fprintf(tw, "optimal\t%v\n", p.Optimal)
	fmt.Fprintf(tw, "check\tpassed\n")
	return tw.Flush()
}

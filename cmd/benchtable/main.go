// Command benchtable measures the planner on the shared benchmark traces
// and prints the markdown tables kept in BENCHMARKS.md ("Planner: auto vs
// baselines"). It builds cmd/plan, then runs
//
//	plan --json --algo auto --align A --budget T FILE
//
// -runs times per instance and budget, timing the whole command (reading
// the trace included), and plan --algo bestfit / bysize once for the
// baselines' ratios. With -runs above 1 a row shows the worst arena of
// the runs (optimal only if every run was) and the median and worst
// times, so that a lucky run cannot make a row. With -scaling it also
// plans traces of 1k to 1M buffers drawn by internal/tracegen. Run it
// under taskset to measure on fewer cores (the plans inherit the mask,
// and Go sizes GOMAXPROCS, hence the workers, to it).
//
// Usage:
//
//	go run ./cmd/benchtable [-data ../shared/data] [-scaling] [-runs N] [-only REGEXP]
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/arenaplan/arenaplan/lifetime"
	"github.com/arenaplan/arenaplan/lifetime/tracegen"
	"github.com/arenaplan/arenaplan/planner"
)

// instance is one row: a trace, its alignment and budget, and the best
// height known from the data's README (0: unknown). The planner never sees
// the best known height; the table only reports it.
type instance struct {
	group     string
	path      string
	align     int64
	budget    time.Duration
	bestKnown int64
}

type result struct {
	Buffers    int     `json:"buffers"`
	LowerBound int64   `json:"lower_bound"`
	Arena      int64   `json:"arena"`
	Ratio      float64 `json:"ratio"`
	Optimal    bool    `json:"optimal"`
	Millis     float64 `json:"millis"`
	ToBest     float64 `json:"millis_to_best"`
	wall       time.Duration
}

// runs is one instance planned several times.
type runs []*result

// worst is the run with the largest arena (the slowest among equals).
func (rs runs) worst() *result {
	w := rs[0]
	for _, r := range rs[1:] {
		if r.Arena > w.Arena || r.Arena == w.Arena && r.wall > w.wall {
			w = r
		}
	}
	return w
}

func (rs runs) optimal() bool {
	for _, r := range rs {
		if !r.Optimal {
			return false
		}
	}
	return true
}

// times formats a time of every run, in seconds: "m" for one run, else
// "median (worst)".
func (rs runs) times(of func(*result) float64) string {
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = of(r)
	}
	sort.Float64s(v)
	if len(v) == 1 {
		return fmt.Sprintf("%.2f s", v[0])
	}
	return fmt.Sprintf("%.2f (%.2f) s", v[len(v)/2], v[len(v)-1])
}

func wallOf(r *result) float64   { return r.wall.Seconds() }
func searchOf(r *result) float64 { return r.Millis / 1000 }
func bestOf(r *result) float64   { return r.ToBest / 1000 }

// challenging are MiniMalloc's budgets: half its published time, rounded
// (D and J, whose optimum is unknown, get 10 s), and the best heights known.
var challenging = map[string]struct {
	budget time.Duration
	best   int64
}{
	"A": {6500 * time.Millisecond, 1048576}, "B": {4200 * time.Millisecond, 1048576},
	"C": {1000 * time.Millisecond, 1039360}, "D": {10 * time.Second, 1031168},
	"E": {4600 * time.Millisecond, 1048576}, "F": {6700 * time.Millisecond, 1048576},
	"G": {1500 * time.Millisecond, 1048576}, "H": {2300 * time.Millisecond, 1048576},
	"I": {5200 * time.Millisecond, 1048576}, "J": {10 * time.Second, 1036288},
	"K": {800 * time.Millisecond, 1048576},
}

func main() {
	data := flag.String("data", "../shared/data", "the shared data folder")
	scaling := flag.Bool("scaling", false, "also run the scaling traces (1k to 1M buffers)")
	only := flag.String("only", "", "run only instances whose path matches this regexp")
	n := flag.Int("runs", 1, "plan every instance this many times with auto (worst arena, median and worst times)")
	flag.Parse()
	if *n < 1 {
		fmt.Fprintln(os.Stderr, "benchtable: -runs must be at least 1")
		os.Exit(2)
	}
	if err := run(*data, *scaling, *only, *n); err != nil {
		fmt.Fprintln(os.Stderr, "benchtable:", err)
		os.Exit(1)
	}
}

func run(data string, scaling bool, only string, n int) error {
	tmp, err := os.MkdirTemp("", "benchtable")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	plan := filepath.Join(tmp, "plan")
	if out, err := exec.Command("go", "build", "-o", plan, "./cmd/plan").CombinedOutput(); err != nil {
		return fmt.Errorf("building cmd/plan: %v\n%s", err, out)
	}
	var re *regexp.Regexp
	if only != "" {
		if re, err = regexp.Compile(only); err != nil {
			return err
		}
	}
	insts, err := instances(data)
	if err != nil {
		return err
	}
	host, _ := os.Hostname()
	fmt.Printf("Machine: %s, %d cores (GOMAXPROCS %d), %s/%s, %s; %d run(s) each; measured %s.\n\n",
		host, runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.GOOS, runtime.GOARCH, runtime.Version(), n, time.Now().UTC().Format("2006-01-02 15:04 MST"))
	fmt.Println("| group | instance | align | buffers | lower bound | best known | auto arena | ratio | optimal | budget | wall time | to best | bestfit | bysize |")
	fmt.Println("|---|---|---:|---:|---:|---:|---:|---:|:---:|---:|---:|---:|---:|---:|")
	for _, in := range insts {
		if re != nil && !re.MatchString(in.path) {
			continue
		}
		rs, err := planRuns(plan, in.path, in.align, in.budget, n)
		if err != nil {
			return err
		}
		r := rs.worst()
		bf, err := planOnce(plan, "bestfit", in.path, in.align, in.budget)
		if err != nil {
			return err
		}
		bs, err := planOnce(plan, planner.BySize, in.path, in.align, in.budget)
		if err != nil {
			return err
		}
		best := "-"
		if in.bestKnown > 0 {
			best = strconv.FormatInt(in.bestKnown, 10)
		}
		name := strings.TrimSuffix(filepath.Base(in.path), ".csv")
		if in.group == "idealloc" {
			name = filepath.Base(filepath.Dir(in.path)) + "/" + name
		}
		fmt.Printf("| %s | %s | %d | %d | %d | %s | %d | %.5f | %s | %v | %s | %s | %.4f | %.4f |\n",
			in.group, name, in.align, r.Buffers, r.LowerBound, best, r.Arena, r.Ratio, yes(rs.optimal()),
			in.budget, rs.times(wallOf), rs.times(bestOf), bf.Ratio, bs.Ratio)
	}
	if scaling {
		fmt.Println()
		fmt.Println("| buffers | lower bound | auto arena | ratio | budget | wall time | of it planning | to best | bestfit ratio | bestfit time | bysize ratio | bysize time |")
		fmt.Println("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
		for _, size := range []int{1000, 10000, 100000, 1000000} {
			tr, err := tracegen.Generate(tracegen.Options{Buffers: size, Seed: 1})
			if err != nil {
				return err
			}
			path := filepath.Join(tmp, fmt.Sprintf("gen-%d.csv", size))
			if err := writeCSV(path, tr); err != nil {
				return err
			}
			bf, err := planOnce(plan, planner.BestFit, path, 1, 0)
			if err != nil {
				return err
			}
			bs, err := planOnce(plan, planner.BySize, path, 1, 0)
			if err != nil {
				return err
			}
			// The default budget.
			budget := 2 * time.Second
			rs, err := planRuns(plan, path, 1, budget, n)
			if err != nil {
				return err
			}
			r := rs.worst()
			fmt.Printf("| %d | %d | %d | %.5f | %v | %s | %s | %s | %.4f | %.2f s | %.4f | %.2f s |\n",
				size, r.LowerBound, r.Arena, r.Ratio, budget, rs.times(wallOf), rs.times(searchOf), rs.times(bestOf),
				bf.Ratio, bf.wall.Seconds(), bs.Ratio, bs.wall.Seconds())
		}
	}
	return nil
}

func yes(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func instances(data string) ([]instance, error) {
	var out []instance
	glob := func(pattern string) []string {
		m, _ := filepath.Glob(filepath.Join(data, pattern))
		sort.Strings(m)
		return m
	}
	torch := glob("torch/*.csv")
	if len(torch) == 0 {
		return nil, fmt.Errorf("no traces under %s", data)
	}
	for _, align := range []int64{1, 512} {
		for _, p := range torch {
			out = append(out, instance{"torch", p, align, 100 * time.Millisecond, 0})
		}
	}
	for _, p := range glob("minimalloc/related/idealloc/*/*.csv") {
		b := time.Second
		if strings.HasSuffix(p, "Y_1.csv") {
			b = 3 * time.Second
		}
		out = append(out, instance{"idealloc", p, 1, b, 0})
	}
	for _, p := range glob("minimalloc/challenging/*.csv") {
		c, ok := challenging[strings.SplitN(filepath.Base(p), ".", 2)[0]]
		if !ok {
			continue
		}
		out = append(out, instance{"challenging", p, 1, c.budget, c.best})
	}
	for _, p := range glob("minimalloc/related/omnimalloc_small/*.csv") {
		// The number in the file name is the optimum.
		f := strings.Split(filepath.Base(p), ".")
		best, _ := strconv.ParseInt(f[1], 10, 64)
		out = append(out, instance{"omnimalloc_small", p, 1, time.Second, best})
	}
	return out, nil
}

// planRuns plans path with auto n times.
func planRuns(plan, path string, align int64, budget time.Duration, n int) (runs, error) {
	var rs runs
	for range n {
		r, err := planOnce(plan, "auto", path, align, budget)
		if err != nil {
			return nil, err
		}
		rs = append(rs, r)
	}
	return rs, nil
}

func planOnce(plan, algo, path string, align int64, budget time.Duration) (*result, error) {
	args := []string{"--json", "--algo", algo, "--align", strconv.FormatInt(align, 10)}
	if budget > 0 {
		args = append(args, "--budget", budget.String())
	}
	cmd := exec.Command(plan, append(args, path)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	start := time.Now()
	out, err := cmd.Output()
	wall := time.Since(start)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %v\n%s", algo, path, err, stderr.String())
	}
	var r result
	if err := json.Unmarshal(bytes.TrimSpace(out), &r); err != nil {
		return nil, fmt.Errorf("%s %s: %v in %q", algo, path, err, out)
	}
	r.wall = wall
	return &r, nil
}

func writeCSV(path string, t *lifetime.Trace) error {
	var b bytes.Buffer
	b.WriteString("id,lower,upper,size\n")
	for i := range t.Buffers {
		x := &t.Buffers[i]
		fmt.Fprintf(&b, "%d,%d,%d,%d\n", i, x.Start, x.End, x.Size)
	}
	return os.WriteFile(path, b.Bytes(), 0o644)
}

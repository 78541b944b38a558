package planner

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sort"
	"time"

	"github.com/arenaplan/arenaplan/lifetime"
)

// DefaultAlign is CUDA's allocation alignment, used when Options.Align is 0.
const DefaultAlign = 256

// MaxAlign is the largest Options.Align (1 GiB).
const MaxAlign = 1 << 30

// The algorithms of this package, by the names Run and the other planning
// calls take.
const (
	// Auto is the anytime search: the best plan the package can find
	// within Options.Budget, never worse than the baselines.
	Auto = "auto"
	// BestFit is llama.cpp's in-order best fit (a baseline).
	BestFit = "bestfit"
	// BySize is TFLite/XLA's greedy by size (a baseline).
	BySize = "bysize"
)

// ErrOptions is wrapped by every error about invalid Options.
var ErrOptions = errors.New("invalid options")

// DefaultBudget bounds a search when Options.Budget is 0.
const DefaultBudget = 2 * time.Second

// Plan is an offset for every buffer of a trace inside one arena.
type Plan struct {
	Algo       string // the algorithm that produced the offsets
	Align      int64  // every size was rounded up to this before planning
	Arena      int64  // arena size in bytes: the highest end of any buffer
	LowerBound int64  // peak of live bytes (sizes rounded to Align)
	// Bound is the strongest lower bound the algorithm proved, at least
	// LowerBound after Run: auto adds the window bound (LowerBoundProven)
	// where its first plans stay above the peak; others report
	// LowerBound. 0 where nothing was proven beyond the peak and the plan
	// did not come from Run (plan files keep no bound).
	Bound   int64
	Offsets []int64 // indexed by lifetime.ID
	// Optimal is true when the arena is proven minimal (Arena == Bound).
	Optimal bool
	// Elapsed is the planning time; ToBest when the final arena was first
	// found (equal to Elapsed for one-shot algorithms).
	Elapsed, ToBest time.Duration
	// Stop says why an anytime search ended ("" for one-shot algorithms).
	Stop Stop
}

// Stop is why an anytime search ended, from the strongest reason to the
// weakest.
type Stop string

const (
	// StopBound: the arena reached the lower bound.
	StopBound Stop = "bound"
	// StopProof: the search proved that no smaller arena exists, or the
	// arena met a lower bound above the peak of live bytes (Plan.Bound).
	StopProof Stop = "proof"
	// StopGoal: the arena is at most Options.Goal, which serves the
	// caller as well as any smaller one (a family member's under the
	// peak of the largest member, PlanFamily).
	StopGoal Stop = "goal"
	// StopRule: the stop rule (see Options.FullBudget) decided that more
	// search was unlikely to pay, or nothing was left to try.
	StopRule Stop = "rule"
	// StopBudget: the budget ran out, or the context was cancelled.
	StopBudget Stop = "budget"
)

// Ratio is Arena / LowerBound (1 when the lower bound is 0).
func (p *Plan) Ratio() float64 {
	if p.LowerBound == 0 {
		return 1
	}
	return float64(p.Arena) / float64(p.LowerBound)
}

// RatioBound is Arena / max(Bound, LowerBound) (1 when both are 0): how
// far the arena may still be from the optimum.
func (p *Plan) RatioBound() float64 {
	b := max(p.Bound, p.LowerBound)
	if b == 0 {
		return 1
	}
	return float64(p.Arena) / float64(b)
}

// Progress is reported by anytime algorithms while they search.
type Progress struct {
	Best, LowerBound int64 // Best is 0 while the search has no whole plan yet
	Elapsed          time.Duration
}

// Options tune an algorithm. The zero value is valid; Validate says what
// else is, and every planning call refuses what it rejects.
type Options struct {
	// Align rounds every size up and aligns every offset (0: DefaultAlign).
	Align int64
	// Budget bounds anytime searches (0: DefaultBudget). It is a ceiling:
	// the search stops early when it reaches the lower bound, proves its
	// arena optimal, or when the stop rule says more search is unlikely
	// to pay (Plan.Stop says which).
	Budget time.Duration
	// FullBudget turns the stop rule off: the search goes on until the
	// budget is spent, unless it reaches the lower bound or proves its
	// arena optimal. The rule: a leaf's search stops once its best arena
	// is within 1/256 of the lower bound and it has searched 4 nodes per
	// buffer, plus 1024, without finding a lower one (the dives, the
	// rolling search and the exact search together). It counts search
	// nodes, not time, so with Workers == 1 it stops at the same point on
	// every machine.
	FullBudget bool
	// Workers is how many goroutines a search may use (0: GOMAXPROCS).
	// Workers == 1 makes every algorithm deterministic.
	Workers int
	// Progress, if set, is called now and then by long searches, from the
	// goroutine that called the algorithm.
	Progress func(Progress)
	// Goal, where positive, is an arena in bytes that serves the caller
	// as well as any smaller one: a step added to an arena of that size
	// that it fits in, a family member whose arena cannot exceed the
	// largest member's (PlanFamily sets it so). Auto stops at its first
	// plan at most Goal, its baselines', with StopGoal, where no search
	// is needed; 0 (the default) searches as usual. Grouped plans
	// (RunGrouped, a trace of several tags) ignore it.
	Goal int64

	// spare lends a search with one worker the cores that the runs planned
	// beside it no longer need (sideBySide).
	spare *spareCores
}

// Validate reports an invalid field: an Align that is not 0 or a power of
// two up to MaxAlign, a negative Budget, Workers or Goal. Errors wrap
// ErrOptions.
func (o Options) Validate() error {
	switch {
	case o.Align < 0 || o.Align > MaxAlign || o.Align&(o.Align-1) != 0:
		return fmt.Errorf("%w: Align %d is not a power of two up to %d (0: %d)", ErrOptions, o.Align, MaxAlign, DefaultAlign)
	case o.Budget < 0:
		return fmt.Errorf("%w: Budget %v is negative (0: %v)", ErrOptions, o.Budget, DefaultBudget)
	case o.Workers < 0:
		return fmt.Errorf("%w: Workers %d is negative (0: GOMAXPROCS)", ErrOptions, o.Workers)
	case o.Goal < 0:
		return fmt.Errorf("%w: Goal %d is negative (0: none)", ErrOptions, o.Goal)
	}
	return nil
}

// prepared validates o and fills in the defaults of its zero fields.
func (o Options) prepared() (Options, error) {
	if err := o.Validate(); err != nil {
		return o, err
	}
	return o.normalized(), nil
}

// normalized fills in the defaults of o's zero fields.
func (o Options) normalized() Options {
	if o.Align == 0 {
		o.Align = DefaultAlign
	}
	if o.Budget == 0 {
		o.Budget = DefaultBudget
	}
	if o.Workers == 0 {
		o.Workers = runtime.GOMAXPROCS(0)
	}
	return o
}

// Func is the shape of every planning algorithm. It returns offsets for
// every buffer; Run fills in the arena size, the lower bound and timing,
// and checks the plan. It must honour every buffer's Fixed offset and stop
// soon after ctx is done, returning the best plan it has if any.
type Func func(ctx context.Context, t *lifetime.Trace, opt Options) (*Plan, error)

var registry = map[string]Func{}

func register(name string, f Func) { registry[name] = f }

// Names lists the registered algorithms in alphabetical order.
func Names() []string {
	names := make([]string, 0, len(registry))
	for n := range registry {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Baselines are the simple planners kept forever for comparison.
var Baselines = []string{BestFit, BySize}

// Run validates t, plans it with the named algorithm and checks the result.
// The returned plan always passed Check.
func Run(ctx context.Context, algo string, t *lifetime.Trace, opt Options) (*Plan, error) {
	f, ok := registry[algo]
	if !ok {
		return nil, fmt.Errorf("planner: unknown algorithm %q (have %v)", algo, Names())
	}
	opt, err := opt.prepared()
	if err != nil {
		return nil, fmt.Errorf("planner: %w", err)
	}
	if err := t.Validate(); err != nil {
		return nil, fmt.Errorf("planner: %w", err)
	}
	// Fixed offsets that no plan can honour are the trace's fault, not an
	// algorithm's: say so before any algorithm runs.
	req, err := requirements(t, opt.Align)
	if err != nil {
		return nil, fmt.Errorf("planner: %w", err)
	}
	if _, err := newFixedSet(t, req, opt.Align); err != nil {
		return nil, fmt.Errorf("planner: %w", err)
	}
	start := time.Now()
	p, err := f(ctx, t, opt)
	if err != nil {
		return nil, fmt.Errorf("planner: %s: %w", algo, err)
	}
	elapsed := time.Since(start)
	if p.Algo == "" {
		p.Algo = algo
	}
	p.Align = opt.Align
	p.LowerBound, _ = t.LowerBound(opt.Align)
	p.Arena = ArenaSize(t, p.Offsets, opt.Align)
	// An algorithm's bound counts only up to the arena it found: a bound
	// above it would be a bug, and no bound below the peak is news.
	p.Bound = min(max(p.Bound, p.LowerBound), max(p.Arena, p.LowerBound))
	p.Optimal = p.Arena <= p.Bound
	switch {
	case p.Stop == "":
	case p.Arena <= p.LowerBound:
		p.Stop = StopBound
	case p.Optimal:
		p.Stop = StopProof
	}
	p.Elapsed = elapsed
	if p.ToBest == 0 || p.ToBest > elapsed {
		p.ToBest = elapsed
	}
	if err := Check(t, p); err != nil {
		return nil, fmt.Errorf("planner: %s produced an invalid plan: %w", algo, err)
	}
	return p, nil
}

// ArenaSize is the highest end offset+RoundUp(size, align) over all
// buffers (0 for an empty trace); offsets must have one entry per buffer.
func ArenaSize(t *lifetime.Trace, offsets []int64, align int64) int64 {
	var top int64
	for i := range t.Buffers {
		if i < len(offsets) {
			top = max(top, offsets[i]+lifetime.RoundUp(t.Buffers[i].Size, align))
		}
	}
	return top
}

// Need returns a buffer's size rounded up to align and the alignment its
// offset needs: the least common multiple of align and its own alignment.
func Need(b *lifetime.Buffer, align int64) (size, offsetAlign int64) {
	a := max(align, 1)
	if b.Align > 1 {
		a = lcm(a, b.Align)
	}
	return lifetime.RoundUp(b.Size, align), a
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

func lcm(a, b int64) int64 { return a / gcd(a, b) * b }

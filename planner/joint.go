package planner

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/arenaplan/arenaplan/lifetime"
)

// Window is one trace of a joint timeline: traces replayed one after the
// other from one arena (a family's members, a chain's stages, a training
// step's forward and backward).
type Window struct {
	Name  string
	Trace *lifetime.Trace
}

// WindowTime is a tick of window Window's own clock.
type WindowTime struct {
	Window int
	Time   int64
}

// Crossings says which buffers of a joint timeline cross windows. A
// buffer not named here lives in its own window only, as its trace says.
type Crossings struct {
	// Same lists groups of buffers that are one buffer at one offset,
	// live from the earliest start to the latest end of its members on the
	// joint timeline, gaps dropped (a chain's links, a family's shared
	// keys). A buffer is in at most one group; a group's buffers agree on
	// size and alignment and have no fixed offset.
	Same [][]BufferRef
	// Whole, if set, marks buffers that live over the whole timeline
	// (persistent state); a group lives there when any of its buffers does.
	Whole func(BufferRef) bool
	// Until makes a buffer live until just after a tick of a later window
	// (a hand-off: a later window frees it).
	Until map[BufferRef]WindowTime
	// OutputsToEnd makes every other buffer still live at its window's end
	// live to the end of the timeline (outputs nobody frees).
	OutputsToEnd bool
}

// Joint is windows laid on one timeline, window i's span right after
// window i-1's, with the buffers that cross windows merged or stretched
// as Crossings says: one plan of Trace is a plan of every window in which
// crossing buffers keep their bytes where later windows need them.
type Joint struct {
	Trace *lifetime.Trace
	Spans []Span
	// own[id]: joint buffer id is one window's buffer as its trace has it
	// (moved in time only); whole[id]: it lives over the whole timeline.
	own, whole []bool
}

// Span is one window's place in a joint timeline.
type Span struct {
	// Start and End bound the window on the joint timeline.
	Start, End int64
	// Joint maps each buffer of the window's trace to its joint buffer.
	Joint []lifetime.ID
}

// Join lays windows on one timeline: each window's span is its trace's
// span (at least one tick) moved to follow the previous window's; a
// buffer keeps its gaps unless it crosses windows.
func Join(name string, windows []Window, c Crossings) (*Joint, error) {
	if len(windows) == 0 {
		return nil, fmt.Errorf("no windows")
	}
	j := &Joint{Trace: &lifetime.Trace{Name: name}, Spans: make([]Span, len(windows))}
	// A window's span covers its buffers and the ticks at which it frees
	// earlier windows' buffers (a hand-off may come before the window's
	// first allocation).
	los := make([]int64, len(windows))
	his := make([]int64, len(windows))
	for w, win := range windows {
		if win.Trace == nil {
			return nil, fmt.Errorf("window %d (%s) has no trace", w, win.Name)
		}
		if err := win.Trace.Validate(); err != nil {
			return nil, fmt.Errorf("window %d (%s): %w", w, win.Name, err)
		}
		los[w], his[w] = win.Trace.Span()
		if len(win.Trace.Buffers) == 0 {
			los[w], his[w] = math.MaxInt64, math.MinInt64
		}
	}
	for r, at := range c.Until {
		if at.Window >= 0 && at.Window < len(windows) && at.Time >= 0 && at.Time < lifetime.MaxSize {
			los[at.Window] = min(los[at.Window], at.Time)
			his[at.Window] = max(his[at.Window], at.Time+1)
		} else {
			return nil, fmt.Errorf("window %d buffer %d: handed to window %d at tick %d, out of range", r.Stage, r.Buffer, at.Window, at.Time)
		}
	}
	var base int64
	for w, win := range windows {
		if los[w] > his[w] {
			los[w], his[w] = 0, 0
		}
		lo, hi := los[w], his[w]
		width := max(hi-lo, 1)
		if base > lifetime.MaxSize-width {
			return nil, fmt.Errorf("window %d (%s): the joint timeline overflows", w, win.Name)
		}
		j.Spans[w] = Span{Start: base, End: base + width, Joint: make([]lifetime.ID, len(win.Trace.Buffers))}
		base += width
	}
	shift := func(w int, t int64) int64 { return t - los[w] + j.Spans[w].Start }
	exists := func(r BufferRef) bool {
		return r.Stage >= 0 && r.Stage < len(windows) && r.Buffer >= 0 && int(r.Buffer) < len(windows[r.Stage].Trace.Buffers)
	}
	buf := func(r BufferRef) *lifetime.Buffer { return &windows[r.Stage].Trace.Buffers[r.Buffer] }
	end := base
	until := make(map[BufferRef]int64, len(c.Until))
	for r, at := range c.Until {
		if !exists(r) || at.Window <= r.Stage || at.Window >= len(windows) {
			return nil, fmt.Errorf("window %d buffer %d: no such buffer, or it is handed to no later window", r.Stage, r.Buffer)
		}
		until[r] = shift(at.Window, at.Time) + 1
		end = max(end, until[r])
	}
	group := map[BufferRef]int{}
	whole := make([]bool, len(c.Same))
	for g, refs := range c.Same {
		for _, r := range refs {
			if !exists(r) {
				return nil, fmt.Errorf("window %d buffer %d does not exist", r.Stage, r.Buffer)
			}
			if _, ok := group[r]; ok {
				return nil, fmt.Errorf("window %d buffer %d is in two groups", r.Stage, r.Buffer)
			}
			if _, ok := until[r]; ok {
				return nil, fmt.Errorf("window %d buffer %d is both merged and handed on", r.Stage, r.Buffer)
			}
			b, first := buf(r), buf(refs[0])
			if b.Size != first.Size || max(b.Align, 1) != max(first.Align, 1) || b.HasFixed {
				return nil, fmt.Errorf("window %d buffer %d (%s): a merged buffer must match its group's size and alignment and have no fixed offset", r.Stage, r.Buffer, b.Name)
			}
			group[r] = g
			whole[g] = whole[g] || c.Whole != nil && c.Whole(r)
		}
	}
	jointOf := make([]lifetime.ID, len(c.Same))
	for i := range jointOf {
		jointOf[i] = -1
	}
	for w, win := range windows {
		_, hi := win.Trace.Span()
		for i := range win.Trace.Buffers {
			r := BufferRef{w, lifetime.ID(i)}
			b := win.Trace.Buffers[i]
			start, stop := shift(w, b.Start), shift(w, b.End)
			if g, ok := group[r]; ok {
				if whole[g] {
					start, stop = 0, end
				}
				if id := jointOf[g]; id >= 0 {
					jb := &j.Trace.Buffers[id]
					jb.Start, jb.End = min(jb.Start, start), max(jb.End, stop)
					j.Spans[w].Joint[i] = id
					continue
				}
				jointOf[g] = lifetime.ID(len(j.Trace.Buffers))
				b.Gaps, b.Hint, b.HasHint = nil, 0, false
				j.own, j.whole = append(j.own, false), append(j.whole, whole[g])
			} else {
				isWhole, own := c.Whole != nil && c.Whole(r), false
				switch e, handed := until[r]; {
				case isWhole:
					start, stop, b.Gaps = 0, end, nil
				case handed:
					stop, b.Gaps = e, nil
				case c.OutputsToEnd && b.End >= hi:
					stop, b.Gaps = end, nil
				default:
					b.Gaps, own = shiftGaps(b.Gaps, func(t int64) int64 { return shift(w, t) }), true
				}
				j.own, j.whole = append(j.own, own), append(j.whole, isWhole)
			}
			b.ID, b.Start, b.End = lifetime.ID(len(j.Trace.Buffers)), start, stop
			j.Trace.Buffers = append(j.Trace.Buffers, b)
			j.Spans[w].Joint[i] = b.ID
		}
	}
	if err := j.Trace.Validate(); err != nil {
		return nil, err
	}
	return j, nil
}

func shiftGaps(gaps []lifetime.Gap, shift func(int64) int64) []lifetime.Gap {
	if len(gaps) == 0 {
		return nil
	}
	out := make([]lifetime.Gap, len(gaps))
	for k, g := range gaps {
		g.Start, g.End = shift(g.Start), shift(g.End)
		out[k] = g
	}
	return out
}

// Offsets projects joint offsets onto window w: an offset for every
// buffer of its trace.
func (j *Joint) Offsets(w int, joint []int64) []int64 { return project(j.Spans[w].Joint, joint) }

func project(ids []lifetime.ID, joint []int64) []int64 {
	out := make([]int64, len(ids))
	for i, id := range ids {
		out[i] = joint[id]
	}
	return out
}

// Lift is the inverse of Offsets: from every window's offsets, the joint
// offsets, or an error where two windows place one joint buffer apart.
func (j *Joint) Lift(windows [][]int64) ([]int64, error) {
	if len(windows) != len(j.Spans) {
		return nil, fmt.Errorf("%d windows of offsets for %d windows", len(windows), len(j.Spans))
	}
	out := make([]int64, len(j.Trace.Buffers))
	set := make([]bool, len(out))
	for w, offs := range windows {
		if len(offs) != len(j.Spans[w].Joint) {
			return nil, fmt.Errorf("window %d: %d offsets for %d buffers", w, len(offs), len(j.Spans[w].Joint))
		}
		for i, id := range j.Spans[w].Joint {
			if set[id] && out[id] != offs[i] {
				return nil, fmt.Errorf("window %d buffer %d is at %d, where another window has it at %d", w, i, offs[i], out[id])
			}
			out[id], set[id] = offs[i], true
		}
	}
	return out, nil
}

// GroupPlan is several members laid on one joint timeline in one arena,
// each member's plan placing its buffers there: a family's members
// (PlanFamily), replayed one at a time in any order, or a chain's stages
// (PlanChain, Joint.Group), replayed in Order. Buffers that cross members
// keep their bytes between replays: a family's shared keys sit at one
// offset each, below every private buffer (Shared); a chain's values are
// read in place by later stages, and Values says which stages overwrite
// them, for Guard.
type GroupPlan struct {
	Algo  string
	Align int64
	// Arena is the group arena: the highest end of any buffer of any
	// member, or of the shared region.
	Arena int64
	// LowerBound is what no arena that holds the group can be below: a
	// family's largest member bound, the peak of a joint trace.
	LowerBound int64
	Members    []MemberPlan
	// SharedRegion is [0, top of the shared buffers); Shared lists them by
	// offset. Both are empty in a chain.
	SharedRegion Region
	Shared       []SharedBuffer
	// Values are the buffers later members read in place; empty in a
	// family.
	Values []ChainValue
	// Order is the replay order the plan was made for, which Guard keeps:
	// 0, 1, ..., n-1 for a chain; nil for a family, whose members replay
	// in any order.
	Order []int
	// Joint is the members on one timeline (its trace, and each member's
	// span with its buffers' joint IDs) and Plan the plan of its trace,
	// where the group was planned as one trace (a chain); nil for a
	// family, planned member by member above its shared buffers.
	Joint *Joint
	Plan  *Plan
	// SeparateArenas is the sum of the members' Alone arenas: what one
	// arena per member would cost.
	SeparateArenas int64
	Elapsed        time.Duration
}

// MemberPlan is one member's place in a group plan.
type MemberPlan struct {
	Name string
	// Plan holds an offset for every buffer of the member's trace inside
	// the group arena; it passes Check on the member's trace. Its Arena
	// is the highest end of the member's own buffers (at most the group
	// arena) and its LowerBound the member's peak of live bytes, shared
	// buffers included.
	Plan *Plan
	// Alone is the arena the member would cost in an arena of its own:
	// in a family, what the same algorithm gives it planned by itself; in
	// a group planned as one trace, its lower bound.
	Alone int64
}

// Ratio is Arena / LowerBound (1 when the lower bound is 0).
func (gp *GroupPlan) Ratio() float64 {
	if gp.LowerBound == 0 {
		return 1
	}
	return float64(gp.Arena) / float64(gp.LowerBound)
}

// Group is the group plan of windows laid on j and planned as one trace
// by p, a plan of j.Trace: each window is a member whose plan is p on its
// buffers (Offsets), and they replay in window order. It has no values:
// PlanChain adds a chain's.
func (j *Joint) Group(p *Plan, windows []Window) *GroupPlan {
	gp := &GroupPlan{Algo: p.Algo, Align: p.Align, Arena: p.Arena, LowerBound: p.LowerBound, Joint: j, Plan: p}
	for w, win := range windows {
		offs := j.Offsets(w, p.Offsets)
		mp := &Plan{Algo: p.Algo, Align: p.Align, Arena: ArenaSize(win.Trace, offs, p.Align), Offsets: offs}
		mp.LowerBound, _ = win.Trace.LowerBound(p.Align)
		gp.Members = append(gp.Members, MemberPlan{Name: win.Name, Plan: mp, Alone: mp.LowerBound})
		gp.SeparateArenas += mp.LowerBound
		gp.Order = append(gp.Order, w)
	}
	return gp
}

// windowPlan is planWindows' result: joint offsets, the buffers stacked at
// the bottom in offset order with the top of their region, and each
// window's plan of its own buffers (nil for a window with none).
type windowPlan struct {
	Offsets []int64
	Stacked []lifetime.ID
	Top     int64
	Own     []*Plan
}

// planWindows plans j without a joint search, valid when every buffer
// that crosses windows lives over the whole timeline (a family): those
// are stacked from offset 0, largest alignment first, then in joint
// order; each window's own buffers are planned alone with algo and moved
// above them, windows side by side, since no two windows overlap in time.
// It is optimal when the stacked buffers are live through every window.
//
// ahead (nil, or one per window) holds plans of windows that share
// nothing, made before: such a window's plan is taken as it is where it
// plans its whole trace at opt.Align.
func (j *Joint) planWindows(ctx context.Context, algo string, windows []Window, ahead []*Plan, opt Options) (*windowPlan, error) {
	wp := &windowPlan{Offsets: make([]int64, len(j.Trace.Buffers)), Own: make([]*Plan, len(windows))}
	for id := range j.Trace.Buffers {
		switch {
		case j.whole[id]:
			wp.Stacked = append(wp.Stacked, lifetime.ID(id))
		case !j.own[id]:
			return nil, fmt.Errorf("buffer %d (%s) crosses windows but does not live over the whole timeline", id, j.Trace.Buffers[id].Name)
		}
	}
	need := func(id lifetime.ID) (int64, int64) { return Need(&j.Trace.Buffers[id], opt.Align) }
	sort.SliceStable(wp.Stacked, func(a, b int) bool {
		_, x := need(wp.Stacked[a])
		_, y := need(wp.Stacked[b])
		return x > y
	})
	for _, id := range wp.Stacked {
		size, a := need(id)
		wp.Offsets[id] = lifetime.RoundUp(wp.Top, a)
		if wp.Top = wp.Offsets[id] + size; wp.Top > lifetime.MaxSize {
			return nil, fmt.Errorf("the stacked buffers need more than %d bytes", lifetime.MaxSize)
		}
	}
	// Own offsets move up by base, which must keep every own buffer's
	// alignment: a multiple of all of them.
	baseAlign := opt.Align
	for id := range j.Trace.Buffers {
		b := &j.Trace.Buffers[id]
		if b.HasFixed {
			return nil, fmt.Errorf("buffer %d (%s) has a fixed offset", id, b.Name)
		}
		if j.own[id] {
			_, a := Need(b, opt.Align)
			if baseAlign = lcm(baseAlign, a); baseAlign > lifetime.MaxSize {
				return nil, fmt.Errorf("the buffers' alignments have no common multiple below %d", lifetime.MaxSize)
			}
		}
	}
	base := lifetime.RoundUp(wp.Top, baseAlign)
	// Each window's private buffers, and the largest of their peaks: the
	// private part of the arena is at least that, so a window planned
	// under it is as good as planned at its own peak (Options.Goal).
	subs := make([]*lifetime.Trace, len(windows))
	owns := make([][]int, len(windows))
	var goal int64
	for w := range windows {
		t := windows[w].Trace
		sub := &lifetime.Trace{Name: t.Name + "/private"}
		for i, id := range j.Spans[w].Joint {
			if j.own[id] {
				b := t.Buffers[i]
				b.ID = lifetime.ID(len(owns[w]))
				sub.Buffers = append(sub.Buffers, b)
				owns[w] = append(owns[w], i)
			}
		}
		subs[w] = sub
		peak, _ := sub.LowerBound(opt.Align)
		goal = max(goal, peak)
	}
	err := sideBySide(len(windows), opt, func(w int, opt Options) error {
		sub, own := subs[w], owns[w]
		if len(own) == 0 {
			return nil
		}
		opt.Goal = max(opt.Goal, goal)
		var p *Plan
		if ahead != nil {
			if a := ahead[w]; a != nil && len(own) == len(windows[w].Trace.Buffers) && len(a.Offsets) == len(own) && a.Align == opt.Align {
				p = a
			}
		}
		if p == nil {
			var err error
			if p, err = Run(ctx, algo, sub, opt); err != nil {
				return fmt.Errorf("window %d (%s): private buffers: %w", w, windows[w].Name, err)
			}
		}
		for k, i := range own {
			wp.Offsets[j.Spans[w].Joint[i]] = base + p.Offsets[k]
		}
		wp.Own[w] = p
		return nil
	})
	if err != nil {
		return nil, err
	}
	return wp, nil
}

// sideBySide runs f(0..n-1) on up to one goroutine per core, sharing
// opt.Workers between them (more goroutines than cores only slice the
// cores between searches), and returns the first error by index. A
// goroutine that finds nothing left to start lends its core to the runs
// still going (spareCores), for work that changes none of their results.
func sideBySide(n int, opt Options, f func(i int, opt Options) error) error {
	errs := make([]error, n)
	par := max(1, min(runtime.NumCPU(), n))
	opt.Workers = max(1, opt.Workers/par)
	opt.spare = &spareCores{}
	var next atomic.Int32
	var wg sync.WaitGroup
	for range par {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				errs[i] = f(i, opt)
			}
			opt.spare.give()
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// spareCores counts the cores that runs side by side no longer need. A
// run with one worker borrows one, where there is one, only for work
// whose outcome does not depend on whether it runs beside the rest or
// after it (a stage it would run anyway, or one it may need and would
// run the same way), so that its plan is the same either way. The nil
// *spareCores lends nothing.
type spareCores struct{ n atomic.Int32 }

// borrow takes a spare core if there is one; give it back when done.
func (c *spareCores) borrow() bool {
	if c == nil {
		return false
	}
	for {
		v := c.n.Load()
		if v <= 0 {
			return false
		}
		if c.n.CompareAndSwap(v, v-1) {
			return true
		}
	}
}

// give adds a core to the spare ones.
func (c *spareCores) give() {
	if c != nil {
		c.n.Add(1)
	}
}

// eachOnCores runs f(0..n-1) on up to one goroutine per core, each
// taking the next index as it finishes the last: put the longest first.
func eachOnCores(n int, f func(i int)) {
	var next atomic.Int32
	var wg sync.WaitGroup
	for range max(1, min(runtime.NumCPU(), n)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				f(i)
			}
		}()
	}
	wg.Wait()
}

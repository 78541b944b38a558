package planner

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/arenaplan/arenaplan/lifetime"
)

// Stage is one graph of a chain: graphs replayed in turn where a later one
// consumes an earlier one's outputs in place (a model split around a part
// that cannot be captured, the prefill → decode hand-off).
type Stage struct {
	Name  string
	Trace *lifetime.Trace
	// Persistent, if set, marks buffers whose contents must survive from
	// one replay of the stage to the next (weights, caches): they keep
	// their bytes through the whole chain, so no other stage reuses them.
	Persistent func(*lifetime.Buffer) bool
}

// BufferRef names buffer Buffer of stage Stage.
type BufferRef struct {
	Stage  int
	Buffer lifetime.ID
}

// Link says that buffer From of an earlier stage is consumed, in place, as
// buffer To of a later stage: both are one buffer at one offset, live from
// its producer's birth to its last consumer's end. A buffer may feed
// several consumers and be fed by at most one link; linked buffers must
// have the same size and alignment. Consumers only read what they consume.
type Link struct {
	From, To BufferRef
}

// ChainValue is a buffer that lives across stages: a producer's output
// and the consumers' inputs it is linked to.
type ChainValue struct {
	Name     string // the producer's buffer name
	Joint    lifetime.ID
	Offset   int64
	Size     int64 // rounded up to the plan's alignment
	Producer BufferRef
	// Consumers are the stages that read it, in increasing order.
	Consumers []int
	// Overwriters are the stages whose replay writes some of its bytes
	// (the producer always does), from the joint plan's offsets.
	Overwriters []int
}

// PlanChain builds the joint trace of stages and links, plans it with the
// named algorithm and derives, from the offsets, which stage overwrites
// which value: a GroupPlan (Joint.Group) whose members are the stages,
// on one timeline (stage i's window follows stage i-1's) and planned
// once, so that a linked output stays where its consumers read it and
// nothing is copied. Stages must replay in Order; ChainGuard refuses, at
// run time, an order that would overwrite memory a stage still needs.
// Fixed offsets are kept on unlinked buffers and refused on linked ones;
// linked buffers lose their gaps (treating them as live is always safe).
func PlanChain(ctx context.Context, algo string, stages []Stage, links []Link, opt Options) (*GroupPlan, error) {
	start := time.Now()
	j, values, err := buildChain(stages, links)
	if err != nil {
		return nil, fmt.Errorf("planner: chain: %w", err)
	}
	p, err := Run(ctx, algo, j.Trace, opt)
	if err != nil {
		return nil, fmt.Errorf("planner: chain: %w", err)
	}
	cp := chainPlan(j, stages, values, p)
	// The guard's rules come from the offsets; the order the plan was made
	// for must pass them (twice: a second round re-produces every value).
	g := cp.Guard()
	for range 2 {
		for _, s := range cp.Order {
			if err := g.Next(s); err != nil {
				return nil, fmt.Errorf("planner: chain: the planned order fails its own guard: %w", err)
			}
		}
	}
	cp.Elapsed = time.Since(start)
	return cp, nil
}

// chainPlan is the group plan of stages laid on j and planned by p, with
// values placed.
func chainPlan(j *Joint, stages []Stage, values []ChainValue, p *Plan) *GroupPlan {
	windows := make([]Window, len(stages))
	for s, st := range stages {
		windows[s] = Window{Name: st.Name, Trace: st.Trace}
	}
	cp := j.Group(p, windows)
	cp.Values = values
	cp.place(stages)
	return cp
}

// CheckChain verifies cp against stages and links independently of the
// algorithm: the joint trace is rebuilt and must match, the plan passes
// Check on it, every stage's plan is the joint plan on its buffers, the
// group's figures are the joint plan's and the values' overwriters are
// recomputed.
func CheckChain(stages []Stage, links []Link, cp *GroupPlan) error {
	if cp == nil || cp.Plan == nil || cp.Joint == nil {
		return fmt.Errorf("check chain: no plan")
	}
	j, values, err := buildChain(stages, links)
	if err != nil {
		return fmt.Errorf("check chain: %w", err)
	}
	if cp.Joint.Trace == nil || j.Trace.Fingerprint() != cp.Joint.Trace.Fingerprint() || len(cp.Joint.Spans) != len(j.Spans) {
		return fmt.Errorf("check chain: the joint trace does not match the stages and links")
	}
	if err := Check(j.Trace, cp.Plan); err != nil {
		return fmt.Errorf("check chain: %w", err)
	}
	want := chainPlan(j, stages, values, cp.Plan)
	if len(cp.Members) != len(want.Members) || len(cp.Values) != len(want.Values) {
		return fmt.Errorf("check chain: %d stages and %d values, want %d and %d", len(cp.Members), len(cp.Values), len(want.Members), len(want.Values))
	}
	if cp.Algo != want.Algo || cp.Align != want.Align || cp.Arena != want.Arena || cp.LowerBound != want.LowerBound ||
		cp.SeparateArenas != want.SeparateArenas || !slices.Equal(cp.Order, want.Order) || len(cp.Shared) != 0 || cp.SharedRegion.Hi != 0 {
		return fmt.Errorf("check chain: the plan's figures or order are not the joint plan's")
	}
	for s := range want.Members {
		w, g := &want.Members[s], &cp.Members[s]
		ws, gs := &j.Spans[s], &cp.Joint.Spans[s]
		if g.Plan == nil || len(g.Plan.Offsets) != len(w.Plan.Offsets) || len(gs.Joint) != len(ws.Joint) || gs.Start != ws.Start || gs.End != ws.End ||
			g.Name != w.Name || g.Alone != w.Alone || g.Plan.Align != w.Plan.Align || g.Plan.Arena != w.Plan.Arena || g.Plan.LowerBound != w.Plan.LowerBound {
			return fmt.Errorf("check chain: stage %d (%s) does not match its trace", s, w.Name)
		}
		for i := range w.Plan.Offsets {
			if g.Plan.Offsets[i] != w.Plan.Offsets[i] || gs.Joint[i] != ws.Joint[i] {
				return fmt.Errorf("check chain: stage %d (%s) buffer %d: offset %d (joint %d), the joint plan says %d (joint %d)",
					s, w.Name, i, g.Plan.Offsets[i], gs.Joint[i], w.Plan.Offsets[i], ws.Joint[i])
			}
		}
	}
	for v := range want.Values {
		w, g := &want.Values[v], &cp.Values[v]
		if g.Joint != w.Joint || g.Offset != w.Offset || g.Size != w.Size || g.Producer != w.Producer ||
			!slices.Equal(g.Consumers, w.Consumers) || !slices.Equal(g.Overwriters, w.Overwriters) {
			return fmt.Errorf("check chain: value %d (%s) does not match the plan", v, w.Name)
		}
	}
	return nil
}

// buildChain validates stages and links and returns their joint timeline
// (Join: the stages as windows, each link's buffers one buffer,
// persistent buffers live over the whole timeline) and the values
// (without offsets: place fills those in once the joint trace is
// planned).
func buildChain(stages []Stage, links []Link) (*Joint, []ChainValue, error) {
	if len(stages) == 0 {
		return nil, nil, fmt.Errorf("no stages")
	}
	idx := make([]int, len(stages)) // index of stage s's buffer 0 in flat
	n := 0
	for s, st := range stages {
		if st.Trace == nil {
			return nil, nil, fmt.Errorf("stage %d (%s) has no trace", s, st.Name)
		}
		if err := st.Trace.Validate(); err != nil {
			return nil, nil, fmt.Errorf("stage %d (%s): %w", s, st.Name, err)
		}
		idx[s] = n
		n += len(st.Trace.Buffers)
	}
	buf := func(r BufferRef) *lifetime.Buffer { return &stages[r.Stage].Trace.Buffers[r.Buffer] }
	flat := func(r BufferRef) int { return idx[r.Stage] + int(r.Buffer) }
	persistent := func(r BufferRef) bool {
		p := stages[r.Stage].Persistent
		return p != nil && p(buf(r))
	}
	// Union-find over every buffer; each link joins a consumer to its
	// producer's set, whose root stays the producer with no incoming link.
	parent := make([]int, n)
	for i := range parent {
		parent[i] = i
	}
	find := func(i int) int {
		for parent[i] != i {
			parent[i] = parent[parent[i]]
			i = parent[i]
		}
		return i
	}
	fed := map[int]int{}
	consumers := map[int][]int{} // root → consumer stages
	for li, l := range links {
		for _, r := range []BufferRef{l.From, l.To} {
			if r.Stage < 0 || r.Stage >= len(stages) || r.Buffer < 0 || int(r.Buffer) >= len(stages[r.Stage].Trace.Buffers) {
				return nil, nil, fmt.Errorf("link %d: stage %d buffer %d does not exist", li, r.Stage, r.Buffer)
			}
		}
		from, to := buf(l.From), buf(l.To)
		name := fmt.Sprintf("link %d: stage %d (%s) buffer %d (%s) → stage %d (%s) buffer %d (%s)", li,
			l.From.Stage, stages[l.From.Stage].Name, l.From.Buffer, from.Name, l.To.Stage, stages[l.To.Stage].Name, l.To.Buffer, to.Name)
		switch {
		case l.To.Stage <= l.From.Stage:
			return nil, nil, fmt.Errorf("%s: a link must go to a later stage", name)
		case from.Size != to.Size || max(from.Align, 1) != max(to.Align, 1):
			return nil, nil, fmt.Errorf("%s: sizes %d and %d or alignments %d and %d differ", name, from.Size, to.Size, from.Align, to.Align)
		case from.HasFixed || to.HasFixed:
			return nil, nil, fmt.Errorf("%s: linked buffers cannot have fixed offsets", name)
		case persistent(l.From) || persistent(l.To):
			return nil, nil, fmt.Errorf("%s: a persistent buffer cannot be linked", name)
		}
		if prev, ok := fed[flat(l.To)]; ok {
			return nil, nil, fmt.Errorf("%s: the consumer is already fed by link %d", name, prev)
		}
		fed[flat(l.To)] = li
		root := find(flat(l.From))
		if find(flat(l.To)) == root {
			return nil, nil, fmt.Errorf("%s: the link closes a cycle", name)
		}
		parent[find(flat(l.To))] = root
		consumers[root] = append(consumers[root], l.To.Stage)
	}
	// Merging sets may have re-rooted consumers' own consumers: collect
	// consumer stages and members per final root.
	final := map[int][]int{}
	for r, cs := range consumers {
		final[find(r)] = append(final[find(r)], cs...)
	}
	windows := make([]Window, len(stages))
	group := map[int]int{} // root → index in same
	var same [][]BufferRef
	for s, st := range stages {
		windows[s] = Window{Name: st.Name, Trace: st.Trace}
		for i := range st.Trace.Buffers {
			r := BufferRef{s, lifetime.ID(i)}
			root := find(flat(r))
			if _, linked := final[root]; !linked {
				continue
			}
			g, ok := group[root]
			if !ok {
				g, group[root] = len(same), len(same)
				same = append(same, nil)
			}
			same[g] = append(same[g], r)
		}
	}
	j, err := Join("chain", windows, Crossings{Same: same, Whole: persistent})
	if err != nil {
		return nil, nil, err
	}
	// A value per group, in the order of its producers (every other
	// buffer of a group is in a later stage).
	var values []ChainValue
	for _, refs := range same {
		cs := append([]int(nil), final[find(flat(refs[0]))]...)
		sort.Ints(cs)
		values = append(values, ChainValue{Name: buf(refs[0]).Name, Joint: j.Spans[refs[0].Stage].Joint[refs[0].Buffer], Producer: refs[0], Consumers: dedup(cs)})
	}
	return j, values, nil
}

func dedup(s []int) []int {
	out := s[:0]
	for i, v := range s {
		if i == 0 || v != s[i-1] {
			out = append(out, v)
		}
	}
	return out
}

// place fills in, per value, its offset and the stages whose replay
// writes its bytes: a stage writes every buffer of its own except the
// ones it consumes through a link.
func (cp *GroupPlan) place(stages []Stage) {
	p := cp.Plan
	consumed := map[BufferRef]bool{}
	for v := range cp.Values {
		val := &cp.Values[v]
		val.Offset = p.Offsets[val.Joint]
		val.Size = lifetime.RoundUp(cp.Joint.Trace.Buffers[val.Joint].Size, p.Align)
		val.Overwriters = nil
	}
	isValue := map[lifetime.ID]int{}
	for v := range cp.Values {
		isValue[cp.Values[v].Joint] = v
	}
	for s, sp := range cp.Joint.Spans {
		for i, j := range sp.Joint {
			if v, ok := isValue[j]; ok && cp.Values[v].Producer != (BufferRef{s, lifetime.ID(i)}) {
				consumed[BufferRef{s, lifetime.ID(i)}] = true
			}
		}
	}
	for s, st := range stages {
		type span struct{ lo, hi int64 }
		var w []span
		for i := range st.Trace.Buffers {
			if consumed[BufferRef{s, lifetime.ID(i)}] {
				continue
			}
			off := cp.Members[s].Plan.Offsets[i]
			w = append(w, span{off, off + lifetime.RoundUp(st.Trace.Buffers[i].Size, p.Align)})
		}
		sort.Slice(w, func(a, b int) bool { return w[a].lo < w[b].lo })
		// Merge into disjoint sorted spans for the search.
		var m []span
		for _, x := range w {
			if len(m) > 0 && x.lo <= m[len(m)-1].hi {
				m[len(m)-1].hi = max(m[len(m)-1].hi, x.hi)
				continue
			}
			m = append(m, x)
		}
		for v := range cp.Values {
			val := &cp.Values[v]
			lo, hi := val.Offset, val.Offset+val.Size
			k := sort.Search(len(m), func(k int) bool { return m[k].hi > lo })
			if k < len(m) && m[k].lo < hi {
				val.Overwriters = append(val.Overwriters, s)
			}
		}
	}
}

// OrderError is ChainGuard's refusal of a replay: Stage may not run now
// because Value, produced by Producer, is either missing (never produced,
// or overwritten since, by OverwrittenBy) or still needed by Consumer,
// which has not yet read it, and Stage would overwrite it.
type OrderError struct {
	Stage, Producer int
	StageName       string
	ProducerName    string
	Value           string // the buffer's name in the producing stage
	Offset, Size    int64
	// Missing: Stage reads the value and it is not there. Otherwise Stage
	// would overwrite it while Consumer still needs it.
	Missing       bool
	OverwrittenBy int // the stage that overwrote a missing value, -1 if none
	Consumer      int
	ConsumerName  string
}

func (e *OrderError) Error() string {
	what := fmt.Sprintf("buffer %q [%d, %d) of stage %d (%s)", e.Value, e.Offset, e.Offset+e.Size, e.Producer, e.ProducerName)
	if e.Missing {
		if e.OverwrittenBy >= 0 {
			return fmt.Sprintf("chain: stage %d (%s) cannot replay: its input %s was overwritten by stage %d since it was produced",
				e.Stage, e.StageName, what, e.OverwrittenBy)
		}
		return fmt.Sprintf("chain: stage %d (%s) cannot replay: its input %s has not been produced", e.Stage, e.StageName, what)
	}
	return fmt.Sprintf("chain: stage %d (%s) cannot replay: it would overwrite %s, which stage %d (%s) has not yet consumed",
		e.Stage, e.StageName, what, e.Consumer, e.ConsumerName)
}

// ChainGuard tracks replays of a chain's stages and refuses one that
// would read a value that is not there or overwrite a value a stage still
// needs. A value is produced when its producer replays; it is needed until
// every consumer has replayed after that; a stage overwrites it when the
// plan's offsets put any buffer the stage writes over its bytes (a
// consumer may overwrite a value once it has read it, when no other
// consumer still needs it). It is not safe for concurrent use.
type ChainGuard struct {
	cp       *GroupPlan
	reads    [][]int // per stage, the values it consumes
	writes   [][]int // per stage, the values it overwrites (produced ones included)
	produces [][]int
	valid    []bool
	by       []int    // who invalidated a value, -1: never produced
	pending  [][]bool // per value, per consumer index: not yet consumed
}

// Guard returns a new guard for cp, with no value produced yet. A
// family's plan has no values: its guard allows any member at any time.
func (cp *GroupPlan) Guard() *ChainGuard {
	n := len(cp.Members)
	g := &ChainGuard{cp: cp, reads: make([][]int, n), writes: make([][]int, n), produces: make([][]int, n)}
	for v := range cp.Values {
		val := &cp.Values[v]
		for _, c := range val.Consumers {
			g.reads[c] = append(g.reads[c], v)
		}
		for _, s := range val.Overwriters {
			g.writes[s] = append(g.writes[s], v)
		}
		g.produces[val.Producer.Stage] = append(g.produces[val.Producer.Stage], v)
	}
	g.Reset()
	return g
}

// Reset forgets every produced value, as after the caller has dropped
// whatever the chain had in flight.
func (g *ChainGuard) Reset() {
	g.valid = make([]bool, len(g.cp.Values))
	g.by = make([]int, len(g.cp.Values))
	g.pending = make([][]bool, len(g.cp.Values))
	for v := range g.cp.Values {
		g.by[v] = -1
		g.pending[v] = make([]bool, len(g.cp.Values[v].Consumers))
	}
}

// Allow reports whether stage may replay now, without recording it. The
// error is an *OrderError unless stage does not exist; a write over a
// value still needed is reported before a missing input.
func (g *ChainGuard) Allow(stage int) error {
	if stage < 0 || stage >= len(g.cp.Members) {
		return fmt.Errorf("chain: no stage %d (have %d)", stage, len(g.cp.Members))
	}
	for _, v := range g.writes[stage] {
		if !g.valid[v] {
			continue
		}
		for c, p := range g.pending[v] {
			// A consumer may overwrite its own input after reading it, as
			// the joint plan lets it within its replay; not another's.
			if p && g.cp.Values[v].Consumers[c] != stage {
				e := g.errorFor(stage, v)
				e.Consumer = g.cp.Values[v].Consumers[c]
				e.ConsumerName = g.cp.Members[e.Consumer].Name
				return e
			}
		}
	}
	for _, v := range g.reads[stage] {
		if !g.valid[v] {
			e := g.errorFor(stage, v)
			e.Missing, e.OverwrittenBy = true, g.by[v]
			return e
		}
	}
	return nil
}

// Next records a replay of stage if Allow permits it, and returns Allow's
// error otherwise (recording nothing).
func (g *ChainGuard) Next(stage int) error {
	if err := g.Allow(stage); err != nil {
		return err
	}
	for _, v := range g.reads[stage] {
		for c, s := range g.cp.Values[v].Consumers {
			if s == stage {
				g.pending[v][c] = false
			}
		}
	}
	for _, v := range g.writes[stage] {
		if g.valid[v] {
			g.valid[v], g.by[v] = false, stage
		}
	}
	for _, v := range g.produces[stage] {
		g.valid[v], g.by[v] = true, -1
		for c := range g.pending[v] {
			g.pending[v][c] = true
		}
	}
	return nil
}

func (g *ChainGuard) errorFor(stage, v int) *OrderError {
	val := &g.cp.Values[v]
	return &OrderError{
		Stage: stage, StageName: g.cp.Members[stage].Name,
		Producer: val.Producer.Stage, ProducerName: g.cp.Members[val.Producer.Stage].Name,
		Value: val.Name, Offset: val.Offset, Size: val.Size, OverwrittenBy: -1, Consumer: -1,
	}
}

package planner

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/arenaplan/arenaplan/lifetime"
)

func chainTrace(name string, bs ...lifetime.Buffer) *lifetime.Trace {
	t := &lifetime.Trace{Name: name}
	for i, b := range bs {
		b.ID, b.Fixed, b.HasFixed, b.Hint, b.HasHint = lifetime.ID(i), 0, false, 0, false
		t.Buffers = append(t.Buffers, b)
	}
	return t
}

func cbuf(name, tag string, size, start, end int64) lifetime.Buffer {
	return lifetime.Buffer{Name: name, Tag: tag, Size: size, Start: start, End: end}
}

func isWeight(b *lifetime.Buffer) bool { return b.Tag == "weight" }

// prefillDecodeHead is a three-graph chain: prefill produces a KV cache
// and a hidden state, decode consumes both and produces logits, a head
// consumes the logits. The head's scratch is large enough that it must
// reuse memory of values the earlier stages hand on.
func prefillDecodeHead() ([]Stage, []Link) {
	const M = 1 << 20
	prefill := chainTrace("prefill",
		cbuf("w.prefill", "weight", 4*M, 0, 6), // 0
		cbuf("tokens", "input", M, 0, 2),       // 1
		cbuf("act", "", 8*M, 1, 4),             // 2
		cbuf("kv", "kv", 16*M, 2, 6),           // 3: → decode
		cbuf("h", "", 2*M, 4, 6),               // 4: → decode
	)
	decode := chainTrace("decode",
		cbuf("w.decode", "weight", 4*M, 0, 5), // 0
		cbuf("kv.in", "kv", 16*M, 0, 5),       // 1: ← prefill.kv
		cbuf("h.in", "", 2*M, 0, 2),           // 2: ← prefill.h
		cbuf("act", "", 4*M, 1, 3),            // 3
		cbuf("logits", "output", 3*M, 3, 5),   // 4: → head
	)
	head := chainTrace("head",
		cbuf("logits.in", "", 3*M, 0, 2), // 0: ← decode.logits
		cbuf("scratch", "", 20*M, 0, 3),  // 1
		cbuf("out", "output", M, 2, 4),   // 2
	)
	stages := []Stage{{"prefill", prefill, isWeight}, {"decode", decode, isWeight}, {"head", head, isWeight}}
	links := []Link{
		{BufferRef{0, 3}, BufferRef{1, 1}},
		{BufferRef{0, 4}, BufferRef{1, 2}},
		{BufferRef{1, 4}, BufferRef{2, 0}},
	}
	return stages, links
}

func TestChainPrefillDecode(t *testing.T) {
	stages, links := prefillDecodeHead()
	for _, algo := range Baselines {
		cp, err := PlanChain(context.Background(), algo, stages, links, Options{Workers: 1})
		if err != nil {
			t.Fatal(err)
		}
		if err := CheckChain(stages, links, cp); err != nil {
			t.Fatal(err)
		}
		// Linked buffers share an offset: nothing is copied.
		for _, l := range links {
			a, b := cp.Members[l.From.Stage].Plan.Offsets[l.From.Buffer], cp.Members[l.To.Stage].Plan.Offsets[l.To.Buffer]
			if a != b {
				t.Fatalf("%s: link %v: offsets %d and %d", algo, l, a, b)
			}
		}
		if len(cp.Values) != 3 {
			t.Fatalf("%s: %d values, want 3", algo, len(cp.Values))
		}
		// Persistent weights keep their bytes through the whole chain.
		_, end := cp.Joint.Trace.Span()
		for s := range 2 {
			j := cp.Joint.Spans[s].Joint[0]
			if b := cp.Joint.Trace.Buffers[j]; b.Tag != "weight" || b.Start != 0 || b.End != end {
				t.Fatalf("%s: stage %d weights live [%d, %d), want [0, %d)", algo, s, b.Start, b.End, end)
			}
		}
		var sep int64
		for _, st := range stages {
			p, err := Run(context.Background(), algo, st.Trace, Options{Workers: 1})
			if err != nil {
				t.Fatal(err)
			}
			sep += p.Arena
		}
		t.Logf("%s: chain arena %d, lower bound %d; stages planned apart (plus copies of the hand-offs) %d", algo, cp.Plan.Arena, cp.Plan.LowerBound, sep)
		for _, v := range cp.Values {
			t.Logf("%s: value %s [%d, %d) produced by %d, consumed by %v, overwritten by %v", algo, v.Name, v.Offset, v.Offset+v.Size, v.Producer.Stage, v.Consumers, v.Overwriters)
		}

		g := cp.Guard()
		for round := range 3 {
			for s := range stages {
				if err := g.Next(s); err != nil {
					t.Fatalf("%s: round %d: the planned order refused: %v", algo, round, err)
				}
			}
		}
		// Decode before prefill has produced.
		g = cp.Guard()
		err = g.Next(1)
		var oe *OrderError
		if !errors.As(err, &oe) || !oe.Missing || oe.Stage != 1 || oe.Producer != 0 {
			t.Fatalf("%s: decode first: %v", algo, err)
		}
		for _, w := range []string{"stage 1 (decode)", "stage 0 (prefill)", "has not been produced", `"kv"`} {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: decode first: %q lacks %q", algo, err, w)
			}
		}
		// Prefill twice: the second would overwrite what decode has not read.
		g = cp.Guard()
		mustNext(t, g, 0)
		err = g.Next(0)
		if !errors.As(err, &oe) || oe.Missing || oe.Consumer != 1 {
			t.Fatalf("%s: prefill twice: %v", algo, err)
		}
		if !strings.Contains(err.Error(), "stage 0 (prefill) cannot replay: it would overwrite buffer") ||
			!strings.Contains(err.Error(), "stage 1 (decode) has not yet consumed") {
			t.Errorf("%s: prefill twice: %v", algo, err)
		}
		// A refused replay records nothing: decode may still run.
		mustNext(t, g, 1)
		mustNext(t, g, 2)
		mustNext(t, g, 0)

		// The head reuses memory of a prefill output: running it between
		// prefill and decode is refused; running it after decode, then
		// decode again, finds decode's input overwritten.
		clobbered := map[string]bool{}
		for _, v := range cp.Values {
			if v.Producer.Stage == 0 && containsInt(v.Overwriters, 2) {
				clobbered[v.Name] = true
			}
		}
		if len(clobbered) == 0 {
			t.Fatalf("%s: the head reuses no prefill output's memory; the test needs it to", algo)
		}
		g = cp.Guard()
		mustNext(t, g, 0)
		err = g.Next(2)
		if !errors.As(err, &oe) || oe.Stage != 2 || oe.Consumer != 1 || !clobbered[oe.Value] {
			t.Fatalf("%s: head before decode: %v", algo, err)
		}
		t.Logf("%s: %v", algo, err)
		mustNext(t, g, 1)
		mustNext(t, g, 2)
		err = g.Next(1)
		if !errors.As(err, &oe) || !oe.Missing || oe.OverwrittenBy != 2 || !strings.Contains(err.Error(), "overwritten by stage 2") {
			t.Fatalf("%s: decode again after head: %v", algo, err)
		}
		t.Logf("%s: %v", algo, err)
		if err := g.Allow(7); err == nil {
			t.Errorf("%s: stage 7 allowed", algo)
		}
	}
}

func mustNext(t *testing.T, g *ChainGuard, s int) {
	t.Helper()
	if err := g.Next(s); err != nil {
		t.Fatalf("stage %d refused: %v", s, err)
	}
}

func containsInt(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func TestChainErrors(t *testing.T) {
	stages, _ := prefillDecodeHead()
	fixed := chainTrace("fixed", cbuf("a", "", 100, 0, 2))
	fixed.Buffers[0].Fixed, fixed.Buffers[0].HasFixed = 0, true
	cases := []struct {
		name   string
		stages []Stage
		links  []Link
		wants  string
	}{
		{"no stages", nil, nil, "no stages"},
		{"backwards", stages, []Link{{BufferRef{1, 1}, BufferRef{0, 3}}}, "must go to a later stage"},
		{"same stage", stages, []Link{{BufferRef{1, 1}, BufferRef{1, 2}}}, "must go to a later stage"},
		{"size", stages, []Link{{BufferRef{0, 3}, BufferRef{1, 2}}}, "sizes 16777216 and 2097152"},
		{"fed twice", stages, []Link{{BufferRef{0, 4}, BufferRef{1, 2}}, {BufferRef{0, 4}, BufferRef{1, 2}}}, "already fed by link 0"},
		{"missing buffer", stages, []Link{{BufferRef{0, 9}, BufferRef{1, 2}}}, "stage 0 buffer 9 does not exist"},
		{"missing stage", stages, []Link{{BufferRef{0, 4}, BufferRef{5, 2}}}, "stage 5 buffer 2 does not exist"},
		{"persistent", stages, []Link{{BufferRef{0, 0}, BufferRef{1, 0}}}, "persistent buffer cannot be linked"},
		{"fixed", []Stage{{"f", fixed, nil}, {"g", chainTrace("g", cbuf("b", "", 100, 0, 2)), nil}}, []Link{{BufferRef{0, 0}, BufferRef{1, 0}}}, "fixed offsets"},
		{"no trace", []Stage{{"x", nil, nil}}, nil, "has no trace"},
	}
	for _, c := range cases {
		_, err := PlanChain(context.Background(), "bestfit", c.stages, c.links, Options{})
		if err == nil || !strings.Contains(err.Error(), c.wants) {
			t.Errorf("%s: got %v, want an error containing %q", c.name, err, c.wants)
		}
	}
}

func TestCheckChainCatches(t *testing.T) {
	stages, links := prefillDecodeHead()
	plan := func() *GroupPlan {
		cp, err := PlanChain(context.Background(), "bestfit", stages, links, Options{})
		if err != nil {
			t.Fatal(err)
		}
		return cp
	}
	cases := []struct {
		name string
		edit func(*GroupPlan)
	}{
		{"stage offset", func(cp *GroupPlan) { cp.Members[1].Plan.Offsets[3] += 256 }},
		{"joint offset", func(cp *GroupPlan) { cp.Plan.Offsets[0] = cp.Plan.Offsets[1] }},
		{"value overwriters", func(cp *GroupPlan) { cp.Values[0].Overwriters = nil }},
		{"joint trace", func(cp *GroupPlan) { cp.Joint.Trace.Buffers[2].End++ }},
		{"stage arena", func(cp *GroupPlan) { cp.Members[2].Plan.Arena++ }},
		{"group arena", func(cp *GroupPlan) { cp.Arena++ }},
		{"order", func(cp *GroupPlan) { cp.Order = nil }},
	}
	for _, c := range cases {
		cp := plan()
		c.edit(cp)
		if err := CheckChain(stages, links, cp); err == nil {
			t.Errorf("%s: CheckChain accepted it", c.name)
		}
	}
	if err := CheckChain(stages, links[:2], plan()); err == nil {
		t.Errorf("other links: CheckChain accepted it")
	}
}

// TestChainGuardRandom plans random chains and replays random orders:
// whatever the guard lets through must never read a value after another
// replay wrote over it, by a simulation of the arena's bytes that uses
// only the stages' offsets (not the plan's precomputed overwriters).
func TestChainGuardRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	n := 150
	if testing.Short() {
		n = 30
	}
	accepted, refused := 0, 0
	for k := range n {
		var stages []Stage
		for s := range 2 + rng.IntN(3) {
			tr := genTrace(rng, genOptions{maxBuffers: 12, maxTime: 12, align: 256})
			for i := range tr.Buffers {
				tr.Buffers[i].Fixed, tr.Buffers[i].HasFixed = 0, false
			}
			stages = append(stages, Stage{Name: fmt.Sprint("g", s), Trace: tr})
		}
		// Links: a later stage gets a copy of an earlier buffer's shape,
		// fed by it.
		var links []Link
		for range rng.IntN(5) {
			a := rng.IntN(len(stages) - 1)
			b := a + 1 + rng.IntN(len(stages)-1-a)
			ta, tb := stages[a].Trace, stages[b].Trace
			if len(ta.Buffers) == 0 {
				continue
			}
			src := ta.Buffers[rng.IntN(len(ta.Buffers))]
			nb := lifetime.Buffer{ID: lifetime.ID(len(tb.Buffers)), Name: src.Name + ".in", Size: src.Size, Align: src.Align,
				Start: rng.Int64N(6)}
			nb.End = nb.Start + 1 + rng.Int64N(6)
			tb.Buffers = append(tb.Buffers, nb)
			links = append(links, Link{BufferRef{a, src.ID}, BufferRef{b, nb.ID}})
		}
		cp, err := PlanChain(context.Background(), Baselines[k%2], stages, links, Options{Workers: 1})
		if err != nil {
			t.Fatalf("chain %d: %v", k, err)
		}
		if err := CheckChain(stages, links, cp); err != nil {
			t.Fatalf("chain %d: %v", k, err)
		}
		for range 20 {
			g := cp.Guard()
			sim := newArenaSim(stages, cp)
			for range 12 {
				s := rng.IntN(len(stages))
				if err := g.Next(s); err != nil {
					refused++
					continue
				}
				accepted++
				if err := sim.replay(s); err != nil {
					t.Fatalf("chain %d: the guard let through a replay that reads clobbered memory: %v", k, err)
				}
			}
		}
	}
	t.Logf("%d replays accepted, %d refused", accepted, refused)
}

// arenaSim tracks, per value, the replay that produced it and every write
// since, from the stages' buffer offsets alone.
type arenaSim struct {
	stages []Stage
	cp     *GroupPlan
	step   int
	// produced[v]: the step at which value v was last produced (-1 never).
	produced []int
	// writes: every write, as (step, stage, lo, hi).
	writes [][4]int64
}

func newArenaSim(stages []Stage, cp *GroupPlan) *arenaSim {
	s := &arenaSim{stages: stages, cp: cp, produced: make([]int, len(cp.Values))}
	for v := range s.produced {
		s.produced[v] = -1
	}
	return s
}

func (a *arenaSim) replay(stage int) error {
	a.step++
	sp, joint := &a.cp.Members[stage], a.cp.Joint.Spans[stage].Joint
	valueOf := map[lifetime.ID]int{}
	for v, val := range a.cp.Values {
		valueOf[val.Joint] = v
	}
	// Reads first: a consumed value must be intact since its production.
	for i, j := range joint {
		v, ok := valueOf[j]
		if !ok || a.cp.Values[v].Producer == (BufferRef{stage, lifetime.ID(i)}) {
			continue
		}
		if a.produced[v] < 0 {
			return fmt.Errorf("stage %d reads value %d never produced", stage, v)
		}
		lo := sp.Plan.Offsets[i]
		hi := lo + lifetime.RoundUp(a.stages[stage].Trace.Buffers[i].Size, a.cp.Plan.Align)
		for _, w := range a.writes {
			if int(w[0]) > a.produced[v] && w[2] < hi && lo < w[3] {
				return fmt.Errorf("stage %d reads value %d [%d, %d), overwritten at step %d by stage %d", stage, v, lo, hi, w[0], w[1])
			}
		}
	}
	for i, j := range joint {
		v, ok := valueOf[j]
		if ok && a.cp.Values[v].Producer != (BufferRef{stage, lifetime.ID(i)}) {
			continue // consumers only read
		}
		lo := sp.Plan.Offsets[i]
		hi := lo + lifetime.RoundUp(a.stages[stage].Trace.Buffers[i].Size, a.cp.Plan.Align)
		a.writes = append(a.writes, [4]int64{int64(a.step), int64(stage), lo, hi})
		if ok {
			a.produced[v] = a.step
		}
	}
	return nil
}

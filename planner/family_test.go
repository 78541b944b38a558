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

// decodeStep is a trace shaped like one transformer decode step at the
// given batch: weights and a KV cache (sized for the largest batch) live
// through the whole step and are shared; per layer, activations that grow
// with the batch live for a few operations; logits come out at the end.
func decodeStep(rng *rand.Rand, batch int64, layers int) *lifetime.Trace {
	const hidden, vocab, maxBatch, seq = 768, 50257, 64, 1024
	t := &lifetime.Trace{Name: fmt.Sprintf("gpt2-decode b%d", batch)}
	add := func(name, tag string, size, start, end int64) {
		t.Buffers = append(t.Buffers, lifetime.Buffer{ID: lifetime.ID(len(t.Buffers)), Name: name, Tag: tag,
			Size: size, Start: start, End: end})
	}
	steps := int64(6*layers + 4)
	add("wte", "weight", vocab*hidden*2, 0, steps)
	add("tokens", "input", batch*8, 0, 2)
	for l := range layers {
		add(fmt.Sprintf("l%d.w", l), "weight", 12*hidden*hidden*2, 0, steps)
		add(fmt.Sprintf("l%d.kv", l), "kv", 2*maxBatch*seq*hidden*2/16, 0, steps)
	}
	now := int64(1)
	add("x0", "intermediate", batch*hidden*4, now, now+3)
	for l := range layers {
		// ln → qkv → attn → proj (+residual) → mlp up → mlp down
		t0 := now + 2
		jitter := func() int64 { return 1 + rng.Int64N(3) }
		add(fmt.Sprintf("l%d.ln", l), "intermediate", batch*hidden*4, t0, t0+2)
		add(fmt.Sprintf("l%d.qkv", l), "intermediate", 3*batch*hidden*4, t0+1, t0+3)
		add(fmt.Sprintf("l%d.scores", l), "intermediate", batch*12*seq*4/jitter(), t0+2, t0+3)
		add(fmt.Sprintf("l%d.attn", l), "intermediate", batch*hidden*4, t0+2, t0+4)
		add(fmt.Sprintf("l%d.x", l), "intermediate", batch*hidden*4, t0+3, t0+7)
		add(fmt.Sprintf("l%d.up", l), "intermediate", 4*batch*hidden*4, t0+4, t0+6)
		now = t0 + 4
	}
	add("logits", "output", batch*vocab*4, now+2, now+4)
	for i := range t.Buffers {
		t.Buffers[i].End = min(t.Buffers[i].End, steps)
	}
	return t
}

func decodeFamily(seed uint64, layers int) []Member {
	rng := rand.New(rand.NewPCG(seed, 7))
	var ms []Member
	for b := int64(1); b <= 64; b *= 2 {
		t := decodeStep(rng, b, layers)
		ms = append(ms, Member{Name: fmt.Sprintf("batch=%d", b), Trace: t, Keys: SharedByTag(t, "weight", "kv")})
	}
	return ms
}

func TestFamilyDecode(t *testing.T) {
	for _, algo := range Baselines {
		ms := decodeFamily(1, 12)
		fp, err := PlanFamily(context.Background(), algo, ms, Options{Workers: 1})
		if err != nil {
			t.Fatal(err)
		}
		if err := CheckFamily(ms, fp); err != nil {
			t.Fatal(err)
		}
		largest := fp.Members[len(fp.Members)-1].Plan.LowerBound
		if fp.LowerBound != largest {
			t.Errorf("%s: family lower bound %d, largest member's %d", algo, fp.LowerBound, largest)
		}
		if r := float64(fp.Arena) / float64(largest); r > 1.05 {
			t.Errorf("%s: family arena %d is %.4fx the largest member lower bound %d, want <= 1.05x", algo, fp.Arena, r, largest)
		}
		if fp.SeparateArenas <= fp.Arena {
			t.Errorf("%s: separate arenas %d not above the family arena %d", algo, fp.SeparateArenas, fp.Arena)
		}
		for _, m := range fp.Members {
			t.Logf("%s %-9s lower bound %11d  in family %11d  alone %11d", algo, m.Name, m.Plan.LowerBound, m.Plan.Arena, m.Alone)
		}
		t.Logf("%s family arena %d (%.4fx the largest lower bound %d), shared %d, separate arenas %d (%.2fx)",
			algo, fp.Arena, float64(fp.Arena)/float64(largest), largest, fp.SharedRegion.Hi, fp.SeparateArenas,
			float64(fp.SeparateArenas)/float64(fp.Arena))
		// Every member sees "wte" at one offset.
		s, ok := fp.SharedKey("wte")
		if !ok {
			t.Fatal("no shared wte")
		}
		for mi, m := range ms {
			if off := fp.Members[mi].Plan.Offsets[0]; m.Trace.Buffers[0].Name != "wte" || off != s.Offset {
				t.Fatalf("member %s: wte at %d, family says %d", m.Name, off, s.Offset)
			}
		}
	}
}

func TestFamilyCorruptionCaught(t *testing.T) {
	ms := decodeFamily(2, 4)
	fresh := func() *GroupPlan {
		fp, err := PlanFamily(context.Background(), "bestfit", ms, Options{Workers: 1})
		if err != nil {
			t.Fatal(err)
		}
		return fp
	}
	private := func(m Member) int {
		for i, k := range m.Keys {
			if k == "" {
				return i
			}
		}
		t.Fatal("no private buffer")
		return 0
	}
	cases := []struct {
		name  string
		edit  func(fp *GroupPlan)
		wants string
	}{
		{"shared offset in one member", func(fp *GroupPlan) {
			// Swap two equally sized layer weights in member 3 only: its own
			// plan stays valid, the family's is not.
			p := fp.Members[3].Plan
			i, j := 2, 4 // l0.w and l1.w
			p.Offsets[i], p.Offsets[j] = p.Offsets[j], p.Offsets[i]
		}, `shared key "l0.w" is at`},
		{"shared key moved", func(fp *GroupPlan) { fp.Shared[1].Offset += fp.Align }, "shared key"},
		{"private buffer over shared", func(fp *GroupPlan) {
			p := fp.Members[0].Plan
			p.Offsets[private(ms[0])] = 0
		}, "overlap"},
		{"arena too small", func(fp *GroupPlan) { fp.Arena -= fp.Align }, "beyond the family arena"},
		{"arena too large", func(fp *GroupPlan) { fp.Arena += fp.Align }, "members and shared buffers need"},
		{"lower bound", func(fp *GroupPlan) { fp.LowerBound-- }, "lower bound"},
		{"separate arenas", func(fp *GroupPlan) { fp.SeparateArenas++ }, "separate arenas"},
		{"alone below bound", func(fp *GroupPlan) { fp.Members[2].Alone = 1; fp.SeparateArenas = 0 }, "below its lower bound"},
		{"member renamed", func(fp *GroupPlan) { fp.Members[1].Name = "x" }, `"x" in the plan`},
		{"member dropped", func(fp *GroupPlan) { fp.Members = fp.Members[1:] }, "members"},
		{"unused shared key", func(fp *GroupPlan) {
			// Above everything, so that only the unused key is wrong.
			fp.Shared = append(fp.Shared, SharedBuffer{Key: "ghost", Offset: fp.Arena, Size: fp.Align, Align: fp.Align})
			fp.Arena += fp.Align
			fp.SharedRegion.Hi = fp.Arena
		}, "used by no member"},
		{"shared region", func(fp *GroupPlan) { fp.SharedRegion.Hi++ }, "shared region"},
		{"replay order", func(fp *GroupPlan) { fp.Order = []int{0, 1, 2} }, "a chain's"},
		{"alignment", func(fp *GroupPlan) { fp.Members[0].Plan.Align = 1 }, "alignment"},
	}
	for _, c := range cases {
		fp := fresh()
		c.edit(fp)
		err := CheckFamily(ms, fp)
		if err == nil || !strings.Contains(err.Error(), c.wants) {
			t.Errorf("%s: got %v, want an error containing %q", c.name, err, c.wants)
		}
	}
	// The swap alone keeps member 3's own plan valid: only the family
	// check can see it.
	fp := fresh()
	cases[0].edit(fp)
	if err := Check(ms[3].Trace, fp.Members[3].Plan); err != nil {
		t.Fatalf("the swapped member plan should pass Check: %v", err)
	}
}

func TestFamilyErrors(t *testing.T) {
	tr := func(bs ...lifetime.Buffer) *lifetime.Trace {
		t := &lifetime.Trace{Name: "t"}
		for i, b := range bs {
			b.ID, b.Fixed, b.HasFixed, b.Hint, b.HasHint = lifetime.ID(i), 0, false, 0, false
			if b.End == 0 {
				b.End = 4
			}
			t.Buffers = append(t.Buffers, b)
		}
		return t
	}
	w := lifetime.Buffer{Name: "w", Size: 1000, Tag: "weight"}
	w2 := lifetime.Buffer{Name: "w", Size: 2000, Tag: "weight"}
	wa := lifetime.Buffer{Name: "w", Size: 1000, Align: 4096, Tag: "weight"}
	x := lifetime.Buffer{Name: "x", Size: 10, Start: 1, End: 2}
	fixed := tr(w, x)
	fixed.Buffers[1].Fixed, fixed.Buffers[1].HasFixed = 0, true
	cases := []struct {
		name    string
		members []Member
		wants   string
	}{
		{"none", nil, "no members"},
		{"size", []Member{{Name: "a", Trace: tr(w, x), Keys: []string{"w", ""}}, {Name: "b", Trace: tr(w2, x), Keys: []string{"w", ""}}}, `shared key "w" is 1000 bytes aligned to 1 in member "a"`},
		{"align", []Member{{Name: "a", Trace: tr(w, x), Keys: []string{"w", ""}}, {Name: "b", Trace: tr(wa, x), Keys: []string{"w", ""}}}, "aligned to 4096"},
		{"twice in a member", []Member{{Name: "a", Trace: tr(w, w), Keys: []string{"w", "w"}}}, `both have shared key "w"`},
		{"names", []Member{{Name: "a", Trace: tr(w), Keys: nil}, {Name: "a", Trace: tr(w), Keys: nil}}, `"a" appears twice`},
		{"no name", []Member{{Name: "", Trace: tr(w), Keys: nil}}, "no name"},
		{"no trace", []Member{{Name: "a", Trace: nil, Keys: nil}}, "no trace"},
		{"keys", []Member{{Name: "a", Trace: tr(w, x), Keys: []string{"w"}}}, "1 keys for 2 buffers"},
		{"fixed", []Member{{Name: "a", Trace: fixed, Keys: nil}}, "fixed offset"},
		{"invalid trace", []Member{{Name: "a", Trace: tr(lifetime.Buffer{Name: "bad", Size: 0}), Keys: nil}}, "size 0"},
	}
	for _, c := range cases {
		_, err := PlanFamily(context.Background(), "bestfit", c.members, Options{})
		if err == nil || !strings.Contains(err.Error(), c.wants) {
			t.Errorf("%s: got %v, want an error containing %q", c.name, err, c.wants)
			continue
		}
		if c.name != "none" && !errors.Is(err, ErrFamily) {
			t.Errorf("%s: %v does not wrap ErrFamily", c.name, err)
		}
	}
	if _, err := PlanFamily(context.Background(), "nope", []Member{{Name: "a", Trace: tr(w), Keys: nil}}, Options{}); err == nil || !strings.Contains(err.Error(), "unknown algorithm") {
		t.Errorf("unknown algorithm: %v", err)
	}
}

// familyOracle checks, pair by pair, what CheckFamily promises about the
// shared buffers: one offset per key, and no byte of a shared buffer used
// by any other buffer of any member.
func familyOracle(ms []Member, fp *GroupPlan) error {
	type rng struct{ lo, hi int64 }
	keyAt := map[string]rng{}
	for mi, m := range ms {
		p := fp.Members[mi].Plan
		if err := oracleCheck(m.Trace, p); err != nil {
			return err
		}
		for i, k := range m.Keys {
			if k == "" {
				continue
			}
			r := rng{p.Offsets[i], p.Offsets[i] + lifetime.RoundUp(m.Trace.Buffers[i].Size, p.Align)}
			if old, ok := keyAt[k]; ok && old != r {
				return fmt.Errorf("oracle: key %q at %v and %v", k, old, r)
			}
			keyAt[k] = r
		}
	}
	for mi, m := range ms {
		p := fp.Members[mi].Plan
		if p.Arena > fp.Arena {
			return fmt.Errorf("oracle: member %s beyond the arena", m.Name)
		}
		for i := range m.Trace.Buffers {
			lo := p.Offsets[i]
			hi := lo + lifetime.RoundUp(m.Trace.Buffers[i].Size, p.Align)
			for k, r := range keyAt {
				if m.Keys != nil && m.Keys[i] == k {
					continue
				}
				if lo < r.hi && r.lo < hi {
					return fmt.Errorf("oracle: member %s buffer %d [%d, %d) overlaps key %q %v", m.Name, i, lo, hi, k, r)
				}
			}
		}
	}
	return nil
}

// TestFamilyRandom plans random families: random traces, with shared
// buffers drawn from one pool of keys (so their sizes agree) at random
// lifetimes; every plan must pass CheckFamily and the pairwise oracle.
func TestFamilyRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	n := 300
	if testing.Short() {
		n = 60
	}
	aligns := []int64{1, 8, 256}
	for k := range n {
		align := aligns[rng.IntN(len(aligns))]
		type key struct{ size, align int64 }
		pool := make([]key, rng.IntN(6))
		for i := range pool {
			pool[i] = key{1 + rng.Int64N(5000), []int64{0, 1, 64, 512}[rng.IntN(4)]}
		}
		var ms []Member
		for m := range 1 + rng.IntN(5) {
			tr := genTrace(rng, genOptions{maxBuffers: 25, maxTime: 20, align: align})
			keys := make([]string, len(tr.Buffers))
			for i := range tr.Buffers {
				tr.Buffers[i].Fixed, tr.Buffers[i].HasFixed = 0, false
			}
			for i, s := range pool {
				if rng.IntN(3) == 0 {
					continue
				}
				b := lifetime.Buffer{ID: lifetime.ID(len(tr.Buffers)), Name: fmt.Sprint("s", i), Size: s.size, Align: s.align,
					Start: rng.Int64N(10)}
				b.End = b.Start + 1 + rng.Int64N(15)
				tr.Buffers = append(tr.Buffers, b)
				keys = append(keys, b.Name)
			}
			if rng.IntN(4) == 0 {
				keys = nil
				tr.Buffers = tr.Buffers[:len(tr.Buffers)-countKeys(tr)]
			}
			ms = append(ms, Member{Name: fmt.Sprint("m", m), Trace: tr, Keys: keys})
		}
		algo := Baselines[k%len(Baselines)]
		fp, err := PlanFamily(context.Background(), algo, ms, Options{Align: align, Workers: 1})
		if err != nil {
			t.Fatalf("family %d: %v", k, err)
		}
		if err := CheckFamily(ms, fp); err != nil {
			t.Fatalf("family %d: %v", k, err)
		}
		if err := familyOracle(ms, fp); err != nil {
			t.Fatalf("family %d: CheckFamily accepted what the oracle refuses: %v", k, err)
		}
		if fp.Arena < fp.LowerBound {
			t.Fatalf("family %d: arena %d below the lower bound %d", k, fp.Arena, fp.LowerBound)
		}
		// Moving any shared buffer of any member must be caught.
		for mi, m := range ms {
			for i, key := range m.Keys {
				if key == "" {
					continue
				}
				p := fp.Members[mi].Plan
				old := p.Offsets[i]
				p.Offsets[i] = old + fp.Align*lcm(256, 4096)
				if err := CheckFamily(ms, fp); err == nil {
					t.Fatalf("family %d: member %s key %q moved and CheckFamily accepted it", k, m.Name, key)
				}
				p.Offsets[i] = old
				break
			}
		}
	}
}

// countKeys counts the buffers TestFamilyRandom appended (named s<i>).
func countKeys(t *lifetime.Trace) int {
	n := 0
	for _, b := range t.Buffers {
		if strings.HasPrefix(b.Name, "s") {
			n++
		}
	}
	return n
}

// TestWithMember replans one member of a family in its arena: the family
// plan made again from the members' plans passes CheckFamily and keeps
// the other members as they were.
func TestWithMember(t *testing.T) {
	mk := func(name string, sizes ...int64) Member {
		tr := &lifetime.Trace{Name: name}
		for i, s := range sizes {
			tr.Buffers = append(tr.Buffers, lifetime.Buffer{ID: lifetime.ID(i), Name: fmt.Sprint(i), Size: s, Start: int64(i), End: int64(i) + 2})
		}
		return Member{Name: name, Trace: tr}
	}
	ms := []Member{mk("a", 1000, 2000, 3000), mk("b", 4000, 8000, 4000)}
	fp, err := PlanFamily(context.Background(), "bestfit", ms, Options{Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	run := mk("a", 1000, 1000)
	p, err := Run(context.Background(), "bestfit", run.Trace, Options{Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	n := fp.WithMember(0, p)
	ms[0] = run
	if err := CheckFamily(ms, n); err != nil {
		t.Fatal(err)
	}
	if n.Members[0].Plan != p || n.Members[1] != fp.Members[1] || fp.Members[0].Plan == p {
		t.Errorf("WithMember changed the wrong member or its receiver")
	}
	if n.Arena != fp.Members[1].Plan.Arena || n.SeparateArenas != p.Arena+fp.Members[1].Alone {
		t.Errorf("arena %d, separate %d", n.Arena, n.SeparateArenas)
	}
}

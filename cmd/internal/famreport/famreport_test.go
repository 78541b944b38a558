package famreport

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/arenaplan/arenaplan/lifetime"
	"github.com/arenaplan/arenaplan/planner"
	"github.com/arenaplan/arenaplan/plans"
)

// decodeMember is a small decode step at one batch: weights and a cache
// (shared) through the whole step, activations that grow with the batch.
// Member 0 also carries gaps, own alignments, streams, prior offsets and
// PyTorch statistics, so that every section of a member is exercised.
func decodeMember(batch int64, extras bool) *lifetime.Trace {
	t := &lifetime.Trace{Name: fmt.Sprintf("decode b%d", batch)}
	add := func(name, tag string, size, start, end int64) *lifetime.Buffer {
		t.Buffers = append(t.Buffers, lifetime.Buffer{ID: lifetime.ID(len(t.Buffers)), Name: name, Tag: tag,
			Size: size, Start: start, End: end})
		return &t.Buffers[len(t.Buffers)-1]
	}
	add("wte", "weight", 100000, 0, 12)
	add("kv", "kv", 64*4096, 0, 12)
	for l := range 3 {
		add(fmt.Sprintf("l%d.w", l), "weight", 30000, 0, 12)
		a := add(fmt.Sprintf("l%d.act", l), "intermediate", batch*3000, int64(1+3*l), int64(4+3*l))
		add(fmt.Sprintf("l%d.up", l), "intermediate", batch*12000, int64(2+3*l), int64(3+3*l))
		if extras && l == 1 {
			a.Align = 4096
			a.Stream = 2
			a.Gaps = []lifetime.Gap{{Start: a.Start + 1, End: a.Start + 2, HasWindow: true, Lo: 0, Hi: 100}}
		}
	}
	add("logits", "output", batch*5000, 10, 12)
	if extras {
		t.Prior = make([]int64, len(t.Buffers))
		for i := range t.Prior {
			t.Prior[i] = lifetime.NoOffset
		}
		t.Prior[3] = 4096
		t.Torch = &lifetime.TorchStats{Device: 0, ReservedPeak: 9 << 20, LiveAtStart: 1 << 20, HasSegments: true}
	}
	return t
}

func familyFile(t testing.TB, batches ...int64) *plans.Family {
	t.Helper()
	var ms []planner.Member
	var ws []*plans.Workload
	for i, b := range batches {
		tr := decodeMember(b, i == 0)
		ms = append(ms, planner.Member{Name: fmt.Sprintf("batch=%d", b), Trace: tr, Keys: planner.SharedByTag(tr, "weight", "kv")})
		ws = append(ws, &plans.Workload{Name: "gpt2-decode", Shape: []plans.Dim{{Name: "batch", Value: b}, {Name: "seq", Value: 1024}}})
	}
	ws[len(ws)-1] = nil // one member without a workload
	fp, err := planner.PlanFamily(context.Background(), "bestfit", ms, planner.Options{Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	return &plans.Family{Members: ms, Plan: fp, Workloads: ws}
}

func TestFamilyReport(t *testing.T) {
	f := familyFile(t, 1, 8, 64)
	r := NewFamilyReport(f)
	if r.Arena != f.Plan.Arena || r.SeparateArenas != f.Plan.SeparateArenas || len(r.Members) != 3 {
		t.Fatalf("report %+v", r)
	}
	if r.Members[1].Batch == nil || *r.Members[1].Batch != 8 || r.Members[2].Batch != nil {
		t.Fatalf("batches %v %v", r.Members[1].Batch, r.Members[2].Batch)
	}
	if r.Members[0].SharedKeys != 5 {
		t.Fatalf("shared keys %d", r.Members[0].SharedKeys)
	}
	r.Members[0].ReplayUSPerStep = 751.5
	var text bytes.Buffer
	if err := r.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"batch=64", "751.5", "separate arenas", "lower bound"} {
		if !strings.Contains(text.String(), w) {
			t.Errorf("text lacks %q:\n%s", w, text.String())
		}
	}
	js, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{`"separate_arenas_bytes":`, `"batch":1,`, `"replay_us_per_step":751.5`, `"lower_bound":`} {
		if !bytes.Contains(js, []byte(w)) {
			t.Errorf("json lacks %s: %s", w, js)
		}
	}
	t.Logf("\n%s%s", text.String(), js)
}

package planner

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/arenaplan/arenaplan/lifetime"
)

// randomWindow is a trace of n buffers with random sizes (many equal, as
// activations are) and lifetimes over span ticks; some live to its end.
func randomWindow(r *rand.Rand, name string, n int, span int64) *lifetime.Trace {
	t := &lifetime.Trace{Name: name}
	first := r.Int64N(span / 4) // ticks before the first allocation
	sizes := []int64{256, 512, 4096, 1 << 20, 3 << 20, 12 << 20}
	for i := 0; i < n; i++ {
		s := first + r.Int64N(span-first-1)
		e := s + 1 + r.Int64N(span-s)
		if r.IntN(5) == 0 {
			e = span
		}
		size := sizes[r.IntN(len(sizes))]
		if r.IntN(3) == 0 {
			size = 256 * (1 + r.Int64N(4096))
		}
		t.Buffers = append(t.Buffers, lifetime.Buffer{ID: lifetime.ID(i), Name: fmt.Sprintf("b%d", i), Start: s, End: e, Size: size})
	}
	return t
}

// TestJointPlanProjectsOntoWindows: a plan of a joint timeline, projected
// onto each window (Joint.Offsets), is a plan of that window's own trace,
// also where a hand-off comes before the later window's first allocation
// (a backward that frees saved activations first); planning leaves the
// traces it is given as they were.
func TestJointPlanProjectsOntoWindows(t *testing.T) {
	for seed := uint64(1); seed <= 40; seed++ {
		r := rand.New(rand.NewPCG(seed, 7))
		windows := []Window{
			{Name: "fw", Trace: randomWindow(r, "fw", 60+r.IntN(300), 100+r.Int64N(600))},
			{Name: "bw", Trace: randomWindow(r, "bw", 60+r.IntN(300), 100+r.Int64N(600))},
		}
		until := map[BufferRef]WindowTime{}
		fw, bw := windows[0].Trace, windows[1].Trace
		_, hi := fw.Span()
		_, bhi := bw.Span()
		for i, b := range fw.Buffers {
			if b.End >= hi && r.IntN(2) == 0 {
				until[BufferRef{Stage: 0, Buffer: lifetime.ID(i)}] = WindowTime{Window: 1, Time: r.Int64N(bhi)}
			}
		}
		j, err := Join("chain", windows, Crossings{Until: until, OutputsToEnd: true})
		if err != nil {
			t.Fatal(err)
		}
		before := fmt.Sprint(j.Trace.Buffers)
		p, _, err := RunByTag(context.Background(), Auto, j.Trace, Options{Budget: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if after := fmt.Sprint(j.Trace.Buffers); after != before {
			t.Fatalf("seed %d: planning changed the joint trace", seed)
		}
		if err := Check(j.Trace, p); err != nil {
			t.Fatalf("seed %d: joint: %v", seed, err)
		}
		for w := range windows {
			offs := j.Offsets(w, p.Offsets)
			mp := &Plan{Algo: p.Algo, Align: p.Align, Arena: ArenaSize(windows[w].Trace, offs, p.Align), Offsets: offs}
			if err := Check(windows[w].Trace, mp); err != nil {
				t.Fatalf("seed %d (%s): window %d: %v", seed, p.Algo, w, err)
			}
		}
	}
}

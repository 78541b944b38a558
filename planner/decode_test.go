package planner

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/arenaplan/arenaplan/internal/tracegen"
	"github.com/arenaplan/arenaplan/lifetime"
)

var updateDecode = flag.Bool("update", false, "rewrite the generated traces in testdata from internal/tracegen")

// decodeCases are the generated traces kept in testdata. The decode-step
// traces: a decode step that expands its KV cache per layer (see
// tracegen.DecodeOptions), with expansions freed a few operators late,
// which leaves every greedy pass 0.08-0.16% above the peak of live bytes
// and the exact search unable to go lower; the rolling search reaches
// it. The sliding window (tracegen.WindowOptions) of buffers of 0.5 to
// 1 MiB, four live at a time, where the greedy passes end 22% above the
// bound and the exact search stays there; the rolling search reaches it
// too.
var decodeCases = []struct {
	file string
	gen  func() (*lifetime.Trace, error)
}{
	{"decode-b8-s512.csv", decode(tracegen.DecodeOptions{Batch: 8, Context: 512, FreeDelay: 20, Seed: 1, StaticCache: true})},
	{"decode-b8-s1024.csv", decode(tracegen.DecodeOptions{Batch: 8, Context: 1024, FreeDelay: 20, Seed: 8, StaticCache: true})},
	{"decode-b64-l11.csv", decode(tracegen.DecodeOptions{Batch: 64, Layers: 11, Context: 512, FreeDelay: 20, Seed: 1, StaticCache: true})},
	{"window-1024-512k.csv", func() (*lifetime.Trace, error) {
		return tracegen.Window(tracegen.WindowOptions{Buffers: 1024, MinSize: 512 << 10, Seed: 1})
	}},
}

func decode(opt tracegen.DecodeOptions) func() (*lifetime.Trace, error) {
	return func() (*lifetime.Trace, error) { return tracegen.Decode(opt) }
}

// decodeStepFamily is the nine-member family of decode steps, batch 64 to 1.
func decodeStepFamily() []Member {
	var ms []Member
	for _, b := range tracegen.DecodeFamilyBatches {
		tr, _ := tracegen.Decode(tracegen.DecodeOptions{Batch: b, Context: 512, FreeDelay: 20, Seed: 1, StaticCache: true})
		ms = append(ms, Member{Name: fmt.Sprintf("b%d", b), Trace: tr})
	}
	return ms
}

// TestDecodeTestdata checks that testdata holds what the generator makes
// (-update rewrites it) and that auto plans each trace.
func TestDecodeTestdata(t *testing.T) {
	for _, c := range decodeCases {
		want, err := c.gen()
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join("testdata", c.file)
		if *updateDecode {
			f, err := os.Create(path)
			if err != nil {
				t.Fatal(err)
			}
			if err := lifetime.WriteCSV(f, want, nil); err != nil {
				t.Fatal(err)
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
		}
		got, err := readTestCSV(path)
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Buffers) != len(want.Buffers) {
			t.Fatalf("%s: %d buffers, the generator makes %d (go test -run TestDecodeTestdata -update)", c.file, len(got.Buffers), len(want.Buffers))
		}
		for i := range got.Buffers {
			g, w := got.Buffers[i], want.Buffers[i]
			if g.Size != w.Size || g.Start != w.Start || g.End != w.End {
				t.Fatalf("%s: buffer %d differs from the generator's (go test -run TestDecodeTestdata -update)", c.file, i)
			}
		}
		// The budget only guards against a hang: the search is at the
		// bound after a fixed number of nodes (one worker).
		p, err := Run(context.Background(), Auto, got, Options{Workers: 1, Budget: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if p.Stop != StopBound || p.Arena != p.LowerBound {
			t.Errorf("%s: arena %d, lower bound %d, stopped by %q; want the bound", c.file, p.Arena, p.LowerBound, p.Stop)
		}
	}
}

// BenchmarkDecode plans the decode-step traces with default options (one
// worker) and reports the ratio to the lower bound and how the search
// stopped (stop-bound, stop-proof, stop-rule, stop-budget: 1 for the
// reason of the last run). Targets: 50 ms for a trace of about 400
// buffers.
func BenchmarkDecode(b *testing.B) {
	for _, c := range decodeCases {
		tr, err := readTestCSV(filepath.Join("testdata", c.file))
		if err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("%s/%d", c.file, len(tr.Buffers)), func(b *testing.B) {
			var p *Plan
			for b.Loop() {
				if p, err = Run(context.Background(), Auto, tr, Options{}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(p.Ratio(), "x-lb")
			b.ReportMetric(1, "stop-"+string(p.Stop))
		})
	}
}

// BenchmarkDecodeFamily plans the nine-member decode family with default
// options. Target: 100 ms.
func BenchmarkDecodeFamily(b *testing.B) {
	ms := decodeStepFamily()
	var fp *FamilyPlan
	var err error
	for b.Loop() {
		if fp, err = PlanFamily(context.Background(), Auto, ms, Options{}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(fp.Ratio(), "x-lb")
	stops := map[Stop]int{}
	for _, m := range fp.Members {
		stops[m.Plan.Stop]++
	}
	for s, n := range stops {
		b.ReportMetric(float64(n), "stop-"+string(s))
	}
}

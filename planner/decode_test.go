package planner

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/arenaplan/arenaplan/internal/tracegen"
	"github.com/arenaplan/arenaplan/lifetime"
)

var updateDecode = flag.Bool("update", false, "rewrite testdata/decode-*.csv from internal/tracegen")

// decodeCases are the decode-step traces kept in testdata: a decode step
// that expands its KV cache per layer (see tracegen.DecodeOptions), with
// expansions freed a few operators late, which leaves the greedy passes
// a few hundred bytes above the peak of live bytes and the exact search
// unable to go lower.
var decodeCases = []struct {
	file string
	opt  tracegen.DecodeOptions
}{
	{"decode-b8-s512.csv", tracegen.DecodeOptions{Batch: 8, Context: 512, FreeDelay: 20, Seed: 1, StaticCache: true}},
	{"decode-b8-s1024.csv", tracegen.DecodeOptions{Batch: 8, Context: 1024, FreeDelay: 20, Seed: 8, StaticCache: true}},
	{"decode-b64-l11.csv", tracegen.DecodeOptions{Batch: 64, Layers: 11, Context: 512, FreeDelay: 20, Seed: 1, StaticCache: true}},
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
		want, err := tracegen.Decode(c.opt)
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
		p, err := Run(context.Background(), Auto, got, Options{Workers: 1})
		if err != nil {
			t.Fatal(err)
		}
		if p.Stop == "" || p.Stop == StopBudget {
			t.Errorf("%s: stopped by %q; want the bound, a proof or the rule", c.file, p.Stop)
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

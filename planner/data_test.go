package planner

import (
	"context"
	"flag"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

var reportFlag = flag.Bool("report", false, "print arena/LB and time of the baselines on ../shared/data")

// sharedTraces lists the CSV traces of the shared data: torch/*.csv and every
// CSV under minimalloc/challenging and minimalloc/related.
func sharedTraces(tb testing.TB) []string {
	tb.Helper()
	if _, err := os.Stat(dataDir); err != nil {
		tb.Skipf("shared data absent (%s): %v", dataDir, err)
	}
	files, _ := filepath.Glob(filepath.Join(dataDir, "torch", "*.csv"))
	for _, sub := range []string{"minimalloc/challenging", "minimalloc/related"} {
		filepath.WalkDir(filepath.Join(dataDir, sub), func(p string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() && strings.HasSuffix(p, ".csv") {
				files = append(files, p)
			}
			return nil
		})
	}
	if len(files) == 0 {
		tb.Skipf("no CSV traces under %s", dataDir)
	}
	return files
}

// benchName is the trace's folder and file, joined by a dot so that -bench
// patterns see one level: "iopddl.Y_1", "challenging.A.1048576".
func benchName(path string) string {
	return filepath.Base(filepath.Dir(path)) + "." + strings.TrimSuffix(filepath.Base(path), ".csv")
}

func benchAlgo(b *testing.B, algo string) {
	for _, path := range sharedTraces(b) {
		t, err := readTestCSV(path)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(benchName(path), func(b *testing.B) {
			var p *Plan
			for b.Loop() {
				if p, err = Run(context.Background(), algo, t, Options{Align: 1, Workers: 1}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(p.Ratio(), "x-lb")
		})
	}
}

func BenchmarkBestFit(b *testing.B) { benchAlgo(b, "bestfit") }
func BenchmarkBySize(b *testing.B)  { benchAlgo(b, "bysize") }

// TestDataReport prints, with -report, each baseline's arena/LB and
// planning time (Check included) on every shared trace at alignment 1.
func TestDataReport(t *testing.T) {
	if !*reportFlag {
		t.Skip("run with -report")
	}
	for _, path := range sharedTraces(t) {
		tr, err := readTestCSV(path)
		if err != nil {
			t.Fatal(err)
		}
		line := benchName(path)
		for _, algo := range Baselines {
			start := time.Now()
			p, err := Run(context.Background(), algo, tr, Options{Align: 1, Workers: 1})
			if err != nil {
				t.Fatal(err)
			}
			line += "  " + algo + " " + strconvRatio(p.Ratio()) + " " + time.Since(start).Round(time.Millisecond/10).String() + " (plan " + p.Elapsed.Round(time.Millisecond/10).String() + ")"
		}
		t.Logf("%6d buffers  %s", len(tr.Buffers), line)
	}
}

func strconvRatio(r float64) string { return strconv.FormatFloat(r, 'f', 4, 64) }

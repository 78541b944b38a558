package planner

import (
	"strings"
	"testing"

	"github.com/arenaplan/arenaplan/lifetime"
)

func TestSameRunAndFits(t *testing.T) {
	base := func() *lifetime.Trace {
		return &lifetime.Trace{Buffers: []lifetime.Buffer{
			{ID: 0, Name: "a", Size: 100, Start: 0, End: 2},
			{ID: 1, Name: "b", Size: 200, Start: 1, End: 3},
		}}
	}
	p := &Plan{Algo: "test", Align: 1, Arena: 300, Offsets: []int64{0, 100}}
	cases := []struct {
		name  string
		edit  func(*lifetime.Trace)
		exact string // SameRun(exact) error substring, "" for nil
		fits  string // Fits error substring
	}{
		{"same", func(*lifetime.Trace) {}, "", ""},
		{"smaller", func(t *lifetime.Trace) { t.Buffers[1].Size = 150 }, "is 200 bytes in the plan, 150", ""},
		{"larger", func(t *lifetime.Trace) { t.Buffers[0].Size = 101 }, "grew from 100 to 101", "grew from 100 to 101"},
		{"later end", func(t *lifetime.Trace) { t.Buffers[0].End = 3 }, "lives [0, 2) in the plan, [0, 3)", "lives [0, 2)"},
		{"tag", func(t *lifetime.Trace) { t.Buffers[1].Tag = "kv" }, `tagged "" in the plan, "kv"`, "tagged"},
		{"fewer", func(t *lifetime.Trace) { t.Buffers = t.Buffers[:1] }, "has 2 buffers, this run 1", "has 2 buffers"},
	}
	for _, c := range cases {
		run := base()
		c.edit(run)
		check := func(what string, err error, want string) {
			t.Helper()
			switch {
			case want == "" && err != nil:
				t.Errorf("%s: %s: %v, want nil", c.name, what, err)
			case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
				t.Errorf("%s: %s: %v, want %q", c.name, what, err, want)
			}
		}
		check("SameRun exact", SameRun(base(), run, true), c.exact)
		check("Fits", Fits(base(), run, p), c.fits)
	}
	// A plan that does not hold the run fails Check even when the run is the same.
	bad := &Plan{Algo: "test", Align: 1, Arena: 300, Offsets: []int64{0, 50}}
	if err := Fits(base(), base(), bad); err == nil || !strings.Contains(err.Error(), "plan check failed") {
		t.Fatalf("Fits with overlapping offsets: %v", err)
	}
}

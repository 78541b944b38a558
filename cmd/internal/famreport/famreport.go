// Package famreport is what the plan and run commands show about a family
// plan (text and JSON): presentation, kept out of the file format of
// package plans. It is not a file format and computes nothing a plan does
// not hold.
package famreport

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/arenaplan/arenaplan/plans"
)

// FamilyReport is what a command shows about a family plan: per member and
// for the family, the lower bound, the arena and what one arena per member
// would have cost. Its JSON form is what `run --json` adds for a family.
type FamilyReport struct {
	Algo  string `json:"algo"`
	Align int64  `json:"align"`
	// Arena is the family arena; LowerBound the largest member bound.
	Arena      int64   `json:"arena_bytes"`
	LowerBound int64   `json:"lower_bound"`
	Ratio      float64 `json:"ratio"`
	// Shared is the bytes of the shared region (weights, caches).
	Shared int64 `json:"shared_bytes"`
	// SeparateArenas is the sum of the members' own arenas.
	SeparateArenas int64          `json:"separate_arenas_bytes"`
	Members        []MemberReport `json:"members"`
}

// MemberReport is one member's line of a FamilyReport.
type MemberReport struct {
	Name string `json:"name"`
	// Batch is the workload's "batch" dimension, when it has one.
	Batch      *int64 `json:"batch,omitempty"`
	LowerBound int64  `json:"lower_bound"`
	// Arena is how far the member's buffers reach in the family arena.
	Arena int64 `json:"arena_bytes"`
	// Alone is the arena the member would have on its own.
	Alone        int64 `json:"alone_arena_bytes"`
	SharedKeys   int   `json:"shared_buffers"`
	PrivateBytes int64 `json:"private_bytes"` // Arena less the shared region
	// ReplayUSPerStep is left for the executor to fill in (0: not run).
	ReplayUSPerStep float64 `json:"replay_us_per_step,omitempty"`
}

// NewFamilyReport summarises f.
func NewFamilyReport(f *plans.Family) *FamilyReport {
	fp := f.Plan
	r := &FamilyReport{
		Algo: fp.Algo, Align: fp.Align, Arena: fp.Arena, LowerBound: fp.LowerBound, Ratio: fp.Ratio(),
		Shared: fp.SharedRegion.Hi, SeparateArenas: fp.SeparateArenas,
		Members: make([]MemberReport, len(f.Members)),
	}
	for i, m := range f.Members {
		mp := &fp.Members[i]
		mr := MemberReport{Name: m.Name, LowerBound: mp.Plan.LowerBound, Arena: mp.Plan.Arena, Alone: mp.Alone,
			PrivateBytes: max(0, mp.Plan.Arena-fp.SharedRegion.Hi)}
		for _, k := range m.Keys {
			if k != "" {
				mr.SharedKeys++
			}
		}
		if w := f.Workload(i); w != nil {
			if b, ok := w.Dim("batch"); ok {
				mr.Batch = &b
			}
		}
		r.Members[i] = mr
	}
	return r
}

// WriteText writes r as a table, one line per member and a family line.
func (r *FamilyReport) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "member\tbatch\tlower bound\tin family\talone\treplay µs/step\t\n")
	for _, m := range r.Members {
		batch, replay := "-", "-"
		if m.Batch != nil {
			batch = fmt.Sprint(*m.Batch)
		}
		if m.ReplayUSPerStep > 0 {
			replay = fmt.Sprintf("%.1f", m.ReplayUSPerStep)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\t\n", m.Name, batch, m.LowerBound, m.Arena, m.Alone, replay)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	sep := 1.0
	if r.Arena > 0 {
		sep = float64(r.SeparateArenas) / float64(r.Arena)
	}
	_, err := fmt.Fprintf(w, "family (%s): arena %d, lower bound %d (ratio %.4f), shared %d; separate arenas %d (%.2fx the family arena)\n",
		r.Algo, r.Arena, r.LowerBound, r.Ratio, r.Shared, r.SeparateArenas, sep)
	return err
}

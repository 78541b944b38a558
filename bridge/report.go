package bridge

import "github.com/arenaplan/arenaplan/planner"

// Report is what a step has done, for people: its plan against the lower
// bound, the memory it holds, and how faithfully its runs followed the
// plan.
type Report struct {
	ID     int    `json:"id"`
	Name   string `json:"name"`
	Device int    `json:"device"`
	State  string `json:"state"`
	// Buffers is how many allocations the recorded (or loaded) step makes.
	Buffers int `json:"buffers"`
	// LowerBound is the peak of live bytes (sizes rounded to Align); Arena
	// the plan's arena. Both 0 before a plan.
	LowerBound int64 `json:"lower_bound"`
	// Bound is the strongest lower bound the planner proved (at least
	// LowerBound; LowerBound for a loaded plan), Stop why its search
	// ended ("" for a loaded plan).
	Bound      int64   `json:"bound"`
	Arena      int64   `json:"arena"`
	Ratio      float64 `json:"ratio"`
	Optimal    bool    `json:"optimal"`
	Stop       string  `json:"stop,omitempty"`
	Algo       string  `json:"algo"`
	Align      int64   `json:"align"`
	PlanMillis float64 `json:"plan_ms"`
	Loaded     string  `json:"loaded,omitempty"` // the plan file, if loaded
	// ArenaMapped is the arena's physical memory now (an arena in the
	// graph heap: the bytes laid out for it, whose granules it shares);
	// SpillHeld the spill memory mapped for the step's captured graphs
	// (allocations the plan did not serve during capture). Their sum is
	// the graph's memory.
	ArenaMapped uint64 `json:"arena_mapped"`
	SpillHeld   uint64 `json:"spill_held"`
	// Runs served from the plan; Served allocations that got their planned
	// address; Divergences those that spilled (or failed, when strict).
	Runs            uint64 `json:"runs"`
	Served          uint64 `json:"served"`
	Divergences     uint64 `json:"divergences"`
	FirstDivergence string `json:"first_divergence,omitempty"`
	// LastRunDivergences are the last finished served run's. Replans is
	// how often the step was planned again from a served run (Replan),
	// ReplanReason what the run replanned last had diverged by; Runs,
	// Served and the divergences count from the last plan on.
	LastRunDivergences uint64 `json:"last_run_divergences"`
	Replans            int    `json:"replans"`
	ReplanReason       string `json:"replan_reason,omitempty"`
}

// Report describes the step.
func (s *Step) Report() Report {
	d := s.d
	d.mu.Lock()
	defer d.mu.Unlock()
	r := Report{ID: s.id, Name: s.name, Device: d.ordinal, State: s.state.String(), Loaded: s.loaded,
		Runs: s.runs, Served: s.served, Divergences: s.divergences, FirstDivergence: s.firstDivergence,
		LastRunDivergences: s.lastRunDivergences, Replans: s.replans,
		ReplanReason: s.replanReason}
	if s.closing {
		r.State = "closed"
	}
	if s.trace != nil {
		r.Buffers = len(s.trace.Buffers)
	}
	if p := s.plan; p != nil {
		r.LowerBound, r.Arena, r.Optimal, r.Algo, r.Align = p.LowerBound, p.Arena, p.Optimal, p.Algo, p.Align
		r.Bound, r.Stop = max(p.Bound, p.LowerBound), string(p.Stop)
		r.Ratio = p.Ratio()
		r.PlanMillis = float64(p.Elapsed.Microseconds()) / 1000
	} else if s.trace != nil {
		r.LowerBound, _ = s.trace.LowerBound(planner.DefaultAlign)
		r.Bound = r.LowerBound
	}
	if s.ar != nil {
		r.ArenaMapped = s.ar.Mapped()
	}
	if s.pool != nil {
		r.SpillHeld = s.pool.Mapped()
	}
	return r
}

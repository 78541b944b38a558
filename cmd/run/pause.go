package main

import (
	"fmt"
	"io"
	"time"

	"github.com/arenaplan/arenaplan/arena"
	"github.com/arenaplan/arenaplan/cuda"
	"github.com/arenaplan/arenaplan/graph"
	"github.com/arenaplan/arenaplan/graphexec"
)

// PauseRun is what --pause adds to the report: the arena paused and
// resumed twice halfway through a replayed sequence.
type PauseRun struct {
	// ReturnedBytes is the rise of the device's free memory over the
	// first Pause (cuMemGetInfo; other processes on the GPU blur it).
	ReturnedBytes int64 `json:"returned_bytes"`
	// HostBytes is the host memory the backed-up regions (weights, KV
	// cache) keep, page-locked when Pinned.
	HostBytes uint64  `json:"host_bytes"`
	Pinned    bool    `json:"host_pinned"`
	PauseMS   float64 `json:"pause_ms"`
	ResumeMS  float64 `json:"resume_ms"`
	// The second cycle reuses the page-locked memory of the first.
	Pause2MS  float64 `json:"pause_again_ms"`
	Resume2MS float64 `json:"resume_again_ms"`
	// OutputsEqual: the paused sequence's outputs and state equal the
	// eager sequence's bit for bit.
	OutputsEqual bool `json:"outputs_equal"`
}

// pauseRun replays the timed sequence again from the initial state,
// pausing and resuming the arena twice after half of it (the executor
// backs up weights and KV cache and drops the rest), then finishes it:
// the captured graph must go on as if nothing happened.
func pauseRun(dev cuda.Device, e *graphexec.Executor, g *graph.Graph, steps int, eagerOut [][]byte) (*PauseRun, error) {
	if err := e.ResetState(); err != nil {
		return nil, err
	}
	half := steps / 2
	for s := range half {
		if err := e.Replay(s); err != nil {
			return nil, err
		}
	}
	pr := &PauseRun{}
	timed := func(f func(...string) error) (float64, error) {
		start := time.Now()
		if err := f(); err != nil {
			return 0, err
		}
		return float64(time.Since(start).Microseconds()) / 1000, nil
	}
	a := e.Arena()
	free0, _, err := dev.MemGetInfo()
	if err != nil {
		return nil, err
	}
	if pr.PauseMS, err = timed(a.Pause); err != nil {
		return nil, err
	}
	free1, _, err := dev.MemGetInfo()
	if err != nil {
		return nil, err
	}
	pr.ReturnedBytes = int64(free1) - int64(free0)
	for _, r := range a.Regions() {
		if r.Policy == arena.Backup {
			pr.HostBytes += r.Host
			pr.Pinned = r.Pinned
		}
	}
	if pr.ResumeMS, err = timed(a.Resume); err != nil {
		return nil, err
	}
	if pr.Pause2MS, err = timed(a.Pause); err != nil {
		return nil, err
	}
	if pr.Resume2MS, err = timed(a.Resume); err != nil {
		return nil, err
	}
	for s := half; s < steps; s++ {
		if err := e.Replay(s); err != nil {
			return nil, err
		}
	}
	out, err := results(e, g)
	if err != nil {
		return nil, err
	}
	pr.OutputsEqual = equalAll(out, eagerOut)
	return pr, nil
}

func printPause(w io.Writer, pr *PauseRun) {
	kind := "Go"
	if pr.Pinned {
		kind = "page-locked"
	}
	fmt.Fprintf(w, "pause\thalfway through a replayed sequence: %s of device memory returned; pause %.2f ms, resume %.2f ms (again: %.2f ms, %.2f ms)\n",
		bytesStr(pr.ReturnedBytes), pr.PauseMS, pr.ResumeMS, pr.Pause2MS, pr.Resume2MS)
	fmt.Fprintf(w, "  kept\tweights and KV cache in %s of %s host memory; outputs after resume equal eager bit for bit: %v\n",
		bytesStr(int64(pr.HostBytes)), kind, pr.OutputsEqual)
}

package main

import (
	"bytes"
	"context"
	"time"

	"github.com/arenaplan/arenaplan/cuda"
	"github.com/arenaplan/arenaplan/graph"
	"github.com/arenaplan/arenaplan/graphexec"
)

// engine is what run executes on one arena, whatever its shape: one
// workload (graphexec.Executor), or the members of a family or the stages
// of a chain (graphexec.Group).
type engine interface {
	Init() error
	ResetState() error
	Capture() (time.Duration, error)
	Captured() (bool, int)
	Synchronize() error
}

var (
	_ engine = (*graphexec.Executor)(nil)
	_ engine = (*graphexec.Group)(nil)
)

// loop runs an engine's steps and times them.
type loop struct {
	ctx context.Context
	en  engine
	// fresh starts the timed steps from the initial state (ResetState)
	// instead of where the warm-up left it.
	fresh bool
}

// time runs step for warmup steps untimed, then for n steps timed (each
// run numbered from 0), and returns the time from the first timed step
// until the device has finished the last.
func (l loop) time(warmup, n int, step func(int) error) (time.Duration, error) {
	for s := 0; s < warmup; s++ {
		if err := step(s); err != nil {
			return 0, err
		}
	}
	prepare := l.en.Synchronize
	if l.fresh {
		prepare = l.en.ResetState
	}
	if err := prepare(); err != nil {
		return 0, err
	}
	start := time.Now()
	for s := 0; s < n; s++ {
		if l.ctx.Err() != nil {
			return 0, l.ctx.Err()
		}
		if err := step(s); err != nil {
			return 0, err
		}
	}
	if err := l.en.Synchronize(); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// measured is what eagerThenReplay found.
type measured struct {
	eager, capture, replay time.Duration
	eagerOut, replayOut    [][]byte
}

// eagerThenReplay times n steps run eagerly and reads the outputs, then
// captures from the initial state, times the same steps replayed and
// reads the outputs again.
func (l loop) eagerThenReplay(warmup, n int, eager, replay func(int) error, read func() ([][]byte, error)) (measured, error) {
	var m measured
	var err error
	if m.eager, err = l.time(warmup, n, eager); err != nil {
		return m, err
	}
	if m.eagerOut, err = read(); err != nil {
		return m, err
	}
	if err := l.en.ResetState(); err != nil {
		return m, err
	}
	if m.capture, err = l.en.Capture(); err != nil {
		return m, err
	}
	if m.replay, err = l.time(warmup, n, replay); err != nil {
		return m, err
	}
	if m.replayOut, err = read(); err != nil {
		return m, err
	}
	return m, nil
}

// equal says whether the replayed outputs are the eager ones bit for bit.
func (m measured) equal() bool { return equalAll(m.eagerOut, m.replayOut) }

func equalAll(a, b [][]byte) bool {
	eq := len(a) == len(b)
	for i := 0; eq && i < len(a); i++ {
		eq = bytes.Equal(a[i], b[i])
	}
	return eq
}

// newReport starts a report of a run of g on dev: what the workload is,
// where it runs, and the plan's source.
func newReport(g *graph.Graph, dev cuda.Device, choice, source string) *report {
	rep := &report{
		Workload: g.Name, Shape: map[string]int64{}, Fingerprint: g.Fingerprint().String(),
		Device: dev.Name(), DeviceChoice: choice, Storage: "fp32", PlanSource: source,
	}
	for _, d := range g.Shape {
		rep.Shape[d.Name] = d.Value
	}
	return rep
}

// setLaunch records how the kernels were launched.
func (r *report) setLaunch(lm graphexec.LaunchMode, noPDL bool) {
	r.PDL, r.PDLLaunches, r.PTXTarget, r.NoPDL = lm.PDL, lm.PDLLaunches, lm.Target, noPDL
}

// setTimes records the capture time and the eager and replayed times per
// step of n steps.
func (r *report) setTimes(capture, eager, replay time.Duration, n int) {
	r.CaptureMS = float64(capture.Microseconds()) / 1000
	r.EagerUS = usPerStep(eager, n)
	r.ReplayUS = usPerStep(replay, n)
	if r.ReplayUS > 0 {
		r.Speedup = r.EagerUS / r.ReplayUS
	}
}

func usPerStep(d time.Duration, n int) float64 { return float64(d.Nanoseconds()) / 1000 / float64(n) }

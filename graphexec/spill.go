package graphexec

import (
	"errors"
	"fmt"

	"github.com/arenaplan/arenaplan/cuda"
	"github.com/arenaplan/arenaplan/graph"
	"github.com/arenaplan/arenaplan/spill"
)

// Spillover in the executor.
//
// What the plan does not cover is served by spill.Allocator, the spillover
// caching allocator: tensors marked SetUnplanned (allocated right before
// the first op that uses them, freed right after the last, as the dry run
// would have done) and workspaces of ops with Launch.SpillWorkspace
// (allocated before the launch, freed after it). A tensor used on a
// stream other than the one it was allocated on is recorded on that
// stream (Allocator.RecordStream) before its free, so its memory comes back
// only once that work is ordered before the reuse: outside a capture by
// events, inside one by the capture graph (capture-time reuse, see
// spill.Capture). The executor captures through Allocator.BeginCapture, so a
// captured graph's spillover lives in a private pool that stays mapped as
// long as the graph does.
//
// Streams. An op runs on stream Launch.Stream; side streams (1 to
// MaxStreams-1) fork from the executor's stream at the start of every
// step and join it at the end, so a step is one unit of work on the
// executor's stream, eager or captured. Launch.Wait orders an op after
// the work enqueued so far on other streams.

// spillSlot is a kernel argument whose address the spillover allocator
// gives at launch time: a tensor's, or the op's workspace (tensor -1).
type spillSlot struct {
	arg, tensor int
}

// spillState is an executor's spillover allocator and streams.
type spillState struct {
	spill   *spill.Allocator
	streams []cuda.Stream // [0] is the executor's stream (not owned)
	ev      cuda.Event

	used     []bool        // streams the graph uses
	slots    [][]spillSlot // by op
	allocAt  [][]int       // by op: unplanned tensors first used there
	freeAt   [][]int       // by op: unplanned tensors last used there
	home     []int         // by tensor: the stream that allocates it
	users    [][]int       // by tensor: other streams that use it
	args     []cuda.KernelArg
	capture  *spill.Capture // the capture of the graph the exec runs
	pending  *spill.Capture // a capture not yet adopted (Capture, Rebind)
	capBase  spill.Stats
	capPeak  uint64 // bytes held at the peak of the latest capture
	runPeak  uint64 // bytes held at the peak of the executor's life
	capTaken uint64 // bytes the latest capture mapped
	capReuse uint64 // capture-time reuses in the latest capture
	inCap    bool
}

// SpillReport is what the spillover allocator did for an executor.
type SpillReport struct {
	// Used says whether the graph needs the spillover allocator.
	Used bool
	// PeakHeld and PeakReserved are the most bytes held (allocated, or
	// freed but not reusable yet: Stats' InUse + Waiting) and the most
	// bytes mapped at any time, eager steps and captures together.
	PeakHeld, PeakReserved uint64
	// Reserved is what is mapped now; GraphReserved the part of it that
	// the captured graph's private pool holds for replays.
	Reserved, GraphReserved uint64
	// CapturePeakHeld and CaptureReserved are the latest capture's own:
	// the most bytes it held at once and the bytes it mapped.
	CapturePeakHeld, CaptureReserved uint64
	// CaptureReuses counts blocks the latest capture reused by the
	// capture-time marker walk.
	CaptureReuses uint64
	// CaptureReuse says whether capture-time reuse is on.
	CaptureReuse bool
	Stats        spill.Stats
}

// SpillReport returns the spillover figures (zero when the graph needs no
// spillover).
func (e *Executor) SpillReport() SpillReport {
	r := SpillReport{CaptureReuse: !e.opt.NoCaptureReuse}
	sp := e.sp
	if sp == nil || sp.spill == nil {
		return r
	}
	st := sp.spill.Stats()
	r.Used, r.Stats = true, st
	r.PeakHeld, r.PeakReserved, r.Reserved = sp.runPeak, st.PeakMapped, st.Mapped
	r.CapturePeakHeld, r.CaptureReserved, r.CaptureReuses = sp.capPeak, sp.capTaken, sp.capReuse
	if sp.capture != nil {
		r.GraphReserved = sp.capTaken
	}
	return r
}

// bindSpill prepares the spillover state for g (after bind resolved the
// planned addresses): which arguments take spillover addresses, where
// each unplanned tensor is allocated and freed, which streams it uses.
func (e *Executor) bindSpill(g *graph.Graph) error {
	if !graph.UsesSpill(g) {
		if e.sp != nil {
			e.sp.slots = nil
		}
		return nil
	}
	if e.sp == nil {
		e.sp = &spillState{}
	}
	sp := e.sp
	if sp.spill == nil {
		s, err := spill.New(e.dev, spill.WithCaptureReuse(!e.opt.NoCaptureReuse))
		if err != nil {
			return fmt.Errorf("graphexec: %s: %w", g.Label(), err)
		}
		sp.spill = s
	}
	if sp.ev == nil {
		ev, err := e.dev.NewEvent(false)
		if err != nil {
			return fmt.Errorf("graphexec: %s: %w", g.Label(), err)
		}
		sp.ev = ev
	}
	sp.used = make([]bool, graph.MaxStreams)
	sp.used[0] = true
	first := make([]int, len(g.Tensors))
	last := make([]int, len(g.Tensors))
	sp.home = make([]int, len(g.Tensors))
	sp.users = make([][]int, len(g.Tensors))
	for i := range first {
		first[i], last[i] = -1, -1
	}
	sp.slots = make([][]spillSlot, len(g.Ops))
	sp.allocAt = make([][]int, len(g.Ops))
	sp.freeAt = make([][]int, len(g.Ops))
	for i, op := range g.Ops {
		sp.used[op.Stream] = true
		for _, w := range op.Wait {
			sp.used[w] = true
		}
		for j, a := range op.Args {
			switch {
			case a.Kind() == graph.ArgWorkspace && op.SpillWorkspace:
				sp.slots[i] = append(sp.slots[i], spillSlot{arg: j, tensor: -1})
			case a.Kind() == graph.ArgTensor && tensorOf(a).Unplanned():
				t := tensorOf(a).Index()
				sp.slots[i] = append(sp.slots[i], spillSlot{arg: j, tensor: t})
				if first[t] < 0 {
					first[t], sp.home[t] = i, op.Stream
				}
				last[t] = i
				if op.Stream != sp.home[t] && !containsInt(sp.users[t], op.Stream) {
					sp.users[t] = append(sp.users[t], op.Stream)
				}
			}
		}
	}
	for t, i := range first {
		if i >= 0 {
			sp.allocAt[i] = append(sp.allocAt[i], t)
			sp.freeAt[last[t]] = append(sp.freeAt[last[t]], t)
		}
	}
	for len(sp.streams) < graph.MaxStreams {
		sp.streams = append(sp.streams, nil)
	}
	sp.streams[0] = e.stream
	for k, u := range sp.used {
		if u && sp.streams[k] == nil {
			s, err := e.dev.NewStream()
			if err != nil {
				return fmt.Errorf("graphexec: %s: side stream %d: %w", g.Label(), k, err)
			}
			sp.streams[k] = s
		}
	}
	return nil
}

func containsInt(xs []int, x int) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

// order makes later work on stream to wait for the work enqueued so far on
// stream from.
func (sp *spillState) order(from, to int) error {
	if err := sp.ev.Record(sp.streams[from]); err != nil {
		return err
	}
	return sp.streams[to].WaitEvent(sp.ev)
}

// launchSpill enqueues one step of a graph that uses the spillover
// allocator or side streams. Every spillover block it allocates is freed
// by the end of the step, also when it fails.
func (e *Executor) launchSpill() (err error) {
	sp, g := e.sp, e.g
	live := map[int]cuda.DevicePtr{} // unplanned tensor → address
	var ws cuda.DevicePtr
	defer func() {
		// On failure: give back what the step holds. Those blocks may
		// still be used by enqueued work; the allocator orders their
		// reuse after it only for the streams recorded, so wait first.
		if err == nil {
			return
		}
		if !sp.inCap {
			for k, u := range sp.used {
				if u {
					sp.streams[k].Synchronize()
				}
			}
		}
		if ws != 0 {
			sp.spill.Free(ws)
		}
		for _, p := range live {
			sp.spill.Free(p)
		}
	}()
	for k := 1; k < graph.MaxStreams; k++ {
		if sp.used[k] {
			if err := sp.order(0, k); err != nil {
				return fmt.Errorf("graphexec: %s: fork stream %d: %w", g.Label(), k, err)
			}
		}
	}
	for i, op := range g.Ops {
		st := sp.streams[op.Stream]
		for _, w := range op.Wait {
			if err := sp.order(w, op.Stream); err != nil {
				return fmt.Errorf("graphexec: %s: op %d (%s): wait for stream %d: %w", g.Label(), i, op.Name, w, err)
			}
		}
		for _, t := range sp.allocAt[i] {
			p, err := sp.alloc(uint64(g.Tensors[t].Bytes()), st)
			if err != nil {
				return fmt.Errorf("graphexec: %s: op %d (%s): unplanned tensor %s: %w", g.Label(), i, op.Name, g.Tensors[t].Name, err)
			}
			live[t] = p
			e.ptr[t] = p
		}
		args := e.args[i]
		if len(sp.slots[i]) > 0 {
			if op.SpillWorkspace {
				if ws, err = sp.alloc(uint64(op.Workspace), st); err != nil {
					return fmt.Errorf("graphexec: %s: op %d (%s): workspace: %w", g.Label(), i, op.Name, err)
				}
			}
			sp.args = append(sp.args[:0], args...)
			for _, s := range sp.slots[i] {
				p := ws
				if s.tensor >= 0 {
					p = live[s.tensor]
				}
				sp.args[s.arg] = cuda.Ptr(p)
			}
			args = sp.args
		}
		if err := e.dev.Launch(e.fns[i], op.Grid, op.Block, op.Shared, st, args...); err != nil {
			return fmt.Errorf("graphexec: %s: op %d (%s): %w", g.Label(), i, op.Name, err)
		}
		if ws != 0 {
			// Only this launch, on its own stream, used it.
			if err := sp.spill.Free(ws); err != nil {
				return fmt.Errorf("graphexec: %s: op %d (%s): workspace: %w", g.Label(), i, op.Name, err)
			}
			ws = 0
		}
		for _, t := range sp.freeAt[i] {
			p := live[t]
			for _, u := range sp.users[t] {
				if err := sp.spill.RecordStream(p, sp.streams[u]); err != nil {
					return fmt.Errorf("graphexec: %s: op %d (%s): %s: %w", g.Label(), i, op.Name, g.Tensors[t].Name, err)
				}
			}
			delete(live, t)
			e.ptr[t] = 0
			if err := sp.spill.Free(p); err != nil {
				return fmt.Errorf("graphexec: %s: op %d (%s): free %s: %w", g.Label(), i, op.Name, g.Tensors[t].Name, err)
			}
		}
	}
	for k := 1; k < graph.MaxStreams; k++ {
		if sp.used[k] {
			if err := sp.order(k, 0); err != nil {
				return fmt.Errorf("graphexec: %s: join stream %d: %w", g.Label(), k, err)
			}
		}
	}
	return nil
}

// alloc allocates from the spillover allocator and keeps the capture's
// own peak.
func (sp *spillState) alloc(n uint64, st cuda.Stream) (cuda.DevicePtr, error) {
	p, err := sp.spill.Alloc(n, st)
	if err != nil {
		return 0, err
	}
	// Held bytes only rise at an allocation (a free moves them from in
	// use to waiting, a reuse happens inside Alloc), so this sees every
	// peak.
	s := sp.spill.Stats()
	held := s.InUse + s.Waiting
	sp.runPeak = max(sp.runPeak, held)
	if base := sp.capBase.InUse + sp.capBase.Waiting; sp.inCap && held > base {
		sp.capPeak = max(sp.capPeak, held-base)
	}
	return p, nil
}

// beginCapture begins a global-mode capture on the executor's stream,
// through the spillover allocator when the graph uses it. Memory the
// default pool caches is given back first, so that what the capture maps
// is its own.
func (e *Executor) beginCapture() error {
	sp := e.sp
	if sp == nil || sp.slots == nil {
		return e.dev.BeginCapture(e.stream, cuda.CaptureModeGlobal)
	}
	if err := e.dev.Synchronize(); err != nil {
		return err
	}
	if err := sp.spill.EmptyCache(); err != nil {
		return err
	}
	c, err := sp.spill.BeginCapture(e.stream, cuda.CaptureModeGlobal, nil)
	if err != nil {
		return err
	}
	sp.pending, sp.inCap = c, true
	sp.capBase = sp.spill.Stats()
	sp.capPeak = 0
	return nil
}

// endCapture ends the capture beginCapture began.
func (e *Executor) endCapture() (cuda.Graph, error) {
	sp := e.sp
	if sp == nil || sp.pending == nil {
		return e.dev.EndCapture(e.stream)
	}
	sp.inCap = false
	g, err := sp.pending.End()
	if g == nil {
		sp.pending = nil // a failed capture holds no pool
		return nil, err
	}
	st := sp.spill.Stats()
	sp.capTaken = st.Mapped - sp.capBase.Mapped
	sp.capReuse = st.CaptureReuses - sp.capBase.CaptureReuses
	return g, err
}

// adoptCapture makes the latest capture the one the exec runs, releasing
// the earlier one's pool (its graph and exec are destroyed, or the exec
// took the new graph's parameters).
func (e *Executor) adoptCapture() error {
	sp := e.sp
	if sp == nil || sp.pending == nil {
		return nil
	}
	old := sp.capture
	sp.capture, sp.pending = sp.pending, nil
	if old != nil {
		if err := old.Release(); err != nil {
			return err
		}
	}
	// Earlier graphs' memory goes back to the driver now.
	return sp.spill.EmptyCache()
}

// dropPending releases a capture that no exec runs.
func (e *Executor) dropPending() error {
	sp := e.sp
	if sp == nil || sp.pending == nil {
		return nil
	}
	c := sp.pending
	sp.pending = nil
	return c.Release()
}

// releaseCapture says the exec and graph of the current capture are gone.
func (e *Executor) releaseCapture() error {
	sp := e.sp
	if sp == nil || sp.capture == nil {
		return nil
	}
	c := sp.capture
	sp.capture = nil
	return c.Release()
}

// closeSpill releases the side streams, the event and the allocator
// (after the graphs that used its pools are gone).
func (e *Executor) closeSpill() error {
	sp := e.sp
	if sp == nil {
		return nil
	}
	var errs []error
	errs = append(errs, e.dropPending(), e.releaseCapture())
	e.sp = nil
	for k := 1; k < len(sp.streams); k++ {
		if sp.streams[k] != nil {
			errs = append(errs, sp.streams[k].Synchronize(), sp.streams[k].Close())
		}
	}
	if sp.ev != nil {
		errs = append(errs, sp.ev.Close())
	}
	if sp.spill != nil {
		errs = append(errs, sp.spill.Close())
	}
	return errors.Join(errs...)
}

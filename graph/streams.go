package graph

import (
	"fmt"
	"strconv"
	"strings"
)

// MaxStreams is how many streams one step may use, the executor's own
// included.
const MaxStreams = 8

// SetUnplanned makes an intermediate tensor come from the spillover
// allocator at run time instead of the plan: it is left out of the dry
// run. It returns t.
func (t *Tensor) SetUnplanned() *Tensor { t.unplanned = true; return t }

// Unplanned reports whether the spillover allocator serves t.
func (t *Tensor) Unplanned() bool { return t.unplanned }

// checkStreams records a builder error for a launch's bad stream fields.
func (b *Builder) checkStreams(l Launch) {
	if l.Stream < 0 || l.Stream >= MaxStreams {
		b.fail("op %s: stream %d: want 0..%d", l.Name, l.Stream, MaxStreams-1)
	}
	for _, w := range l.Wait {
		if w < 0 || w >= MaxStreams || w == l.Stream {
			b.fail("op %s: waits for stream %d: want another stream in 0..%d", l.Name, w, MaxStreams-1)
		}
	}
	if l.SpillWorkspace && l.Workspace <= 0 {
		b.fail("op %s: SpillWorkspace without a workspace", l.Name)
	}
}

// checkUnplanned refuses unplanned tensors of roles other than
// intermediate: only those have a lifetime within one step.
func checkUnplanned(g *Graph) error {
	for _, t := range g.Tensors {
		if t.unplanned && t.Role != Intermediate {
			return fmt.Errorf("graph: %s: %s %s is unplanned; only intermediates can be", g.Name, t.Role, t.Name)
		}
	}
	return nil
}

// UsesSpill reports whether g needs the spillover allocator or streams
// beyond the executor's.
func UsesSpill(g *Graph) bool {
	for _, t := range g.Tensors {
		if t.unplanned {
			return true
		}
	}
	for _, op := range g.Ops {
		if op.SpillWorkspace || op.Stream != 0 || len(op.Wait) > 0 {
			return true
		}
	}
	return false
}

// hashStreams adds unplanned tensors, streams, waits and spilled
// workspaces to a fingerprint; graphs without any keep the fingerprint
// they had before these existed.
func hashStreams(u func(uint64), g *Graph) {
	if !UsesSpill(g) {
		return
	}
	u(0x5350494c4c) // "SPILL"
	for _, t := range g.Tensors {
		if t.unplanned {
			u(uint64(t.index))
		}
	}
	u(uint64(len(g.Ops)))
	for _, op := range g.Ops {
		u(uint64(op.Stream))
		u(uint64(len(op.Wait)))
		for _, w := range op.Wait {
			u(uint64(w))
		}
		if op.SpillWorkspace {
			u(1)
		} else {
			u(0)
		}
	}
}

// streamTopology is the part of a graph's topology that streams add.
func streamTopology(g *Graph) string {
	if !UsesSpill(g) {
		return ""
	}
	var sb strings.Builder
	for _, op := range g.Ops {
		sb.WriteString(strconv.Itoa(op.Stream))
		for _, w := range op.Wait {
			sb.WriteString("<" + strconv.Itoa(w))
		}
		if op.SpillWorkspace {
			sb.WriteString("w")
		}
		sb.WriteString("|")
	}
	for _, t := range g.Tensors {
		if t.unplanned {
			sb.WriteString("u" + strconv.Itoa(t.index))
		}
	}
	return sb.String()
}

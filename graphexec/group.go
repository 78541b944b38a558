package graphexec

import (
	"errors"
	"fmt"
	"time"

	"github.com/arenaplan/arenaplan/arena"
	"github.com/arenaplan/arenaplan/cuda"
)

// group is what a Family and a Chain share: one arena, one stream and one
// set of loaded modules for several executors, which own none of them.
type group struct {
	what   string // "family" or "chain", for errors
	arena  *arena.Arena
	stream cuda.Stream
	mods   []cuda.Module
	execs  []*Executor
}

// Synchronize waits for the group's stream.
func (g *group) Synchronize() error {
	if g.stream == nil {
		return nil
	}
	if err := g.stream.Synchronize(); err != nil {
		return fmt.Errorf("graphexec: %s: %w", g.what, err)
	}
	return nil
}

// Capture captures every executor's step into its own graph and returns
// the total capture and instantiation time.
func (g *group) Capture() (time.Duration, error) {
	var total time.Duration
	for _, e := range g.execs {
		d, err := e.Capture()
		if err != nil {
			return 0, err
		}
		total += d
	}
	return total, nil
}

// Captured reports whether every executor has a captured graph, and the
// node count of their graphs in all.
func (g *group) Captured() (bool, int) {
	all, nodes := len(g.execs) > 0, 0
	for _, e := range g.execs {
		ok, n := e.Captured()
		all, nodes = all && ok, nodes+n
	}
	return all, nodes
}

// Close releases every executor's graph and staging memory, the modules,
// the stream and the arena.
func (g *group) Close() error {
	var errs []error
	errs = append(errs, g.Synchronize())
	for _, e := range g.execs {
		e.stream, e.mods = nil, nil // the group's, closed below
		errs = append(errs, e.Close())
	}
	g.execs = nil
	for _, m := range g.mods {
		errs = append(errs, m.Close())
	}
	g.mods = nil
	if g.stream != nil {
		errs = append(errs, g.stream.Close())
		g.stream = nil
	}
	if g.arena != nil {
		errs = append(errs, g.arena.Close())
		g.arena = nil
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("graphexec: %s: close: %w", g.what, err)
	}
	return nil
}

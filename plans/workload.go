package plans

import (
	"encoding/hex"
	"fmt"
)

// Dim is one named dimension of a workload's shape (batch=8).
type Dim struct {
	Name  string
	Value int64
}

// Fingerprint identifies a workload: the executor computes it over the
// workload's kernels and shapes (graph.Graph.Fingerprint); a plan stores
// it and never interprets it.
type Fingerprint [32]byte

func (f Fingerprint) String() string { return hex.EncodeToString(f[:]) }

// Short is the first 8 bytes in hex.
func (f Fingerprint) Short() string { return hex.EncodeToString(f[:8]) }

// Workload describes what a trace was recorded from, so that an executor
// can tell whether a plan still fits the workload it is about to run: the
// workload's name, its shape (batch, sequence length, ...) and a
// fingerprint of its kernels. A family file (format version 2) may carry
// one per member (Family.Workloads).
type Workload struct {
	Name string
	// Shape holds the workload's dimensions in the order they were given
	// (graph.Graph.Shape); names are unique and not empty.
	Shape []Dim
	// Fingerprint identifies the workload (graph.Graph.Fingerprint; zero
	// when unknown); this package stores it and never interprets it.
	Fingerprint Fingerprint
}

// TorchStep is the Workload name of the plans the PyTorch bridge saves for
// a PyTorch step or family (arenaplan.torch's save): their Shape holds
// only the "rank" and "world_size" of the process that made them, and
// they are loaded by the bridge, not built from a workload.
const TorchStep = "torch-step"

// Dim returns the value of the named dimension.
func (w *Workload) Dim(name string) (int64, bool) {
	for _, d := range w.Shape {
		if d.Name == name {
			return d.Value, true
		}
	}
	return 0, false
}

// Validate reports an empty or repeated dimension name.
func (w *Workload) Validate() error {
	seen := make(map[string]bool, len(w.Shape))
	for i, d := range w.Shape {
		if d.Name == "" {
			return fmt.Errorf("workload %q: dimension %d has no name", w.Name, i)
		}
		if seen[d.Name] {
			return fmt.Errorf("workload %q: dimension %q appears twice", w.Name, d.Name)
		}
		seen[d.Name] = true
	}
	return nil
}

package kernels_test

import (
	"regexp"
	"testing"

	"github.com/arenaplan/arenaplan/cuda"
	"github.com/arenaplan/arenaplan/kernels"
)

// Every entry of SpillPTX has a Go reference that the simulated device
// accepts, parameter sizes included.
func TestSpillPTXMatchesReferences(t *testing.T) {
	entries := regexp.MustCompile(`\.entry\s+(\w+)`).FindAllSubmatch(kernels.SpillPTX, -1)
	refs := kernels.SpillReference()
	if len(entries) != len(refs) {
		t.Errorf("%d PTX entries, %d references", len(entries), len(refs))
	}
	s, err := cuda.OpenSim(cuda.SimConfig{Kernels: refs})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	m, err := s.LoadModule(kernels.SpillPTX)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for _, e := range entries {
		if _, err := m.Function(string(e[1])); err != nil {
			t.Errorf("%s: %v", e[1], err)
		}
	}
}

package planner

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/arenaplan/arenaplan/lifetime"
)

// dataDir is the shared benchmark data, beside the repository.
const dataDir = "../../shared/data"

// readTestCSV reads a MiniMalloc CSV trace. An offset column (IREE's own
// plan) is read as a prior solution, which the planners ignore.
func readTestCSV(path string) (*lifetime.Trace, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return lifetime.ReadCSV(f, filepath.Base(path))
}

// dataFiles lists the shared data files matching pattern, skipping the
// test when there are none.
func dataFiles(t testing.TB, pattern string) []string {
	files, _ := filepath.Glob(filepath.Join(dataDir, pattern))
	if len(files) == 0 {
		t.Skipf("no files %s under %s (shared data absent)", pattern, dataDir)
	}
	return files
}

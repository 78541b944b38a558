package planner

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/arenaplan/arenaplan/lifetime"
)

// dataDir is the shared benchmark data, beside the repository.
const dataDir = "../../shared/data"

// readTestCSV reads a MiniMalloc CSV (id,lower,upper,size[,...]); the
// tests use it so that they do not depend on the importers.
func readTestCSV(path string) (*lifetime.Trace, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	t := &lifetime.Trace{Name: filepath.Base(path)}
	first := true
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		if first {
			first = false
			continue
		}
		f := strings.Split(line, ",")
		if len(f) < 4 {
			return nil, fmt.Errorf("%s: bad line %q", path, line)
		}
		var v [3]int64
		for k := 0; k < 3; k++ {
			v[k], err = strconv.ParseInt(strings.TrimSpace(f[k+1]), 10, 64)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", path, err)
			}
		}
		t.Buffers = append(t.Buffers, lifetime.Buffer{
			ID: lifetime.ID(len(t.Buffers)), Name: f[0], Start: v[0], End: v[1], Size: v[2],
			Fixed: lifetime.NoOffset, Hint: lifetime.NoOffset,
		})
	}
	return t, sc.Err()
}

func dataFiles(t testing.TB, pattern string) []string {
	files, _ := filepath.Glob(filepath.Join(dataDir, pattern))
	if len(files) == 0 {
		t.Skipf("no files %s under %s (shared data absent)", pattern, dataDir)
	}
	return files
}

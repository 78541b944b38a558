package planner

import (
	"encoding/csv"
	"fmt"
	"io"
	"os"
	"strconv"

	"github.com/arenaplan/arenaplan/lifetime"
)

// readCSV is a minimal reader of MiniMalloc's id,lower,upper,size format
// (further columns ignored) for the tests, until lifetime grows its own.
func readCSV(r io.Reader, name string) (*lifetime.Trace, error) {
	cr := csv.NewReader(r)
	cr.Comment = '#'
	head, err := cr.Read()
	if err != nil {
		return nil, fmt.Errorf("%s: header: %w", name, err)
	}
	col := map[string]int{}
	for i, h := range head {
		col[h] = i
	}
	for _, h := range []string{"id", "lower", "upper", "size"} {
		if _, ok := col[h]; !ok {
			return nil, fmt.Errorf("%s: no %q column", name, h)
		}
	}
	t := &lifetime.Trace{Name: name}
	for line := 2; ; line++ {
		rec, err := cr.Read()
		if err == io.EOF {
			return t, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		var v [3]int64
		for k, h := range []string{"lower", "upper", "size"} {
			if v[k], err = strconv.ParseInt(rec[col[h]], 10, 64); err != nil {
				return nil, fmt.Errorf("%s:%d: %s: %w", name, line, h, err)
			}
		}
		t.Buffers = append(t.Buffers, lifetime.Buffer{
			ID: lifetime.ID(len(t.Buffers)), Name: rec[col["id"]],
			Start: v[0], End: v[1], Size: v[2],
			Fixed: lifetime.NoOffset, Hint: lifetime.NoOffset,
		})
	}
}

func loadCSV(path string) (*lifetime.Trace, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readCSV(f, path)
}

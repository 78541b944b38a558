package lifetime

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/arenaplan/arenaplan/internal/regfile"
)

// MaxFileSize bounds every trace file and stream the importers read
// (1 GiB): traces are untrusted input, and a file beyond this is more
// likely a mistake than a workload.
const MaxFileSize = 1 << 30

// Load reads the traces in the file at path. format is "csv", "torch" or
// "json", or "" to pick it from the extension (.csv; .pickle or .pkl;
// .json). A CSV or JSON file holds one trace, a PyTorch snapshot one per
// device. Each trace is named after the file's base name. Errors name the
// file. The path must name a regular file (it is checked before it is
// opened, so a FIFO or a device is refused instead of blocking or reading
// without end) of at most MaxFileSize bytes.
func Load(path, format string) ([]*Trace, error) {
	return LoadContext(context.Background(), path, format)
}

// LoadContext is Load that stops reading, with ctx's error, once ctx is
// done.
func LoadContext(ctx context.Context, path, format string) ([]*Trace, error) {
	ts, err := load(ctx, path, format)
	if err != nil {
		return nil, fmt.Errorf("lifetime: %s: %w", path, err)
	}
	return ts, nil
}

func load(ctx context.Context, path, format string) ([]*Trace, error) {
	if format == "" {
		switch strings.ToLower(filepath.Ext(path)) {
		case ".csv":
			format = "csv"
		case ".pickle", ".pkl":
			format = "torch"
		case ".json":
			format = "json"
		default:
			return nil, fmt.Errorf("cannot tell the format from the extension %q: name one of csv, torch, json", filepath.Ext(path))
		}
	}
	switch format {
	case "csv", "torch", "json":
	default:
		return nil, fmt.Errorf("unknown format %q (want csv, torch or json)", format)
	}
	fh, size, err := regfile.Open(path, MaxFileSize)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	f := regfile.Reader(ctx, fh)
	name := filepath.Base(path)
	switch format {
	case "csv":
		t, err := ReadCSV(f, name)
		if err != nil {
			return nil, err
		}
		return []*Trace{t}, nil
	case "json":
		t, err := ReadJSON(f, name)
		if err != nil {
			return nil, err
		}
		return []*Trace{t}, nil
	default:
		ts, err := readTorchSnapshot(f, name, int(size))
		if err == nil {
			err = ctx.Err() // decoding itself does not look at ctx
		}
		return ts, err
	}
}

// KeepPriorOffsets turns the offsets of an earlier solution read with the
// trace (Prior, a CSV offset column) into fixed offsets every planner must
// use: what the plan command's --keep-offsets asks for. Buffers without a
// prior offset stay free.
func (t *Trace) KeepPriorOffsets() {
	for i, off := range t.Prior {
		if i < len(t.Buffers) && off != NoOffset {
			t.Buffers[i].Fixed, t.Buffers[i].HasFixed = off, true
		}
	}
}

// headBytes is how much of an input the importers look at before reading
// the rest: enough for a pickle's protocol or the start of a JSON object
// after some white space.
const headBytes = 4096

package lifetime

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// zeros is a reader of n zero bytes that counts what was read from it:
// the contents of a sparse file.
type zeros struct{ n, read int64 }

func (z *zeros) Read(p []byte) (int, error) {
	if z.read >= z.n {
		return 0, io.EOF
	}
	k := min(int64(len(p)), z.n-z.read)
	clear(p[:k])
	z.read += k
	return int(k), nil
}

// TestImportersLookFirst: a gigabyte of zeros is refused by the torch and
// JSON importers after its first bytes, not read whole; and from a file
// (a sparse one, costing no disk) through Load.
func TestImportersLookFirst(t *testing.T) {
	for _, c := range []struct {
		name string
		read func(io.Reader) error
		want string
	}{
		{"torch", func(r io.Reader) error { _, err := ReadTorchSnapshot(r, "z"); return err }, "not a pickled memory snapshot"},
		{"json", func(r io.Reader) error { _, err := ReadJSON(r, "z"); return err }, "not a JSON trace"},
	} {
		z := &zeros{n: MaxFileSize}
		err := c.read(z)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: 1 GiB of zeros: %v, want %q", c.name, err, c.want)
		}
		if z.read > 64<<10 {
			t.Errorf("%s: read %d bytes of a 1 GiB input it refuses, want at most 64 KiB", c.name, z.read)
		}
	}
	// White space alone, past the head, is refused there too.
	spaces := io.MultiReader(strings.NewReader(strings.Repeat(" ", 2*headBytes)), &zeros{n: MaxFileSize})
	if _, err := ReadJSON(spaces, "z"); err == nil || !strings.Contains(err.Error(), "only white space") {
		t.Errorf("white space then zeros: %v", err)
	}
	path := filepath.Join(t.TempDir(), "sparse.pickle")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(MaxFileSize); err != nil {
		t.Fatal(err)
	}
	f.Close()
	for _, format := range []string{"torch", "json"} {
		if _, err := Load(path, format); err == nil || !strings.Contains(err.Error(), "not a") {
			t.Errorf("Load(sparse 1 GiB, %s): %v", format, err)
		}
	}
}

package term

import (
	"os"
	"path/filepath"
	"testing"
)

// TestNotTerminals: the null device (a character device), a regular file
// and a pipe are not terminals.
func TestNotTerminals(t *testing.T) {
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	file, err := os.Create(filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	for name, f := range map[string]*os.File{"null device": null, "regular file": file, "pipe": w, "nil": nil} {
		if IsTerminal(f) {
			t.Errorf("%s taken for a terminal", name)
		}
	}
}

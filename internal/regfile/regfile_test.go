//go:build unix

package regfile

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
)

// TestOpen: what is not a regular file of at most the limit is refused
// before it is opened; a FIFO with no writer does not block (os.Open
// would, forever) and /dev/zero is not read.
func TestOpen(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Skip("mkfifo:", err)
	}
	ok := filepath.Join(dir, "ok")
	if err := os.WriteFile(ok, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(dir, "big")
	if err := os.WriteFile(big, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(big, 1<<40); err != nil { // sparse
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(fifo, link); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path string
		want error
	}{
		{fifo, ErrNotRegular},
		{link, ErrNotRegular},
		{dir, ErrNotRegular},
		{"/dev/zero", ErrNotRegular},
		{big, ErrTooLarge},
		{filepath.Join(dir, "missing"), os.ErrNotExist},
	} {
		f, _, err := Open(c.path, 1<<30)
		if !errors.Is(err, c.want) {
			t.Errorf("%s: err = %v, want %v", c.path, err, c.want)
		}
		if f != nil {
			f.Close()
		}
		if _, err := Read(context.Background(), c.path, 1<<30); !errors.Is(err, c.want) {
			t.Errorf("Read %s: err = %v, want %v", c.path, err, c.want)
		}
	}
	data, err := Read(context.Background(), ok, 5)
	if err != nil || string(data) != "hello" {
		t.Errorf("Read = %q, %v", data, err)
	}
	if _, err := Read(context.Background(), ok, 4); !errors.Is(err, ErrTooLarge) {
		t.Errorf("Read over the limit: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Read(ctx, ok, 5); !errors.Is(err, context.Canceled) {
		t.Errorf("Read with a cancelled context: %v", err)
	}
	if _, err := io.ReadAll(Reader(ctx, bytes.NewReader([]byte("x")))); !errors.Is(err, context.Canceled) {
		t.Errorf("Reader with a cancelled context: %v", err)
	}
}

// TestReadAllocates: Read allocates the file's size once, not the
// doubling of io.ReadAll.
func TestReadAllocates(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(path, bytes.Repeat([]byte{'x'}, 10<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	data, err := Read(context.Background(), path, 1<<30)
	runtime.ReadMemStats(&m1)
	if err != nil {
		t.Fatal(err)
	}
	if n := m1.TotalAlloc - m0.TotalAlloc; len(data) != 10<<20 || n > 11<<20 {
		t.Errorf("read %d bytes allocating %d", len(data), n)
	}
}

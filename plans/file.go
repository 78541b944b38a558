package plans

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// Save encodes f and writes it to path atomically: it writes a temporary
// file in the same directory, syncs it and renames it over path, so a
// reader sees the old file or the new one, never a part.
func Save(path string, f *File) error {
	data, err := encode(f)
	if err != nil {
		return fmt.Errorf("plans: %s: %w", path, err)
	}
	return writeAtomic(path, data)
}

// writeAtomic writes data to a temporary file beside path, syncs it and
// renames it over path.
func writeAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("plans: %s: %w", path, err)
	}
	name := tmp.Name()
	fail := func(err error) error {
		tmp.Close()
		os.Remove(name)
		return fmt.Errorf("plans: %s: %w", path, err)
	}
	if _, err := tmp.Write(data); err != nil {
		return fail(err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		return fail(err)
	}
	if err := tmp.Sync(); err != nil {
		return fail(err)
	}
	if err := tmp.Close(); err != nil {
		os.Remove(name)
		return fmt.Errorf("plans: %s: %w", path, err)
	}
	if err := os.Rename(name, path); err != nil {
		os.Remove(name)
		return fmt.Errorf("plans: %s: %w", path, err)
	}
	return nil
}

// Load reads and decodes the plan file at path. It refuses files larger
// than MaxFile before reading them; every error names the file.
func Load(path string) (*File, error) {
	data, err := readBounded(path)
	if err != nil {
		return nil, err
	}
	f, err := decodeSafe(data)
	if err != nil {
		return nil, fmt.Errorf("plans: %s: %w", path, err)
	}
	return f, nil
}

// readBounded reads a regular file of at most MaxFile bytes; its errors
// name the file.
func readBounded(path string) ([]byte, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("plans: %w", err)
	}
	defer fh.Close()
	st, err := fh.Stat()
	if err != nil {
		return nil, fmt.Errorf("plans: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("plans: %s: %w: not a regular file", path, ErrNotPlan)
	}
	if st.Size() > MaxFile {
		return nil, fmt.Errorf("plans: %s: %w: %d bytes exceeds %d", path, ErrTooLarge, st.Size(), MaxFile)
	}
	// The file may grow after Stat: read at most one byte past the limit.
	data, err := io.ReadAll(io.LimitReader(fh, MaxFile+1))
	if err != nil {
		return nil, fmt.Errorf("plans: %s: %w", path, err)
	}
	return data, nil
}

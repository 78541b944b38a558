package plans

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/arenaplan/arenaplan/internal/regfile"
)

// Save encodes f and writes it to path atomically: it writes a temporary
// file in the same directory, syncs it and renames it over path, so a
// reader sees the old file or the new one, never a part.
func Save(path string, f *File) error {
	return save(path, f, encode)
}

// save encodes v and writes it to path atomically; every error names the
// file.
func save[T any](path string, v T, encode func(T) ([]byte, error)) error {
	data, err := encode(v)
	if err != nil {
		return fmt.Errorf("plans: %s: %w", path, err)
	}
	return writeAtomic(path, data)
}

// writeAtomic writes data to a temporary file beside path, syncs it and
// renames it over path.
func writeAtomic(path string, data []byte) error {
	if path == "" {
		return errors.New("plans: no file name given to write the plan to")
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("plans: %s: %w", path, bare(err))
	}
	name := tmp.Name()
	fail := func(err error) error {
		tmp.Close()
		os.Remove(name)
		return fmt.Errorf("plans: %s: %w", path, bare(err))
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
		return fmt.Errorf("plans: %s: %w", path, bare(err))
	}
	if err := os.Rename(name, path); err != nil {
		os.Remove(name)
		return fmt.Errorf("plans: %s: %w", path, bare(err))
	}
	return nil
}

// bare strips the temporary file's name from an error of the os package
// (its *fs.PathError or *os.LinkError), keeping the cause for errors.Is:
// the user asked for path and never heard of the temporary file.
func bare(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return fmt.Errorf("%s: %w", pe.Op, pe.Err)
	}
	var le *os.LinkError
	if errors.As(err, &le) {
		return fmt.Errorf("%s: %w", le.Op, le.Err)
	}
	return err
}

// Load reads and decodes the plan file at path. It refuses what is not a
// regular file (before opening it: a FIFO does not block) and files
// larger than MaxFile before reading them; every error names the file.
func Load(path string) (*File, error) {
	return load(path, decodeSafe)
}

// load reads the plan file at path and decodes it; every error names the
// file.
func load[T any](path string, decode func([]byte) (*T, error)) (*T, error) {
	data, err := readBounded(context.Background(), path)
	if err != nil {
		return nil, err
	}
	v, err := decode(data)
	if err != nil {
		return nil, fmt.Errorf("plans: %s: %w", path, err)
	}
	return v, nil
}

// LoadAny reads the plan file at path and decodes it once, whatever its
// version: a version 1 file gives its File and a nil Family, a version 2
// file its Family and a nil File. It stops reading with ctx's error once
// ctx is done. Errors are Load's.
func LoadAny(ctx context.Context, path string) (*File, *Family, error) {
	data, err := readBounded(ctx, path)
	if err != nil {
		return nil, nil, err
	}
	f, fam, err := DecodeAny(data)
	if err != nil {
		return nil, nil, fmt.Errorf("plans: %s: %w", path, err)
	}
	return f, fam, nil
}

// DecodeAny is LoadAny for bytes in memory, without the file name.
func DecodeAny(data []byte) (f *File, fam *Family, err error) {
	defer corruptOnPanic(&err)
	return decodeAny(data)
}

// readBounded reads a regular file of at most MaxFile bytes; its errors
// name the file.
func readBounded(ctx context.Context, path string) ([]byte, error) {
	data, err := regfile.Read(ctx, path, MaxFile)
	switch {
	case errors.Is(err, regfile.ErrNotRegular):
		return nil, fmt.Errorf("plans: %s: %w: %w", path, ErrNotPlan, err)
	case errors.Is(err, regfile.ErrTooLarge):
		// Said once: "plan file too large: N bytes exceeds the limit of M".
		var tl *regfile.TooLargeError
		if errors.As(err, &tl) {
			return nil, fmt.Errorf("plans: %s: %w: %d bytes exceeds the limit of %d", path, ErrTooLarge, tl.Size, tl.Limit)
		}
		return nil, fmt.Errorf("plans: %s: %w: %w", path, ErrTooLarge, err)
	case err != nil:
		return nil, fmt.Errorf("plans: %s: %w", path, err)
	}
	return data, nil
}

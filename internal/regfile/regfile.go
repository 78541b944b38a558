// Package regfile opens and reads input files that must be regular files
// of bounded size, without ever blocking on what is not one.
//
// os.Open of a FIFO with no writer blocks in open(2) forever, and a
// device such as /dev/zero reads without end, so a size check after the
// open comes too late. Open checks the path with stat(2) first, then opens
// it non-blocking (a FIFO swapped in between cannot block either) and
// checks the opened file again: it must be the same regular file, of at
// most the limit. It is not a sandbox: a regular file may still grow
// after the check, which is why Read reads at most one byte past the
// limit.
package regfile

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
)

// ErrNotRegular: the path is a directory, FIFO, socket or device.
var ErrNotRegular = errors.New("not a regular file")

// ErrTooLarge: the file is larger than the caller's limit. The error
// returned is a *TooLargeError.
var ErrTooLarge = errors.New("file too large")

// TooLargeError says how large the file is and what the limit was, so
// that a caller with a sentinel of its own says it once.
type TooLargeError struct{ Size, Limit int64 }

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("%v: %d bytes exceeds the limit of %d", ErrTooLarge, e.Size, e.Limit)
}

// Is makes errors.Is(err, ErrTooLarge) hold.
func (e *TooLargeError) Is(target error) bool { return target == ErrTooLarge }

// Open opens path for reading if it is a regular file of at most limit
// bytes, and returns it with its size. Errors wrap ErrNotRegular,
// ErrTooLarge or the *fs.PathError of the failed call.
func Open(path string, limit int64) (*os.File, int64, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, 0, err
	}
	if err := check(st, limit); err != nil {
		return nil, 0, err
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, 0, err
	}
	st2, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	if err := check(st2, limit); err != nil {
		f.Close()
		return nil, 0, err
	}
	if !os.SameFile(st, st2) {
		f.Close()
		return nil, 0, fmt.Errorf("%w: replaced while being opened", ErrNotRegular)
	}
	return f, st2.Size(), nil
}

func check(st os.FileInfo, limit int64) error {
	switch {
	case st.IsDir():
		return fmt.Errorf("%w: is a directory", ErrNotRegular)
	case !st.Mode().IsRegular():
		return fmt.Errorf("%w: %s", ErrNotRegular, st.Mode().Type())
	case st.Size() > limit:
		return &TooLargeError{Size: st.Size(), Limit: limit}
	}
	return nil
}

// chunk is how much Read reads between checks of its context.
const chunk = 4 << 20

// Read reads the regular file at path, of at most limit bytes, into one
// buffer sized from its length (no regrowth), stopping with ctx's error
// when ctx is done.
func Read(ctx context.Context, path string, limit int64) ([]byte, error) {
	f, size, err := Open(path, limit)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	// One byte more than the size seen, to notice a file that grew.
	buf := make([]byte, 0, size+1)
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if int64(len(buf)) > limit {
			return nil, fmt.Errorf("%w: grew past the limit of %d bytes while being read", ErrTooLarge, limit)
		}
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := f.Read(buf[len(buf):min(cap(buf), len(buf)+chunk)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

// Reader wraps r so that reads fail with ctx's error once ctx is done:
// a streaming decoder reading from it stops at its next read.
func Reader(ctx context.Context, r io.Reader) io.Reader {
	return ctxReader{ctx, r}
}

type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

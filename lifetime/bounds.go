package lifetime

import (
	"fmt"
	"io"
	"unsafe"
)

// What decoding an input may hold, whatever the input: the importers read
// as they decode (no copy of the file is kept), refuse an input where it
// stops being possibly valid, and count what the decoded trace holds.

// MaxTraceMemory bounds what decoding one input may hold: the buffers'
// structs, names, tags, gaps and prior offsets, and what the decoder keeps
// of them until the trace is made (448 MiB: about 3 million buffers
// without gaps). With the runtime's own memory, decoding any input stays
// under 512 MB. An input that would need more is refused where it passes
// the bound, not after the whole file was read.
const MaxTraceMemory = 448 << 20

// maxTraceMemory is MaxTraceMemory; tests lower it.
var maxTraceMemory uint64 = MaxTraceMemory

// Bounds on single values of a JSON trace, far beyond any real one.
const (
	maxJSONString = 1 << 20  // one string (a name, a tag)
	maxJSONBuffer = 32 << 20 // one buffer object, its gaps included
)

// decodeBudget counts the memory of the buffers decoded so far.
type decodeBudget struct{ used uint64 }

var bufferBytes = uint64(unsafe.Sizeof(Buffer{}))

// spendOn counts n bytes for what (a part of the input); it fails once
// decoding needs more than maxTraceMemory.
func (d *decodeBudget) spendOn(what string, n uint64) error {
	d.used += n
	if d.used > maxTraceMemory {
		return fmt.Errorf("%s: the trace needs more than %d MiB of memory: refused", what, maxTraceMemory>>20)
	}
	return nil
}

// traceMemoryError refuses a trace at buffer i, where it passed
// maxTraceMemory.
func traceMemoryError(i int, name string) error {
	return fmt.Errorf("%s: the trace needs more than %d MiB of memory (%d buffers so far): refused", Label(i, name), maxTraceMemory>>20, i+1)
}

// jsonFilter passes a JSON text on without the white space between its
// tokens (encoding/json's Decoder keeps white space it skips in its
// buffer), and refuses a string or a buffer object past its bound and an
// input past MaxFileSize, where that is read.
type jsonFilter struct {
	r       io.Reader
	left    int64 // bytes still allowed
	read    int64 // bytes read so far
	inStr   bool
	escape  bool
	strLen  int
	depth   int
	objFrom int64 // where the current buffer object began (depth 3)
}

func (f *jsonFilter) Read(p []byte) (int, error) {
	for {
		if f.left <= 0 {
			var one [1]byte
			if n, _ := f.r.Read(one[:]); n > 0 {
				return 0, fmt.Errorf("input is larger than the limit of %d bytes", MaxFileSize)
			}
			return 0, io.EOF
		}
		n, err := f.r.Read(p[:min(int64(len(p)), f.left)])
		f.left -= int64(n)
		k := 0
		for i := 0; i < n; i++ {
			c := p[i]
			f.read++
			if f.inStr {
				f.strLen++
				switch {
				case f.escape:
					f.escape = false
				case c == '\\':
					f.escape = true
				case c == '"':
					f.inStr = false
				}
				if f.strLen > maxJSONString {
					return 0, fmt.Errorf("offset %d: a string longer than %d bytes", f.read, maxJSONString)
				}
				p[k] = c
				k++
				continue
			}
			switch c {
			case ' ', '\t', '\r', '\n':
				continue
			case '"':
				f.inStr, f.strLen = true, 0
			case '{', '[':
				f.depth++
				if f.depth == 3 {
					f.objFrom = f.read
				}
			case '}', ']':
				f.depth--
			}
			if f.depth >= 3 && f.read-f.objFrom > maxJSONBuffer {
				return 0, fmt.Errorf("offset %d: a buffer longer than %d bytes", f.read, maxJSONBuffer)
			}
			p[k] = c
			k++
		}
		if k > 0 || err != nil {
			return k, err
		}
	}
}

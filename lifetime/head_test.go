package lifetime

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/iotest"
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

// headThenZeros is a valid head followed by zeros up to MaxFileSize: a
// sparse file that starts as a trace would.
func headThenZeros(head string) (io.Reader, *zeros) {
	z := &zeros{n: MaxFileSize - int64(len(head))}
	return io.MultiReader(strings.NewReader(head), z), z
}

// TestImportersStopWhereInvalid: a gigabyte that starts as a JSON trace
// or a pickled snapshot and then holds zeros (or white space, or one
// endless string) is refused where the input stops being valid, having
// read and allocated a few megabytes at most. Before, each was read whole
// (4.1 GB of memory, 9-15 s) and then refused.
func TestImportersStopWhereInvalid(t *testing.T) {
	json := func(r io.Reader) error { _, err := ReadJSON(r, "z"); return err }
	torch := func(r io.Reader) error { _, err := ReadTorchSnapshot(r, "z"); return err }
	for _, c := range []struct {
		name, head string
		read       func(io.Reader) error
		want       string
	}{
		{"json buffers then zeros", `{"buffers":[`, json, `invalid character '\x00'`},
		{"json format then zeros", `{"format":"arenaplan-trace","version":1,"buffers":[{"size":1,"start":0,"end":1},`, json, `invalid character '\x00'`},
		{"pickle header then zeros", "\x80\x04\x95\x00\x00\x00\x00\x00\x00\x00\x00}\x94(", torch, "unsupported opcode 0x00"},
		{"pickle endless string", "\x80\x04}\x94(\x8d\x00\x00\x00\x20\x00\x00\x00\x00", torch, "more than any value of a memory snapshot"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, z := headThenZeros(c.head)
			var err error
			n := allocated(func() { err = c.read(r) })
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want %q", err, c.want)
			}
			if z.read > 4<<20 || n > 16<<20 {
				t.Errorf("read %d bytes and allocated %d of a 1 GiB input refused at its start; want at most 4 MiB and 16 MiB", z.read, n)
			}
		})
	}
	// One endless string.
	endless := io.MultiReader(strings.NewReader(`{"buffers":[{"name":"`), &repeatReader{s: "a", n: MaxFileSize})
	var err error
	if n := allocated(func() { err = json(endless) }); err == nil || !strings.Contains(err.Error(), "a string longer than") || n > 16<<20 {
		t.Errorf("an endless string: err %v, allocated %d bytes, want refused at %d bytes with at most 16 MiB", err, n, maxJSONString)
	}
	// White space between the tokens of a valid head is not kept.
	spaces := io.MultiReader(strings.NewReader(`{"buffers":[`), strings.NewReader(strings.Repeat(" ", 64<<20)), &zeros{n: 1})
	if n := allocated(func() { err = json(spaces) }); err == nil || n > 16<<20 {
		t.Errorf("64 MiB of white space inside the head: err %v, allocated %d bytes, want an error and at most 16 MiB", err, n)
	}
}

// TestImportersFaults: a reader that fails, or returns data a byte at a
// time, or with its last bytes and an error together, gives the same
// trace or the reader's error (testing/iotest).
func TestImportersFaults(t *testing.T) {
	tr := &Trace{Name: "f", Buffers: []Buffer{{Name: "a", Size: 512, Start: 0, End: 2}, {Name: "b", Size: 256, Start: 1, End: 3, Gaps: []Gap{{Start: 2, End: 3}}}}}
	var js bytes.Buffer
	if err := WriteJSON(&js, tr); err != nil {
		t.Fatal(err)
	}
	snap := pk([]kv{{"device_traces", []any{[]any{torchEv("alloc", 16, 8), torchEv("free_requested", 16, 8)}}}})
	for _, c := range []struct {
		name string
		data []byte
		read func(io.Reader) (int, error)
	}{
		{"json", js.Bytes(), func(r io.Reader) (int, error) { t, err := ReadJSON(r, "f"); return lenBuffers(t), err }},
		{"torch", snap, func(r io.Reader) (int, error) {
			ts, err := ReadTorchSnapshot(r, "f")
			if len(ts) == 0 {
				return 0, err
			}
			return len(ts[0].Buffers), err
		}},
	} {
		want, err := c.read(bytes.NewReader(c.data))
		if err != nil || want == 0 {
			t.Fatalf("%s: %d buffers, %v", c.name, want, err)
		}
		for name, r := range map[string]io.Reader{
			"one byte":   iotest.OneByteReader(bytes.NewReader(c.data)),
			"data+error": iotest.DataErrReader(bytes.NewReader(c.data)),
			"half":       iotest.HalfReader(bytes.NewReader(c.data)),
		} {
			if got, err := c.read(r); err != nil || got != want {
				t.Errorf("%s, %s reader: %d buffers, %v; want %d", c.name, name, got, err, want)
			}
		}
		fail := io.MultiReader(bytes.NewReader(c.data[:len(c.data)/2]), iotest.ErrReader(errors.New("disk on fire")))
		if _, err := c.read(fail); err == nil || !strings.Contains(err.Error(), "disk on fire") {
			t.Errorf("%s: a read failing halfway: %v, want the reader's error", c.name, err)
		}
	}
}

func lenBuffers(t *Trace) int {
	if t == nil {
		return 0
	}
	return len(t.Buffers)
}

// TestTraceMemoryBound: an input whose buffers would hold more than the
// bound (MaxTraceMemory; 1 MiB here) is refused there, before the rest
// is read.
func TestTraceMemoryBound(t *testing.T) {
	defer func(m uint64) { maxTraceMemory = m }(maxTraceMemory)
	maxTraceMemory = 1 << 20
	one := `{"size":1,"start":0,"end":1},`
	n := int(maxTraceMemory/bufferBytes) + 2
	body := &repeatReader{s: one, n: MaxFileSize / len(one)}
	r := io.MultiReader(strings.NewReader(`{"format":"arenaplan-trace","version":1,"buffers":[`), body)
	if _, err := ReadJSON(r, "m"); err == nil || !strings.Contains(err.Error(), "needs more than") {
		t.Fatalf("%d buffers: %v, want refused for memory", n, err)
	}
	if read := MaxFileSize/len(one) - body.n; read > 2*n {
		t.Errorf("read %d buffers of a trace refused after %d", read, n)
	}
}

// repeatReader reads s n times.
type repeatReader struct {
	s   string
	n   int
	off int
}

func (r *repeatReader) Read(p []byte) (int, error) {
	k := 0
	for k < len(p) && r.n > 0 {
		c := copy(p[k:], r.s[r.off:])
		k += c
		r.off += c
		if r.off == len(r.s) {
			r.off = 0
			r.n--
		}
	}
	if k == 0 {
		return 0, io.EOF
	}
	return k, nil
}

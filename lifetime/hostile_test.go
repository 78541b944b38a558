package lifetime

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// Hostile inputs: small files that claim or imply far more work than their
// size. Each must be answered at a cost proportional to its size. The
// small ones are kept as fuzz seeds in testdata/fuzz; the big ones are
// generated here. With ARENAPLAN_HOSTILE_DIR set, TestWriteHostile writes
// the big ones there for the measurements in BENCHMARKS.md.

// memoBombPickle is a snapshot whose device_traces is one list referenced
// devices times, that list holding one memoized alloc event dict refs
// times: about 2*(refs+devices) bytes for refs*devices events.
func memoBombPickle(refs, devices int) []byte {
	var b bytes.Buffer
	b.Write([]byte{0x80, 4, '}', '(', 'X', 13, 0, 0, 0})
	b.WriteString("device_traces")
	b.Write([]byte{']', '(', ']', '('})
	ev := pk(torchEv("alloc", 16, 8))
	b.Write(ev[2 : len(ev)-1]) // the dict without PROTO and STOP
	b.WriteByte(0x94)          // memo 0: the event
	for range refs - 1 {
		b.Write([]byte{'h', 0})
	}
	b.WriteByte('e')
	b.WriteByte(0x94) // memo 1: the device's list
	for range devices - 1 {
		b.Write([]byte{'h', 1})
	}
	b.Write([]byte{'e', 'u', '.'})
	return b.Bytes()
}

// segmentBombPickle has one event and a segments list naming one segment
// segs times, its blocks list naming one block dict blocks times.
func segmentBombPickle(segs, blocks int) []byte {
	var b bytes.Buffer
	b.Write([]byte{0x80, 4, '}', '('})
	dt := pk([]kv{{"device_traces", []any{[]any{torchEv("alloc", 16, 8)}}}})
	b.Write(dt[4 : len(dt)-2]) // the key and value, without '}', '(' and 'u', '.'
	b.Write(pk("segments")[2:])
	b.Truncate(b.Len() - 1)
	b.Write([]byte{']', '('})
	seg := pk([]kv{{"device", int64(0)}, {"total_size", int64(1 << 20)}})
	b.Write(seg[2 : len(seg)-2]) // open: without 'u' and STOP
	b.Write(pk("blocks")[2:])
	b.Truncate(b.Len() - 1)
	b.Write([]byte{']', '('})
	blk := pk([]kv{{"address", int64(1 << 20)}, {"size", int64(512)}, {"state", "active_allocated"}})
	b.Write(blk[2 : len(blk)-1])
	b.WriteByte(0x94) // memo 0: the block
	for range blocks - 1 {
		b.Write([]byte{'h', 0})
	}
	b.Write([]byte{'e', 'u', 0x94}) // memo 1: the segment
	for range segs - 1 {
		b.Write([]byte{'h', 1})
	}
	b.Write([]byte{'e', 'u', '.'})
	return b.Bytes()
}

// wideDictPickle has one alloc event dict with keys junk keys before its
// real ones, referenced refs times: every lookup of a field would scan
// the junk keys again without the dict's index.
func wideDictPickle(keys, refs int) []byte {
	var b bytes.Buffer
	b.Write([]byte{0x80, 4, '}', '(', 'X', 13, 0, 0, 0})
	b.WriteString("device_traces")
	b.Write([]byte{']', '(', ']', '(', '}', '('})
	for i := range keys {
		b.Write(pk(fmt.Sprintf("k%d", i))[2:])
		b.Truncate(b.Len() - 1)
		b.Write([]byte{'N'})
	}
	for _, f := range torchEv("alloc", 16, 8) {
		b.Write(pk(f.k)[2:])
		b.Truncate(b.Len() - 1)
		v := pk(f.v)
		b.Write(v[2 : len(v)-1])
	}
	b.Write([]byte{'u', 0x94})
	for range refs - 1 {
		b.Write([]byte{'h', 0})
	}
	b.Write([]byte{'e', 'e', 'u', '.'})
	return b.Bytes()
}

// gapsCSV is one buffer with n gaps: a CSV of about 13n bytes.
func gapsCSV(n int) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "id,lower,upper,size,gaps\nb,0,%d,64,", 2*n+1)
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%d-%d", 2*i+1, 2*i+2)
	}
	b.WriteByte('\n')
	return b.Bytes()
}

// allocated runs f and returns the bytes it allocated.
func allocated(f func()) uint64 {
	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	f()
	runtime.ReadMemStats(&m1)
	return m1.TotalAlloc - m0.TotalAlloc
}

// TestHostileSnapshots: pickles that repeat lists or dicts through memo
// references are answered with work proportional to their size: refused
// when they would make more events or blocks than they have bytes,
// decoded with each dict looked at once otherwise. Before, the 67 KB memo
// bomb made 33 M events (11.5 GB, 111 s).
func TestHostileSnapshots(t *testing.T) {
	for _, c := range []struct {
		name string
		in   []byte
		want string // error; "" for success
	}{
		{"memo bomb 32768x1024", memoBombPickle(32768, 1024), "repeated through pickle memo references"},
		{"memo bomb 32768x256", memoBombPickle(32768, 256), "repeated through pickle memo references"},
		{"memo bomb 64x64", memoBombPickle(64, 64), "repeated through pickle memo references"},
		{"segment bomb 20000x20000", segmentBombPickle(20000, 20000), "repeated through pickle memo references"},
		{"wide dict 20000x20000", wideDictPickle(20000, 20000), ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			var err error
			n := allocated(func() { _, err = ReadTorchSnapshot(bytes.NewReader(c.in), "h") })
			if c.want == "" && err != nil {
				t.Fatalf("%d bytes: %v", len(c.in), err)
			}
			if c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
				t.Fatalf("%d bytes: err = %v, want %q", len(c.in), err, c.want)
			}
			// Real snapshots allocate 11-16x their size; decoding holds
			// up to 24 bytes per input byte and the trace about 200 per
			// event, at most one event per 8 input bytes. Before, the
			// memo bomb allocated 170000x its size.
			if limit := 128*uint64(len(c.in)) + 1<<20; n > limit {
				t.Errorf("%d-byte pickle allocated %d bytes, more than %d", len(c.in), n, limit)
			}
		})
	}
}

// TestHostileGapsCSV: a 1.3 MB CSV of one buffer with 100k gaps reads and
// validates with allocation proportional to its size (the pairwise gap
// check took 27 s).
func TestHostileGapsCSV(t *testing.T) {
	in := gapsCSV(100000)
	var tr *Trace
	var err error
	n := allocated(func() { tr, err = ReadCSV(bytes.NewReader(in), "g") })
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.Buffers) != 1 || len(tr.Buffers[0].Gaps) != 100000 {
		t.Fatalf("%d buffers, want one with 100000 gaps", len(tr.Buffers))
	}
	if limit := 64 * uint64(len(in)); n > limit {
		t.Errorf("%d-byte CSV allocated %d bytes, more than %d", len(in), n, limit)
	}
}

// TestWriteHostile writes the big hostile inputs of this package into
// $ARENAPLAN_HOSTILE_DIR (for the BENCHMARKS.md table); skipped without it.
func TestWriteHostile(t *testing.T) {
	dir := os.Getenv("ARENAPLAN_HOSTILE_DIR")
	if dir == "" {
		t.Skip("ARENAPLAN_HOSTILE_DIR not set")
	}
	for name, data := range map[string][]byte{
		"memo-bomb-1024.pickle": memoBombPickle(32768, 1024),
		"memo-bomb-256.pickle":  memoBombPickle(32768, 256),
		"segment-bomb.pickle":   segmentBombPickle(20000, 20000),
		"wide-dict.pickle":      wideDictPickle(20000, 20000),
		"gaps-100k.csv":         gapsCSV(100000),
		"gaps-1m.csv":           gapsCSV(1000000),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

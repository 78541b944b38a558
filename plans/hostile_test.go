package plans

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/arenaplan/arenaplan/lifetime"
	"github.com/arenaplan/arenaplan/planner"
)

// Hostile plan files: small files whose payload expands, or decodes into,
// far more than their size. Each is answered at a cost proportional to its
// size. Small ones are fuzz seeds (FuzzDecode); big ones are generated
// here, and TestWriteHostile writes them to $ARENAPLAN_HOSTILE_DIR for the
// measurements in docs/TESTING.md.

// rleFrame is a zstd frame of n zero bytes in RLE blocks of 128 KiB: 4
// bytes of frame per block, about 32 KB a GiB.
func rleFrame(n uint64) []byte {
	const block = 128 << 10
	b := []byte{0x28, 0xb5, 0x2f, 0xfd, 0x00, 13 << 3} // magic, no content size, 8 MiB window
	for n > 0 || len(b) == 6 {
		k := min(n, block)
		n -= k
		h := uint32(k)<<3 | 1<<1 // RLE
		if n == 0 {
			h |= 1 // last block
		}
		b = append(b, byte(h), byte(h>>8), byte(h>>16), 0)
	}
	return b
}

// skippableFrame is a zstd skippable frame of n bytes: padding a decoder
// passes over.
func skippableFrame(n int) []byte {
	b := []byte{0x50, 0x2a, 0x4d, 0x18, 0, 0, 0, 0}
	binary.LittleEndian.PutUint32(b[4:], uint32(n))
	return append(b, make([]byte, n)...)
}

// sealFrame wraps compressed bytes in a header declaring a payload of
// declared bytes, with a valid checksum.
func sealFrame(frame []byte, declared uint64, version uint16) []byte {
	h := header{version: version, headerLen: HeaderLen, compressed: uint64(len(frame)), uncompressed: declared}
	out := append(h.marshal(), frame...)
	return resum(out)
}

// zstdBomb is a file whose frame really expands to declared zero bytes:
// the 1 GiB one was 114,755 bytes, this one 32 KB.
func zstdBomb(declared uint64) []byte { return sealFrame(rleFrame(declared), declared, Version) }

// boundBomb is a file of c compressed bytes whose frame expands to the
// largest payload c bytes may declare: the bomb the format still decodes.
func boundBomb(c int) []byte {
	u := payloadBound(uint64(c))
	f := rleFrame(u)
	f = append(f, skippableFrame(c-len(f)-8)...)
	return sealFrame(f, u, Version)
}

// buffersBomb is a file whose payload holds n minimal buffers (11 bytes
// each, all alike, so they compress to almost nothing), padded to c
// compressed bytes: within the ratio bound, beyond the item budget.
func buffersBomb(n, c int) []byte {
	w := writer{}
	w.section(kindMeta, 64, func(s *writer) {
		s.bytes(make([]byte, 32))
		s.str("bomb")
		s.str("none")
		for range 6 {
			s.uvarint(1)
		}
	})
	w.section(kindBuffers, 11*n+8, func(s *writer) {
		s.uvarint(uint64(n))
		for range n {
			s.b = append(s.b, 0, 1, 0, 2, 1, 0, 0, 1, 1, 0, 0)
		}
	})
	w.b = append(w.b, kindEnd)
	e, err := encoder()
	if err != nil {
		panic(err)
	}
	f := e.EncodeAll(w.b, nil)
	if pad := c - len(f) - 8; pad > 0 {
		f = append(f, skippableFrame(pad)...)
	}
	return sealFrame(f, uint64(len(w.b)), Version)
}

// gapsFile is a valid plan of one buffer with n gaps (about 3 bytes of
// file a gap): the pairwise gap check took 33 s for 100k.
func gapsFile(t testing.TB, n int) []byte {
	t.Helper()
	tr := &lifetime.Trace{Name: "gaps", Buffers: []lifetime.Buffer{{
		Name: "b", Size: 256, Start: 0, End: int64(2*n + 1),
		Gaps: make([]lifetime.Gap, n),
	}}}
	for i := range tr.Buffers[0].Gaps {
		tr.Buffers[0].Gaps[i] = lifetime.Gap{Start: int64(2*i + 1), End: int64(2*i + 2)}
	}
	lb, _ := tr.LowerBound(256)
	data, err := Encode(&File{Trace: tr, Plan: &planner.Plan{Algo: "x", Align: 256, Offsets: []int64{0}, Arena: 256, LowerBound: lb}})
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// farOffsetFile is a plan whose one buffer sits at an offset near 2^63
// (its end does not fit in an int64), with a valid checksum.
func farOffsetFile(t testing.TB) []byte {
	t.Helper()
	f := smallFile(t)
	f.Plan.Offsets[1] = math.MaxInt64 - 255 // buffer x: 300 bytes, 512 at the plan's alignment
	return mustSeal(t, encodePayload(f))
}

// TestHostilePlanFiles: each hostile file is refused by name, allocating
// about its size (header refusals) or at most 1.5 times the payload it is
// allowed to declare (bombs within the bounds). Before, the 1 GiB bomb
// took 35 s and 6.8 GB in inspect, the 4 GiB one did not finish.
func TestHostilePlanFiles(t *testing.T) {
	bound := boundBomb(256 << 10)
	for _, c := range []struct {
		name  string
		data  []byte
		want  error
		msg   string
		alloc uint64 // bytes Decode may allocate
	}{
		{"zstd bomb 1 GiB", zstdBomb(1 << 30), ErrTooLarge, "exceeds 67108864", 64 << 10},
		{"zstd bomb 4 GiB", zstdBomb(4 << 30), ErrTooLarge, "exceeds 67108864", 64 << 10},
		{"zstd bomb 64 MiB from 8 KB", zstdBomb(MaxPayload), ErrTooLarge, "more than the 1048576 this format allows them", 64 << 10},
		{"bomb at the ratio bound", bound, ErrCorrupt, "bytes after the end marker", 3 * payloadBound(256<<10) / 2},
		{"minimal buffers beyond the item budget", buffersBomb(200000, 40<<10), ErrCorrupt, "200000 buffers exceed what a file of", 4 << 20},
	} {
		t.Run(c.name, func(t *testing.T) {
			var err error
			n := allocated(func() { err = mustFail(t, c.data, c.name) })
			if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.msg) {
				t.Fatalf("%d-byte file: %v, want %v with %q", len(c.data), err, c.want, c.msg)
			}
			if n > c.alloc+uint64(len(c.data)) {
				t.Errorf("%d-byte file allocated %d bytes, more than %d", len(c.data), n, c.alloc+uint64(len(c.data)))
			}
			// The family reader decodes the same way.
			if _, err := DecodeFamily(c.data); !errors.Is(err, c.want) {
				t.Errorf("DecodeFamily: %v, want %v", err, c.want)
			}
		})
	}
}

// TestHostileGapsPlan: a valid plan of one buffer with 100k gaps decodes,
// with allocation proportional to its payload.
func TestHostileGapsPlan(t *testing.T) {
	data := gapsFile(t, 100000)
	var f *File
	var err error
	n := allocated(func() { f, err = Decode(data) })
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Trace.Buffers[0].Gaps) != 100000 {
		t.Fatalf("%d gaps", len(f.Trace.Buffers[0].Gaps))
	}
	u := binary.LittleEndian.Uint64(data[24:])
	if n > 128*u {
		t.Errorf("%d-byte file of a %d-byte payload allocated %d bytes", len(data), u, n)
	}
}

// TestExactMessages: checksums print whole, and a range whose end passes
// 2^63 prints exactly instead of wrapping.
func TestExactMessages(t *testing.T) {
	good, err := Encode(smallFile(t))
	if err != nil {
		t.Fatal(err)
	}
	bad := bytes.Clone(good)
	bad[40] ^= 1
	err = mustFail(t, bad, "checksum")
	if want := "stored " + hexOf(bad[32:64]) + ", computed " + hexOf(good[32:64]); !strings.Contains(err.Error(), want) {
		t.Errorf("checksum error %q does not contain %q", err, want)
	}
	err = mustFail(t, farOffsetFile(t), "far offset")
	if want := "[9223372036854775552, 9223372036854776064) ends beyond the arena"; !strings.Contains(err.Error(), want) {
		t.Errorf("far offset: %v, want %q", err, want)
	}
	// A start and a length that sum past 2^63 name both values.
	f := smallFile(t)
	f.Trace.Buffers[2].Start, f.Trace.Buffers[2].End = math.MaxInt64-5, math.MinInt64+10
	err = mustFail(t, mustSeal(t, encodePayload(f)), "wrapped end")
	if want := "end 9223372036854775802+16 is outside the 64-bit range"; !strings.Contains(err.Error(), want) {
		t.Errorf("wrapped end: %v, want %q", err, want)
	}
}

func hexOf(b []byte) string {
	const digits = "0123456789abcdef"
	out := make([]byte, 0, 2*len(b))
	for _, c := range b {
		out = append(out, digits[c>>4], digits[c&15])
	}
	return string(out)
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

// TestWriteHostile writes the hostile files into $ARENAPLAN_HOSTILE_DIR.
func TestWriteHostile(t *testing.T) {
	dir := os.Getenv("ARENAPLAN_HOSTILE_DIR")
	if dir == "" {
		t.Skip("ARENAPLAN_HOSTILE_DIR not set")
	}
	good, err := Encode(smallFile(t))
	if err != nil {
		t.Fatal(err)
	}
	badSum := bytes.Clone(good)
	badSum[40] ^= 1
	for name, data := range map[string][]byte{
		"zstd-bomb-1g.plan":      zstdBomb(1 << 30),
		"zstd-bomb-4g.plan":      zstdBomb(4 << 30),
		"bound-bomb.plan":        boundBomb(1 << 20),
		"buffers-bomb.plan":      buffersBomb(1000000, 64<<10),
		"gaps-100k.plan":         gapsFile(t, 100000),
		"far-offset.plan":        farOffsetFile(t),
		"checksum-mismatch.plan": badSum,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

package plans

import (
	"bytes"
	"encoding/binary"
	"errors"
	"runtime"
	"testing"

	"github.com/arenaplan/arenaplan/planner"
)

// mustSeal wraps a payload in a header with a valid checksum.
func mustSeal(t testing.TB, raw []byte) []byte {
	t.Helper()
	data, err := seal(raw, Version)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// resum recomputes the checksum of a file whose header was edited.
func resum(data []byte) []byte {
	out := bytes.Clone(data)
	sum := checksum(out[:32], out[HeaderLen:])
	copy(out[32:], sum[:])
	return out
}

// mustFail decodes data and requires a clean error wrapping a sentinel.
func mustFail(t *testing.T, data []byte, what string) error {
	t.Helper()
	f, err := Decode(data)
	if err == nil {
		t.Fatalf("%s: Decode accepted it (%d buffers)", what, len(f.Trace.Buffers))
	}
	if !isSentinel(err) {
		t.Fatalf("%s: error wraps no sentinel: %v", what, err)
	}
	return err
}

func TestTruncated(t *testing.T) {
	for _, f := range []*File{smallFile(t), synthFile(t, 500)} {
		data, err := Encode(f)
		if err != nil {
			t.Fatal(err)
		}
		for n := range len(data) {
			mustFail(t, data[:n], "truncated")
		}
		mustFail(t, append(bytes.Clone(data), 0), "trailing byte")
	}
}

// TestBitFlips flips every bit of a small file, and of a sample of
// positions in a bigger one: every flip must be refused.
func TestBitFlips(t *testing.T) {
	small, err := Encode(smallFile(t))
	if err != nil {
		t.Fatal(err)
	}
	for i := range small {
		for bit := range 8 {
			c := bytes.Clone(small)
			c[i] ^= 1 << bit
			mustFail(t, c, "bit flip")
		}
	}
	big, err := Encode(synthFile(t, 5000))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < len(big); i += 1 + i/16 {
		c := bytes.Clone(big)
		c[i] ^= 1 << (i % 8)
		mustFail(t, c, "bit flip")
	}
	t.Logf("small file %d bytes, big file %d bytes", len(small), len(big))
}

func TestHeaderErrors(t *testing.T) {
	good, err := Encode(smallFile(t))
	if err != nil {
		t.Fatal(err)
	}
	edit := func(fn func(b []byte)) []byte {
		b := bytes.Clone(good)
		fn(b)
		return b
	}
	le := binary.LittleEndian
	cases := []struct {
		name string
		data []byte
		want error
	}{
		{"empty", nil, ErrCorrupt},
		{"magic prefix only", []byte("ARENA"), ErrCorrupt},
		{"other file", []byte("\x28\xb5\x2f\xfd some zstd"), ErrNotPlan},
		{"text", []byte("id,lower,upper,size\n1,0,2,3\n"), ErrNotPlan},
		{"wrong magic", edit(func(b []byte) { b[7] = 'X' }), ErrNotPlan},
		{"version 0", edit(func(b []byte) { le.PutUint16(b[8:], 0) }), ErrVersion},
		{"version 2", resum(edit(func(b []byte) { le.PutUint16(b[8:], 2) })), ErrVersion},
		{"header length", resum(edit(func(b []byte) { le.PutUint16(b[10:], 72) })), ErrCorrupt},
		{"flags", resum(edit(func(b []byte) { le.PutUint32(b[12:], 1) })), ErrCorrupt},
		{"compressed length", resum(edit(func(b []byte) { le.PutUint64(b[16:], 1<<62) })), ErrCorrupt},
		{"payload over MaxPayload", resum(edit(func(b []byte) { le.PutUint64(b[24:], 1<<40) })), ErrTooLarge},
		{"payload beyond the ratio", resum(edit(func(b []byte) { le.PutUint64(b[24:], MaxPayload-1) })), ErrTooLarge},
		{"payload just beyond the ratio", resum(edit(func(b []byte) { le.PutUint64(b[24:], payloadBound(uint64(len(b)-HeaderLen))+1) })), ErrTooLarge},
		{"payload length off by one", resum(edit(func(b []byte) { le.PutUint64(b[24:], le.Uint64(b[24:])+1) })), ErrCorrupt},
		{"payload length short", resum(edit(func(b []byte) { le.PutUint64(b[24:], le.Uint64(b[24:])-1) })), ErrCorrupt},
		{"checksum", edit(func(b []byte) { b[40] ^= 1 }), ErrChecksum},
		{"not zstd", resum(edit(func(b []byte) { copy(b[HeaderLen:], "nope") })), ErrCorrupt},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := mustFail(t, c.data, c.name)
			if !errors.Is(err, c.want) {
				t.Fatalf("got %v, want %v", err, c.want)
			}
			t.Log(err)
		})
	}
}

// payloadOf returns the uncompressed payload of a valid small file.
func payloadOf(t testing.TB, f *File) []byte {
	t.Helper()
	if err := verify(f); err != nil {
		t.Fatal(err)
	}
	return encodePayload(f)
}

// TestPayloadMutations corrupts the payload behind a valid checksum, as an
// attacker could: every result is refused or, if accepted, is a plan that
// planner.Check accepts for a trace with the stored fingerprint (only
// metadata such as names, tags and timings can change unnoticed).
func TestPayloadMutations(t *testing.T) {
	raw := payloadOf(t, smallFile(t))
	accepted := 0
	try := func(p []byte) {
		f, err := decodeVerified(p, nil)
		if err != nil {
			if !isSentinel(err) {
				t.Fatalf("error wraps no sentinel: %v", err)
			}
			return
		}
		accepted++
		if err := planner.Check(f.Trace, f.Plan); err != nil {
			t.Fatalf("accepted a plan Check rejects: %v", err)
		}
		if got := f.Trace.Fingerprint(); !bytes.Equal(p[2:34], got[:]) {
			t.Fatalf("accepted a trace whose fingerprint is not the stored one")
		}
	}
	for i := range raw {
		for _, m := range []func(byte) byte{
			func(c byte) byte { return c ^ 1 },
			func(c byte) byte { return c ^ 0x80 },
			func(c byte) byte { return c + 1 },
			func(byte) byte { return 0 },
			func(byte) byte { return 0xff },
		} {
			c := bytes.Clone(raw)
			c[i] = m(c[i])
			try(c)
		}
	}
	for n := range len(raw) {
		if _, err := decodeVerified(raw[:n], nil); err == nil {
			t.Fatalf("payload truncated to %d of %d bytes was accepted", n, len(raw))
		}
	}
	// The whole path, through zstd and the checksum, for a sample.
	for i := 0; i < len(raw); i += 7 {
		c := bytes.Clone(raw)
		c[i] ^= 0x40
		if f, err := Decode(mustSeal(t, c)); err == nil {
			if err := planner.Check(f.Trace, f.Plan); err != nil {
				t.Fatalf("accepted a plan Check rejects: %v", err)
			}
		}
	}
	t.Logf("%d bytes of payload, %d mutations accepted (metadata only)", len(raw), accepted)
}

// metaSection is a valid meta section for an empty trace.
func metaSection() []byte {
	w := writer{}
	w.section(kindMeta, 0, func(s *writer) {
		s.bytes(make([]byte, 32))
		s.str("crafted")
		s.str("none")
		s.uvarint(256)
		s.uvarint(0)
		s.uvarint(0)
		s.bool(true)
		s.uvarint(0)
		s.uvarint(0)
	})
	return w.b
}

// TestHugeCounts crafts payloads behind valid checksums that claim 2^40
// of something in a few bytes: each must fail at once, allocating little.
func TestHugeCounts(t *testing.T) {
	huge := uint64(1) << 40
	buffers := func(body func(s *writer)) []byte {
		w := writer{b: metaSection()}
		w.section(kindBuffers, 0, body)
		w.b = append(w.b, kindEnd)
		return w.b
	}
	oneBuffer := func(s *writer, gaps uint64) {
		s.uvarint(1) // count
		s.str("b")
		s.uvarint(256) // size
		s.uvarint(0)   // align
		s.varint(0)    // start
		s.uvarint(1)   // end-start
		s.varint(0)    // stream
		s.str("")      // tag
		s.varint(-1)   // fixed
		s.varint(-1)   // hint
		s.uvarint(0)   // offset
		s.uvarint(gaps)
		s.b = append(s.b, make([]byte, 32)...)
	}
	cases := map[string][]byte{
		"buffers": buffers(func(s *writer) { s.uvarint(huge); s.b = append(s.b, make([]byte, 64)...) }),
		"gaps":    buffers(func(s *writer) { oneBuffer(s, huge) }),
		"name": buffers(func(s *writer) {
			s.uvarint(1)
			s.uvarint(huge)
			s.b = append(s.b, make([]byte, 64)...)
		}),
		"section": append(metaSection(), kindBuffers, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01, kindEnd),
		"prior": func() []byte {
			w := writer{b: metaSection()}
			w.section(kindBuffers, 0, func(s *writer) { s.uvarint(0) })
			w.section(kindPrior, 0, func(s *writer) { s.uvarint(huge); s.uvarint(0) })
			return append(w.b, kindEnd)
		}(),
		"dimensions": func() []byte {
			w := writer{b: metaSection()}
			w.section(kindBuffers, 0, func(s *writer) { s.uvarint(0) })
			w.section(kindWorkload, 0, func(s *writer) {
				s.uvarint(1)
				s.str("w")
				s.bytes(make([]byte, 32))
				s.uvarint(huge)
				s.uvarint(0)
			})
			return append(w.b, kindEnd)
		}(),
	}
	for name, raw := range cases {
		t.Run(name, func(t *testing.T) {
			data := mustSeal(t, raw)
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			err := mustFail(t, data, name)
			runtime.ReadMemStats(&after)
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("got %v, want ErrCorrupt", err)
			}
			// The zstd decoder's own tables are most of this.
			if got := after.TotalAlloc - before.TotalAlloc; got > 1<<20 {
				t.Fatalf("decoding %d bytes allocated %d bytes", len(data), got)
			} else {
				t.Logf("%d-byte file: %v; allocated %d bytes", len(data), err, got)
			}
		})
	}
}

// TestValidChecksumInvalidPlan wraps plans that fail verification, or
// payloads that break the format's rules, in valid checksums.
func TestValidChecksumInvalidPlan(t *testing.T) {
	mutate := func(fn func(f *File)) []byte {
		f := smallFile(t)
		fn(f)
		return encodePayload(f)
	}
	good := payloadOf(t, smallFile(t))
	cases := []struct {
		name string
		raw  []byte
		want error
	}{
		{"overlap", mutate(func(f *File) { f.Plan.Offsets[1] = f.Plan.Offsets[0] }), ErrInvalid},
		{"misaligned", mutate(func(f *File) { f.Plan.Offsets[5] += 8 }), ErrInvalid},
		{"fixed moved", mutate(func(f *File) { f.Trace.Buffers[0].Fixed = 1 << 20 }), ErrInvalid},
		{"beyond arena", mutate(func(f *File) { f.Plan.Arena = 512 }), ErrInvalid},
		{"arena too big", mutate(func(f *File) { f.Plan.Arena *= 2 }), ErrInvalid},
		{"lower bound", mutate(func(f *File) { f.Plan.LowerBound = 1 }), ErrInvalid},
		{"alignment 0", mutate(func(f *File) { f.Plan.Align = 0 }), ErrInvalid},
		{"alignment huge", mutate(func(f *File) { f.Plan.Align = 1 << 62 }), ErrInvalid},
		{"negative time", mutate(func(f *File) { f.Plan.Elapsed = -1 }), ErrInvalid},
		{"empty lifetime", mutate(func(f *File) { f.Trace.Buffers[2].End = 1 }), ErrInvalid},
		{"negative size", mutate(func(f *File) { f.Trace.Buffers[2].Size = -512 }), ErrInvalid},
		{"gap outside", mutate(func(f *File) { f.Trace.Buffers[3].Gaps[0].End = 99 }), ErrInvalid},
		{"dup dimension", mutate(func(f *File) { f.Workload.Shape[1].Name = "batch" }), ErrInvalid},
		{"fingerprint", func() []byte {
			b := bytes.Clone(good)
			b[2] ^= 1 // first byte of the meta section's fingerprint
			return b
		}(), ErrInvalid},
		{"missing end", good[:len(good)-1], ErrCorrupt},
		{"after end", append(bytes.Clone(good), 0), ErrCorrupt},
		{"unknown section", append(bytes.Clone(good[:len(good)-1]), 9, 0, kindEnd), ErrCorrupt},
		{"section out of order", append(bytes.Clone(good[:len(good)-1]), kindPrior, 0, kindEnd), ErrCorrupt},
		{"no buffers", append(metaSection(), kindEnd), ErrCorrupt},
		{"buffers before meta", []byte{kindBuffers, 1, 0, kindEnd}, ErrCorrupt},
		{"empty payload", nil, ErrCorrupt},
		{"two workloads", func() []byte {
			f := smallFile(t)
			f.Workload = nil
			p := encodePayload(f)
			w := writer{b: bytes.Clone(p[:len(p)-1])}
			w.section(kindWorkload, 0, func(s *writer) { s.uvarint(2) })
			return append(w.b, kindEnd)
		}(), ErrCorrupt},
		{"non-minimal varint", func() []byte {
			// The meta section's length written in two bytes.
			b := []byte{kindMeta, good[1] | 0x80, 0}
			return append(b, good[2:]...)
		}(), ErrCorrupt},
		{"flag byte 2", func() []byte {
			f := smallFile(t)
			f.Trace.Torch, f.Workload = nil, nil
			p := encodePayload(f)
			// Torch section: device 0, peak 0, live 0, has-segments 2.
			return append(bytes.Clone(p[:len(p)-1]), kindTorch, 4, 0, 0, 0, 2, kindEnd)
		}(), ErrCorrupt},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := mustFail(t, mustSeal(t, c.raw), c.name)
			if !errors.Is(err, c.want) {
				t.Fatalf("got %v, want %v", err, c.want)
			}
			t.Log(err)
		})
	}
}

// TestLyingHeader declares the largest payload the ratio bound allows for
// a real file: decompression allocates at most that (the bound keeps it
// within 64 times the file), and refuses the frame's shorter output.
func TestLyingHeader(t *testing.T) {
	data, err := Encode(synthFile(t, 2000))
	if err != nil {
		t.Fatal(err)
	}
	claim := payloadBound(uint64(len(data) - HeaderLen))
	binary.LittleEndian.PutUint64(data[24:], claim)
	data = resum(data)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	err = mustFail(t, data, "lying header")
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ErrCorrupt) {
		t.Fatalf("got %v, want ErrCorrupt", err)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > claim+claim/2+1<<20 {
		t.Fatalf("a %d-byte file claiming %d bytes allocated %d bytes", len(data), claim, got)
	} else {
		t.Logf("%d-byte file claiming %d bytes: allocated %d bytes: %v", len(data), claim, got, err)
	}
}

package plans

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/klauspost/compress/zstd"

	"github.com/arenaplan/arenaplan/lifetime"
	"github.com/arenaplan/arenaplan/planner"
)

// Magic opens every plan file.
const Magic = "ARENAPLN"

// Version is the format version of a file holding one plan: what Encode
// writes and Decode reads.
const Version = 1

// FamilyVersion is the format version of a file holding a family of plans
// (see EncodeFamily); DecodeFamily reads both versions.
const FamilyVersion = 2

// HeaderLen is the length of a version 1 header.
const HeaderLen = 64

// MaxPayload bounds the declared uncompressed payload: 64 MiB, 2.6 times
// the largest real plan we know (the 1M-buffer scaling trace of
// BENCHMARKS.md: 24 MB of payload, 24 bytes a buffer), room for about
// 2.7 M buffers. See the package comment.
const MaxPayload = 64 << 20

// MaxFile bounds a plan file's size (Load and Decode refuse larger ones):
// the payload bound and the header. Real plans compress 1.7 to 19 times,
// so a file this large already holds more than MaxPayload would allow.
const MaxFile = MaxPayload + HeaderLen

// maxRatio bounds how much a file may claim its payload expands: the most
// compressible real plan (a built-in workload of 65536 identical layers)
// expands 19 times, the traces of ../shared/data 1.7 to 4.8 times. A
// payload of at most max(maxRatio*C, minPayloadBound) is accepted, so a
// small file cannot make the reader decompress, parse and verify much more
// than its own size, whatever its frame really yields.
const maxRatio = 64

// minPayloadBound lets small files of very regular plans expand more
// than maxRatio: a payload this small costs nothing to decode.
const minPayloadBound = 1 << 20

// maxWindow is the zstd window this package writes and the largest it
// reads, so decompression needs at most this much history besides the
// output itself.
const maxWindow = 8 << 20

// Sentinel errors; every error from Decode and Load wraps one of them.
var (
	// ErrNotPlan: the data does not start with Magic.
	ErrNotPlan = errors.New("not a plan file")
	// ErrVersion: a format version this package cannot read.
	ErrVersion = errors.New("unsupported format version")
	// ErrCorrupt: truncated or malformed bytes (header, zstd or payload).
	ErrCorrupt = errors.New("corrupt plan file")
	// ErrChecksum: the stored checksum does not match the bytes.
	ErrChecksum = errors.New("checksum mismatch")
	// ErrTooLarge: the file or its declared payload exceeds the limits.
	ErrTooLarge = errors.New("plan file too large")
	// ErrInvalid: well-formed, but the trace or plan fails verification
	// (trace.Validate, planner.Check, fingerprint, arena, lower bound).
	ErrInvalid = errors.New("invalid plan")
)

// File is what one plan file holds. Trace and Plan are required; Workload
// is optional metadata about what the trace was recorded from.
type File struct {
	Trace    *lifetime.Trace
	Plan     *planner.Plan
	Workload *Workload // nil when unknown
}

// header is the fixed part of a version 1 file.
type header struct {
	version      uint16
	headerLen    uint16
	flags        uint32
	compressed   uint64
	uncompressed uint64
	sum          [32]byte
}

func (h *header) marshal() []byte {
	b := make([]byte, HeaderLen)
	copy(b, Magic)
	binary.LittleEndian.PutUint16(b[8:], h.version)
	binary.LittleEndian.PutUint16(b[10:], h.headerLen)
	binary.LittleEndian.PutUint32(b[12:], h.flags)
	binary.LittleEndian.PutUint64(b[16:], h.compressed)
	binary.LittleEndian.PutUint64(b[24:], h.uncompressed)
	copy(b[32:], h.sum[:])
	return b
}

// checksum covers the header fields before the checksum, then the payload.
func checksum(head32, payload []byte) [32]byte {
	s := sha256.New()
	s.Write(head32[:32])
	s.Write(payload)
	var out [32]byte
	s.Sum(out[:0])
	return out
}

var (
	encOnce sync.Once
	enc     *zstd.Encoder
	encErr  error
)

// encoder is shared: EncodeAll is safe for concurrent use.
func encoder() (*zstd.Encoder, error) {
	encOnce.Do(func() {
		enc, encErr = zstd.NewWriter(nil,
			zstd.WithEncoderLevel(zstd.SpeedBetterCompression),
			zstd.WithWindowSize(maxWindow),
			zstd.WithEncoderConcurrency(1))
	})
	return enc, encErr
}

// Encode verifies f exactly as Decode will and returns its file bytes.
// It refuses what Decode would refuse, so a saved plan always loads.
func Encode(f *File) ([]byte, error) {
	data, err := encode(f)
	if err != nil {
		return nil, fmt.Errorf("plans: encode: %w", err)
	}
	return data, nil
}

// withoutTimes is f with its plan's planning times cleared: they are no
// part of a plan, and a file of the same plan must be the same bytes.
// Files written before times were left out still decode with theirs.
func withoutTimes(f *File) *File {
	if f.Plan.Elapsed == 0 && f.Plan.ToBest == 0 {
		return f
	}
	g, p := *f, *f.Plan
	p.Elapsed, p.ToBest = 0, 0
	g.Plan = &p
	return &g
}

func encode(f *File) ([]byte, error) {
	if err := verify(f); err != nil {
		return nil, err
	}
	return sealBounded(encodePayload(withoutTimes(f)), Version)
}

// sealBounded is seal for an encoder: it refuses a payload or a file
// larger than Decode reads (MaxPayload, MaxFile).
func sealBounded(raw []byte, version uint16) ([]byte, error) {
	if uint64(len(raw)) > MaxPayload {
		return nil, fmt.Errorf("%w: payload of %d bytes exceeds %d", ErrTooLarge, len(raw), uint64(MaxPayload))
	}
	out, err := seal(raw, version)
	if err != nil {
		return nil, err
	}
	if len(out) > MaxFile {
		return nil, fmt.Errorf("%w: file of %d bytes exceeds %d", ErrTooLarge, len(out), MaxFile)
	}
	return out, nil
}

// seal compresses a payload and prepends its header. It trusts raw: the
// tests use it to wrap crafted payloads in a valid checksum.
func seal(raw []byte, version uint16) ([]byte, error) {
	e, err := encoder()
	if err != nil {
		return nil, err
	}
	out := make([]byte, HeaderLen, HeaderLen+len(raw)/2+64)
	out = e.EncodeAll(raw, out)
	h := header{
		version:      version,
		headerLen:    HeaderLen,
		compressed:   uint64(len(out) - HeaderLen),
		uncompressed: uint64(len(raw)),
	}
	copy(out, h.marshal())
	h.sum = checksum(out[:32], out[HeaderLen:])
	copy(out[32:], h.sum[:])
	return out, nil
}

// Decode parses and verifies a plan file. See the package comment for
// what it checks; every error wraps one of the package's sentinels.
func Decode(data []byte) (*File, error) {
	f, err := decodeSafe(data)
	if err != nil {
		return nil, fmt.Errorf("plans: %w", err)
	}
	return f, nil
}

// decodeSafe is Decode without the package prefix.
func decodeSafe(data []byte) (f *File, err error) {
	defer corruptOnPanic(&err)
	return decode(data)
}

// corruptOnPanic, deferred by a decoder with named results, turns a panic
// into an ErrCorrupt error (the results it was to return stay nil).
// Decoding is written not to panic (FuzzDecode checks it); this is the
// last line against a bug in a dependency.
func corruptOnPanic(err *error) {
	if r := recover(); r != nil {
		*err = fmt.Errorf("%w: internal error while decoding: %v", ErrCorrupt, r)
	}
}

// decode is decodeSafe without the recover; the fuzzer calls it.
func decode(data []byte) (*File, error) {
	raw, version, budget, err := open(data)
	if err != nil {
		return nil, err
	}
	if version != Version {
		return nil, fmt.Errorf("%w: %d holds a family of plans: read it with DecodeFamily or LoadFamily", ErrVersion, version)
	}
	return decodeVerified(raw, budget)
}

// decodeAny decompresses data once and decodes it by its version: a
// version 1 file into a File, a version 2 file into a Family.
func decodeAny(data []byte) (*File, *Family, error) {
	raw, version, budget, err := open(data)
	if err != nil {
		return nil, nil, err
	}
	if version == Version {
		f, err := decodeVerified(raw, budget)
		return f, nil, err
	}
	fam, err := decodeFamilyVerified(raw, budget)
	return nil, fam, err
}

// open checks the header and the checksum and decompresses the payload;
// it returns the payload, the format version (Version or FamilyVersion)
// and the item budget the compressed size allows.
func open(data []byte) ([]byte, uint16, *itemBudget, error) {
	n := min(len(data), len(Magic))
	if !bytes.Equal(data[:n], []byte(Magic)[:n]) {
		return nil, 0, nil, fmt.Errorf("%w: bad magic %q", ErrNotPlan, data[:n])
	}
	if len(data) > MaxFile {
		return nil, 0, nil, fmt.Errorf("%w: %d bytes exceeds %d", ErrTooLarge, len(data), MaxFile)
	}
	if len(data) < HeaderLen {
		return nil, 0, nil, fmt.Errorf("%w: truncated header: %d of %d bytes", ErrCorrupt, len(data), HeaderLen)
	}
	h := header{
		version:      binary.LittleEndian.Uint16(data[8:]),
		headerLen:    binary.LittleEndian.Uint16(data[10:]),
		flags:        binary.LittleEndian.Uint32(data[12:]),
		compressed:   binary.LittleEndian.Uint64(data[16:]),
		uncompressed: binary.LittleEndian.Uint64(data[24:]),
	}
	copy(h.sum[:], data[32:HeaderLen])
	switch {
	case h.version != Version && h.version != FamilyVersion:
		return nil, 0, nil, fmt.Errorf("%w: %d (this reader knows %d and %d)", ErrVersion, h.version, Version, FamilyVersion)
	case h.headerLen != HeaderLen:
		return nil, 0, nil, fmt.Errorf("%w: header length %d, want %d", ErrCorrupt, h.headerLen, HeaderLen)
	case h.flags != 0:
		return nil, 0, nil, fmt.Errorf("%w: unknown flags %#x", ErrCorrupt, h.flags)
	case h.compressed != uint64(len(data)-HeaderLen):
		return nil, 0, nil, fmt.Errorf("%w: header declares %d payload bytes, file has %d (truncated or trailing data)",
			ErrCorrupt, h.compressed, len(data)-HeaderLen)
	case h.uncompressed > MaxPayload:
		return nil, 0, nil, fmt.Errorf("%w: declared payload of %d bytes exceeds %d", ErrTooLarge, h.uncompressed, uint64(MaxPayload))
	case h.uncompressed > payloadBound(h.compressed):
		return nil, 0, nil, fmt.Errorf("%w: %d compressed bytes declare a payload of %d bytes, more than the %d this format allows them (%d times, at least %d)",
			ErrTooLarge, h.compressed, h.uncompressed, payloadBound(h.compressed), maxRatio, minPayloadBound)
	}
	payload := data[HeaderLen:]
	if sum := checksum(data[:32], payload); sum != h.sum {
		return nil, 0, nil, fmt.Errorf("%w: stored %x, computed %x", ErrChecksum, h.sum, sum)
	}
	raw, err := decompress(payload, h.uncompressed)
	if err != nil {
		return nil, 0, nil, err
	}
	return raw, h.version, newItemBudget(h.compressed), nil
}

// payloadBound is the largest payload c compressed bytes may declare.
func payloadBound(c uint64) uint64 {
	if c > MaxPayload/maxRatio {
		return MaxPayload
	}
	return max(maxRatio*c, minPayloadBound)
}

// decompress decodes one zstd frame of exactly size bytes into one buffer
// of that size, allocated once: peak memory is the payload plus the
// decoder's block buffers (its window is the output itself), and a frame
// that yields more than size bytes stops there.
func decompress(payload []byte, size uint64) ([]byte, error) {
	dec, err := zstd.NewReader(nil,
		zstd.WithDecoderConcurrency(1),
		zstd.WithDecoderLowmem(true),
		zstd.WithDecoderMaxWindow(maxWindow),
		// The decoder refuses a window above this bound, and the smallest
		// window is 1 KiB: a frame may yield up to that much more than
		// size, which the length check below refuses.
		zstd.WithDecoderMaxMemory(max(size, zstd.MinWindowSize)))
	if err != nil {
		return nil, fmt.Errorf("%w: zstd: %w", ErrCorrupt, err)
	}
	defer dec.Close()
	raw, err := dec.DecodeAll(payload, make([]byte, 0, size))
	if err != nil {
		return nil, fmt.Errorf("%w: zstd: %w", ErrCorrupt, err)
	}
	if uint64(len(raw)) != size {
		return nil, fmt.Errorf("%w: payload is %d bytes, header declares %d", ErrCorrupt, len(raw), size)
	}
	return raw, nil
}

// decodeVerified decodes a payload and verifies what it holds.
func decodeVerified(raw []byte, budget *itemBudget) (*File, error) {
	f, fp, err := decodePayload(raw, budget)
	if err != nil {
		return nil, err
	}
	if err := verify(f); err != nil {
		return nil, err
	}
	if got := f.Trace.Fingerprint(); got != fp {
		return nil, fmt.Errorf("%w: trace fingerprint %x does not match the stored %x", ErrInvalid, got, fp)
	}
	return f, nil
}

// verify is what both Encode and Decode require of a File.
func verify(f *File) error {
	switch {
	case f == nil:
		return fmt.Errorf("%w: no file", ErrInvalid)
	case f.Trace == nil:
		return fmt.Errorf("%w: no trace", ErrInvalid)
	case f.Plan == nil:
		return fmt.Errorf("%w: no plan", ErrInvalid)
	}
	t, p := f.Trace, f.Plan
	if err := t.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	switch {
	case p.Align < 1 || p.Align > lifetime.MaxSize:
		return fmt.Errorf("%w: plan alignment %d is out of range", ErrInvalid, p.Align)
	case p.Elapsed < 0 || p.ToBest < 0:
		return fmt.Errorf("%w: negative planning time (elapsed %v, to best %v)", ErrInvalid, p.Elapsed, p.ToBest)
	}
	if err := planner.Check(t, p); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	// Check accepts any arena that holds the plan; a file must state the
	// exact one, and the exact lower bound, so reports read from it are true.
	if a := planner.ArenaSize(t, p.Offsets, p.Align); a != p.Arena {
		return fmt.Errorf("%w: stored arena %d, the offsets need %d", ErrInvalid, p.Arena, a)
	}
	if lb, _ := t.LowerBound(p.Align); lb != p.LowerBound {
		return fmt.Errorf("%w: stored lower bound %d, the trace's is %d", ErrInvalid, p.LowerBound, lb)
	}
	if f.Workload != nil {
		if err := f.Workload.Validate(); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalid, err)
		}
	}
	return nil
}

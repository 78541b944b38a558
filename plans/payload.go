package plans

import (
	"encoding/binary"
	"fmt"
	"math"
	"time"

	"github.com/arenaplan/arenaplan/lifetime"
	"github.com/arenaplan/arenaplan/planner"
)

// Section kinds, in the order they appear in a payload.
const (
	kindEnd      = 0
	kindMeta     = 1
	kindBuffers  = 2
	kindPrior    = 3
	kindTorch    = 4
	kindWorkload = 5
	kindKeys     = 6 // family members only (format version 2)
)

var kindNames = [...]string{"end", "meta", "buffers", "prior", "torch", "workload", "keys"}

// Smallest encodings, used to bound counts against the bytes left before
// allocating: a buffer is at least 11 one-byte fields, a gap 3, a prior
// offset 1, a dimension 2.
const (
	minBufferBytes = 11
	minGapBytes    = 3
	minPriorBytes  = 1
	minDimBytes    = 2
)

// writer appends varint-encoded fields.
type writer struct{ b []byte }

func (w *writer) uvarint(v uint64) { w.b = binary.AppendUvarint(w.b, v) }
func (w *writer) varint(v int64)   { w.b = binary.AppendVarint(w.b, v) }
func (w *writer) bytes(p []byte)   { w.b = append(w.b, p...) }
func (w *writer) str(s string)     { w.uvarint(uint64(len(s))); w.b = append(w.b, s...) }
func (w *writer) bool(v bool) {
	if v {
		w.b = append(w.b, 1)
	} else {
		w.b = append(w.b, 0)
	}
}

// section appends a section of the given kind whose body body writes;
// size is a guess of the body's length.
func (w *writer) section(kind byte, size int, body func(*writer)) {
	s := writer{b: make([]byte, 0, size)}
	body(&s)
	w.b = append(w.b, kind)
	w.uvarint(uint64(len(s.b)))
	w.b = append(w.b, s.b...)
}

// encodePayload writes f without verifying it; Encode verifies first.
// Lengths and differences are written as two's-complement uint64s, which
// round-trip exactly even for values Validate would refuse.
func encodePayload(f *File) []byte { return encodeSections(f, nil) }

// encodeSections is encodePayload with a family member's shared keys
// (written only when keys is not nil).
func encodeSections(f *File, keys []string) []byte {
	t, p := f.Trace, f.Plan
	w := writer{b: make([]byte, 0, 256+48*len(t.Buffers))}
	w.section(kindMeta, 128, func(s *writer) {
		fp := t.Fingerprint()
		s.bytes(fp[:])
		s.str(t.Name)
		s.str(p.Algo)
		s.uvarint(uint64(p.Align))
		s.uvarint(uint64(p.Arena))
		s.uvarint(uint64(p.LowerBound))
		s.bool(p.Optimal)
		s.uvarint(uint64(p.Elapsed))
		s.uvarint(uint64(p.ToBest))
	})
	w.section(kindBuffers, 48*len(t.Buffers), func(s *writer) {
		s.uvarint(uint64(len(t.Buffers)))
		var prev int64
		for i := range t.Buffers {
			b := &t.Buffers[i]
			s.str(b.Name)
			s.uvarint(uint64(b.Size))
			s.uvarint(uint64(b.Align))
			s.varint(b.Start - prev)
			prev = b.Start
			s.uvarint(uint64(b.End - b.Start))
			s.varint(b.Stream)
			s.str(b.Tag)
			s.varint(offsetOrNone(b.Fixed, b.HasFixed))
			s.varint(offsetOrNone(b.Hint, b.HasHint))
			var off int64 = -1
			if i < len(p.Offsets) {
				off = p.Offsets[i]
			}
			s.uvarint(uint64(off))
			s.uvarint(uint64(len(b.Gaps)))
			for _, g := range b.Gaps {
				s.uvarint(uint64(g.Start - b.Start))
				s.uvarint(uint64(g.End - g.Start))
				s.bool(g.HasWindow)
				if g.HasWindow {
					s.uvarint(uint64(g.Lo))
					s.uvarint(uint64(g.Hi))
				}
			}
		}
	})
	if t.Prior != nil {
		w.section(kindPrior, 2*len(t.Prior), func(s *writer) {
			s.uvarint(uint64(len(t.Prior)))
			for _, o := range t.Prior {
				s.varint(o)
			}
		})
	}
	if ts := t.Torch; ts != nil {
		w.section(kindTorch, 32, func(s *writer) {
			s.varint(int64(ts.Device))
			s.varint(ts.ReservedPeak)
			s.varint(ts.LiveAtStart)
			s.bool(ts.HasSegments)
		})
	}
	if wl := f.Workload; wl != nil {
		w.section(kindWorkload, 64, func(s *writer) {
			s.uvarint(1) // workloads in the section: one (a family file describes its members in its family section)
			s.str(wl.Name)
			s.bytes(wl.Fingerprint[:])
			s.uvarint(uint64(len(wl.Shape)))
			for _, d := range wl.Shape {
				s.str(d.Name)
				s.varint(d.Value)
			}
		})
	}
	if keys != nil {
		w.section(kindKeys, 2*len(keys), func(s *writer) {
			s.uvarint(uint64(len(keys)))
			for _, k := range keys {
				s.str(k)
			}
		})
	}
	w.b = append(w.b, kindEnd)
	return w.b
}

// reader consumes fields; the first error sticks and later reads return
// zero values, so decoding code checks r.err once per record.
type reader struct {
	b      []byte
	off    int
	base   int // offset of b inside the payload, for messages
	err    error
	budget *itemBudget // nil: unbounded
}

// itemBudget bounds the buffers, gaps, shared buffers and members a file
// may decode into by the size of its compressed payload (itemsPerByte
// per compressed byte, at least minItems). Each costs a few hundred bytes of
// memory and verification time, and very regular payloads compress
// nearly to nothing, so without this a file could hold a payload within
// the ratio bound whose items cost far more than the file's size says.
type itemBudget struct {
	left       int64
	compressed uint64
}

// Real plans hold 0.12 (traces of ../shared/data, the 1M-buffer scaling
// trace) to 0.62 (a built-in workload of 65536 identical layers) items
// per compressed byte; a file may hold one item per byte, and at least
// minItems.
const (
	itemsPerByte = 1
	minItems     = 1 << 16
)

func newItemBudget(compressed uint64) *itemBudget {
	return &itemBudget{left: max(int64(min(compressed, MaxFile))*itemsPerByte, minItems), compressed: compressed}
}

// spend takes n items from the budget, failing the read when it runs out.
func (r *reader) spend(n int, what string) {
	if r.err != nil || r.budget == nil {
		return
	}
	if r.budget.left -= int64(n); r.budget.left < 0 {
		r.fail("%d %s exceed what a file of %d compressed bytes may hold (%d items a byte, at least %d)",
			n, what, r.budget.compressed, itemsPerByte, minItems)
	}
}

func (r *reader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("payload offset %d: %s", r.base+r.off, fmt.Sprintf(format, args...))
	}
}

func (r *reader) left() int { return len(r.b) - r.off }

// uvarint reads a minimal uvarint: one value, one encoding.
func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	var v uint64
	for i := 0; i < binary.MaxVarintLen64; i++ {
		if r.off >= len(r.b) {
			r.fail("truncated varint")
			return 0
		}
		c := r.b[r.off]
		r.off++
		if i == binary.MaxVarintLen64-1 && c > 1 {
			r.fail("varint overflows 64 bits")
			return 0
		}
		v |= uint64(c&0x7f) << (7 * i)
		if c < 0x80 {
			if c == 0 && i > 0 {
				r.fail("non-minimal varint")
				return 0
			}
			return v
		}
	}
	r.fail("varint overflows 64 bits")
	return 0
}

func (r *reader) varint() int64 {
	u := r.uvarint()
	return int64(u>>1) ^ -int64(u&1)
}

func (r *reader) int64() int64 { return int64(r.uvarint()) }

func (r *reader) byte() byte {
	if r.err != nil {
		return 0
	}
	if r.off >= len(r.b) {
		r.fail("truncated")
		return 0
	}
	c := r.b[r.off]
	r.off++
	return c
}

func (r *reader) bool() bool {
	c := r.byte()
	if c > 1 {
		r.fail("flag byte %d is not 0 or 1", c)
	}
	return c == 1
}

// take returns the next n bytes (aliasing the payload).
func (r *reader) take(n uint64) []byte {
	if r.err != nil {
		return nil
	}
	if n > uint64(r.left()) {
		r.fail("%d bytes needed, %d left", n, r.left())
		return nil
	}
	p := r.b[r.off : r.off+int(n)]
	r.off += int(n)
	return p
}

func (r *reader) str() string { return string(r.take(r.uvarint())) }

func (r *reader) fingerprint() (fp [32]byte) {
	copy(fp[:], r.take(32))
	return fp
}

// count reads a count of items of at least min bytes each and refuses one
// the bytes left cannot hold, before anything is allocated for it.
func (r *reader) count(what string, min int) int {
	n := r.uvarint()
	if r.err == nil && n > uint64(r.left()/min) {
		r.fail("%d %s cannot fit in the %d bytes left", n, what, r.left())
		return 0
	}
	return int(n)
}

// decodePayload parses a payload into a File and the stored trace
// fingerprint. It checks structure only; decodeVerified checks meaning.
func decodePayload(raw []byte, budget *itemBudget) (*File, [32]byte, error) {
	f, fp, err := parsePayload(raw, budget)
	if err != nil {
		return nil, fp, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	return f, fp, nil
}

func parsePayload(raw []byte, budget *itemBudget) (*File, [32]byte, error) {
	f, _, fp, err := parseSections(raw, 0, false, budget)
	return f, fp, err
}

// parseSections parses a version 1 payload or, with member set, a family
// member's (which may end with a keys section). base is raw's offset in
// the whole payload, for messages.
func parseSections(raw []byte, base int, member bool, budget *itemBudget) (*File, []string, [32]byte, error) {
	var fp [32]byte
	var keys []string
	r := &reader{b: raw, base: base, budget: budget}
	t := &lifetime.Trace{}
	p := &planner.Plan{}
	f := &File{Trace: t, Plan: p}
	last := -1
	seen := map[int]bool{}
	for {
		if r.left() == 0 {
			r.fail("missing end marker")
			return nil, nil, fp, r.err
		}
		kind := int(r.byte())
		if kind == kindEnd {
			if r.left() != 0 {
				r.fail("%d bytes after the end marker", r.left())
				return nil, nil, fp, r.err
			}
			break
		}
		if kind >= len(kindNames) || kind == kindKeys && !member {
			r.fail("unknown section kind %d", kind)
			return nil, nil, fp, r.err
		}
		if kind <= last {
			r.fail("section %s out of order", kindNames[kind])
			return nil, nil, fp, r.err
		}
		last = kind
		if kind != kindMeta && !seen[kindMeta] {
			r.fail("section %s before meta", kindNames[kind])
			return nil, nil, fp, r.err
		}
		n := r.uvarint()
		start := r.base + r.off
		body := r.take(n)
		if r.err != nil {
			return nil, nil, fp, r.err
		}
		s := &reader{b: body, base: start, budget: budget}
		switch kind {
		case kindMeta:
			fp = s.fingerprint()
			t.Name = s.str()
			p.Algo = s.str()
			p.Align = s.int64()
			p.Arena = s.int64()
			p.LowerBound = s.int64()
			p.Optimal = s.bool()
			p.Elapsed = time.Duration(s.int64())
			p.ToBest = time.Duration(s.int64())
		case kindBuffers:
			decodeBuffers(s, t, p)
		case kindPrior:
			n := s.count("prior offsets", minPriorBytes)
			if s.err == nil && n != len(t.Buffers) {
				s.fail("%d prior offsets for %d buffers", n, len(t.Buffers))
			}
			if s.err == nil {
				t.Prior = make([]int64, n)
				for i := range t.Prior {
					t.Prior[i] = s.varint()
				}
			}
		case kindTorch:
			ts := &lifetime.TorchStats{}
			dev := s.varint()
			if s.err == nil && (dev < math.MinInt || dev > math.MaxInt) {
				s.fail("torch device %d out of range", dev)
			}
			ts.Device = int(dev)
			ts.ReservedPeak = s.varint()
			ts.LiveAtStart = s.varint()
			ts.HasSegments = s.bool()
			t.Torch = ts
		case kindWorkload:
			f.Workload = decodeWorkload(s)
		case kindKeys:
			n := s.count("keys", 1)
			if s.err == nil && n != len(t.Buffers) {
				s.fail("%d keys for %d buffers", n, len(t.Buffers))
			}
			if s.err == nil {
				keys = make([]string, n)
				shared := false
				for i := range keys {
					keys[i] = s.str()
					shared = shared || keys[i] != ""
				}
				// One encoding per member: no keys section shares nothing.
				if s.err == nil && !shared {
					s.fail("keys section shares no buffer")
				}
			}
		}
		if s.err == nil && s.left() != 0 {
			s.fail("%d unread bytes at the end of section %s", s.left(), kindNames[kind])
		}
		if s.err != nil {
			return nil, nil, fp, fmt.Errorf("section %s: %w", kindNames[kind], s.err)
		}
		seen[kind] = true
	}
	if !seen[kindBuffers] {
		return nil, nil, fp, fmt.Errorf("no buffers section")
	}
	return f, keys, fp, nil
}

func decodeBuffers(s *reader, t *lifetime.Trace, p *planner.Plan) {
	n := s.count("buffers", minBufferBytes)
	s.spend(n, "buffers")
	if s.err != nil || n == 0 {
		return
	}
	t.Buffers = make([]lifetime.Buffer, n)
	p.Offsets = make([]int64, n)
	var prev int64
	for i := range t.Buffers {
		b := &t.Buffers[i]
		b.ID = lifetime.ID(i)
		b.Name = s.str()
		b.Size = s.int64()
		b.Align = s.int64()
		b.Start = s.add(prev, s.varint(), "start")
		prev = b.Start
		b.End = s.add(b.Start, s.int64(), "end")
		b.Stream = s.varint()
		b.Tag = s.str()
		if v := s.varint(); v != lifetime.NoOffset {
			b.Fixed, b.HasFixed = v, true
		}
		if v := s.varint(); v != lifetime.NoOffset {
			b.Hint, b.HasHint = v, true
		}
		p.Offsets[i] = s.int64()
		ng := s.count("gaps", minGapBytes)
		s.spend(ng, "gaps")
		if s.err != nil {
			s.err = fmt.Errorf("buffer %d: %w", i, s.err)
			return
		}
		if ng > 0 {
			b.Gaps = make([]lifetime.Gap, ng)
			for j := range b.Gaps {
				g := &b.Gaps[j]
				g.Start = s.add(b.Start, s.int64(), "gap start")
				g.End = s.add(g.Start, s.int64(), "gap end")
				g.HasWindow = s.bool()
				if g.HasWindow {
					g.Lo = s.int64()
					g.Hi = s.int64()
				}
			}
		}
		if s.err != nil {
			s.err = fmt.Errorf("buffer %d: %w", i, s.err)
			return
		}
	}
}

// add returns a+d, failing the read when the sum leaves int64, so that an
// error names the values the file holds instead of a wrapped range.
func (r *reader) add(a, d int64, what string) int64 {
	sum := a + d
	if r.err == nil && (d > 0 && sum < a || d < 0 && sum > a) {
		r.fail("%s %d%+d is outside the 64-bit range", what, a, d)
	}
	return sum
}

func decodeWorkload(s *reader) *Workload {
	members := s.uvarint()
	if s.err == nil && members != 1 {
		s.fail("%d workload members (version %d holds exactly 1)", members, Version)
		return nil
	}
	w := &Workload{}
	w.Name = s.str()
	w.Fingerprint = s.fingerprint()
	n := s.count("shape dimensions", minDimBytes)
	if s.err != nil || n == 0 {
		return w
	}
	w.Shape = make([]Dim, n)
	for i := range w.Shape {
		w.Shape[i].Name = s.str()
		w.Shape[i].Value = s.varint()
	}
	return w
}

// offsetOrNone is a buffer's fixed offset or hint as the payload stores it:
// lifetime.NoOffset (-1) where the buffer has none.
func offsetOrNone(v int64, ok bool) int64 {
	if !ok {
		return lifetime.NoOffset
	}
	return v
}

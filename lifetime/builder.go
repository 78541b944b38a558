package lifetime

import (
	"encoding/binary"
	"unsafe"
)

// traceBuilder collects the buffers of a CSV or JSON trace as they are
// decoded and makes Trace.Buffers once, at the end, of exactly their
// number. Until then each buffer is a few bytes of varints (about 10 for
// an ordinary one) and its name, tag and gaps sit in chunked arenas that
// the finished buffers point into. A slice grown buffer by buffer would
// hold up to twice the trace while it is copied, and chunks of whole
// Buffers joined at the end twice the trace as well.
//
// Everything the builder allocates, and what finish will, is counted
// against maxTraceMemory as it is decided, so that an input that needs
// more is refused where it passes the bound and decoding never holds much
// more than the bound.
type traceBuilder struct {
	used uint64 // bytes allocated, or to be allocated by finish
	n    int    // buffers added
	rows arena[byte]
	text arena[byte] // names, and tags not interned
	gaps arena[Gap]
	// tags interns the first maxInternedTags distinct tags (a trace has a
	// handful: weight, kv, ...); later ones are kept like names.
	tags    map[string]uint32
	tagList []string
	// perBuffer is what finish allocates per buffer besides the Buffer:
	// a prior offset, the CSV id check.
	perBuffer uint64
	// prior: finish makes Trace.Prior.
	prior bool
	row   [16 * binary.MaxVarintLen64]byte
}

const maxInternedTags = 256

// Flags of an encoded buffer: which optional fields follow.
const (
	rowAlign = 1 << iota
	rowStream
	rowTag      // interned: the tag's index follows
	rowTagBytes // not interned: its length follows, its bytes are in text
	rowFixed
	rowHint
	rowGaps
	rowPrior
)

// add counts and encodes b (its Name, Tag and Gaps copied) with its prior
// offset (NoOffset for none). name, when not nil, stands for b.Name, so
// that a decoder need not make a string of it. It fails, naming the
// buffer, once the trace needs more than maxTraceMemory.
func (tb *traceBuilder) add(b *Buffer, name []byte, prior int64) error {
	if name == nil {
		name = unsafe.Slice(unsafe.StringData(b.Name), len(b.Name))
	}
	var flags byte
	row := tb.row[:1]
	row = binary.AppendUvarint(row, uint64(len(name)))
	row = binary.AppendVarint(row, b.Start)
	row = binary.AppendUvarint(row, uint64(b.End-b.Start)) // wraps back in finish
	row = binary.AppendVarint(row, b.Size)
	if b.Align != 0 {
		flags |= rowAlign
		row = binary.AppendVarint(row, b.Align)
	}
	if b.Stream != 0 {
		flags |= rowStream
		row = binary.AppendVarint(row, b.Stream)
	}
	if b.Tag != "" {
		i, ok := tb.tags[b.Tag]
		if !ok && len(tb.tagList) < maxInternedTags {
			if tb.tags == nil {
				tb.tags = map[string]uint32{}
			}
			i, ok = uint32(len(tb.tagList)), true
			tb.tags[b.Tag] = i
			tb.tagList = append(tb.tagList, b.Tag)
			tb.used += uint64(len(b.Tag)) + 64
		}
		if ok {
			flags |= rowTag
			row = binary.AppendUvarint(row, uint64(i))
		} else {
			flags |= rowTagBytes
			row = binary.AppendUvarint(row, uint64(len(b.Tag)))
		}
	}
	if b.HasFixed {
		flags |= rowFixed
		row = binary.AppendVarint(row, b.Fixed)
	}
	if b.HasHint {
		flags |= rowHint
		row = binary.AppendVarint(row, b.Hint)
	}
	if len(b.Gaps) > 0 {
		flags |= rowGaps
		row = binary.AppendUvarint(row, uint64(len(b.Gaps)))
	}
	if prior != NoOffset {
		flags |= rowPrior
		row = binary.AppendVarint(row, prior)
	}
	row[0] = flags
	tb.used += tb.rows.add(row) + tb.text.add(name) + tb.gaps.add(b.Gaps)
	if flags&rowTagBytes != 0 {
		tb.used += tb.text.add(unsafe.Slice(unsafe.StringData(b.Tag), len(b.Tag)))
	}
	tb.used += bufferBytes + tb.perBuffer
	tb.n++
	if tb.used > maxTraceMemory {
		return traceMemoryError(tb.n-1, string(name))
	}
	return nil
}

// wantPrior makes finish return prior offsets (NoOffset where a buffer has
// none), counting their memory from here on.
func (tb *traceBuilder) wantPrior() {
	if !tb.prior {
		tb.prior = true
		tb.perBuffer += 8
		tb.used += 8 * uint64(tb.n)
	}
}

// finish returns the buffers added, IDs their indices, and their prior
// offsets when wantPrior was called (nil otherwise); nil buffers when
// none were added. The builder is empty afterwards.
func (tb *traceBuilder) finish() ([]Buffer, []int64) {
	var bufs []Buffer
	var prior []int64
	if tb.prior {
		prior = make([]int64, tb.n)
	}
	if tb.n > 0 {
		bufs = make([]Buffer, tb.n)
	}
	r := tb.reader()
	for i := range bufs {
		p := r.next(&bufs[i])
		bufs[i].ID = ID(i)
		if prior != nil {
			prior[i] = p
		}
		// The encoded rows are read once: let the collector have them.
		r.rows.release()
	}
	*tb = traceBuilder{}
	return bufs, prior
}

// names returns the names of the buffers added so far.
func (tb *traceBuilder) names() []string {
	names := make([]string, tb.n)
	r := tb.reader()
	for i := range names {
		var b Buffer
		r.next(&b)
		names[i] = b.Name
	}
	return names
}

// builderReader reads a builder's buffers back in order.
type builderReader struct {
	tb          *traceBuilder
	rows, names arenaReader[byte]
	gaps        arenaReader[Gap]
}

func (tb *traceBuilder) reader() *builderReader {
	r := &builderReader{tb: tb}
	r.rows.a, r.names.a, r.gaps.a = &tb.rows, &tb.text, &tb.gaps
	return r
}

// next decodes the next buffer into b (all but its ID) and returns its
// prior offset.
func (r *builderReader) next(b *Buffer) int64 {
	row := r.rows.rest()
	flags := row[0]
	k := 1
	uvar := func() uint64 {
		v, n := binary.Uvarint(row[k:])
		k += n
		return v
	}
	svar := func() int64 {
		v, n := binary.Varint(row[k:])
		k += n
		return v
	}
	nameLen := int(uvar())
	b.Start = svar()
	b.End = b.Start + int64(uvar())
	b.Size = svar()
	if flags&rowAlign != 0 {
		b.Align = svar()
	}
	if flags&rowStream != 0 {
		b.Stream = svar()
	}
	var tagLen int
	switch {
	case flags&rowTag != 0:
		b.Tag = r.tb.tagList[uvar()]
	case flags&rowTagBytes != 0:
		tagLen = int(uvar())
	}
	if flags&rowFixed != 0 {
		b.Fixed, b.HasFixed = svar(), true
	}
	if flags&rowHint != 0 {
		b.Hint, b.HasHint = svar(), true
	}
	var ngaps int
	if flags&rowGaps != 0 {
		ngaps = int(uvar())
	}
	prior := NoOffset
	if flags&rowPrior != 0 {
		prior = svar()
	}
	r.rows.skip(k)
	b.Name = arenaString(r.names.next(nameLen))
	b.Gaps = r.gaps.next(ngaps)
	if tagLen > 0 {
		b.Tag = arenaString(r.names.next(tagLen))
	}
	return prior
}

// arenaString is the string of bytes an arena handed out: they are never
// written again, so the string can share them.
func arenaString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}

// arena hands out pieces of few large allocations instead of one
// allocation each. Pieces are read back in the order they were added
// (arenaReader), each the same way: a piece of more than a quarter of a
// chunk has an allocation of its own (so at most a quarter of a chunk is
// left unused), and a piece that does not fit in what is left of the
// current chunk starts a new one.
type arena[T any] struct {
	chunks [][]T // the last one is being filled
	big    [][]T
}

const (
	arenaChunkBytes = 64 << 10
	arenaBigBytes   = arenaChunkBytes / 4
)

// add copies s into the arena and returns the bytes that took allocating.
func (a *arena[T]) add(s []T) uint64 {
	if len(s) == 0 {
		return 0
	}
	size := uint64(unsafe.Sizeof(s[0]))
	if uint64(len(s))*size > arenaBigBytes {
		a.big = append(a.big, append([]T(nil), s...))
		return uint64(len(s)) * size
	}
	var cost uint64
	if n := len(a.chunks); n == 0 || len(a.chunks[n-1])+len(s) > cap(a.chunks[n-1]) {
		per := arenaChunkBytes / size
		a.chunks = append(a.chunks, make([]T, 0, per))
		cost = per * size
	}
	c := &a.chunks[len(a.chunks)-1]
	*c = append(*c, s...)
	return cost
}

// lastString returns the piece of n bytes added to a last, as a string.
func lastString(a *arena[byte], n int) string {
	if n > arenaBigBytes {
		return arenaString(a.big[len(a.big)-1])
	}
	c := a.chunks[len(a.chunks)-1]
	return arenaString(c[len(c)-n:])
}

// arenaReader reads an arena's pieces back in order.
type arenaReader[T any] struct {
	a        *arena[T]
	chunk    int // index of the chunk being read, -1 before the first
	pos      int
	big      int
	started  bool
	released int
}

// next returns the next piece, of n items, as a slice of the arena
// without room to grow into its neighbour; nil for n == 0.
func (r *arenaReader[T]) next(n int) []T {
	if n == 0 {
		return nil
	}
	if uint64(n)*uint64(unsafe.Sizeof(*new(T))) > arenaBigBytes {
		s := r.a.big[r.big]
		r.big++
		return s
	}
	if !r.started || r.pos+n > len(r.a.chunks[r.chunk]) {
		if r.started {
			r.chunk++
		}
		r.started, r.pos = true, 0
	}
	s := r.a.chunks[r.chunk][r.pos : r.pos+n : r.pos+n]
	r.pos += n
	return s
}

// rest returns what is left of the current chunk (of an arena whose
// pieces never span chunks and are read with skip), moving to the next
// chunk when the current one is read.
func (r *arenaReader[T]) rest() []T {
	if !r.started || r.pos == len(r.a.chunks[r.chunk]) {
		if r.started {
			r.chunk++
		}
		r.started, r.pos = true, 0
	}
	return r.a.chunks[r.chunk][r.pos:]
}

// skip moves past k items of the current chunk.
func (r *arenaReader[T]) skip(k int) { r.pos += k }

// release drops the chunks before the current one.
func (r *arenaReader[T]) release() {
	for ; r.released < r.chunk; r.released++ {
		r.a.chunks[r.released] = nil
	}
}

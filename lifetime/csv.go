package lifetime

import (
	"bufio"
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"math/bits"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// This file reads and writes MiniMalloc's CSV form of a trace
// (github.com/google/minimalloc, src/converter.cc): a header row naming the
// columns, then one buffer per row. Required columns: id, lower, upper,
// size; optional: alignment, offset, hint, gaps. Aliases: begin and start
// for lower, buffer and buffer_id for id, end for upper, where end is
// inclusive (upper = end + 1, and gap ends get the same +1, as upstream).
// Columns may come in any order; an unknown column is an error, because a
// misspelt one would otherwise be silently ignored.
//
// Fields are split at commas with no quoting, as upstream does, so ids
// cannot contain commas. Blank lines are skipped; a trailing CR is ignored.

// maxCSVRows bounds the rows of one CSV trace.
const maxCSVRows = 50_000_000

// maxCSVLine bounds one line (a gaps column can be long, but not this long).
const maxCSVLine = 16 << 20

type csvColumn int

const (
	colID csvColumn = iota
	colLower
	colUpper
	colSize
	colAlignment
	colOffset
	colHint
	colGaps
	numCSVColumns
)

var csvColumnNames = [numCSVColumns]string{"id", "lower", "upper", "size", "alignment", "offset", "hint", "gaps"}

var csvAliases = map[string]csvColumn{
	"id": colID, "buffer": colID, "buffer_id": colID,
	"lower": colLower, "begin": colLower, "start": colLower,
	"upper": colUpper, "end": colUpper,
	"size":      colSize,
	"alignment": colAlignment,
	"offset":    colOffset,
	"hint":      colHint,
	"gaps":      colGaps,
}

// csvError is an error at a line (and column) of a CSV input.
type csvError struct {
	line   int
	column string // header spelling, "" for the whole line
	err    error
}

func (e *csvError) Error() string {
	if e.column == "" {
		return fmt.Sprintf("csv: line %d: %v", e.line, e.err)
	}
	return fmt.Sprintf("csv: line %d: column %q: %v", e.line, e.column, e.err)
}

func (e *csvError) Unwrap() error { return e.err }

// ReadCSV reads a trace in MiniMalloc's CSV form. Ids become buffer names
// and must be unique and non-empty; buffer IDs are row indices. An offset
// column is an earlier solution: it goes to Trace.Prior (NoOffset where a
// cell is empty or -1), not to Fixed; see KeepPriorOffsets. A hint of -1 or
// an empty hint cell means none.
func ReadCSV(r io.Reader, name string) (*Trace, error) {
	sc := bufio.NewScanner(&limitReader{r: r, left: MaxFileSize})
	sc.Buffer(make([]byte, 0, 64<<10), maxCSVLine)
	t := &Trace{Name: name}
	// Rows are read from the scanner's buffer without a string or an
	// allocation of their own: what a row leaves behind is its encoded
	// buffer and its name in the builder's arenas (traceBuilder).
	var tb traceBuilder
	// The id check (repeatedID) holds a slot table of 6 bytes a row.
	tb.perBuffer = idCheckBytes
	var (
		cols      [numCSVColumns]int // field index of each column, -1 if absent
		spelled   [numCSVColumns]string
		nfields   int
		inclusive bool
		header    bool
		line      int
		lines     rowLines // the line of each row, for repeated ids
		fields    [][]byte
		gaps      []Gap // the row's gaps, copied by the builder
		rows      int
	)
	// fail reports err, or a repeated id on an earlier line: ids are
	// checked once all rows are in (a map grown row by row cost ~1 s of
	// the 1.5 s that 1M rows take), and on the way out of an error.
	fail := func(err error) (*Trace, error) {
		names := tb.names()
		if rep := repeatedID(len(names), func(i int) string { return names[i] }, &lines, spelled[colID]); rep != nil {
			return nil, rep
		}
		return nil, err
	}
	for sc.Scan() {
		line++
		text := sc.Bytes()
		if line == 1 {
			text = bytes.TrimPrefix(text, []byte("\ufeff")) // a BOM some editors write
		}
		if len(bytes.TrimSpace(text)) == 0 {
			continue
		}
		fields = splitComma(fields[:0], text)
		if !header {
			header = true
			for c := range cols {
				cols[c] = -1
			}
			for i, f := range fields {
				h := strings.ToLower(strings.TrimSpace(string(f)))
				c, ok := csvAliases[h]
				if !ok {
					return nil, &csvError{line: line, err: fmt.Errorf("unknown column %q (want %s)", h, strings.Join(csvColumnNames[:], ", "))}
				}
				if cols[c] >= 0 {
					return nil, &csvError{line: line, err: fmt.Errorf("column %q repeats column %q", h, spelled[c])}
				}
				cols[c], spelled[c] = i, h
				if h == "end" {
					inclusive = true
				}
			}
			for c := colID; c <= colSize; c++ {
				if cols[c] < 0 {
					return nil, &csvError{line: line, err: fmt.Errorf("missing column %q", csvColumnNames[c])}
				}
			}
			nfields = len(fields)
			if cols[colOffset] >= 0 {
				tb.wantPrior()
			}
			continue
		}
		if len(fields) != nfields {
			return fail(&csvError{line: line, err: fmt.Errorf("%d fields, want %d", len(fields), nfields)})
		}
		if rows >= maxCSVRows {
			return fail(&csvError{line: line, err: fmt.Errorf("more than %d rows", maxCSVRows)})
		}
		var b Buffer
		prior, err := csvBuffer(&b, &gaps, fields, &cols, &spelled, inclusive)
		if err != nil {
			var ce *csvError
			if errors.As(err, &ce) {
				ce.line = line
				return fail(ce)
			}
			return fail(&csvError{line: line, err: err})
		}
		id := fields[cols[colID]]
		b.ID = ID(rows)
		if err := b.validate(); err != nil {
			return fail(&csvError{line: line, err: fmt.Errorf("buffer %q: %w", id, err)})
		}
		tb.used += lines.add(rows, line)
		if err := tb.add(&b, id, prior); err != nil {
			return fail(&csvError{line: line, err: err})
		}
		rows++
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return fail(&csvError{line: line + 1, err: fmt.Errorf("line longer than %d bytes", maxCSVLine)})
		}
		return fail(fmt.Errorf("csv: line %d: %w", line+1, err))
	}
	if !header {
		return nil, errors.New("csv: no header line (want id,lower,upper,size)")
	}
	t.Buffers, t.Prior = tb.finish()
	if rep := repeatedID(len(t.Buffers), func(i int) string { return t.Buffers[i].Name }, &lines, spelled[colID]); rep != nil {
		return nil, rep
	}
	return t, nil
}

// idCheckBytes is what repeatedID holds per row: a slot table at two
// thirds full, of 4-byte slots.
const idCheckBytes = 6

// rowLines maps row indices to input lines: a row's line is its index
// plus the offset of the last run before it, and a run begins only where
// blank lines were skipped, so that a file without blank lines costs one
// run, not an int a row.
type rowLines struct {
	row  []int // first row of each run
	line []int // its line
}

// add records that row is on line and returns the bytes that took.
func (l *rowLines) add(row, line int) uint64 {
	if n := len(l.row); n > 0 && line-row == l.line[n-1]-l.row[n-1] {
		return 0
	}
	l.row = append(l.row, row)
	l.line = append(l.line, line)
	return 2 * 8 * 2 // two ints, twice for the growth of their slices
}

// of returns the line of row i.
func (l *rowLines) of(i int) int {
	k, _ := slices.BinarySearch(l.row, i+1) // the first run after i
	return l.line[k-1] + i - l.row[k-1]
}

// repeatedID returns the error for the first of n rows whose id (name(i))
// repeats an earlier row's, or nil. It holds a table of 4-byte slots,
// idCheckBytes a row, instead of a map of the names (about 40 bytes a
// row).
func repeatedID(n int, name func(int) string, lines *rowLines, column string) error {
	if n == 0 {
		return nil
	}
	slots := make([]uint32, n+n/2+1) // row+1; 0 is empty
	seed := maphash.MakeSeed()
	for i := range n {
		id := name(i)
		hi, _ := bits.Mul64(maphash.String(seed, id), uint64(len(slots)))
		for k := int(hi); ; k++ {
			if k == len(slots) {
				k = 0
			}
			j := int(slots[k]) - 1
			if j < 0 {
				slots[k] = uint32(i + 1)
				break
			}
			if name(j) == id {
				return &csvError{line: lines.of(i), column: column, err: fmt.Errorf("id %q repeats line %d", id, lines.of(j))}
			}
		}
	}
	return nil
}

// splitComma splits s at commas into dst, reusing its storage.
func splitComma(dst [][]byte, s []byte) [][]byte {
	for {
		i := bytes.IndexByte(s, ',')
		if i < 0 {
			return append(dst, s)
		}
		dst = append(dst, s[:i])
		s = s[i+1:]
	}
}

// parseInt is strconv.ParseInt(string(s), 10, 64) without making a
// string of s where s is a plain number.
func parseInt(s []byte) (int64, error) {
	d := s
	if len(d) > 0 && (d[0] == '-' || d[0] == '+') {
		d = d[1:]
	}
	if len(d) == 0 || len(d) > 18 {
		return strconv.ParseInt(string(s), 10, 64)
	}
	var v int64
	for _, c := range d {
		if c < '0' || c > '9' {
			return strconv.ParseInt(string(s), 10, 64)
		}
		v = v*10 + int64(c-'0')
	}
	if s[0] == '-' {
		v = -v
	}
	return v, nil
}

// csvBuffer fills b (all but its name and ID) from the fields of one row,
// its gaps in *gaps, and returns the row's prior offset; errors are
// *csvError without a line number.
func csvBuffer(b *Buffer, gaps *[]Gap, fields [][]byte, cols *[numCSVColumns]int, spelled *[numCSVColumns]string, inclusive bool) (int64, error) {
	prior := NoOffset
	fail := func(c csvColumn, format string, args ...any) (int64, error) {
		return 0, &csvError{column: spelled[c], err: fmt.Errorf(format, args...)}
	}
	// num parses an integer field and checks it lies in [lo, hi].
	num := func(c csvColumn, lo, hi int64) (int64, error) {
		s := bytes.TrimSpace(fields[cols[c]])
		v, err := parseInt(s)
		if err != nil {
			return 0, &csvError{column: spelled[c], err: fmt.Errorf("%q is not an integer", s)}
		}
		switch {
		case v < lo && lo == 0:
			return 0, &csvError{column: spelled[c], err: fmt.Errorf("%d is negative", v)}
		case v < lo && lo == 1:
			return 0, &csvError{column: spelled[c], err: fmt.Errorf("%d is not positive", v)}
		case v < lo:
			return 0, &csvError{column: spelled[c], err: fmt.Errorf("%d is less than %d", v, lo)}
		case v > hi:
			return 0, &csvError{column: spelled[c], err: fmt.Errorf("%d exceeds the limit %d", v, hi)}
		}
		return v, nil
	}
	// optOffset parses an offset or hint cell: empty or -1 means none.
	optOffset := func(c csvColumn) (int64, error) {
		s := bytes.TrimSpace(fields[cols[c]])
		if len(s) == 0 || string(s) == "-1" {
			return NoOffset, nil
		}
		return num(c, 0, MaxSize)
	}

	id := fields[cols[colID]]
	if len(id) == 0 {
		return fail(colID, "empty id")
	}
	if bytes.IndexByte(id, '\r') >= 0 {
		// WriteCSV could not write it back.
		return fail(colID, "%q has a carriage return", id)
	}
	var err error
	if b.Start, err = num(colLower, 0, MaxSize); err != nil {
		return 0, err
	}
	if b.End, err = num(colUpper, 0, MaxSize); err != nil {
		return 0, err
	}
	if inclusive {
		b.End++
	}
	if b.Size, err = num(colSize, 1, MaxSize); err != nil {
		return 0, err
	}
	if cols[colAlignment] >= 0 {
		if b.Align, err = num(colAlignment, 1, MaxSize); err != nil {
			return 0, err
		}
	}
	if cols[colHint] >= 0 {
		hint, err := optOffset(colHint)
		if err != nil {
			return 0, err
		}
		if hint != NoOffset {
			b.Hint, b.HasHint = hint, true
		}
	}
	if cols[colOffset] >= 0 {
		if prior, err = optOffset(colOffset); err != nil {
			return 0, err
		}
	}
	if cols[colGaps] >= 0 {
		if *gaps, err = parseGaps((*gaps)[:0], fields[cols[colGaps]], inclusive); err != nil {
			return 0, &csvError{column: spelled[colGaps], err: err}
		}
		b.Gaps = *gaps
	}
	return prior, nil
}

// parseGaps parses MiniMalloc's gaps cell into dst: space-separated "a-b"
// or "a-b@x:y" entries, each an inactive sub-interval [a, b) (b inclusive
// when the trace uses an end column) during which the buffer keeps only
// the window [x, y) of its bytes, or none. Gaps are returned sorted and
// must not overlap: overlapping gaps would subtract a buffer's bytes twice
// from the live total. A cell without gaps returns nil.
func parseGaps(dst []Gap, s []byte, inclusive bool) ([]Gap, error) {
	gaps := dst
	for tok := range spaceFields(s) {
		bad := func() error { return fmt.Errorf("%q is not a gap (want a-b or a-b@x:y)", tok) }
		span, window, hasWindow := bytes.Cut(tok, []byte("@"))
		a, b, ok := bytes.Cut(span, []byte("-"))
		if !ok {
			return nil, bad()
		}
		var g Gap
		var err1, err2 error
		g.Start, err1 = parseInt(a)
		g.End, err2 = parseInt(b)
		if err1 != nil || err2 != nil || g.Start < 0 || g.End < 0 || g.End > MaxSize {
			return nil, bad()
		}
		if inclusive {
			g.End++
		}
		if hasWindow {
			x, y, ok := bytes.Cut(window, []byte(":"))
			if !ok {
				return nil, bad()
			}
			g.HasWindow = true
			g.Lo, err1 = parseInt(x)
			g.Hi, err2 = parseInt(y)
			if err1 != nil || err2 != nil {
				return nil, bad()
			}
		}
		gaps = append(gaps, g)
	}
	if len(gaps) == 0 {
		return nil, nil
	}
	slices.SortFunc(gaps, func(x, y Gap) int { return cmp.Compare(x.Start, y.Start) })
	for i := 1; i < len(gaps); i++ {
		if gaps[i].Start < gaps[i-1].End {
			return nil, fmt.Errorf("gaps [%d, %d) and [%d, %d) overlap", gaps[i-1].Start, gaps[i-1].End, gaps[i].Start, gaps[i].End)
		}
	}
	return gaps, nil
}

// spaceFields yields the fields of s that white space separates, as
// bytes.Fields does, without a slice of them.
func spaceFields(s []byte) func(yield func([]byte) bool) {
	return func(yield func([]byte) bool) {
		start := -1
		for i := 0; i < len(s); {
			r, n := rune(s[i]), 1
			if r >= utf8.RuneSelf {
				r, n = utf8.DecodeRune(s[i:])
			}
			if unicode.IsSpace(r) {
				if start >= 0 && !yield(s[start:i]) {
					return
				}
				start = -1
			} else if start < 0 {
				start = i
			}
			i += n
		}
		if start >= 0 {
			yield(s[start:])
		}
	}
}

// WriteCSV writes t in MiniMalloc's CSV form: id, lower, upper, size, then
// alignment, hint and gaps when any buffer has them, then offset when
// offsets is not nil (one per buffer, NoOffset written as -1). Ids are the
// buffer names, or the buffer's ID where the name is empty; a name with a
// comma or a line break cannot be written.
func WriteCSV(w io.Writer, t *Trace, offsets []int64) error {
	if offsets != nil && len(offsets) != len(t.Buffers) {
		return fmt.Errorf("csv: %d offsets for %d buffers", len(offsets), len(t.Buffers))
	}
	var withAlign, withHint, withGaps bool
	for i := range t.Buffers {
		b := &t.Buffers[i]
		withAlign = withAlign || b.Align > 1
		withHint = withHint || b.HasHint
		withGaps = withGaps || len(b.Gaps) > 0
		if strings.ContainsAny(b.Name, ",\r\n") {
			return fmt.Errorf("csv: buffer %d: name %q has a comma or line break", i, b.Name)
		}
	}
	bw := bufio.NewWriter(w)
	bw.WriteString("id,lower,upper,size")
	if withAlign {
		bw.WriteString(",alignment")
	}
	if withHint {
		bw.WriteString(",hint")
	}
	if withGaps {
		bw.WriteString(",gaps")
	}
	if offsets != nil {
		bw.WriteString(",offset")
	}
	bw.WriteByte('\n')
	var buf []byte
	for i := range t.Buffers {
		b := &t.Buffers[i]
		buf = buf[:0]
		if b.Name == "" {
			buf = strconv.AppendInt(buf, int64(b.ID), 10)
		} else {
			buf = append(buf, b.Name...)
		}
		for _, v := range []int64{b.Start, b.End, b.Size} {
			buf = append(buf, ',')
			buf = strconv.AppendInt(buf, v, 10)
		}
		if withAlign {
			buf = append(buf, ',')
			buf = strconv.AppendInt(buf, max(b.Align, 1), 10)
		}
		if withHint {
			buf = append(buf, ',')
			hint := NoOffset
			if b.HasHint {
				hint = b.Hint
			}
			buf = strconv.AppendInt(buf, hint, 10)
		}
		if withGaps {
			buf = append(buf, ',')
			for j, g := range b.Gaps {
				if j > 0 {
					buf = append(buf, ' ')
				}
				buf = strconv.AppendInt(buf, g.Start, 10)
				buf = append(buf, '-')
				buf = strconv.AppendInt(buf, g.End, 10)
				if g.HasWindow {
					buf = append(buf, '@')
					buf = strconv.AppendInt(buf, g.Lo, 10)
					buf = append(buf, ':')
					buf = strconv.AppendInt(buf, g.Hi, 10)
				}
			}
		}
		if offsets != nil {
			buf = append(buf, ',')
			buf = strconv.AppendInt(buf, offsets[i], 10)
		}
		buf = append(buf, '\n')
		if _, err := bw.Write(buf); err != nil {
			return fmt.Errorf("csv: %w", err)
		}
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("csv: %w", err)
	}
	return nil
}

// errTooLarge is returned by limitReader past its limit.
var errTooLarge = fmt.Errorf("input is larger than the limit of %d bytes", MaxFileSize)

// limitReader is io.LimitReader that fails instead of reporting EOF, so
// that an input cut at the limit is not taken for a complete one.
type limitReader struct {
	r    io.Reader
	left int64
}

func (l *limitReader) Read(p []byte) (int, error) {
	if l.left <= 0 {
		// Probe for more input: none means the input ended exactly here.
		var one [1]byte
		n, err := l.r.Read(one[:])
		if n > 0 {
			return 0, errTooLarge
		}
		return 0, err
	}
	if int64(len(p)) > l.left {
		p = p[:l.left]
	}
	n, err := l.r.Read(p)
	l.left -= int64(n)
	return n, err
}

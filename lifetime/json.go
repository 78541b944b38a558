package lifetime

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// This file reads and writes arenaplan's own JSON trace format, described
// in FORMAT.md. Unlike the CSV it keeps everything a Trace holds: streams,
// tags, fixed offsets, hints, gaps, prior offsets and the PyTorch
// allocator's statistics.

// JSONFormat and JSONVersion identify the format; a reader refuses any
// other version rather than guess at fields it does not know.
const (
	JSONFormat  = "arenaplan-trace"
	JSONVersion = 1
)

// JSONTorch is TorchStats as the JSON format writes it.
type JSONTorch struct {
	Device       int   `json:"device"`
	ReservedPeak int64 `json:"reserved_peak"`
	LiveAtStart  int64 `json:"live_at_start"`
	HasSegments  bool  `json:"has_segments"`
}

// JSONBuffer is one buffer as the JSON format writes it (FORMAT.md); the
// plan export of package plans writes the same fields, with the buffer's
// id and offset. Optional offsets are pointers so that 0 (a valid offset)
// and absent (none) differ.
type JSONBuffer struct {
	Name   string    `json:"name,omitempty"`
	Size   int64     `json:"size"`
	Align  int64     `json:"align,omitempty"`
	Start  int64     `json:"start"`
	End    int64     `json:"end"`
	Stream int64     `json:"stream,omitempty"`
	Tag    string    `json:"tag,omitempty"`
	Fixed  *int64    `json:"fixed,omitempty"`
	Hint   *int64    `json:"hint,omitempty"`
	Prior  *int64    `json:"prior,omitempty"`
	Gaps   []JSONGap `json:"gaps,omitempty"`
}

// JSONGap is a Gap as the JSON format writes it: Lo and Hi only with a
// window.
type JSONGap struct {
	Start int64  `json:"start"`
	End   int64  `json:"end"`
	Lo    *int64 `json:"lo,omitempty"`
	Hi    *int64 `json:"hi,omitempty"`
}

// ReadJSON reads a trace in arenaplan's JSON format. It refuses another
// format or version, unknown fields, trailing data, inputs over
// MaxFileSize and any buffer that Validate would refuse. The name in the
// file is kept; name is used where the file has none.
func ReadJSON(r io.Reader, name string) (*Trace, error) {
	t, err := readJSON(r, name)
	if err != nil {
		return nil, fmt.Errorf("json: %w", err)
	}
	return t, nil
}

// checkJSONHead refuses an input whose first bytes, past white space (and
// a UTF-8 byte order mark), do not open a JSON object.
func checkJSONHead(head []byte) error {
	rest := bytes.TrimLeft(bytes.TrimPrefix(head, []byte("\xef\xbb\xbf")), " \t\r\n")
	switch {
	case len(head) == 0:
		return errors.New("empty input: want a JSON object")
	case len(rest) == 0 && len(head) >= headBytes:
		return fmt.Errorf("no JSON object in the first %d bytes (only white space)", headBytes)
	case len(rest) == 0:
		return errors.New("no JSON object (only white space)")
	case rest[0] != '{':
		return fmt.Errorf("not a JSON trace: it starts with %q where a JSON object starts with '{'", rest[:min(len(rest), 8)])
	}
	return nil
}

func readJSON(r io.Reader, name string) (*Trace, error) {
	// The input is decoded as it is read, one buffer at a time, so that
	// what decoding holds follows the trace, not the file: a valid head
	// followed by anything else is refused where that begins.
	br := bufio.NewReaderSize(r, 64<<10)
	head, err := br.Peek(headBytes)
	if err != nil && err != io.EOF && err != bufio.ErrBufferFull {
		return nil, err
	}
	if err := checkJSONHead(head); err != nil {
		return nil, err
	}
	f := &jsonFilter{r: br, left: MaxFileSize}
	dec := json.NewDecoder(f)
	dec.DisallowUnknownFields()
	if err := jsonDelim(dec, '{', "a JSON object"); err != nil {
		return nil, err
	}
	t := &Trace{}
	// Buffers are decoded into one JSONBuffer, kept in a traceBuilder
	// and made into Trace.Buffers once all are in.
	var (
		tb   traceBuilder
		jb   JSONBuffer
		gaps []Gap
	)
	seenFormat, seenVersion, seenBuffers := false, false, false
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		key, _ := tok.(string)
		switch key {
		case "format":
			var format string
			if err := dec.Decode(&format); err != nil {
				return nil, fmt.Errorf("format: %w", err)
			}
			if format != JSONFormat {
				return nil, fmt.Errorf("format is %q, want %q", format, JSONFormat)
			}
			seenFormat = true
		case "version":
			var v json.RawMessage
			if err := dec.Decode(&v); err != nil {
				return nil, fmt.Errorf("version: %w", err)
			}
			if string(v) != "1" {
				return nil, fmt.Errorf("unsupported version %s (this reader knows version %d)", v, JSONVersion)
			}
			seenVersion = true
		case "name":
			if err := dec.Decode(&t.Name); err != nil {
				return nil, fmt.Errorf("name: %w", err)
			}
		case "torch":
			var jt *JSONTorch
			if err := dec.Decode(&jt); err != nil {
				return nil, fmt.Errorf("torch: %w", err)
			}
			if jt != nil {
				t.Torch = &TorchStats{Device: jt.Device, ReservedPeak: jt.ReservedPeak,
					LiveAtStart: jt.LiveAtStart, HasSegments: jt.HasSegments}
			}
		case "buffers":
			if err := jsonDelim(dec, '[', `a "buffers" array`); err != nil {
				return nil, err
			}
			for dec.More() {
				// Reused: gaps decoded into elements past the length keep
				// what they held, so those are cleared first.
				clear(jb.Gaps[:cap(jb.Gaps)])
				jb = JSONBuffer{Gaps: jb.Gaps[:0]}
				if err := dec.Decode(&jb); err != nil {
					return nil, fmt.Errorf("%s: %w", Label(tb.n, ""), err)
				}
				if err := addJSONBuffer(&tb, &jb, &gaps); err != nil {
					return nil, err
				}
			}
			if err := jsonDelim(dec, ']', `the end of the "buffers" array`); err != nil {
				return nil, err
			}
			seenBuffers = true
		default:
			return nil, fmt.Errorf("json: unknown field %q", key)
		}
	}
	if err := jsonDelim(dec, '}', "the end of the object"); err != nil {
		return nil, err
	}
	if tok, err := dec.Token(); err != io.EOF {
		if d, ok := tok.(json.Delim); ok && err == nil {
			err = fmt.Errorf("invalid character '%c' after top-level value", rune(d))
		} else if err == nil {
			err = fmt.Errorf("trailing data after the top-level value: %v", tok)
		}
		return nil, err
	}
	if !seenFormat {
		return nil, fmt.Errorf("format is %q, want %q", "", JSONFormat)
	}
	if !seenVersion {
		return nil, fmt.Errorf("unsupported version  (this reader knows version %d)", JSONVersion)
	}
	if !seenBuffers {
		return nil, errors.New(`no "buffers" array`)
	}
	if t.Name == "" {
		t.Name = name
	}
	t.Buffers, t.Prior = tb.finish()
	if err := t.Validate(); err != nil {
		return nil, err
	}
	return t, nil
}

// jsonDelim reads the delimiter want, or says what was expected.
func jsonDelim(dec *json.Decoder, want json.Delim, what string) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	if d, ok := tok.(json.Delim); !ok || d != want {
		return fmt.Errorf("want %s, found %v", what, tok)
	}
	return nil
}

// addJSONBuffer adds jb to tb, checking what Validate does not; *gaps is
// scratch for its gaps.
func addJSONBuffer(tb *traceBuilder, jb *JSONBuffer, gaps *[]Gap) error {
	i := tb.n
	b := Buffer{ID: ID(i), Size: jb.Size, Align: jb.Align, Start: jb.Start,
		End: jb.End, Stream: jb.Stream, Tag: jb.Tag}
	if jb.Fixed != nil {
		if *jb.Fixed < 0 {
			return fmt.Errorf("%s: fixed offset %d is negative", Label(i, jb.Name), *jb.Fixed)
		}
		b.Fixed, b.HasFixed = *jb.Fixed, true
	}
	if jb.Hint != nil {
		if *jb.Hint < 0 || *jb.Hint > MaxSize {
			return fmt.Errorf("%s: hint %d is invalid", Label(i, jb.Name), *jb.Hint)
		}
		b.Hint, b.HasHint = *jb.Hint, true
	}
	prior := NoOffset
	if jb.Prior != nil {
		if *jb.Prior < 0 || *jb.Prior > MaxSize {
			return fmt.Errorf("%s: prior offset %d is invalid", Label(i, jb.Name), *jb.Prior)
		}
		prior = *jb.Prior
		tb.wantPrior()
	}
	if jb.Start < 0 {
		return fmt.Errorf("%s: start %d is negative", Label(i, jb.Name), jb.Start)
	}
	*gaps = (*gaps)[:0]
	for k, g := range jb.Gaps {
		if (g.Lo == nil) != (g.Hi == nil) {
			return fmt.Errorf("%s: gap %d has only one of lo and hi", Label(i, jb.Name), k)
		}
		gap := Gap{Start: g.Start, End: g.End}
		if g.Lo != nil {
			gap.HasWindow, gap.Lo, gap.Hi = true, *g.Lo, *g.Hi
		}
		if k > 0 && gap.Start < (*gaps)[k-1].End {
			return fmt.Errorf("%s: gap %d starts before gap %d ends (gaps must be sorted and disjoint)", Label(i, jb.Name), k, k-1)
		}
		*gaps = append(*gaps, gap)
	}
	b.Gaps = *gaps
	b.Name = jb.Name
	// The strings encoding/json made for the name and the tag are left to
	// the collector once the builder has copied or interned them: counted
	// all the same, so that what decoding allocates stays within the bound.
	tb.used += jsonStringBytes(jb.Name) + jsonStringBytes(jb.Tag)
	return tb.add(&b, nil, prior)
}

// jsonStringBytes is what encoding/json allocated for s: its length
// rounded up to the allocator's smallest size classes.
func jsonStringBytes(s string) uint64 {
	if s == "" {
		return 0
	}
	return (uint64(len(s)) + 15) &^ 15
}

// WriteJSON writes t in arenaplan's JSON format, one buffer per line so
// that diffs of trace files stay readable.
func WriteJSON(w io.Writer, t *Trace) error {
	if t.Prior != nil && len(t.Prior) != len(t.Buffers) {
		return fmt.Errorf("json: %d prior offsets for %d buffers", len(t.Prior), len(t.Buffers))
	}
	var buf bytes.Buffer
	head := struct {
		Format  string     `json:"format"`
		Version int        `json:"version"`
		Name    string     `json:"name,omitempty"`
		Torch   *JSONTorch `json:"torch,omitempty"`
	}{Format: JSONFormat, Version: JSONVersion, Name: t.Name}
	if s := t.Torch; s != nil {
		head.Torch = &JSONTorch{Device: s.Device, ReservedPeak: s.ReservedPeak, LiveAtStart: s.LiveAtStart, HasSegments: s.HasSegments}
	}
	hb, err := json.Marshal(head)
	if err != nil {
		return fmt.Errorf("json: %w", err)
	}
	// Splice the buffers array into the head object by hand, one per line.
	buf.Write(hb[:len(hb)-1])
	buf.WriteString(`,"buffers":[`)
	for i := range t.Buffers {
		bb, err := json.Marshal(NewJSONBuffer(t, i))
		if err != nil {
			return fmt.Errorf("json: %w", err)
		}
		if i > 0 {
			buf.WriteByte(',')
		}
		buf.WriteString("\n")
		buf.Write(bb)
		if buf.Len() >= 1<<20 {
			if _, err := w.Write(buf.Bytes()); err != nil {
				return fmt.Errorf("json: %w", err)
			}
			buf.Reset()
		}
	}
	buf.WriteString("\n]}\n")
	if _, err := w.Write(buf.Bytes()); err != nil {
		return fmt.Errorf("json: %w", err)
	}
	return nil
}

// NewJSONBuffer is buffer i of t as the JSON format writes it, its prior
// offset (t.Prior) included.
func NewJSONBuffer(t *Trace, i int) JSONBuffer {
	b := &t.Buffers[i]
	jb := JSONBuffer{Name: b.Name, Size: b.Size, Align: b.Align, Start: b.Start, End: b.End,
		Stream: b.Stream, Tag: b.Tag}
	if b.HasFixed {
		fixed := b.Fixed
		jb.Fixed = &fixed
	}
	if b.HasHint {
		hint := b.Hint
		jb.Hint = &hint
	}
	if i < len(t.Prior) && t.Prior[i] != NoOffset {
		prior := t.Prior[i]
		jb.Prior = &prior
	}
	for _, g := range b.Gaps {
		jg := JSONGap{Start: g.Start, End: g.End}
		if g.HasWindow {
			lo, hi := g.Lo, g.Hi
			jg.Lo, jg.Hi = &lo, &hi
		}
		jb.Gaps = append(jb.Gaps, jg)
	}
	return jb
}

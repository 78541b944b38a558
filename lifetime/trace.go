package lifetime

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
)

// ID identifies a buffer inside one trace: it is the buffer's index in
// Trace.Buffers.
type ID int

// NoOffset marks a missing offset where offsets are stored as plain
// integers: Trace.Prior, the offset and hint columns of a CSV, plan files.
// In a Buffer, HasFixed and HasHint say whether an offset was asked for.
const NoOffset int64 = -1

// Tags are the well-known buffer tags, longest-lived first: the order in
// which a plan by tag (planner.RunByTag) stacks their regions.
var Tags = []string{"weight", "kv", "input", "output", "intermediate"}

// MaxSize bounds a single buffer's size and an arena's size (2^56 bytes,
// far above any device) so that offset arithmetic never overflows int64.
const MaxSize int64 = 1 << 56

// Buffer is one allocation of a workload.
//
// The zero value of every optional field means "nothing asked for":
// Buffer{Size: n, Start: s, End: e} is an ordinary buffer that a planner
// may place anywhere. A fixed offset or a hint is explicit:
// Buffer{..., Fixed: 4096, HasFixed: true}.
type Buffer struct {
	ID    ID
	Name  string // free text: a tensor name, a CSV id, a snapshot address
	Size  int64  // bytes, > 0
	Align int64  // required offset alignment in bytes; 0 or 1 means none
	Start int64  // first logical time the buffer is live
	End   int64  // first logical time it is dead again; End > Start
	// Stream is the stream the buffer was allocated on (0: default).
	Stream int64
	// Tag groups buffers by role: one of Tags, or another name, "" for
	// unknown. An arena maps, pauses and resumes each tag's buffers as one
	// region when the plan keeps them apart (planner.RunByTag).
	Tag string
	// Fixed, when HasFixed, is an offset every planner must use.
	Fixed int64
	// Hint, when HasHint, is a suggested offset (MiniMalloc's hint
	// column); planners may ignore it.
	Hint int64
	// Gaps are sub-intervals of [Start, End) during which the buffer is
	// inactive (MiniMalloc's gaps column). During a gap with a window the
	// buffer still occupies [Window.Lo, Window.Hi) relative to its offset.
	// Planners may ignore gaps (treating the buffer as live throughout),
	// which is always safe; Check honours them.
	Gaps []Gap
	// HasFixed and HasHint say whether Fixed and Hint were asked for. They
	// come last, side by side, so that a Buffer is 128 bytes, not 136: a
	// trace of millions of buffers holds little else.
	HasFixed, HasHint bool
}

// Gap is an inactive sub-interval [Start, End) of a buffer's lifetime.
type Gap struct {
	Start, End int64
	// HasWindow says the buffer keeps occupying [Lo, Hi) (offsets relative
	// to the buffer's own offset) during the gap.
	HasWindow bool
	Lo, Hi    int64
}

// Trace is the whole set of buffers of one workload step.
type Trace struct {
	Name    string
	Buffers []Buffer
	// Prior holds offsets of an earlier solution read with the trace (an
	// offset column), indexed by ID, NoOffset where absent; nil if none.
	Prior []int64
	// Torch is what PyTorch's caching allocator did during the trace; nil
	// unless the trace came from a memory snapshot.
	Torch *TorchStats
}

// TorchStats summarises the caching allocator's behaviour in a snapshot.
type TorchStats struct {
	Device int
	// ReservedPeak is the most bytes held in segments at once during the
	// trace, replaying segment_alloc/segment_free over the segments that
	// existed before the trace.
	ReservedPeak int64
	// LiveAtStart is the bytes of blocks already allocated when the trace
	// began (weights, inputs), which a plan of the trace does not cover.
	LiveAtStart int64
	// Kept are the sizes of the blocks allocated before the trace that it
	// neither touched nor freed (weights, optimizer state), by address:
	// what a replay of the trace allocates first. Only with segment data.
	Kept []int64
	// HasSegments is false when the snapshot carries no segment data.
	HasSegments bool
}

// Reserved returns what the caching allocator held for the trace's own
// buffers: ReservedPeak less LiveAtStart, comparable with an arena size.
func (s *TorchStats) Reserved() int64 {
	if s == nil || !s.HasSegments {
		return 0
	}
	r := s.ReservedPeak - s.LiveAtStart
	if r < 0 {
		return 0
	}
	return r
}

// RoundUp rounds n up to a multiple of align (align <= 1 returns n).
func RoundUp(n, align int64) int64 {
	if align <= 1 {
		return n
	}
	return (n + align - 1) / align * align
}

// Validate reports the first malformed buffer: non-positive size, an empty
// or inverted lifetime, a bad alignment, gaps outside the lifetime, or an
// ID that is not the buffer's index.
func (t *Trace) Validate() error {
	if t.Prior != nil && len(t.Prior) != len(t.Buffers) {
		return fmt.Errorf("trace %q: %d prior offsets for %d buffers", t.Name, len(t.Prior), len(t.Buffers))
	}
	for i := range t.Buffers {
		b := &t.Buffers[i]
		if err := b.validate(); err != nil {
			return fmt.Errorf("trace %q: %s: %w", t.Name, Label(i, b.Name), err)
		}
		if b.ID != ID(i) {
			return fmt.Errorf("trace %q: %s: id %d is not its index", t.Name, Label(i, b.Name), b.ID)
		}
	}
	return nil
}

func (b *Buffer) validate() error {
	switch {
	case b.Size <= 0:
		return fmt.Errorf("size %d is not positive", b.Size)
	case b.Size > MaxSize:
		return fmt.Errorf("size %d exceeds the limit %d", b.Size, MaxSize)
	case b.End <= b.Start:
		return fmt.Errorf("lifetime [%d, %d) is empty", b.Start, b.End)
	case b.Align < 0 || b.Align > MaxSize:
		return fmt.Errorf("alignment %d is invalid", b.Align)
	case b.HasFixed && (b.Fixed < 0 || b.Fixed > MaxSize):
		return fmt.Errorf("fixed offset %d is invalid", b.Fixed)
	case !b.HasFixed && b.Fixed != 0:
		// Most likely a Buffer written before HasFixed existed (Fixed: -1
		// for none) or one that forgot to ask: refuse rather than guess.
		return fmt.Errorf("fixed offset %d is set but HasFixed is false", b.Fixed)
	case b.HasHint && (b.Hint < 0 || b.Hint > MaxSize):
		return fmt.Errorf("hint %d is invalid", b.Hint)
	case !b.HasHint && b.Hint != 0:
		return fmt.Errorf("hint %d is set but HasHint is false", b.Hint)
	}
	for _, g := range b.Gaps {
		if g.Start < b.Start || g.End > b.End || g.End <= g.Start {
			return fmt.Errorf("gap [%d, %d) is not inside the lifetime [%d, %d)", g.Start, g.End, b.Start, b.End)
		}
		if g.HasWindow && (g.Lo < 0 || g.Hi > b.Size || g.Hi <= g.Lo) {
			return fmt.Errorf("gap window [%d, %d) is not inside the buffer's %d bytes", g.Lo, g.Hi, b.Size)
		}
	}
	return gapsDisjoint(b.Gaps)
}

// gapsDisjoint reports two gaps that overlap, in O(n log n) for n gaps
// (O(n) when they are in order, as every importer writes them). The gaps
// are non-empty, so once they are sorted by start, two of them overlap
// only if two neighbours do.
func gapsDisjoint(gaps []Gap) error {
	sorted := slices.IsSortedFunc(gaps, func(x, y Gap) int { return cmp.Compare(x.Start, y.Start) })
	if !sorted {
		gaps = slices.Clone(gaps)
		slices.SortFunc(gaps, func(x, y Gap) int { return cmp.Compare(x.Start, y.Start) })
	}
	for i := 1; i < len(gaps); i++ {
		h, g := gaps[i-1], gaps[i]
		if g.Start < h.End {
			return fmt.Errorf("gaps [%d, %d) and [%d, %d) overlap", h.Start, h.End, g.Start, g.End)
		}
	}
	return nil
}

// Label names buffer i of a trace as errors do: "buffer 3 (attn.q)", or
// "buffer 3" when it has no name.
func Label(i int, name string) string {
	if name == "" {
		return fmt.Sprintf("buffer %d", i)
	}
	return fmt.Sprintf("buffer %d (%s)", i, name)
}

// Overlaps reports whether two half-open lifetimes intersect.
func Overlaps(aStart, aEnd, bStart, bEnd int64) bool {
	return aStart < bEnd && bStart < aEnd
}

// LowerBound returns the peak of live bytes over time, with every size
// rounded up to align, and the first time at which that peak is reached.
// Gaps reduce a buffer's live bytes to its window (or zero). No arena can
// be smaller than the peak.
func (t *Trace) LowerBound(align int64) (peak int64, at int64) {
	type ev struct {
		t     int64
		delta int64
	}
	evs := make([]ev, 0, 2*len(t.Buffers))
	for i := range t.Buffers {
		b := &t.Buffers[i]
		sz := RoundUp(b.Size, align)
		evs = append(evs, ev{b.Start, sz}, ev{b.End, -sz})
		for _, g := range b.Gaps {
			keep := int64(0)
			if g.HasWindow {
				keep = g.Hi - g.Lo
			}
			evs = append(evs, ev{g.Start, keep - sz}, ev{g.End, sz - keep})
		}
	}
	// Ends (negative deltas) sort before starts at the same time: half-open.
	slices.SortFunc(evs, func(a, b ev) int {
		if c := cmp.Compare(a.t, b.t); c != 0 {
			return c
		}
		return cmp.Compare(a.delta, b.delta)
	})
	var live int64
	for _, e := range evs {
		live += e.delta
		if live > peak {
			peak, at = live, e.t
		}
	}
	return peak, at
}

// Span returns the smallest Start and largest End over all buffers.
func (t *Trace) Span() (start, end int64) {
	if len(t.Buffers) == 0 {
		return 0, 0
	}
	start, end = math.MaxInt64, math.MinInt64
	for i := range t.Buffers {
		start = min(start, t.Buffers[i].Start)
		end = max(end, t.Buffers[i].End)
	}
	return start, end
}

// TotalBytes returns the sum of all buffer sizes rounded up to align.
func (t *Trace) TotalBytes(align int64) int64 {
	var s int64
	for i := range t.Buffers {
		s += RoundUp(t.Buffers[i].Size, align)
	}
	return s
}

// Fingerprint is a SHA-256 over everything a plan depends on: every
// buffer's size, alignment, lifetime, fixed offset and gaps, in ID order.
// Names, tags and streams do not change a plan's validity and are left out.
func (t *Trace) Fingerprint() [32]byte {
	h := sha256.New()
	var w [8]byte
	put := func(v int64) {
		binary.LittleEndian.PutUint64(w[:], uint64(v))
		h.Write(w[:])
	}
	put(int64(len(t.Buffers)))
	for i := range t.Buffers {
		b := &t.Buffers[i]
		put(b.Size)
		put(b.Align)
		put(b.Start)
		put(b.End)
		// -1 for "not fixed", as before HasFixed existed, so that plan
		// files written then keep their fingerprints.
		if b.HasFixed {
			put(b.Fixed)
		} else {
			put(NoOffset)
		}
		put(int64(len(b.Gaps)))
		for _, g := range b.Gaps {
			put(g.Start)
			put(g.End)
			if g.HasWindow {
				put(g.Lo)
				put(g.Hi)
			} else {
				put(-1)
				put(-1)
			}
		}
	}
	var out [32]byte
	copy(out[:], h.Sum(nil))
	return out
}

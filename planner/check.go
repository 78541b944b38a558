package planner

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/google/btree"

	"github.com/arenaplan/arenaplan/lifetime"
)

// Check verifies a plan against its trace, independently of every
// algorithm: every buffer has an offset, honours its fixed offset, is
// aligned to both the plan's alignment and its own, lies inside the arena,
// and no two buffers whose lifetimes overlap overlap in memory (gaps
// honoured: during a gap a buffer occupies only its window, or nothing).
// Sizes are rounded up to the plan's alignment, as the plan was made.
//
// It sweeps time once with the live rectangles ordered by offset, so it
// costs O(n log n) for n buffers.
func Check(t *lifetime.Trace, p *Plan) error {
	if err := check(t, p, func(i int) string { return lifetime.Label(i, t.Buffers[i].Name) }); err != nil {
		return fmt.Errorf("check: %w", err)
	}
	return nil
}

// check is Check without its prefix; label names buffer i in errors.
func check(t *lifetime.Trace, p *Plan, label func(int) string) error {
	if p == nil {
		return fmt.Errorf("no plan")
	}
	if len(p.Offsets) != len(t.Buffers) {
		return fmt.Errorf("plan has %d offsets for %d buffers", len(p.Offsets), len(t.Buffers))
	}
	if p.Align < 1 || p.Align > lifetime.MaxSize {
		return fmt.Errorf("plan alignment %d is out of range", p.Align)
	}
	// A malformed trace (an empty lifetime, a negative size) would break
	// the sweep's invariant that live pieces are disjoint and non-empty.
	if err := t.Validate(); err != nil {
		return err
	}
	if p.Arena < 0 || p.Arena > lifetime.MaxSize {
		return fmt.Errorf("arena size %d is out of range", p.Arena)
	}
	pieces := make([]piece, 0, len(t.Buffers)) // one per buffer without gaps
	for i := range t.Buffers {
		b := &t.Buffers[i]
		off := p.Offsets[i]
		size := b.Size
		if r := size % p.Align; r != 0 {
			size += p.Align - r
		}
		switch {
		case off < 0:
			return fmt.Errorf("%s has negative offset %d", label(i), off)
		case off%p.Align != 0:
			return fmt.Errorf("%s offset %d is not a multiple of the plan alignment %d", label(i), off, p.Align)
		case b.Align > 1 && off%b.Align != 0:
			return fmt.Errorf("%s offset %d is not a multiple of its alignment %d", label(i), off, b.Align)
		case b.HasFixed && off != b.Fixed:
			return fmt.Errorf("%s is fixed at %d but placed at %d", label(i), b.Fixed, off)
		case off > p.Arena-size:
			return fmt.Errorf("%s %s ends beyond the arena of %d bytes", label(i), byteRange(off, size), p.Arena)
		}
		pieces = appendPieces(pieces, i, b, off, size)
	}
	return checkPieces(pieces, label)
}

// byteRange prints the byte range [off, off+size) exactly, also where the end
// does not fit in an int64 (a plan file may hold any offset).
func byteRange(off, size int64) string {
	if off >= 0 && size >= 0 {
		return fmt.Sprintf("[%d, %d)", off, uint64(off)+uint64(size))
	}
	return fmt.Sprintf("[%d, %d%+d)", off, off, size)
}

// piece is a rectangle a buffer occupies: time [t0, t1) × memory [lo, hi).
type piece struct {
	buf            int
	t0, t1, lo, hi int64
}

// appendPieces splits a buffer's lifetime at its gaps.
func appendPieces(ps []piece, i int, b *lifetime.Buffer, off, size int64) []piece {
	if len(b.Gaps) == 0 {
		return append(ps, piece{i, b.Start, b.End, off, off + size})
	}
	gaps := slices.Clone(b.Gaps)
	slices.SortFunc(gaps, func(x, y lifetime.Gap) int { return cmp.Compare(x.Start, y.Start) })
	at := b.Start
	for _, g := range gaps {
		if g.Start > at {
			ps = append(ps, piece{i, at, g.Start, off, off + size})
		}
		if g.HasWindow {
			ps = append(ps, piece{i, g.Start, g.End, off + g.Lo, off + g.Hi})
		}
		at = max(at, g.End)
	}
	if at < b.End {
		ps = append(ps, piece{i, at, b.End, off, off + size})
	}
	return ps
}

func checkPieces(ps []piece, label func(int) string) error {
	type event struct {
		time int64
		end  bool
		p    int
	}
	evs := make([]event, 0, 2*len(ps))
	for i, p := range ps {
		evs = append(evs, event{p.t0, false, i}, event{p.t1, true, i})
	}
	// At equal times, ends come first: lifetimes are half-open.
	slices.SortFunc(evs, func(a, b event) int {
		if c := cmp.Compare(a.time, b.time); c != 0 {
			return c
		}
		switch {
		case a.end && !b.end:
			return -1
		case b.end && !a.end:
			return 1
		}
		return 0
	})
	// Live pieces keyed by (lo, index); while the check holds they are
	// disjoint, so a new piece can only collide with its neighbours.
	less := func(a, b int) bool {
		if ps[a].lo != ps[b].lo {
			return ps[a].lo < ps[b].lo
		}
		return a < b
	}
	live := btree.NewG[int](16, less)
	for _, e := range evs {
		if e.end {
			live.Delete(e.p)
			continue
		}
		cur := ps[e.p]
		var clash = -1
		live.DescendLessOrEqual(e.p, func(q int) bool {
			if ps[q].hi > cur.lo {
				clash = q
			}
			return false
		})
		if clash < 0 {
			live.AscendGreaterOrEqual(e.p, func(q int) bool {
				if q != e.p && ps[q].lo < cur.hi {
					clash = q
				}
				return false
			})
		}
		if clash >= 0 {
			q := ps[clash]
			return fmt.Errorf("%s and %s overlap: memory [%d, %d) and [%d, %d) both live at time %d",
				label(cur.buf), label(q.buf), cur.lo, cur.hi, q.lo, q.hi, e.time)
		}
		live.ReplaceOrInsert(e.p)
	}
	return nil
}

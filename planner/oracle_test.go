package planner

import (
	"fmt"
	"math/rand/v2"

	"github.com/arenaplan/arenaplan/lifetime"
)

// oracleCheck is the trivially correct twin of Check for small traces:
// it walks every integer time of the trace's span and compares every pair
// of buffers live at that time, O(T·n²). It shares no code with Check.
func oracleCheck(t *lifetime.Trace, p *Plan) error {
	if p == nil || len(p.Offsets) != len(t.Buffers) || p.Align < 1 || p.Arena < 0 || p.Arena > lifetime.MaxSize {
		return fmt.Errorf("oracle: malformed plan")
	}
	sizes := make([]int64, len(t.Buffers))
	for i, b := range t.Buffers {
		off := p.Offsets[i]
		sizes[i] = (b.Size + p.Align - 1) / p.Align * p.Align
		if off < 0 || off%p.Align != 0 || (b.Align > 1 && off%b.Align != 0) ||
			(b.HasFixed && off != b.Fixed) || off+sizes[i] > p.Arena {
			return fmt.Errorf("oracle: buffer %d misplaced", i)
		}
	}
	lo, hi := t.Span()
	type occ struct {
		buf    int
		lo, hi int64
	}
	var live []occ
	for now := lo; now < hi; now++ {
		live = live[:0]
		for i, b := range t.Buffers {
			if now < b.Start || now >= b.End {
				continue
			}
			o := occ{i, p.Offsets[i], p.Offsets[i] + sizes[i]}
			for _, g := range b.Gaps {
				if g.Start <= now && now < g.End {
					if !g.HasWindow {
						o.hi = o.lo // occupies nothing
					} else {
						o.lo, o.hi = p.Offsets[i]+g.Lo, p.Offsets[i]+g.Hi
					}
				}
			}
			if o.lo == o.hi {
				continue // inactive: occupies nothing
			}
			for _, q := range live {
				if o.lo < q.hi && q.lo < o.hi {
					return fmt.Errorf("oracle: buffers %d and %d overlap at time %d", q.buf, i, now)
				}
			}
			live = append(live, o)
		}
	}
	return nil
}

// genOptions shape the random traces.
type genOptions struct {
	maxBuffers int
	maxTime    int64
	align      int64 // the plan alignment fixed offsets must respect
}

// genTrace makes a valid random trace: sizes that are and are not
// multiples of the alignments, buffer alignments (some not powers of two),
// gaps with and without windows, and fixed offsets that never conflict
// with each other.
func genTrace(rng *rand.Rand, o genOptions) *lifetime.Trace {
	n := rng.IntN(o.maxBuffers + 1)
	t := &lifetime.Trace{Name: "random"}
	for i := 0; i < n; i++ {
		b := lifetime.Buffer{ID: lifetime.ID(i), Name: fmt.Sprint("b", i)}
		switch rng.IntN(4) {
		case 0:
			b.Size = 1 + rng.Int64N(16)
		case 1:
			b.Size = 256 * (1 + rng.Int64N(8))
		case 2:
			b.Size = 1 + rng.Int64N(3000)
		default:
			b.Size = 1 << rng.IntN(12)
		}
		if rng.IntN(5) == 0 {
			b.Align = []int64{0, 1, 2, 3, 8, 48, 512, 1024}[rng.IntN(8)]
		}
		b.Start = rng.Int64N(o.maxTime)
		b.End = b.Start + 1 + rng.Int64N(max(1, o.maxTime/2))
		if rng.IntN(6) == 0 && b.End-b.Start >= 3 {
			// One or two disjoint gaps strictly inside the lifetime.
			at := b.Start + 1
			for k := 0; k < 1+rng.IntN(2) && at < b.End-1; k++ {
				g := lifetime.Gap{Start: at + rng.Int64N(b.End-1-at)}
				g.End = g.Start + 1 + rng.Int64N(b.End-g.Start-1)
				if rng.IntN(2) == 0 {
					g.HasWindow = true
					g.Lo = rng.Int64N(b.Size)
					g.Hi = g.Lo + 1 + rng.Int64N(b.Size-g.Lo)
				}
				b.Gaps = append(b.Gaps, g)
				at = g.End + 1
			}
		}
		t.Buffers = append(t.Buffers, b)
		if rng.IntN(8) == 0 {
			// Try a fixed offset; keep it only if no earlier fixed buffer
			// is in the way.
			_, a := Need(&b, o.align)
			t.Buffers[i].Fixed, t.Buffers[i].HasFixed = a*rng.Int64N(1+4096/a), true
			if !fixedConsistent(t, o.align) {
				t.Buffers[i].Fixed, t.Buffers[i].HasFixed = 0, false
			}
		}
	}
	return t
}

// fixedConsistent reports whether the fixed buffers of t alone form a
// valid placement, by the oracle.
func fixedConsistent(t *lifetime.Trace, align int64) bool {
	sub := &lifetime.Trace{}
	var offs []int64
	for _, b := range t.Buffers {
		if b.HasFixed {
			b.ID = lifetime.ID(len(sub.Buffers))
			sub.Buffers = append(sub.Buffers, b)
			offs = append(offs, b.Fixed)
		}
	}
	return oracleCheck(sub, &Plan{Align: align, Offsets: offs, Arena: ArenaSize(sub, offs, align)}) == nil
}

// dumpTrace prints a trace as Go-ish lines for a failure message.
func dumpTrace(t *lifetime.Trace) string {
	s := ""
	for _, b := range t.Buffers {
		s += fmt.Sprintf("  {size %d, align %d, [%d, %d), fixed %d, gaps %+v}\n", b.Size, b.Align, b.Start, b.End, b.Fixed, b.Gaps)
	}
	return s
}

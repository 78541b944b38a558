package plans

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/arenaplan/arenaplan/lifetime"
	"github.com/arenaplan/arenaplan/planner"
)

var update = flag.Bool("update", false, "rewrite golden files and fuzz seeds under testdata")

// sentinels are the errors every failure must wrap one of.
var sentinels = []error{ErrNotPlan, ErrVersion, ErrCorrupt, ErrChecksum, ErrTooLarge, ErrInvalid}

func isSentinel(err error) bool {
	for _, s := range sentinels {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}

// smallTrace has a bit of everything the format carries: fixed offsets,
// own alignments, streams, tags, hints, gaps with and without a window,
// prior offsets and PyTorch statistics.
func smallTrace() *lifetime.Trace {
	t := &lifetime.Trace{
		Name: "small step",
		Buffers: []lifetime.Buffer{
			{Name: "weights", Size: 1000, Start: 0, End: 10, Tag: "weight", Fixed: 0, HasFixed: true},
			{Name: "x", Size: 300, Start: 0, End: 2, Tag: "input"},
			{Name: "h1", Size: 512, Align: 512, Start: 1, End: 4, Stream: 1, Tag: "intermediate",
				Gaps: []lifetime.Gap{{Start: 2, End: 3, HasWindow: true, Lo: 0, Hi: 100}}},
			{Name: "h2", Size: 256, Start: 2, End: 5, Tag: "intermediate",
				Gaps: []lifetime.Gap{{Start: 3, End: 4}}},
			{Name: "kv", Size: 700, Start: 4, End: 8, Stream: -3, Tag: "kv", Hint: 2048, HasHint: true},
			{Name: "out \"ü\"", Size: 100, Start: 8, End: 10, Tag: "output"},
		},
		Prior: []int64{0, 1024, lifetime.NoOffset, 4096, lifetime.NoOffset, 1024},
		Torch: &lifetime.TorchStats{Device: 1, ReservedPeak: 1 << 20, LiveAtStart: 4096, HasSegments: true},
	}
	for i := range t.Buffers {
		t.Buffers[i].ID = lifetime.ID(i)
	}
	return t
}

func smallWorkload() *Workload {
	w := &Workload{Name: "gpt2-decode", Shape: []Dim{{Name: "batch", Value: 1}, {Name: "seq", Value: 1024}, {Name: "neg", Value: -7}}}
	for i := range w.Fingerprint {
		w.Fingerprint[i] = byte(i * 7)
	}
	return w
}

// firstFit places buffers in order of start at the lowest offset that
// does not overlap any buffer whose lifetime overlaps (ignoring gaps,
// which is always safe), after placing fixed buffers where they must be.
// It is a trivially valid placement, independent of package planner's
// algorithms; it costs O(n × live).
func firstFit(t *lifetime.Trace, align int64) []int64 {
	type rect struct{ lo, hi, end int64 }
	offs := make([]int64, len(t.Buffers))
	var fixed []int
	order := make([]int, 0, len(t.Buffers))
	for i := range t.Buffers {
		if b := &t.Buffers[i]; b.HasFixed {
			offs[i] = b.Fixed
			fixed = append(fixed, i)
		} else {
			order = append(order, i)
		}
	}
	sort.SliceStable(order, func(x, y int) bool { return t.Buffers[order[x]].Start < t.Buffers[order[y]].Start })
	var active []rect // placed buffers that may still be live, by lo
	var cand []rect
	for _, i := range order {
		b := &t.Buffers[i]
		size, a := planner.Need(b, align)
		kept := active[:0]
		for _, r := range active {
			if r.end > b.Start {
				kept = append(kept, r)
			}
		}
		active = kept
		cand = append(cand[:0], active...)
		for _, j := range fixed {
			f := &t.Buffers[j]
			if lifetime.Overlaps(f.Start, f.End, b.Start, b.End) {
				fs, _ := planner.Need(f, align)
				cand = append(cand, rect{f.Fixed, f.Fixed + fs, f.End})
			}
		}
		sort.Slice(cand, func(x, y int) bool { return cand[x].lo < cand[y].lo })
		var off int64
		for _, r := range cand {
			if off+size <= r.lo {
				break
			}
			off = max(off, lifetime.RoundUp(r.hi, a))
		}
		offs[i] = off
		r := rect{off, off + size, b.End}
		at := sort.Search(len(active), func(k int) bool { return active[k].lo >= off })
		active = append(active, rect{})
		copy(active[at+1:], active[at:])
		active[at] = r
	}
	return offs
}

// planFor makes a verified plan of t from the given offsets.
func planFor(t *lifetime.Trace, algo string, align int64, offs []int64) *planner.Plan {
	// No planning times: files do not store them (TestSamePlanSameBytes).
	p := &planner.Plan{Algo: algo, Align: align, Offsets: offs}
	p.Arena = planner.ArenaSize(t, offs, align)
	p.LowerBound, _ = t.LowerBound(align)
	p.Optimal = p.Arena == p.LowerBound
	return p
}

func smallFile(t testing.TB) *File {
	t.Helper()
	tr := smallTrace()
	p := planFor(tr, "firstfit-test", 256, firstFit(tr, 256))
	if err := planner.Check(tr, p); err != nil {
		t.Fatalf("test plan is invalid: %v", err)
	}
	return &File{Trace: tr, Plan: p, Workload: smallWorkload()}
}

// synthTrace is a transformer-like step of n buffers: names with layer
// numbers, a few sizes that repeat, short lifetimes and some long ones.
func synthTrace(n int, seed uint64) *lifetime.Trace {
	rng := rand.New(rand.NewPCG(seed, 1))
	t := &lifetime.Trace{Name: fmt.Sprintf("synthetic-%d", n), Buffers: make([]lifetime.Buffer, n)}
	sizes := []int64{4096, 65536, 3 << 20, 12 << 20, 768 * 4, 50257 * 4, 1 << 10}
	parts := []string{"attn.q", "attn.k", "attn.v", "attn.out", "mlp.fc", "mlp.proj", "ln_1", "ln_2"}
	tags := []string{"intermediate", "intermediate", "intermediate", "weight", "kv"}
	var now int64
	for i := range t.Buffers {
		if rng.IntN(2) == 0 {
			now++
		}
		dur := int64(1 + rng.IntN(4))
		if rng.IntN(50) == 0 {
			dur += int64(rng.IntN(2000))
		}
		t.Buffers[i] = lifetime.Buffer{
			ID:    lifetime.ID(i),
			Name:  "h." + strconv.Itoa(i/200) + "." + parts[rng.IntN(len(parts))] + "." + strconv.Itoa(i),
			Size:  sizes[rng.IntN(len(sizes))] + int64(rng.IntN(3))*256,
			Start: now, End: now + dur,
			Tag: tags[rng.IntN(len(tags))],
		}
	}
	return t
}

func synthFile(t testing.TB, n int) *File {
	t.Helper()
	tr := synthTrace(n, 42)
	return &File{Trace: tr, Plan: planFor(tr, "firstfit-test", 256, firstFit(tr, 256))}
}

// readCSV reads a MiniMalloc CSV (id,lower,upper,size) without package
// lifetime's importers, so this package's tests depend only on the model.
func readCSV(path string) (*lifetime.Trace, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	t := &lifetime.Trace{Name: path}
	sc := bufio.NewScanner(fh)
	for line := 0; sc.Scan(); line++ {
		if line == 0 {
			continue
		}
		f := strings.Split(sc.Text(), ",")
		if len(f) < 4 {
			return nil, fmt.Errorf("%s:%d: %d fields", path, line+1, len(f))
		}
		var v [3]int64
		for k := range v {
			if v[k], err = strconv.ParseInt(f[k+1], 10, 64); err != nil {
				return nil, fmt.Errorf("%s:%d: %w", path, line+1, err)
			}
		}
		t.Buffers = append(t.Buffers, lifetime.Buffer{ID: lifetime.ID(len(t.Buffers)), Name: f[0],
			Start: v[0], End: v[1], Size: v[2]})
	}
	return t, sc.Err()
}

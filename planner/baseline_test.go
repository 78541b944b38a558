package planner

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/arenaplan/arenaplan/lifetime"
)

// buf is a short constructor for hand-made traces: size, [start, end).
func buf(size, start, end int64) lifetime.Buffer {
	return lifetime.Buffer{Size: size, Start: start, End: end}
}

func fixedAt(b lifetime.Buffer, off int64) lifetime.Buffer { b.Fixed, b.HasFixed = off, true; return b }

func aligned(b lifetime.Buffer, a int64) lifetime.Buffer { b.Align = a; return b }

func withGaps(b lifetime.Buffer, g ...lifetime.Gap) lifetime.Buffer { b.Gaps = g; return b }

func trace(bs ...lifetime.Buffer) *lifetime.Trace {
	t := &lifetime.Trace{Name: "hand"}
	for i, b := range bs {
		b.ID = lifetime.ID(i)
		t.Buffers = append(t.Buffers, b)
	}
	return t
}

func TestBaselinesOnHandMadeTraces(t *testing.T) {
	tests := []struct {
		name    string
		tr      *lifetime.Trace
		align   int64
		optimum int64            // the smallest arena any plan can have
		want    map[string]int64 // each baseline's arena
	}{
		{"empty", trace(), 1, 0, map[string]int64{"bestfit": 0, "bysize": 0}},
		{"one", trace(buf(7, 0, 1)), 1, 7, map[string]int64{"bestfit": 7, "bysize": 7}},
		{"chain shares memory (half-open)", trace(buf(100, 0, 2), buf(100, 2, 4), buf(100, 4, 6)), 1, 100,
			map[string]int64{"bestfit": 100, "bysize": 100}},
		{"all live at once", trace(buf(10, 0, 5), buf(20, 0, 5), buf(30, 0, 5)), 1, 60,
			map[string]int64{"bestfit": 60, "bysize": 60}},
		{"reuse after free", trace(buf(64, 0, 2), buf(32, 0, 4), buf(64, 2, 4)), 1, 96,
			map[string]int64{"bestfit": 96, "bysize": 96}},
		// In order, z finds only the 10-byte hole x left and must go on
		// top; largest first puts z at 0 and x under y.
		{"in-order fragmentation", trace(buf(10, 0, 1), buf(10, 0, 3), buf(20, 1, 3)), 1, 30,
			map[string]int64{"bestfit": 40, "bysize": 30}},
		// At t=2 there are holes of 30 and 10 bytes: best fit puts the
		// 10-byte buffer in the small one, leaving room for the 30 (first
		// fit would not).
		{"best fit picks the smaller hole", trace(
			buf(30, 0, 2), buf(10, 0, 9), buf(10, 0, 2), buf(10, 0, 9),
			buf(10, 2, 9), buf(30, 3, 9)), 1, 60,
			map[string]int64{"bestfit": 60, "bysize": 60}},
		{"plan alignment rounds sizes", trace(buf(100, 0, 2), buf(100, 1, 3)), 256, 512,
			map[string]int64{"bestfit": 512, "bysize": 512}},
		// Neither greedy thinks of putting the 512-aligned buffer first.
		{"buffer alignment", trace(buf(256, 0, 2), aligned(buf(256, 0, 2), 512)), 256, 512,
			map[string]int64{"bestfit": 768, "bysize": 768}},
		{"odd alignment", trace(buf(5, 0, 2), aligned(buf(4, 0, 2), 3)), 1, 10,
			map[string]int64{"bestfit": 10, "bysize": 10}},
		{"fixed buffer kept clear", trace(fixedAt(buf(50, 0, 10), 100), buf(100, 0, 5), buf(150, 5, 10)), 1, 300,
			map[string]int64{"bestfit": 300, "bysize": 300}},
		{"fixed buffer dead before", trace(fixedAt(buf(100, 0, 2), 0), buf(100, 2, 4)), 1, 100,
			map[string]int64{"bestfit": 100, "bysize": 100}},
		// bestfit places b at time 0, before f is live: it must still
		// keep clear of f's future.
		{"fixed buffer live later", trace(buf(100, 0, 4), fixedAt(buf(100, 2, 4), 0)), 1, 200,
			map[string]int64{"bestfit": 200, "bysize": 200}},
		{"fixed buffers touching in time", trace(fixedAt(buf(100, 0, 2), 0), fixedAt(buf(100, 2, 4), 0)), 1, 100,
			map[string]int64{"bestfit": 100, "bysize": 100}},
		{"fixed buffers share memory in a gap", trace(
			fixedAt(withGaps(buf(100, 0, 10), lifetime.Gap{Start: 2, End: 8}), 0), fixedAt(buf(100, 3, 7), 0)), 1, 100,
			map[string]int64{"bestfit": 100, "bysize": 100}},
		// Gaps are ignored by the baselines: safe, not optimal.
		{"gap ignored", trace(withGaps(buf(100, 0, 10), lifetime.Gap{Start: 2, End: 8}), buf(100, 3, 7)), 1, 100,
			map[string]int64{"bestfit": 200, "bysize": 200}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// Searches cannot prove optimality where the optimum exceeds
			// the lower bound: keep their budget short.
			opt := Options{Align: tc.align, Workers: 1, Budget: 20 * time.Millisecond}
			lb, _ := tc.tr.LowerBound(tc.align)
			if lb > tc.optimum {
				t.Fatalf("test is wrong: lower bound %d above the optimum %d", lb, tc.optimum)
			}
			best := int64(-1)
			for _, name := range Names() {
				p, err := Run(context.Background(), name, tc.tr, opt)
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				if p.Arena < tc.optimum {
					t.Errorf("%s: arena %d below the optimum %d", name, p.Arena, tc.optimum)
				}
				if want, ok := tc.want[name]; ok && p.Arena != want {
					t.Errorf("%s: arena %d, want %d (offsets %v)", name, p.Arena, want, p.Offsets)
				}
				if name != "auto" && (best < 0 || p.Arena < best) {
					best = p.Arena
				}
			}
			auto, err := Run(context.Background(), "auto", tc.tr, opt)
			if err != nil {
				t.Fatal(err)
			}
			if auto.Arena > best {
				t.Errorf("auto: arena %d, worse than the best of the others, %d", auto.Arena, best)
			}
		})
	}
}

func TestPlannersRefuseImpossibleTraces(t *testing.T) {
	tests := []struct {
		name  string
		tr    *lifetime.Trace
		align int64
		want  string // in the error
	}{
		{"fixed buffers overlap", trace(fixedAt(buf(100, 0, 5), 0), fixedAt(buf(100, 2, 6), 50)), 1, "overlap"},
		{"fixed buffer over a gap window", trace(
			fixedAt(withGaps(buf(100, 0, 10), lifetime.Gap{Start: 2, End: 8, HasWindow: true, Lo: 0, Hi: 10}), 0),
			fixedAt(buf(100, 3, 7), 0)), 1, "overlap"},
		{"fixed offset not plan-aligned", trace(fixedAt(buf(100, 0, 5), 100)), 256, "not a multiple"},
		{"fixed offset not buffer-aligned", trace(fixedAt(aligned(buf(100, 0, 5), 64), 32)), 1, "not a multiple"},
		{"arena overflows", trace(buf(lifetime.MaxSize, 0, 5), buf(lifetime.MaxSize, 0, 5)), 1, "exceed"},
		{"empty lifetime", trace(buf(100, 5, 5)), 1, "empty"},
		{"zero size", trace(buf(0, 0, 5)), 1, "size"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, name := range Names() {
				p, err := Run(context.Background(), name, tc.tr, Options{Align: tc.align, Workers: 1})
				if err == nil {
					t.Fatalf("%s: planned %v, want an error", name, p.Offsets)
				}
				// The baselines' messages are pinned; others need only fail.
				if slices.Contains(Baselines, name) && !strings.Contains(err.Error(), tc.want) {
					t.Errorf("%s: error %q does not say %q", name, err, tc.want)
				}
			}
		})
	}
	if _, err := Run(context.Background(), "no-such", trace(), Options{}); err == nil {
		t.Error("unknown algorithm: no error")
	}
}

// The baselines refuse a buffer alignment whose least common multiple with
// the plan's leaves the offset range, rather than overflow (offset 0 would
// do for a lone buffer, but they do not look for it).
func TestBaselinesRefuseHugeAlignment(t *testing.T) {
	// An odd buffer alignment just below the limit: its lcm with the plan's
	// power-of-two alignment 2 is twice as large.
	tr := trace(aligned(buf(100, 0, 5), lifetime.MaxSize-1))
	for _, name := range Baselines {
		if _, err := Run(context.Background(), name, tr, Options{Align: 2}); err == nil || !strings.Contains(err.Error(), "exceeds") {
			t.Errorf("%s: error %v, want one about the alignment", name, err)
		}
	}
}

// The baselines give up on a cancelled context; others may still return
// the best plan they have (Func's contract), which Run has checked.
func TestStopWhenCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	tr := trace(buf(1, 0, 1), buf(1, 0, 1))
	for _, name := range Names() {
		_, err := Run(ctx, name, tr, Options{})
		if slices.Contains(Baselines, name) && !errors.Is(err, context.Canceled) {
			t.Errorf("%s: error %v, want context.Canceled", name, err)
		}
		if err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("%s: error %v, want nil or context.Canceled", name, err)
		}
	}
}

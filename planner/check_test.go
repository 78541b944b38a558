package planner

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/arenaplan/arenaplan/lifetime"
)

func TestCheckCases(t *testing.T) {
	// a and b overlap in time, b and c too, a and c do not.
	abc := trace(buf(100, 0, 4), buf(100, 2, 6), buf(100, 4, 8))
	plan := func(align, arena int64, offs ...int64) *Plan {
		return &Plan{Align: align, Arena: arena, Offsets: offs}
	}
	windowed := trace(withGaps(buf(100, 0, 10), lifetime.Gap{Start: 2, End: 8, HasWindow: true, Lo: 40, Hi: 60}), buf(100, 3, 7))
	tests := []struct {
		name string
		tr   *lifetime.Trace
		p    *Plan
		want string // "" for a valid plan, else part of the error
	}{
		{"valid", abc, plan(1, 200, 0, 100, 0), ""},
		{"valid with a larger arena", abc, plan(1, 1000, 0, 100, 0), ""},
		{"valid, touching in time", trace(buf(100, 0, 2), buf(100, 2, 4)), plan(1, 100, 0, 0), ""},
		{"valid, empty trace", trace(), plan(1, 0), ""},
		{"no plan", abc, nil, "no plan"},
		{"too few offsets", abc, plan(1, 200, 0, 100), "2 offsets for 3 buffers"},
		{"too many offsets", abc, plan(1, 200, 0, 100, 0, 0), "4 offsets for 3 buffers"},
		{"zero plan alignment", abc, plan(0, 200, 0, 100, 0), "alignment"},
		{"huge plan alignment", abc, plan(lifetime.MaxSize*2, 200, 0, 100, 0), "alignment"},
		{"negative arena", abc, plan(1, -1, 0, 100, 0), "arena size"},
		{"negative offset", abc, plan(1, 200, 0, 100, -100), "negative offset"},
		{"misaligned to the plan", abc, plan(64, 256, 0, 128, 1), "plan alignment 64"},
		{"misaligned to the buffer", trace(aligned(buf(100, 0, 4), 48)), plan(1, 200, 32), "its alignment 48"},
		{"overlap", abc, plan(1, 300, 0, 50, 150), "overlap"},
		{"overlap at the same offset", abc, plan(1, 200, 0, 0, 100), "overlap"},
		{"overlap after rounding", trace(buf(100, 0, 4), buf(100, 2, 6)), plan(128, 256, 0, 0), "overlap"},
		{"rounded size beyond the arena", trace(buf(100, 0, 4)), plan(128, 100, 0), "beyond the arena"},
		{"beyond the arena", abc, plan(1, 199, 0, 100, 0), "beyond the arena"},
		{"fixed offset ignored", trace(fixedAt(buf(100, 0, 4), 100)), plan(1, 100, 0), "fixed at 100"},
		{"fixed offset kept", trace(fixedAt(buf(100, 0, 4), 100)), plan(1, 200, 100), ""},
		{"gap without window frees memory", trace(withGaps(buf(100, 0, 10), lifetime.Gap{Start: 2, End: 8}), buf(100, 3, 7)), plan(1, 100, 0, 0), ""},
		{"gap window overlaps", windowed, plan(1, 200, 0, 50), "overlap"},
		// The first buffer at 60 spans [60, 160) outside its gap, where
		// the second is dead, and only its window [100, 120) inside it.
		{"gap window clear, body overlaps outside the gap", windowed, plan(1, 200, 60, 0), ""},
		{"gap window clear above", windowed, plan(1, 160, 0, 60), ""},
		{"malformed trace", trace(buf(100, 4, 4)), plan(1, 100, 0), "empty"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := Check(tc.tr, tc.p)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("valid plan rejected: %v", err)
			case tc.want != "" && err == nil:
				t.Fatalf("invalid plan accepted, want an error about %q", tc.want)
			case tc.want != "" && !strings.Contains(err.Error(), tc.want):
				t.Fatalf("error %q does not say %q", err, tc.want)
			}
			if tc.p != nil && tc.tr.Validate() == nil {
				if o := oracleCheck(tc.tr, tc.p); (o == nil) != (err == nil) {
					t.Fatalf("oracle disagrees: Check %v, oracle %v", err, o)
				}
			}
		})
	}
}

// TestCheckAgainstOracle mutates valid plans of random traces at random
// and requires Check to reject exactly the plans the brute-force oracle
// rejects.
func TestCheckAgainstOracle(t *testing.T) {
	rounds := 20000
	if testing.Short() {
		rounds = 2000
	}
	rng := rand.New(rand.NewPCG(5, 6))
	aligns := []int64{1, 2, 8, 256}
	var valid, invalid int
	for k := 0; k < rounds; k++ {
		align := aligns[rng.IntN(len(aligns))]
		tr := genTrace(rng, genOptions{maxBuffers: 12, maxTime: 12, align: align})
		p, err := Run(context.Background(), "bestfit", tr, Options{Align: align, Workers: 1})
		if err != nil {
			t.Fatal(err)
		}
		p.Offsets = mutateOffsets(rng, tr, p, align)
		if rng.IntN(4) == 0 {
			p.Arena += rng.Int64N(2*align+1) - align // maybe too small
		}
		got, want := Check(tr, p), oracleCheck(tr, p)
		if (got == nil) != (want == nil) {
			t.Fatalf("round %d: Check says %v, the oracle %v\nplan %+v\n%s", k, got, want, p, dumpTrace(tr))
		}
		if got == nil {
			valid++
		} else {
			invalid++
		}
	}
	t.Logf("%d plans: %d valid, %d invalid", rounds, valid, invalid)
	if valid < rounds/10 || invalid < rounds/10 {
		t.Fatal("the mutations no longer give a mix of valid and invalid plans")
	}
}

func mutateOffsets(rng *rand.Rand, tr *lifetime.Trace, p *Plan, align int64) []int64 {
	offs := append([]int64(nil), p.Offsets...)
	n := len(offs)
	if n == 0 {
		return offs
	}
	for m := rng.IntN(3); m > 0; m-- {
		i := rng.IntN(n)
		switch rng.IntN(7) {
		case 0: // anywhere, aligned to the plan
			offs[i] = align * rng.Int64N(p.Arena/align+1)
		case 1: // on top of another buffer
			offs[i] = offs[rng.IntN(n)]
		case 2: // one alignment step either way
			offs[i] += align * (2*rng.Int64N(2) - 1)
		case 3: // misaligned
			offs[i] += 1 + rng.Int64N(align)
		case 4: // swap two
			j := rng.IntN(n)
			offs[i], offs[j] = offs[j], offs[i]
		case 5: // negative
			offs[i] = -align
		case 6: // just above the arena's top
			offs[i] = ArenaSize(tr, offs, align)
		}
	}
	return offs
}

// TestZeroValueBuffers plans a trace written as a Go literal with nothing
// but sizes and lifetimes: the zero value of Fixed/Hint means "free to
// place", and an impossible fixed layout is reported with the buffers'
// own names, not the name of the pass that found it.
func TestZeroValueBuffers(t *testing.T) {
	tr := &lifetime.Trace{Name: "lit", Buffers: []lifetime.Buffer{
		{ID: 0, Size: 100, Start: 0, End: 2},
		{ID: 1, Size: 100, Start: 1, End: 3},
	}}
	for _, algo := range Names() {
		p, err := Run(context.Background(), algo, tr, Options{Workers: 1})
		if err != nil {
			t.Fatalf("%s: %v", algo, err)
		}
		if p.Arena != 512 {
			t.Errorf("%s: arena %d, want 512 (two 256-byte buffers side by side)", algo, p.Arena)
		}
	}
	fixed := &lifetime.Trace{Name: "lit", Buffers: []lifetime.Buffer{
		{ID: 0, Size: 100, Start: 0, End: 2, Fixed: 0, HasFixed: true},
		{ID: 1, Name: "kv", Size: 100, Start: 1, End: 3, Fixed: 0, HasFixed: true},
	}}
	for _, algo := range Names() {
		_, err := Run(context.Background(), algo, fixed, Options{Workers: 1})
		if err == nil {
			t.Fatalf("%s: overlapping fixed buffers planned", algo)
		}
		msg := err.Error()
		if !strings.Contains(msg, "buffer 1 (kv) and buffer 0 overlap") {
			t.Errorf("%s: %q does not name the buffers as the trace does", algo, msg)
		}
		for _, internal := range []string{"bysize", "bestfit", "auto:", "check:", "()"} {
			if strings.Contains(msg, internal) {
				t.Errorf("%s: %q names an internal pass or an empty name (%q)", algo, msg, internal)
			}
		}
	}
	stale := &lifetime.Trace{Name: "lit", Buffers: []lifetime.Buffer{{ID: 0, Size: 1, Start: 0, End: 1, Fixed: -1}}}
	if _, err := Run(context.Background(), "bysize", stale, Options{}); err == nil || !strings.Contains(err.Error(), "HasFixed is false") {
		t.Errorf("a Fixed offset without HasFixed: err = %v, want a refusal", err)
	}
}

// TestOptionsValidate: bad options are refused by every planning call,
// never quietly replaced by a default.
func TestOptionsValidate(t *testing.T) {
	tr := trace(buf(100, 0, 2), buf(100, 1, 3))
	cases := []struct {
		name string
		opt  Options
		msg  string // "" for valid
	}{
		{"zero value", Options{}, ""},
		{"align 1", Options{Align: 1}, ""},
		{"align 512", Options{Align: 512}, ""},
		{"align 3", Options{Align: 3}, "Align 3 is not a power of two"},
		{"align -8", Options{Align: -8}, "Align -8"},
		{"align too big", Options{Align: MaxAlign * 2}, "Align"},
		{"negative workers", Options{Workers: -1}, "Workers -1"},
		{"negative budget", Options{Budget: -time.Second}, "Budget -1s"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.opt.Validate()
			if c.msg == "" {
				if err != nil {
					t.Fatalf("Validate = %v, want nil", err)
				}
				if _, err := Run(context.Background(), BySize, tr, c.opt); err != nil {
					t.Fatalf("Run = %v", err)
				}
				return
			}
			if err == nil || !errors.Is(err, ErrOptions) || !strings.Contains(err.Error(), c.msg) {
				t.Fatalf("Validate = %v, want ErrOptions saying %q", err, c.msg)
			}
			for name, call := range map[string]func() error{
				"Run": func() error { _, err := Run(context.Background(), BySize, tr, c.opt); return err },
				"RunGrouped": func() error {
					_, _, err := RunGrouped(context.Background(), BySize, tr, c.opt, func(*lifetime.Buffer) string { return "" }, nil, 0)
					return err
				},
				"PlanFamily": func() error {
					_, err := PlanFamily(context.Background(), BySize, []Member{{Name: "m", Trace: tr}}, c.opt)
					return err
				},
			} {
				if err := call(); !errors.Is(err, ErrOptions) {
					t.Errorf("%s = %v, want ErrOptions", name, err)
				}
			}
		})
	}
}

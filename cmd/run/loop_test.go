package main

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"testing"
	"time"
)

// recorder is an engine that records the calls the loop makes.
type recorder struct{ calls []string }

func (r *recorder) Init() error       { r.calls = append(r.calls, "init"); return nil }
func (r *recorder) ResetState() error { r.calls = append(r.calls, "reset"); return nil }
func (r *recorder) Capture() (time.Duration, error) {
	r.calls = append(r.calls, "capture")
	return 0, nil
}
func (r *recorder) Captured() (bool, int) { return true, 1 }
func (r *recorder) Synchronize() error    { r.calls = append(r.calls, "sync"); return nil }

func TestLoopTime(t *testing.T) {
	for _, tc := range []struct {
		name   string
		fresh  bool
		warmup int
		want   []string
	}{
		{"fresh", true, 2, []string{"step 0", "step 1", "reset", "step 0", "step 1", "step 2", "sync"}},
		{"going on", false, 1, []string{"step 0", "sync", "step 0", "step 1", "step 2", "sync"}},
		{"no warm-up", true, 0, []string{"reset", "step 0", "step 1", "step 2", "sync"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &recorder{}
			step := func(s int) error {
				r.calls = append(r.calls, "step "+strconv.Itoa(s))
				return nil
			}
			if _, err := (loop{ctx: context.Background(), en: r, fresh: tc.fresh}).time(tc.warmup, 3, step); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(r.calls, tc.want) {
				t.Errorf("calls %q, want %q", r.calls, tc.want)
			}
		})
	}
}

func TestLoopStops(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	n := 0
	step := func(int) error {
		if n++; n == 2 {
			cancel()
		}
		return nil
	}
	_, err := (loop{ctx: ctx, en: &recorder{}}).time(0, 10, step)
	if !errors.Is(err, context.Canceled) || n != 2 {
		t.Fatalf("after %d steps: %v, want context.Canceled after 2", n, err)
	}
	boom := errors.New("boom")
	if _, err := (loop{ctx: context.Background(), en: &recorder{}}).time(1, 3, func(int) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("a failing warm-up step: %v", err)
	}
}

func TestEagerThenReplay(t *testing.T) {
	r := &recorder{}
	step := func(kind string) func(int) error {
		return func(int) error { r.calls = append(r.calls, kind); return nil }
	}
	reads := 0
	read := func() ([][]byte, error) {
		reads++
		r.calls = append(r.calls, "read")
		return [][]byte{{1, 2}}, nil
	}
	m, err := (loop{ctx: context.Background(), en: r, fresh: true}).eagerThenReplay(1, 1, step("eager"), step("replay"), read)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"eager", "reset", "eager", "sync", "read", "reset", "capture", "replay", "reset", "replay", "sync", "read"}
	if !slices.Equal(r.calls, want) {
		t.Errorf("calls %q, want %q", r.calls, want)
	}
	if !m.equal() || reads != 2 {
		t.Errorf("equal %v after %d reads", m.equal(), reads)
	}
	if equalAll([][]byte{{1}}, [][]byte{{1}, {2}}) || equalAll([][]byte{{1}}, [][]byte{{2}}) || !equalAll(nil, nil) {
		t.Error("equalAll")
	}
}

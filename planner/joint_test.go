package planner

import (
	"strings"
	"testing"
)

// TestJoin lays two windows on one timeline with every kind of crossing
// and checks each joint lifetime against the rule that made it.
func TestJoin(t *testing.T) {
	a := chainTrace("a",
		cbuf("w", "weight", 100, 0, 4), // 0: whole
		cbuf("x", "", 100, 1, 3),       // 1: merged with b.1
		cbuf("h", "", 100, 2, 4),       // 2: handed to b at its tick 2
		cbuf("out", "", 100, 3, 4),     // 3: live at the end: to the end
		cbuf("tmp", "", 100, 0, 1),     // 4: its own
	)
	a.Buffers[4].Gaps = nil
	b := chainTrace("b",
		cbuf("s", "", 50, 10, 12),     // 0: its own, moved
		cbuf("x.in", "", 100, 10, 11), // 1
	)
	windows := []Window{{"a", a}, {"b", b}}
	j, err := Join("j", windows, Crossings{
		Same:         [][]BufferRef{{{0, 1}, {1, 1}}},
		Whole:        func(r BufferRef) bool { return windows[r.Stage].Trace.Buffers[r.Buffer].Tag == "weight" },
		Until:        map[BufferRef]WindowTime{{0, 2}: {1, 11}},
		OutputsToEnd: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	// a spans [0, 4), b [10, 12) moved to [4, 6).
	want := map[string][2]int64{"w": {0, 6}, "x": {1, 5}, "h": {2, 6}, "out": {3, 6}, "tmp": {0, 1}, "s": {4, 6}}
	if len(j.Trace.Buffers) != len(want) {
		t.Fatalf("%d joint buffers, want %d", len(j.Trace.Buffers), len(want))
	}
	for _, jb := range j.Trace.Buffers {
		if w := want[jb.Name]; jb.Start != w[0] || jb.End != w[1] {
			t.Errorf("%s: [%d, %d), want [%d, %d)", jb.Name, jb.Start, jb.End, w[0], w[1])
		}
	}
	if j.Spans[1].Start != 4 || j.Spans[1].End != 6 || j.Spans[1].Joint[1] != j.Spans[0].Joint[1] {
		t.Fatalf("window b: %+v", j.Spans[1])
	}
	offs := make([]int64, len(j.Trace.Buffers))
	for i := range offs {
		offs[i] = int64(i) * 256
	}
	lifted, err := j.Lift([][]int64{j.Offsets(0, offs), j.Offsets(1, offs)})
	if err != nil {
		t.Fatal(err)
	}
	for i := range offs {
		if lifted[i] != offs[i] {
			t.Fatalf("lift(project) moved joint buffer %d from %d to %d", i, offs[i], lifted[i])
		}
	}
	bo := j.Offsets(1, offs)
	bo[1] += 256
	if _, err := j.Lift([][]int64{j.Offsets(0, offs), bo}); err == nil || !strings.Contains(err.Error(), "another window") {
		t.Fatalf("lift of a merged buffer at two offsets: %v", err)
	}

	bad := []struct {
		name string
		c    Crossings
		want string
	}{
		{"size", Crossings{Same: [][]BufferRef{{{0, 1}, {1, 0}}}}, "must match"},
		{"twice", Crossings{Same: [][]BufferRef{{{0, 1}, {1, 1}}, {{0, 1}}}}, "two groups"},
		{"missing", Crossings{Same: [][]BufferRef{{{0, 9}}}}, "does not exist"},
		{"backwards", Crossings{Until: map[BufferRef]WindowTime{{1, 0}: {0, 1}}}, "no later window"},
	}
	for _, c := range bad {
		if _, err := Join("j", windows, c.c); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want %q", c.name, err, c.want)
		}
	}
	if _, err := Join("j", nil, Crossings{}); err == nil {
		t.Error("no windows: no error")
	}
}

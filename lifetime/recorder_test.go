package lifetime

import (
	"reflect"
	"strings"
	"testing"
)

func TestRecorderLifetimes(t *testing.T) {
	r := NewRecorder("step")
	in := r.Alloc(64, Name("input"), Tag("input"))          // t0
	w := r.Alloc(128, Tag("weight"), Align(256), Stream(3)) // t0, named buf1
	r.Tick()                                                // t1
	out := r.Alloc(32, Name("out"))                         // t1
	if err := r.Free(in); err != nil {                      // last read at t1: dead from t2
		t.Fatal(err)
	}
	r.Tick() // t2
	tmp := r.Alloc(16, Name("tmp"))
	if err := r.Free(tmp); err != nil { // born and freed in one tick
		t.Fatal(err)
	}
	if r.Live(in) || r.Live(tmp) || !r.Live(w) || !r.Live(out) || r.Live(99) || r.Live(-1) {
		t.Errorf("Live is wrong")
	}
	if r.Now() != 2 {
		t.Errorf("Now = %d", r.Now())
	}
	tr := r.Trace()
	want := []Buffer{
		{ID: 0, Name: "input", Tag: "input", Size: 64, Start: 0, End: 2},
		{ID: 1, Name: "buf1", Tag: "weight", Size: 128, Align: 256, Stream: 3, Start: 0, End: 3},
		{ID: 2, Name: "out", Size: 32, Start: 1, End: 3},
		{ID: 3, Name: "tmp", Size: 16, Start: 2, End: 3},
	}
	if tr.Name != "step" || !reflect.DeepEqual(tr.Buffers, want) {
		t.Errorf("trace\n got %+v\nwant %+v", tr.Buffers, want)
	}
	if err := tr.Validate(); err != nil {
		t.Error(err)
	}
	// The inputs an operation frees and the outputs it allocates in the same
	// tick overlap: input [0,2) and out [1,3).
	if !Overlaps(tr.Buffers[0].Start, tr.Buffers[0].End, tr.Buffers[2].Start, tr.Buffers[2].End) {
		t.Error("input and out should overlap")
	}
	if lb, at := tr.LowerBound(1); lb != 64+128+32 || at != 1 {
		t.Errorf("LowerBound = %d at %d", lb, at)
	}
	// The returned trace is a copy: recording on does not change it.
	r.Tick()
	r.Alloc(1)
	if len(tr.Buffers) != 4 || tr.Buffers[1].End != 3 {
		t.Error("Trace() result changed after more recording")
	}
}

func TestRecorderErrors(t *testing.T) {
	r := NewRecorder("e")
	a := r.Alloc(8, Name("a"))
	if err := r.Free(a); err != nil {
		t.Fatal(err)
	}
	r.Tick()
	for _, c := range []struct {
		id   ID
		want string
	}{
		{a, "lifetime: double free of buffer 0 (a)"},
		{5, "lifetime: free of unknown buffer id 5"},
		{-1, "lifetime: free of unknown buffer id -1"},
	} {
		err := r.Free(c.id)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Free(%d) = %v, want %q", c.id, err, c.want)
		}
	}
	// A failed free changes nothing: a still ends at 1.
	if tr := r.Trace(); tr.Buffers[0].End != 1 {
		t.Errorf("End = %d after a failed double free, want 1", tr.Buffers[0].End)
	}
}

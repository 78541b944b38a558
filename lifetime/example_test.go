package lifetime_test

import (
	"fmt"

	"github.com/arenaplan/arenaplan/lifetime"
)

// A trace written as a Go literal: the zero value of every optional field
// means "nothing asked for", so sizes and lifetimes are all it takes. A
// fixed offset is asked for explicitly.
func ExampleTrace() {
	tr := &lifetime.Trace{Name: "step", Buffers: []lifetime.Buffer{
		{ID: 0, Name: "weights", Size: 4096, Start: 0, End: 4, Fixed: 0, HasFixed: true},
		{ID: 1, Name: "act", Size: 1000, Start: 0, End: 2},
		{ID: 2, Name: "out", Size: 3000, Start: 1, End: 4},
	}}
	if err := tr.Validate(); err != nil {
		fmt.Println(err)
		return
	}
	peak, at := tr.LowerBound(256)
	start, end := tr.Span()
	fmt.Printf("%d buffers over [%d, %d): lower bound %d bytes at time %d\n", len(tr.Buffers), start, end, peak, at)
	// Output:
	// 3 buffers over [0, 4): lower bound 8192 bytes at time 1
}

// A dry run records allocations as they happen; Tick advances logical
// time, so a buffer freed before a Tick and one allocated after it may
// share memory.
func ExampleRecorder() {
	rec := lifetime.NewRecorder("mlp")
	x := rec.Alloc(1<<20, lifetime.Name("x"), lifetime.Tag("input"))
	h := rec.Alloc(4<<20, lifetime.Name("h"))
	rec.Free(x)
	rec.Tick()
	y := rec.Alloc(1<<20, lifetime.Name("y"), lifetime.Tag("output"))
	rec.Free(h)
	rec.Tick()
	rec.Free(y)
	tr := rec.Trace()
	for _, b := range tr.Buffers {
		fmt.Printf("%s %q: %d bytes, [%d, %d)\n", b.Name, b.Tag, b.Size, b.Start, b.End)
	}
	peak, _ := tr.LowerBound(256)
	fmt.Println("lower bound", peak)
	// Output:
	// x "input": 1048576 bytes, [0, 1)
	// h "": 4194304 bytes, [0, 2)
	// y "output": 1048576 bytes, [1, 3)
	// lower bound 5242880
}

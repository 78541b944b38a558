package spill

import (
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/arenaplan/arenaplan/cuda"
)

// twoStreams is a capture on s1 with a side stream s2 that forks from and
// joins back into s1 through events.
type twoStreams struct {
	t      *testing.T
	e      *env
	s      *Allocator
	s1, s2 cuda.Stream
	ev     cuda.Event
}

func newTwoStreams(t *testing.T, e *env, s *Allocator) *twoStreams {
	ev, err := e.Dev.NewEvent(false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ev.Close() })
	return &twoStreams{t: t, e: e, s: s, s1: e.Stream(t), s2: e.Stream(t), ev: ev}
}

// use enqueues work on st that writes the first word of p: one node.
func (c *twoStreams) use(st cuda.Stream, p cuda.DevicePtr, v uint32) {
	c.t.Helper()
	if err := c.e.Dev.Memset32(p, v, 1, st); err != nil {
		c.t.Fatal(err)
	}
}

// order makes later work on to wait for what was enqueued on from so far.
func (c *twoStreams) order(from, to cuda.Stream) {
	c.t.Helper()
	if err := c.ev.Record(from); err != nil {
		c.t.Fatal(err)
	}
	if err := to.WaitEvent(c.ev); err != nil {
		c.t.Fatal(err)
	}
}

func (c *twoStreams) fork() { c.order(c.s1, c.s2) }
func (c *twoStreams) join() { c.order(c.s2, c.s1) }

// captureCases are the cases of PyTorch PR #158352/#162186 for a block x
// allocated on s1 and also used on s2 (RecordStream), freed during the
// capture. Each returns what it observed: for every allocation it checks,
// whether it got x's address back.
var captureCases = []struct {
	name string
	// run does the case after x was allocated on s1, used on s1 and s2
	// (s2 forked from s1) and recorded on s2. scratch is a block of the
	// default pool for unrelated work. It returns, per probe allocation,
	// whether it reused x.
	run func(c *twoStreams, x, scratch cuda.DevicePtr) []bool
	// reuse: expected probes with capture-time reuse on; off: with it off.
	reuse, off []bool
}{
	{
		// Case 0: the frees on s1 and s2 are not ordered before s1's
		// terminal (s2 has not joined): not reusable on s1.
		name: "0-unordered-frees",
		run: func(c *twoStreams, x, _ cuda.DevicePtr) []bool {
			c.free(x)
			got := c.probe(c.s1, x)
			c.join()
			return []bool{got}
		},
		reuse: []bool{false}, off: []bool{false},
	},
	{
		// Case 1: s2 joins s1 after the free: both markers precede s1's
		// terminal, so x is reusable on s1.
		name: "1-ordered-frees",
		run: func(c *twoStreams, x, _ cuda.DevicePtr) []bool {
			c.free(x)
			c.join()
			return []bool{c.probe(c.s1, x)}
		},
		reuse: []bool{true}, off: []bool{false},
	},
	{
		// Case 2: s2's terminal follows both markers too, but x belongs
		// to s1: it is never handed to s2 (the unreachable case), and
		// s1 still gets it.
		name: "2-cross-stream",
		run: func(c *twoStreams, x, _ cuda.DevicePtr) []bool {
			c.free(x)
			c.join()
			c.fork()
			on2 := c.probe(c.s2, x)
			c.join()
			return []bool{on2, c.probe(c.s1, x)}
		},
		reuse: []bool{false, true}, off: []bool{false, false},
	},
	{
		// Case 3: the strong rule holds (every stream's terminal follows
		// every marker); the per-stream rule suffices for s1.
		name: "3-strong-rule",
		run: func(c *twoStreams, x, _ cuda.DevicePtr) []bool {
			c.free(x)
			c.join()
			c.fork()
			got := c.probe(c.s1, x)
			c.join()
			return []bool{got}
		},
		reuse: []bool{true}, off: []bool{false},
	},
	{
		// Case 4: x is freed after s2 joined, while s2 goes on with other
		// work: s2's marker is that later work, so x waits for the next
		// join (the missed opportunity the design accepts).
		name: "4-free-after-join",
		run: func(c *twoStreams, x, scratch cuda.DevicePtr) []bool {
			c.join()
			c.use(c.s2, scratch, 4)
			c.free(x)
			first := c.probe(c.s1, x)
			c.join()
			return []bool{first, c.probe(c.s1, x)}
		},
		reuse: []bool{false, true}, off: []bool{false, false},
	},
}

func (c *twoStreams) free(p cuda.DevicePtr) {
	c.t.Helper()
	if err := c.s.Free(p); err != nil {
		c.t.Fatal(err)
	}
}

// probe allocates x's size on st, uses the block, and reports whether it
// is x. The block stays allocated.
func (c *twoStreams) probe(st cuda.Stream, x cuda.DevicePtr) bool {
	c.t.Helper()
	p := mustAlloc(c.t, c.s, captureBlock, st)
	c.use(st, p, 9)
	return p == x
}

// captureBlock is the size of x: one chunk, so that a probe either gets x
// back or needs a new segment.
const captureBlock = 2 * MiB

func TestSpillCaptureCases(t *testing.T) {
	for _, reuse := range []bool{true, false} {
		for _, cc := range captureCases {
			t.Run(fmt.Sprintf("%s/reuse=%v", cc.name, reuse), func(t *testing.T) {
				runCaptureCase(t, newSimEnv(t, 1*GiB), cc.run, cc.reuse, cc.off, reuse)
			})
		}
	}
}

func runCaptureCase(t *testing.T, e *env, run func(*twoStreams, cuda.DevicePtr, cuda.DevicePtr) []bool, wantOn, wantOff []bool, reuse bool) {
	s := newSpill(t, e, WithCaptureReuse(reuse))
	c := newTwoStreams(t, e, s)
	scratch := mustAlloc(t, s, 4096, c.s2)
	capt, err := s.BeginCapture(c.s1, cuda.CaptureModeGlobal, nil)
	if err != nil {
		t.Fatal(err)
	}
	x := mustAlloc(t, s, captureBlock, c.s1)
	c.use(c.s1, x, 1)
	c.fork()
	c.use(c.s2, x, 2)
	if err := s.RecordStream(x, c.s2); err != nil {
		t.Fatal(err)
	}
	got := run(c, x, scratch)
	mustValid(t, s)
	st := s.Stats()
	g, err := capt.End()
	if err != nil {
		t.Fatalf("End: %v", err)
	}
	defer g.Close()
	want := wantOff
	if reuse {
		want = wantOn
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("reused x: %v, want %v", got, want)
	}
	reused := 0
	for _, r := range got {
		if r {
			reused++
		}
	}
	if st.CaptureReuses != uint64(reused) {
		t.Errorf("stats count %d capture-time reuses, probes saw %d", st.CaptureReuses, reused)
	}
	// After End nothing waits any more, and the graph replays.
	mustValid(t, s)
	if st := s.Stats(); st.Waiting != 0 {
		t.Errorf("%d bytes still waiting after End", st.Waiting)
	}
	x2, err := g.Instantiate(0)
	if err != nil {
		t.Fatal(err)
	}
	defer x2.Close()
	if err := x2.Launch(c.s1); err != nil {
		t.Fatal(err)
	}
	if err := c.s1.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if err := capt.Release(); err != nil {
		t.Fatal(err)
	}
	mustFree(t, s, scratch)
}

// TestSpillPrivatePools: a graph's memory stays mapped until the graph is
// released; a shared pool hands a block one capture freed to the next
// capture; the default pool never sees private blocks.
func TestSpillPrivatePools(t *testing.T) { testPrivatePools(t, newSimEnv(t, 1*GiB)) }

func testPrivatePools(t *testing.T, e *env) {
	s := newSpill(t, e)
	st := e.Stream(t)
	pool, err := s.NewSharedPool()
	if err != nil {
		t.Fatal(err)
	}
	capture := func(f func()) (*Capture, cuda.Graph) {
		t.Helper()
		c, err := s.BeginCapture(st, cuda.CaptureModeGlobal, pool)
		if err != nil {
			t.Fatal(err)
		}
		f()
		g, err := c.End()
		if err != nil {
			t.Fatal(err)
		}
		return c, g
	}
	var tmpA, outA, tmpB cuda.DevicePtr
	ca, ga := capture(func() {
		tmpA = mustAlloc(t, s, 1*MiB, st)
		outA = mustAlloc(t, s, 1*MiB, st)
		if err := e.Dev.Memset32(tmpA, 1, 1, st); err != nil {
			t.Fatal(err)
		}
		mustFree(t, s, tmpA) // no other stream: reusable at once
	})
	defer ga.Close()
	// Outside captures: the default pool, never the private block.
	d := mustAlloc(t, s, 1*MiB, st)
	if d == tmpA {
		t.Error("the default pool handed out a private pool's block")
	}
	mustFree(t, s, d)
	cb, gb := capture(func() {
		tmpB = mustAlloc(t, s, 1*MiB, st)
	})
	defer gb.Close()
	if tmpB != tmpA {
		t.Errorf("second capture into the shared pool got %#x, want the block the first freed (%#x)", tmpB, tmpA)
	}
	mustFree(t, s, tmpB)
	mustFree(t, s, outA)
	mapped := s.Stats().Mapped
	if err := s.EmptyCache(); err != nil {
		t.Fatal(err)
	}
	if got := s.Stats().Mapped; got != mapped-2*MiB {
		t.Errorf("EmptyCache left %d mapped, want %d: only the default pool's segment may go", got, mapped-2*MiB)
	}
	// Graphs released, the owner still holds the pool: memory stays.
	for _, c := range []*Capture{ca, cb} {
		if err := c.Release(); err != nil {
			t.Fatal(err)
		}
	}
	s.EmptyCache()
	if s.Stats().Mapped == 0 {
		t.Error("pool memory unmapped while its owner holds it")
	}
	if err := pool.Release(); err != nil {
		t.Fatal(err)
	}
	if err := s.EmptyCache(); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Mapped != 0 {
		t.Errorf("after releasing everything %d bytes mapped", st.Mapped)
	}
	mustValid(t, s)
}

// TestSpillGrowInCapture: a global-mode capture grows the allocator by
// mapping memory (no cuMemAlloc), stays valid, and its graph replays over
// the new memory; a block a stream outside the capture used waits for the
// end of the capture and then for an event.
func TestSpillGrowInCapture(t *testing.T) { testGrowInCapture(t, newSimEnv(t, 1*GiB)) }

func testGrowInCapture(t *testing.T, e *env) {
	s := newSpill(t, e)
	st, other := e.Stream(t), e.Stream(t)
	outside := mustAlloc(t, s, 4096, other)
	c, err := s.BeginCapture(st, cuda.CaptureModeGlobal, nil)
	if err != nil {
		t.Fatal(err)
	}
	const n = 1 << 18 // words: 1 MiB
	src := mustAlloc(t, s, 4*n, st)
	dst := mustAlloc(t, s, 4*n, st)
	big := mustAlloc(t, s, 8*MiB, st)
	if err := e.Dev.Memset32(src, 41, n, st); err != nil {
		t.Fatal(err)
	}
	if err := e.LaunchAdd(st, dst, src, 1, n); err != nil {
		t.Fatal(err)
	}
	if err := e.Dev.Memset32(big, 5, 2*MiB, st); err != nil {
		t.Fatal(err)
	}
	// A block of the default pool used by a stream outside the capture.
	if err := s.RecordStream(outside, st); err != nil {
		t.Fatal(err)
	}
	mustFree(t, s, outside)
	if w := s.Stats().Waiting; w != 4096 {
		t.Errorf("waiting %d during capture, want 4096", w)
	}
	g, err := c.End()
	if err != nil {
		t.Fatalf("capture that grew the allocator: %v", err)
	}
	defer g.Close()
	x, err := g.Instantiate(0)
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	if err := x.Launch(st); err != nil {
		t.Fatal(err)
	}
	if err := st.Synchronize(); err != nil {
		t.Fatal(err)
	}
	out := make([]byte, 4*n)
	if err := e.Dev.CopyDtoH(out, dst); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		if v := binary.LittleEndian.Uint32(out[4*i:]); v != 42 {
			t.Fatalf("dst[%d] = %d after replay, want 42", i, v)
		}
	}
	// The waiting block comes back once its event completed.
	if err := other.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if p := mustAlloc(t, s, 4096, other); p != outside {
		t.Errorf("block used outside the capture not reused after it: %#x, want %#x", p, outside)
	}
	mustValid(t, s)
	if st := s.Stats(); st.Waiting != 0 || st.Grows < 3 {
		t.Errorf("stats %+v", st)
	}
	for _, p := range []cuda.DevicePtr{src, dst, big} {
		mustFree(t, s, p)
	}
	if err := c.Release(); err != nil {
		t.Fatal(err)
	}
}

package spill

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/arenaplan/arenaplan/cuda"
	"github.com/arenaplan/arenaplan/cuda/devtest"
)

const (
	KiB = 1 << 10
	MiB = 1 << 20
	GiB = 1 << 30
)

// env is the device a test runs on: the simulation, or the driver
// (gpu_test.go).
type env = devtest.Env

func newSimEnv(t testing.TB, total uint64) *env { return devtest.NewSim(t, total) }

// validate checks every invariant of the allocator's state: segments are
// tiled exactly by their blocks, free neighbours are coalesced, free
// blocks (and only they) are in their trees, live blocks are in the live
// map, the counters add up, and segments and free address runs tile the
// reservation.
func (s *Allocator) validate() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var mapped, inUse, waiting uint64
	live, free := 0, 0
	type span struct{ lo, hi uint64 }
	var spans []span
	for seg := range s.segments {
		mapped += seg.size
		spans = append(spans, span{uint64(seg.addr - s.base), uint64(seg.addr-s.base) + seg.reserved()})
		var tail uint64
		for _, p := range seg.tail {
			tail += p.size
		}
		if seg.va != 0 && (seg.size > seg.va || tail >= seg.size) || seg.va == 0 && len(seg.tail) > 0 {
			return fmt.Errorf("segment %#x: %d bytes mapped (%d by extensions) of %d reserved", seg.addr, seg.size, tail, seg.va)
		}
		if s.mids[seg] != (seg.va != 0) {
			return fmt.Errorf("segment %#x: %d bytes of addresses reserved, among the mid segments: %v", seg.addr, seg.va, s.mids[seg])
		}
		at := uint64(seg.addr)
		var prev *block
		for b := seg.first; b != nil; b = b.next {
			switch {
			case b.seg != seg:
				return fmt.Errorf("block %#x: wrong segment", b.addr)
			case b.addr != at:
				return fmt.Errorf("segment %#x: block at %#x, expected %#x", seg.addr, b.addr, at)
			case b.prev != prev:
				return fmt.Errorf("block %#x: bad prev link", b.addr)
			case b.size == 0 || b.size%MinBlock != 0:
				return fmt.Errorf("block %#x: size %d", b.addr, b.size)
			}
			switch b.state {
			case stFree:
				if seg.doomed {
					if !slices.ContainsFunc(s.doomed, func(d doomed) bool { return d.seg == seg }) {
						return fmt.Errorf("segment %#x is marked doomed and is not in the doomed list", seg.addr)
					}
					if b.prev != nil || b.next != nil || seg.pool.refs > 0 {
						return fmt.Errorf("doomed segment %#x: blocks still allocated, or its pool held", seg.addr)
					}
					break
				}
				free++
				if prev != nil && prev.state == stFree {
					return fmt.Errorf("blocks %#x and %#x are free neighbours, not coalesced", prev.addr, b.addr)
				}
				if seg.key != freeKey(seg.handle, seg.small) {
					return fmt.Errorf("segment %#x: free-list key %#x", seg.addr, seg.key)
				}
				if t := seg.pool.free[seg.key]; t == nil || !t.Has(b) {
					return fmt.Errorf("free block %#x is not in its tree", b.addr)
				}
			case stAllocated:
				live++
				inUse += b.size
				if s.live[cuda.DevicePtr(b.addr)] != b {
					return fmt.Errorf("allocated block %#x is not in the live map", b.addr)
				}
			case stDeferred, stPending:
				waiting += b.size
			}
			at += b.size
			prev = b
		}
		if at != uint64(seg.addr)+seg.size {
			return fmt.Errorf("segment %#x: blocks end at %#x, segment at %#x", seg.addr, at, uint64(seg.addr)+seg.size)
		}
	}
	inTrees := 0
	for p := range s.pools {
		for h, t := range p.free {
			if t.Len() == 0 && !hasSegment(s, p, h) {
				return fmt.Errorf("%s keeps an empty free list for stream %#x, which has no segment", p, h)
			}
			var err error
			t.Ascend(func(b *block) bool {
				inTrees++
				if b.state != stFree || b.seg.pool != p || b.seg.key != h || !s.segments[b.seg] {
					err = fmt.Errorf("tree of %s holds block %#x (state %d) of another pool, stream, size class or a dead segment", p, b.addr, b.state)
				}
				return err == nil
			})
			if err != nil {
				return err
			}
		}
	}
	if inTrees != free {
		return fmt.Errorf("%d blocks in trees, %d free blocks", inTrees, free)
	}
	for seg := range s.mids {
		if !s.segments[seg] {
			return fmt.Errorf("mid segment %#x is not among the segments", seg.addr)
		}
	}
	if live != len(s.live) || live != s.st.Live {
		return fmt.Errorf("%d allocated blocks, live map %d, stats %d", live, len(s.live), s.st.Live)
	}
	if mapped != s.st.Mapped || inUse != s.st.InUse || waiting != s.st.Waiting || len(s.segments) != s.st.Segments {
		return fmt.Errorf("stats %+v, blocks say mapped %d in use %d waiting %d segments %d",
			s.st, mapped, inUse, waiting, len(s.segments))
	}
	for lo, hi := range s.vaFree.All() {
		spans = append(spans, span{lo, hi})
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].lo < spans[j].lo })
	at := uint64(0)
	for _, r := range spans {
		if r.lo != at || r.hi <= r.lo {
			return fmt.Errorf("address space not tiled at %#x: next span [%#x, %#x)", at, r.lo, r.hi)
		}
		at = r.hi
	}
	if at != s.cfg.addressSpace {
		return fmt.Errorf("address space tiled up to %#x of %#x", at, s.cfg.addressSpace)
	}
	return nil
}

func newSpill(t testing.TB, e *env, opts ...Option) *Allocator {
	t.Helper()
	s, err := New(e.Dev, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func mustAlloc(t testing.TB, s *Allocator, size uint64, st cuda.Stream) cuda.DevicePtr {
	t.Helper()
	p, err := s.Alloc(size, st)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func mustFree(t testing.TB, s *Allocator, p cuda.DevicePtr) {
	t.Helper()
	if err := s.Free(p); err != nil {
		t.Fatal(err)
	}
}

func mustValid(t testing.TB, s *Allocator) {
	t.Helper()
	if err := s.validate(); err != nil {
		t.Fatal(err)
	}
}

func TestSpillBestFitSplitCoalesce(t *testing.T) {
	e := newSimEnv(t, 1*GiB)
	s := newSpill(t, e)
	st := e.Stream(t)
	a := mustAlloc(t, s, 1000, st)
	b := mustAlloc(t, s, 1024, st)
	c := mustAlloc(t, s, 1, st)
	if b != a+1024 || c != b+1024 {
		t.Errorf("blocks not split in order: %#x %#x %#x", a, b, c)
	}
	if st := s.Stats(); st.Segments != 1 || st.Mapped != 2*MiB || st.InUse != 2560 || st.Requested != 2025 {
		t.Errorf("stats %+v", st)
	}
	mustFree(t, s, b)
	// Best fit: the 1 KiB hole beats the rest of the segment.
	if d := mustAlloc(t, s, 600, st); d != b {
		t.Errorf("600 B went to %#x, want the hole at %#x", d, b)
	}
	mustValid(t, s)
	for _, p := range []cuda.DevicePtr{a, b, c} {
		mustFree(t, s, p)
	}
	mustValid(t, s)
	if st := s.Stats(); st.InUse != 0 || st.Cached != 2*MiB || st.PeakInUse != 2560 {
		t.Errorf("stats after freeing all %+v", st)
	}
	// Everything coalesced: the largest small request fits without growing.
	if p := mustAlloc(t, s, SmallBlock, st); p != a || s.Stats().Segments != 1 {
		t.Errorf("1 MiB after coalescing at %#x (segments %d), want %#x", p, s.Stats().Segments, a)
	} else {
		mustFree(t, s, p)
	}
	// A large request never takes a small segment's space, nor a small
	// request a large segment's.
	held := mustAlloc(t, s, 1000, st) // the small segment is not wholly free: it stays (see makeRoom)
	big := mustAlloc(t, s, SmallBlock+MinBlock, st)
	if st := s.Stats(); st.Segments != 2 || st.Mapped != 2*MiB+2*MiB {
		t.Errorf("1 MiB + 512 B beside a small segment with room: %+v, want a second segment mapping one chunk", st)
	}
	mustFree(t, s, big)
	mustFree(t, s, held)
	mustValid(t, s)
	if err := s.EmptyCache(); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Mapped != 0 || st.Segments != 0 || e.Free(t) != 1*GiB {
		t.Errorf("after EmptyCache: %+v, device free %d", st, e.Free(t))
	}
	mustValid(t, s)
	// Requests of at most MidBlock share segments of MidSegment's
	// addresses, mapped as they are needed: a second one extends the
	// first one's segment in place, using the rest of its last chunk.
	big = mustAlloc(t, s, 5*MiB+1, st)
	mid := mustAlloc(t, s, 3*MiB, st)
	if st := s.Stats(); st.Mapped != 10*MiB || st.Segments != 1 || mid != big+5*MiB+MinBlock {
		t.Errorf("5 MiB+1 and 3 MiB: %+v, the second at %#x; want one segment mapping 10 MiB, the second at %#x", st, mid, big+5*MiB+MinBlock)
	}
	mustFree(t, s, mid)
	// Larger requests take a segment of their own, rounded to the chunk.
	huge := mustAlloc(t, s, MidSegment+1, st)
	if st := s.Stats(); st.Mapped != 10*MiB+MidSegment+2*MiB {
		t.Errorf("MidSegment+1 beside it mapped %d", st.Mapped)
	}
	mustFree(t, s, huge)
	mustFree(t, s, big)
	mustValid(t, s)
}

// TestSpillMidSegmentNearTheLimit: a mid segment maps only what its
// blocks need, so requests of at most MidBlock fill a limit exactly, and
// the one that would pass it fails as out of memory.
func TestSpillMidSegmentNearTheLimit(t *testing.T) {
	e := newSimEnv(t, 1*GiB)
	s := newSpill(t, e, WithLimit(16*MiB))
	st := e.Stream(t)
	p := mustAlloc(t, s, 5*MiB, st)
	if got := s.Stats(); got.Mapped != 6*MiB {
		t.Errorf("5 MiB under a 16 MiB limit: %d mapped, want 6 MiB", got.Mapped)
	}
	q := mustAlloc(t, s, 9*MiB, st)
	if got := s.Stats(); got.Mapped != 14*MiB || got.Segments != 1 {
		t.Errorf("and 9 MiB: %+v, want 14 MiB mapped in one segment", got)
	}
	r := mustAlloc(t, s, 2*MiB, st)
	if got := s.Stats(); got.Mapped != 16*MiB {
		t.Errorf("and 2 MiB: %d mapped, want 16 MiB", got.Mapped)
	}
	if _, err := s.Alloc(2*MiB, st); !errors.Is(err, ErrOutOfMemory) {
		t.Errorf("2 MiB more past the limit: %v, want ErrOutOfMemory", err)
	}
	for _, x := range []cuda.DevicePtr{r, q, p} {
		mustFree(t, s, x)
	}
	mustValid(t, s)
}

// TestSpillMidSegmentExtends: a mid segment grows in place up to
// MidSegment of addresses, only for its own stream; a request it cannot
// take starts another; EmptyCache gives every mapping back.
func TestSpillMidSegmentExtends(t *testing.T) {
	e := newSimEnv(t, 1*GiB)
	s := newSpill(t, e)
	st, other := e.Stream(t), e.Stream(t)
	var held []cuda.DevicePtr
	for i := range 6 { // 6 × 3 MiB: 18 MiB of MidSegment's 20
		p := mustAlloc(t, s, 3*MiB, st)
		if i > 0 && p != held[i-1]+3*MiB {
			t.Errorf("request %d at %#x, want %#x (in place after the one before)", i, p, held[i-1]+3*MiB)
		}
		held = append(held, p)
		mustValid(t, s)
	}
	if got := s.Stats(); got.Segments != 1 || got.Mapped != 18*MiB {
		t.Errorf("six 3 MiB requests: %+v, want one segment mapping 18 MiB", got)
	}
	// Another stream's request does not take this stream's segment.
	o := mustAlloc(t, s, 2*MiB, other)
	if got := s.Stats(); got.Segments != 2 {
		t.Errorf("another stream's 2 MiB: %d segments, want 2", got.Segments)
	}
	// 3 MiB more would pass MidSegment's addresses: a new segment.
	n := mustAlloc(t, s, 3*MiB, st)
	if got := s.Stats(); got.Segments != 3 || got.Mapped != 18*MiB+2*MiB+4*MiB || n >= held[0] && n < held[0]+MidSegment {
		t.Errorf("a seventh 3 MiB request: %+v at %#x, want a third segment", got, n)
	}
	// Freed, the extended segment is one free block; the next request
	// of its stream reuses it from its start.
	for _, p := range held {
		mustFree(t, s, p)
	}
	mustValid(t, s)
	if p := mustAlloc(t, s, 10*MiB, st); p != held[0] {
		t.Errorf("10 MiB after freeing the segment at %#x, want %#x", p, held[0])
	} else {
		mustFree(t, s, p)
	}
	mustFree(t, s, n)
	mustFree(t, s, o)
	if err := s.EmptyCache(); err != nil {
		t.Fatal(err)
	}
	if got := s.Stats(); got.Mapped != 0 || got.Segments != 0 || e.Free(t) != 1*GiB {
		t.Errorf("after EmptyCache: %+v, device free %d", got, e.Free(t))
	}
	mustValid(t, s)
}

// TestSpillAllocDefaultWithoutGrowing: told not to grow, AllocDefault
// serves what fits in the mapped segments and says ErrWouldGrow, mapping
// nothing, where nothing fits.
func TestSpillAllocDefaultWithoutGrowing(t *testing.T) {
	e := newSimEnv(t, 1*GiB)
	s := newSpill(t, e)
	st := e.Stream(t)
	a := mustAlloc(t, s, 1*MiB, st)
	if p, def, err := s.AllocDefault(512*KiB, st, false); err != nil || !def || p != a+1*MiB {
		t.Fatalf("512 KiB in the mapped segment: %#x (default pool %v), %v; want %#x", p, def, err, a+1*MiB)
	}
	_, _, err := s.AllocDefault(1*MiB, st, false)
	if !errors.Is(err, ErrWouldGrow) || errors.Is(err, ErrOutOfMemory) {
		t.Fatalf("1 MiB more without growing: %v, want ErrWouldGrow", err)
	}
	if got := s.Stats(); got.Mapped != 2*MiB || got.Allocs != 2 {
		t.Fatalf("after a refused growth: %+v, want 2 MiB mapped and 2 allocations", got)
	}
	mustFree(t, s, a)
	if p, _, err := s.AllocDefault(1*MiB, st, false); err != nil || p != a {
		t.Fatalf("1 MiB after the free: %#x, %v; want %#x", p, err, a)
	}
	if p, _, err := s.AllocDefault(1*MiB, st, true); err != nil || s.Stats().Mapped != 4*MiB {
		t.Fatalf("growing: %#x, %v, %d mapped", p, err, s.Stats().Mapped)
	}
	mustValid(t, s)
}

// TestSpillSizeClassesNeverFailWhatFits: small and large requests keep to
// segments of their own while memory can be mapped; at the limit, a
// request that fits in a free block of the other class takes it rather
// than fail.
func TestSpillSizeClassesNeverFailWhatFits(t *testing.T) {
	e := newSimEnv(t, 1*GiB)
	s := newSpill(t, e, WithLimit(4*MiB))
	st := e.Stream(t)
	big := mustAlloc(t, s, 3*MiB, st) // a 4 MiB segment: the limit
	small := mustAlloc(t, s, 4*KiB, st)
	if got := s.Stats(); got.Mapped != 4*MiB || small < big || small >= big+4*MiB {
		t.Fatalf("4 KiB at the limit: at %#x (large block %#x), %d mapped; want it in the large segment's free MiB", small, big, got.Mapped)
	}
	mustValid(t, s)
	mustFree(t, s, small)
	mustFree(t, s, big)
	if err := s.EmptyCache(); err != nil {
		t.Fatal(err)
	}
	// The other way round: a large request in a free small segment.
	s2 := newSpill(t, e, WithLimit(2*MiB))
	tiny := mustAlloc(t, s2, 4*KiB, st)
	large := mustAlloc(t, s2, 3*MiB/2, st)
	if got := s2.Stats(); got.Mapped != 2*MiB || got.Segments != 1 {
		t.Fatalf("1.5 MiB beside 4 KiB at a 2 MiB limit: %+v", got)
	}
	mustValid(t, s2)
	if _, err := s2.Alloc(1*MiB, st); !errors.Is(err, ErrOutOfMemory) {
		t.Fatalf("1 MiB more than fits: %v, want ErrOutOfMemory", err)
	}
	mustFree(t, s2, tiny)
	mustFree(t, s2, large)
	mustValid(t, s2)
}

func TestSpillStreamsKeepTheirBlocks(t *testing.T) {
	e := newSimEnv(t, 1*GiB)
	s := newSpill(t, e)
	s1, s2 := e.Stream(t), e.Stream(t)
	held := mustAlloc(t, s, 4096, s1) // s1's segment is not wholly free
	a := mustAlloc(t, s, 4096, s1)
	mustFree(t, s, a)
	b := mustAlloc(t, s, 4096, s2)
	if b == a || s.Stats().Segments != 2 {
		t.Errorf("a block freed on s1 was reused on s2 (%#x)", b)
	}
	mustFree(t, s, held)
	// RecordStream outside a capture: the block waits for an event on s2,
	// which the simulation completes at once; the next Alloc sees it.
	c := mustAlloc(t, s, 4096, s1)
	if err := s.RecordStream(c, s2); err != nil {
		t.Fatal(err)
	}
	mustFree(t, s, c)
	if st := s.Stats(); st.Waiting != 4096 || st.CrossStreamFrees != 1 || st.EventQueries != 0 {
		t.Errorf("after freeing a block s2 used: waiting %d, cross-stream frees %d, event queries %d; want 4096, 1, 0",
			st.Waiting, st.CrossStreamFrees, st.EventQueries)
	}
	mustValid(t, s)
	if d := mustAlloc(t, s, 4096, s1); d != c {
		t.Errorf("block not reused once s2's event completed: %#x, want %#x", d, c)
	}
	if st := s.Stats(); st.EventQueries != 1 || st.Syncs != 0 {
		t.Errorf("the next Alloc queried %d events and waited %d times; want 1 query, no wait", st.EventQueries, st.Syncs)
	}
	mustValid(t, s)
}

func TestSpillOutOfMemory(t *testing.T) {
	e := newSimEnv(t, 8*MiB)
	st := e.Stream(t)
	check := func(s *Allocator, size uint64, want ...string) {
		t.Helper()
		before := s.Stats()
		_, err := s.Alloc(size, st)
		if !errors.Is(err, ErrOutOfMemory) {
			t.Fatalf("Alloc(%d): %v, want out of memory", size, err)
		}
		msg := err.Error()
		t.Logf("%s", msg)
		want = append(want, fmt.Sprintf("spill: Alloc(%d)", size), "mapped", "in use", "reserved")
		for _, w := range want {
			if !strings.Contains(msg, w) {
				t.Errorf("error %q lacks %q", msg, w)
			}
		}
		if strings.Contains(msg, "\n") {
			t.Errorf("error is not one line: %q", msg)
		}
		if after := s.Stats(); after != before {
			t.Errorf("failed Alloc changed stats: %+v -> %+v", before, after)
		}
		mustValid(t, s)
	}
	// The limit.
	s := newSpill(t, e, WithLimit(4*MiB))
	a := mustAlloc(t, s, 3*MiB, st)
	check(s, 3*MiB, "pass the limit")
	mustFree(t, s, a)
	s.Close()
	// The reserved addresses, fragmented: [0, 4) unmapped, [4, 6) mapped,
	// [6, 8) unmapped leave no run for a 6 MiB segment.
	s = newSpill(t, e, WithAddressSpace(8*MiB))
	st2 := e.Stream(t)
	a = mustAlloc(t, s, 3*MiB, st)
	b := mustAlloc(t, s, 1*MiB, st2)
	mustFree(t, s, a)
	if err := s.EmptyCache(); err != nil {
		t.Fatal(err)
	}
	check(s, 5*MiB, "reserved addresses left")
	mustFree(t, s, b)
	s.Close()
	// The device; a cached segment is unmapped and the request retried.
	s = newSpill(t, e)
	a = mustAlloc(t, s, 6*MiB, st)
	check(s, 4*MiB, "device has no", "CUDA_ERROR_OUT_OF_MEMORY")
	mustFree(t, s, a)
	b = mustAlloc(t, s, 7*MiB, st2) // more than the cached segment holds
	if b == 0 {
		t.Fatal("no block")
	}
	if st := s.Stats(); st.Mapped != 8*MiB || st.Unmaps != 1 {
		t.Errorf("retry after unmapping the cache: %+v", st)
	}
	mustFree(t, s, b)
	mustValid(t, s)
}

// errOK marks a step that must succeed.
var errOK = errors.New("ok")

func TestSpillMisuse(t *testing.T) {
	e := newSimEnv(t, 1*GiB)
	s := newSpill(t, e)
	st := e.Stream(t)
	p := mustAlloc(t, s, 100, st)
	pool, err := s.NewSharedPool()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		do   func() error
		want error
	}{
		{"Alloc(0)", func() error { _, err := s.Alloc(0, st); return err }, nil},
		{"Alloc nil stream", func() error { _, err := s.Alloc(1, nil); return err }, nil},
		{"Alloc too big", func() error { _, err := s.Alloc(1<<62, st); return err }, nil},
		{"Free unknown", func() error { return s.Free(p + 512) }, ErrUnknown},
		{"Free", func() error { return s.Free(p) }, errOK},
		{"Free twice", func() error { return s.Free(p) }, ErrUnknown},
		{"RecordStream unknown", func() error { return s.RecordStream(p, st) }, ErrUnknown},
		{"Pool.Release", func() error { return pool.Release() }, errOK},
		{"Pool.Release twice", func() error { return pool.Release() }, ErrUnknown},
		{"BeginCapture on a released pool", func() error { _, err := s.BeginCapture(st, cuda.CaptureModeGlobal, pool); return err }, nil},
	} {
		err := c.do()
		if c.want == errOK {
			if err != nil {
				t.Errorf("%s: %v", c.name, err)
			}
			continue
		}
		if err == nil || (c.want != nil && !errors.Is(err, c.want)) || !strings.HasPrefix(err.Error(), "spill: ") {
			t.Errorf("%s: %v, want a spill error (%v)", c.name, err, c.want)
		}
	}
	if c, err := s.Alloc(1, st); err != nil || s.Free(c) != nil {
		t.Fatal("allocator broken after misuse")
	}
	shared, _ := s.NewSharedPool()
	c, err := s.BeginCapture(st, cuda.CaptureModeGlobal, shared)
	if err != nil {
		t.Fatal(err)
	}
	st2 := e.Stream(t)
	if _, err := s.BeginCapture(st2, cuda.CaptureModeGlobal, shared); err == nil {
		t.Error("two captures into one pool at once")
	}
	if err := c.Release(); err == nil {
		t.Error("Release of a capture underway")
	}
	if err := s.EmptyCache(); !errors.Is(err, ErrCapturing) {
		t.Errorf("EmptyCache during capture: %v", err)
	}
	if err := s.Close(); !errors.Is(err, ErrCapturing) {
		t.Errorf("Close during capture: %v", err)
	}
	g, err := c.End()
	if err != nil {
		t.Fatal(err)
	}
	g.Close()
	if _, err := c.End(); err == nil {
		t.Error("End twice")
	}
	if err := c.Release(); err != nil {
		t.Error(err)
	}
	if err := c.Release(); err == nil {
		t.Error("Release twice")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for name, err := range map[string]error{
		"Close":         s.Close(),
		"Free":          s.Free(p),
		"Alloc":         func() error { _, err := s.Alloc(1, st); return err }(),
		"EmptyCache":    s.EmptyCache(),
		"NewSharedPool": func() error { _, err := s.NewSharedPool(); return err }(),
	} {
		if !errors.Is(err, ErrClosed) {
			t.Errorf("%s after Close: %v", name, err)
		}
	}
	if e.Free(t) != 1*GiB {
		t.Errorf("Close leaked: %d free", e.Free(t))
	}
	for _, o := range []Option{WithAddressSpace(0), WithLimit(0), WithChunk(0), WithChunk(3 * MiB)} {
		if s, err := New(e.Dev, o); err == nil {
			s.Close()
			t.Error("bad option accepted")
		}
	}
}

// TestSpillRandom runs random allocations and frees on three streams, with
// stream uses, cache trims and a limit that makes some requests fail, and
// checks after every step that no two live blocks overlap, every block is
// writable where it lies and keeps what was written, and the state is
// consistent.
func TestSpillRandom(t *testing.T) {
	for seed := uint64(1); seed <= 4; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { spillRandom(t, seed, 1500) })
	}
}

func spillRandom(t *testing.T, seed uint64, steps int) {
	e := newSimEnv(t, 256*MiB)
	s := newSpill(t, e, WithLimit(40*MiB), WithAddressSpace(64*MiB))
	streams := []cuda.Stream{e.Stream(t), e.Stream(t), e.Stream(t)}
	rng := rand.New(rand.NewPCG(seed, 99))
	type alloc struct {
		p    cuda.DevicePtr
		size uint64
		tag  byte
	}
	var live []alloc
	var fails int
	for step := 0; step < steps; step++ {
		switch r := rng.IntN(100); {
		case r < 55 || len(live) == 0:
			var size uint64
			switch rng.IntN(4) {
			case 0:
				size = 1 + rng.Uint64N(512)
			case 1, 2:
				size = 1 + rng.Uint64N(256*KiB)
			default:
				size = 1 + rng.Uint64N(6*MiB)
			}
			st := streams[rng.IntN(len(streams))]
			before := s.Stats()
			p, err := s.Alloc(size, st)
			if err != nil {
				if !errors.Is(err, ErrOutOfMemory) {
					t.Fatalf("step %d: %v", step, err)
				}
				if after := s.Stats(); after.InUse != before.InUse || after.Live != before.Live {
					t.Fatalf("step %d: failed Alloc changed the live set", step)
				}
				fails++
				break
			}
			for _, l := range live {
				if p < l.p+cuda.DevicePtr(l.size) && l.p < p+cuda.DevicePtr(size) {
					t.Fatalf("step %d: [%#x, +%d) overlaps live [%#x, +%d)", step, p, size, l.p, l.size)
				}
			}
			if p < s.base || uint64(p-s.base)+size > s.cfg.addressSpace || p%MinBlock != 0 {
				t.Fatalf("step %d: %#x is outside the reservation or misaligned", step, p)
			}
			tag := byte(rng.Uint32())
			for _, at := range []cuda.DevicePtr{p, p + cuda.DevicePtr(size-1)} {
				if err := e.Dev.CopyHtoD(at, []byte{tag}); err != nil {
					t.Fatalf("step %d: block not writable: %v", step, err)
				}
			}
			live = append(live, alloc{p, size, tag})
		case r < 95:
			i := rng.IntN(len(live))
			l := live[i]
			for _, at := range []cuda.DevicePtr{l.p, l.p + cuda.DevicePtr(l.size-1)} {
				got := []byte{0}
				if err := e.Dev.CopyDtoH(got, at); err != nil || got[0] != l.tag {
					t.Fatalf("step %d: block %#x lost its contents (%v, %v): another block overlapped it", step, l.p, got, err)
				}
			}
			if rng.IntN(4) == 0 {
				if err := s.RecordStream(l.p, streams[rng.IntN(len(streams))]); err != nil {
					t.Fatal(err)
				}
			}
			if err := s.Free(l.p); err != nil {
				t.Fatalf("step %d: %v", step, err)
			}
			live = append(live[:i], live[i+1:]...)
		default:
			if err := s.EmptyCache(); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.validate(); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		var sum uint64
		for _, l := range live {
			sum += roundUp(l.size, MinBlock)
		}
		if st := s.Stats(); st.InUse != sum || st.Live != len(live) || st.Mapped != st.InUse+st.Cached || st.Mapped > 40*MiB {
			t.Fatalf("step %d: stats %+v, oracle in use %d live %d", step, st, sum, len(live))
		}
	}
	t.Logf("seed %d: %d steps, %d requests refused, stats %+v", seed, steps, fails, s.Stats())
}

// TestSpillLargerThanAddressSpace: a request larger than every address the
// allocator reserved is out of memory (a caller retries smaller), not a
// usage error.
func TestSpillLargerThanAddressSpace(t *testing.T) {
	e := newSimEnv(t, 64*MiB)
	s := newSpill(t, e, WithAddressSpace(32*MiB))
	st := e.Stream(t)
	if _, err := s.Alloc(64*MiB, st); !errors.Is(err, ErrOutOfMemory) {
		t.Fatalf("64 MiB of a 32 MiB reservation: %v, want ErrOutOfMemory", err)
	}
	if _, err := s.Alloc(0, st); err == nil || errors.Is(err, ErrOutOfMemory) {
		t.Fatalf("0 bytes: %v, want a usage error", err)
	}
	mustAlloc(t, s, 8*MiB, st)
	mustValid(t, s)
}

func hasSegment(s *Allocator, p *Pool, h uintptr) bool {
	for seg := range s.segments {
		if seg.pool == p && seg.key == h {
			return true
		}
	}
	return false
}

// TestSpillRegrow: an allocation told not to grow (its owner keeps freed
// blocks) may map back up to the most the allocator held before, never
// past it; EmptyCache lowers that mark to what stays mapped.
func TestSpillRegrow(t *testing.T) {
	e := newSimEnv(t, 1*GiB)
	s := newSpill(t, e)
	st := e.Stream(t)
	x := mustAlloc(t, s, 16*MiB, st)
	y := mustAlloc(t, s, 16*MiB, st)
	mustFree(t, s, x)
	mustFree(t, s, y)
	if _, _, err := s.AllocDefault(24*MiB, st, false); !errors.Is(err, ErrWouldGrow) {
		t.Fatalf("24 MiB with two free 16 MiB segments at the high mark: %v, want ErrWouldGrow", err)
	}
	if err := s.EmptyCache(); err != nil {
		t.Fatal(err)
	}
	if got := s.Stats().Mapped; got != 0 {
		t.Fatalf("mapped %d after EmptyCache", got)
	}
	if _, _, err := s.AllocDefault(24*MiB, st, false); !errors.Is(err, ErrWouldGrow) {
		t.Fatalf("after EmptyCache, 24 MiB told not to grow: %v, want ErrWouldGrow (nothing held since)", err)
	}
	a := mustAlloc(t, s, 32*MiB, st) // held once: 32 MiB
	mustFree(t, s, a)
	s.mu.Lock()
	s.trim(true) // unmapped without EmptyCache (as a released pool's segments are): the mark stays
	s.mu.Unlock()
	p, _, err := s.AllocDefault(24*MiB, st, false)
	if err != nil {
		t.Fatalf("24 MiB told not to grow, under the 32 MiB held before: %v", err)
	}
	if _, _, err := s.AllocDefault(16*MiB, st, false); !errors.Is(err, ErrWouldGrow) {
		t.Fatalf("16 MiB more would pass the 32 MiB held before: %v, want ErrWouldGrow", err)
	}
	// A request of at most MidBlock regrows by what it maps, not by the
	// addresses its segment reserves.
	q, _, err := s.AllocDefault(4*MiB, st, false)
	if err != nil {
		t.Fatalf("4 MiB beside the 24 MiB held, under the 32 MiB held before: %v", err)
	}
	if _, _, err := s.AllocDefault(6*MiB, st, false); !errors.Is(err, ErrWouldGrow) {
		t.Fatalf("6 MiB more would pass the 32 MiB held before: %v, want ErrWouldGrow", err)
	}
	mustFree(t, s, q)
	mustFree(t, s, p)
	mustValid(t, s)
}

// TestSpillNewPeakGivesCacheBack: a large request that would map more than
// the allocator ever held gives the wholly free segments back first, where
// they hold at least its segment's bytes, so that the peak stays what was
// held before; steady repeats of the same requests then wait for nothing.
func TestSpillNewPeakGivesCacheBack(t *testing.T) {
	e := newSimEnv(t, 1*GiB)
	s := newSpill(t, e)
	st := e.Stream(t)
	phase := func() {
		var ps []cuda.DevicePtr
		for range 4 {
			ps = append(ps, mustAlloc(t, s, MidBlock+MinBlock, st)) // a 12 MiB segment each, at first
		}
		for _, p := range ps {
			mustFree(t, s, p)
		}
		mustFree(t, s, mustAlloc(t, s, 36*MiB, st)) // fits in none of them
	}
	phase()
	got := s.Stats()
	if got.PeakMapped != 48*MiB || got.Syncs != 1 || got.Unmaps != 4 || got.Mapped != 36*MiB {
		t.Fatalf("after the first phase: %+v; want a peak of 48 MiB (four free 12 MiB segments given back for 36 MiB), "+
			"one device wait, 36 MiB mapped", got)
	}
	for range 3 {
		phase()
	}
	if again := s.Stats(); again.Syncs != got.Syncs || again.Unmaps != got.Unmaps || again.PeakMapped != 48*MiB {
		t.Errorf("steady phases: %+v; want no device wait or unmap more, the same peak", again)
	}
	mustValid(t, s)

	// Free segments smaller than the new one stay: giving them back would
	// not keep the peak.
	s2 := newSpill(t, e)
	mustFree(t, s2, mustAlloc(t, s2, MidBlock+2*MiB, st))
	mustFree(t, s2, mustAlloc(t, s2, 40*MiB, st))
	if got := s2.Stats(); got.Mapped != 52*MiB || got.Syncs != 0 {
		t.Errorf("40 MiB beside a free 12 MiB segment: %+v, want both mapped and no device wait", got)
	}
	// A small request at a new peak maps one chunk and gives nothing back.
	s3 := newSpill(t, e)
	mustFree(t, s3, mustAlloc(t, s3, 16*MiB, st))
	for range 3 {
		mustAlloc(t, s3, SmallBlock, st)
	}
	if got := s3.Stats(); got.Syncs != 0 || got.Unmaps != 0 {
		t.Errorf("small requests at a new peak: %+v, want no device wait or unmap", got)
	}
	mustValid(t, s2)
	mustValid(t, s3)
}

// failExtend is a device whose cuMemMap fails (as out of memory) at the
// addresses right after an earlier mapping's end: where a segment would
// extend in place.
type failExtend struct {
	cuda.Device
	ends  map[cuda.DevicePtr]bool
	fails int
}

func (d *failExtend) MemMap(p cuda.DevicePtr, size uint64, h cuda.MemHandle) error {
	if d.ends[p] {
		d.fails++
		return &cuda.Error{Op: "cuMemMap", Code: cuda.ErrorOutOfMemory}
	}
	if err := d.Device.MemMap(p, size, h); err != nil {
		return err
	}
	d.ends[p.Add(size)] = true
	return nil
}

// TestSpillMidSegmentExtendFails: where mapping a segment's extension
// fails, the request gets a segment of its own instead, and the handle
// made for the extension is released (EmptyCache leaves the device as it
// was).
func TestSpillMidSegmentExtendFails(t *testing.T) {
	e := newSimEnv(t, 1*GiB)
	dev := &failExtend{Device: e.Dev, ends: map[cuda.DevicePtr]bool{}}
	s, err := New(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	st := e.Stream(t)
	a := mustAlloc(t, s, 4*MiB, st)
	b := mustAlloc(t, s, 4*MiB, st)
	if dev.fails == 0 {
		t.Fatal("the second request did not try to extend the first one's segment")
	}
	if got := s.Stats(); got.Segments != 2 || got.Mapped != 8*MiB || b >= a && b < a+MidSegment {
		t.Errorf("after a failed extension: %+v, second block at %#x; want two segments of 4 MiB", got, b)
	}
	mustValid(t, s)
	mustFree(t, s, a)
	mustFree(t, s, b)
	if err := s.EmptyCache(); err != nil {
		t.Fatal(err)
	}
	if got := e.Free(t); got != 1*GiB {
		t.Errorf("after EmptyCache the device has %d free, want %d (a handle leaked)", got, 1*GiB)
	}
}

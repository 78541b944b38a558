package bridge

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/arenaplan/arenaplan/cuda"
)

// checkTiled says how sg's blocks fail to tile it as PyTorch's segments
// do (memory_viz lays them end to end): in address order, each starting
// where the one before ends, their sizes adding up to the segment's.
func checkTiled(sg SegmentState) error {
	at := sg.Address
	for i, bl := range sg.Blocks {
		if bl.Address != at {
			return fmt.Errorf("%s segment %#x: block %d (%s) at %#x, want %#x (the end of the one before)", sg.Kind, sg.Address, i, bl.Name, bl.Address, at)
		}
		if bl.Size == 0 {
			return fmt.Errorf("%s segment %#x: block %d is empty", sg.Kind, sg.Address, i)
		}
		at += bl.Size
	}
	if at != sg.Address+sg.TotalSize {
		return fmt.Errorf("%s segment %#x: blocks add up to %d bytes, the segment has %d", sg.Kind, sg.Address, at-sg.Address, sg.TotalSize)
	}
	return nil
}

// checkSnapshotTiled runs checkTiled on every segment of snap, and checks
// that each arena segment's active blocks are its live planned buffers
// (or orphans of a replaced plan).
func checkSnapshotTiled(t *testing.T, snap *Snapshot) {
	t.Helper()
	for _, sg := range snap.Segments {
		if err := checkTiled(sg); err != nil {
			t.Error(err)
		}
		if sg.Kind != SegmentArena {
			continue
		}
		live := map[BlockState]bool{}
		for _, bl := range sg.Planned {
			if bl.State == StateActive {
				live[bl] = true
			}
		}
		for _, bl := range sg.Blocks {
			if bl.State == StateActive && !live[bl] && !strings.HasSuffix(bl.Name, "/orphan") {
				t.Errorf("arena segment %#x: active block %+v is no live planned buffer", sg.Address, bl)
			}
			if bl.State != StateActive && (bl.State != StateFree || bl.Name != "" || bl.Requested != 0) {
				t.Errorf("arena segment %#x: block %+v, want free space: inactive, unnamed, nothing requested", sg.Address, bl)
			}
		}
	}
}

// TestTile: blocks in any order become the segment's blocks in address
// order with the free space between them; a block that overlaps an
// earlier one or leaves the segment is left out.
func TestTile(t *testing.T) {
	a := func(addr, size uint64) BlockState {
		return BlockState{Address: addr, Size: size, Requested: size, State: StateActive}
	}
	free := func(addr, size uint64) BlockState { return BlockState{Address: addr, Size: size, State: StateFree} }
	for _, c := range []struct {
		name   string
		blocks []BlockState
		want   []BlockState
	}{
		{"empty", nil, []BlockState{free(100, 1000)}},
		{"whole", []BlockState{a(100, 1000)}, []BlockState{a(100, 1000)}},
		{"gaps", []BlockState{a(600, 100), a(200, 100)},
			[]BlockState{free(100, 100), a(200, 100), free(300, 300), a(600, 100), free(700, 400)}},
		{"adjacent", []BlockState{a(100, 100), a(200, 900)}, []BlockState{a(100, 100), a(200, 900)}},
		{"overlap", []BlockState{a(200, 300), a(400, 200)}, []BlockState{free(100, 100), a(200, 300), free(500, 600)}},
		{"outside", []BlockState{a(0, 50), a(1000, 200), a(1200, 10)}, []BlockState{free(100, 1000)}},
	} {
		got := tile(100, 1000, c.blocks)
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: tile = %+v, want %+v", c.name, got, c.want)
		}
		if err := checkTiled(SegmentState{Address: 100, TotalSize: 1000, Blocks: got}); err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
	}
}

// snapStep runs a model-like step on stream: activations freed two layers
// later, a workspace per layer, one output kept (returned).
// plannedSnapStep records snapStep on stream as step "decode", frees its
// output and plans it.
func plannedSnapStep(t *testing.T, b *Bridge, stream uintptr) *Step {
	t.Helper()
	s, err := b.NewStep(0, "decode")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Record(stream); err != nil {
		t.Fatal(err)
	}
	out := snapStep(t, b, stream)
	if err := s.End(false); err != nil {
		t.Fatal(err)
	}
	if err := b.Free(out, 0); err != nil {
		t.Fatal(err)
	}
	if err := s.Plan(0); err != nil {
		t.Fatal(err)
	}
	return s
}

func snapStep(t *testing.T, b *Bridge, stream uintptr) cuda.DevicePtr {
	t.Helper()
	var acts []cuda.DevicePtr
	for i := range 5 {
		a, err := b.Alloc(uint64(4096+1000*i), 0, stream)
		if err != nil {
			t.Fatal(err)
		}
		acts = append(acts, a)
		ws, err := b.Alloc(65536, 0, stream)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Free(ws, 0); err != nil {
			t.Fatal(err)
		}
		if len(acts) > 2 {
			if err := b.Free(acts[0], 0); err != nil {
				t.Fatal(err)
			}
			acts = acts[1:]
		}
	}
	out, err := b.Alloc(8192, 0, stream)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range acts {
		if err := b.Free(a, 0); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func count(tr []TraceEntry, action string) int {
	n := 0
	for _, e := range tr {
		if e.Action == action {
			n++
		}
	}
	return n
}

// TestSnapshot: a step recorded, planned and served appears as an arena
// segment whose blocks are its planned buffers (the output it returned
// live, the rest inactive); spill and region memory as their segments with
// their blocks; the history holds every allocation and free in order,
// planned ones named, is bounded, and shuts the fast path while on.
func TestSnapshot(t *testing.T) {
	tid := 3
	b := New(Config{Sim: true, SimMemory: 1 << 30, SpillAddressSpace: 256 << 20, ThreadID: func() int { return tid }})
	t.Cleanup(func() { b.Close() })
	b.CapturesUnderway(0)
	const stream = 0x40

	s := plannedSnapStep(t, b, stream)

	if !b.FastPathAllowed() {
		t.Fatal("FastPathAllowed false before recording")
	}
	if err := b.RecordHistory(true, 0); err != nil {
		t.Fatal(err)
	}
	if b.FastPathAllowed() || !b.Recording() {
		t.Fatal("recording history: the fast path must stay shut")
	}
	if _, keep, err := b.AllocCacheable(1024, 0, 0x41, true); err != nil || keep {
		t.Fatalf("AllocCacheable while recording: keepable %v, %v", keep, err)
	}

	if err := s.Serve(stream, true); err != nil {
		t.Fatal(err)
	}
	out := snapStep(t, b, stream)
	if err := s.End(false); err != nil {
		t.Fatal(err)
	}
	spilled, err := b.Alloc(100000, 0, 0x41)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.BeginRegion(0, tid, "weights", false); err != nil {
		t.Fatal(err)
	}
	w, err := b.Alloc(3000, 0, 0x41)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.EndRegion(0, tid); err != nil {
		t.Fatal(err)
	}

	snap, err := b.Snapshot(0)
	if err != nil {
		t.Fatal(err)
	}
	rep := s.Report()
	var arenaSeg, regionSeg *SegmentState
	var spillBlock *BlockState
	for i := range snap.Segments {
		sg := &snap.Segments[i]
		if i > 0 && sg.Address < snap.Segments[i-1].Address {
			t.Errorf("segments out of address order at %d", i)
		}
		switch sg.Kind {
		case SegmentArena:
			arenaSeg = sg
		case SegmentRegion:
			regionSeg = sg
		case SegmentSpill:
			for j := range sg.Blocks {
				if sg.Blocks[j].Address == uint64(spilled) {
					spillBlock = &sg.Blocks[j]
				}
			}
		}
	}
	if arenaSeg == nil {
		t.Fatalf("no arena segment in %+v", snap.Segments)
	}
	if arenaSeg.TotalSize != uint64(rep.Arena) || arenaSeg.Owner != "step decode" || arenaSeg.Stream != stream {
		t.Errorf("arena segment %d bytes, owner %q, stream %#x; want %d, \"step decode\", %#x",
			arenaSeg.TotalSize, arenaSeg.Owner, arenaSeg.Stream, rep.Arena, stream)
	}
	checkSnapshotTiled(t, snap)
	if len(arenaSeg.Planned) != rep.Buffers {
		t.Fatalf("arena segment lists %d planned buffers, the plan has %d", len(arenaSeg.Planned), rep.Buffers)
	}
	var liveBlocks []BlockState
	for _, bl := range arenaSeg.Blocks {
		if bl.State == StateActive {
			liveBlocks = append(liveBlocks, bl)
		}
	}
	if len(liveBlocks) != 1 || liveBlocks[0].Address != uint64(out) || liveBlocks[0].Requested != 8192 || liveBlocks[0].Name == "" {
		t.Errorf("arena segment's active blocks %+v; want the kept output at %#x, 8192 bytes, named", liveBlocks, uint64(out))
	}
	active := 0
	for _, bl := range arenaSeg.Planned {
		if bl.Address < arenaSeg.Address || bl.Address+bl.Size > arenaSeg.Address+arenaSeg.TotalSize {
			t.Errorf("block %s [%#x, +%d) outside its segment", bl.Name, bl.Address, bl.Size)
		}
		if bl.Size%256 != 0 || bl.Requested > bl.Size || bl.Name == "" {
			t.Errorf("block %+v: want a 256-byte multiple at least its request, named", bl)
		}
		if bl.State == StateActive {
			active++
			if bl.Address != uint64(out) || bl.Requested != 8192 {
				t.Errorf("active planned block %+v; want the output at %#x, 8192 bytes", bl, uint64(out))
			}
		} else if bl.State != StateFree {
			t.Errorf("planned block state %q", bl.State)
		}
	}
	if active != 1 {
		t.Errorf("%d planned blocks active; want the kept output only", active)
	}
	if spillBlock == nil || spillBlock.State != StateActive || spillBlock.Requested != 100000 || spillBlock.Size < 100000 {
		t.Errorf("spilled allocation's block: %+v", spillBlock)
	}
	if regionSeg == nil || regionSeg.Owner != "weights" || regionSeg.Pool[1] == 0 {
		t.Fatalf("region segment: %+v", regionSeg)
	}
	if len(regionSeg.Blocks) == 0 || regionSeg.Blocks[0].Address != uint64(w) || regionSeg.Blocks[0].State != StateActive {
		t.Errorf("region blocks: %+v", regionSeg.Blocks)
	}

	// History: the served run's 11 allocations (5 activations, 5
	// workspaces, the output) and 10 frees, planned ones named; the
	// spill's and region's allocations with their segments.
	tr := snap.Trace
	if !snap.Recording {
		t.Fatal("snapshot says history is off")
	}
	named := 0
	for i, e := range tr {
		if i > 0 && e.TimeUS < tr[i-1].TimeUS {
			t.Errorf("entry %d goes back in time", i)
		}
		if e.Action == ActionAlloc && e.Step == "decode" {
			named++
			if e.Buffer < 0 || e.Buffer >= rep.Buffers || e.Stream != stream {
				t.Errorf("planned alloc %+v", e)
			}
		}
	}
	if named != 11 {
		t.Errorf("%d planned allocs named in the history, want 11", named)
	}
	// + AllocCacheable's, the spilled one, the region's
	if n := count(tr, ActionAlloc); n != 14 {
		t.Errorf("%d allocs in the history, want 14", n)
	}
	if n, m := count(tr, ActionFreeRequested), count(tr, ActionFreeCompleted); n != 10 || m != 10 {
		t.Errorf("%d free_requested, %d free_completed; want 10 each", n, m)
	}
	if n := count(tr, ActionSegmentAlloc); n < 1 {
		t.Errorf("no segment_alloc for the region's new segment")
	}
	for _, e := range tr {
		if e.Action == ActionFreeRequested && (e.Size == 0 || e.Stream != stream) {
			t.Errorf("free without the allocation's size and stream: %+v", e)
		}
	}

	// Bounded: the newest entries only.
	if err := b.RecordHistory(true, 16); err != nil {
		t.Fatal(err)
	}
	for range 50 {
		p, err := b.Alloc(777, 0, 0x41)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Free(p, 0); err != nil {
			t.Fatal(err)
		}
	}
	snap, err = b.Snapshot(0)
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Trace) != 16 || snap.Dropped == 0 {
		t.Fatalf("bounded history: %d entries, %d dropped; want 16 and some", len(snap.Trace), snap.Dropped)
	}
	if last := snap.Trace[15]; last.Action != ActionFreeCompleted || last.Size != 777 {
		t.Errorf("newest entry %+v, want the last free_completed of 777 bytes", last)
	}
	if err := b.RecordHistory(true, MaxHistoryEntries+1); err == nil {
		t.Error("RecordHistory above MaxHistoryEntries accepted")
	}

	if err := b.RecordHistory(false, 0); err != nil {
		t.Fatal(err)
	}
	if !b.FastPathAllowed() {
		t.Error("FastPathAllowed false after recording stopped")
	}
	snap, err = b.Snapshot(0)
	if err != nil {
		t.Fatal(err)
	}
	if snap.Recording || len(snap.Trace) != 0 {
		t.Errorf("history off: recording %v, %d entries", snap.Recording, len(snap.Trace))
	}

	// No planned buffer live: the arena segment is one free block, and
	// still lists every planned buffer.
	if err := b.Free(out, 0); err != nil {
		t.Fatal(err)
	}
	snap, err = b.Snapshot(0)
	if err != nil {
		t.Fatal(err)
	}
	checkSnapshotTiled(t, snap)
	arenaSeg = nil
	for i := range snap.Segments {
		if snap.Segments[i].Kind == SegmentArena {
			arenaSeg = &snap.Segments[i]
		}
	}
	if arenaSeg == nil {
		t.Fatal("no arena segment once the output was freed")
	}
	if want := []BlockState{{Address: arenaSeg.Address, Size: arenaSeg.TotalSize, State: StateFree}}; !reflect.DeepEqual(arenaSeg.Blocks, want) {
		t.Errorf("arena segment with nothing live: blocks %+v, want %+v", arenaSeg.Blocks, want)
	}
	if len(arenaSeg.Planned) != rep.Buffers {
		t.Errorf("arena segment lists %d planned buffers with nothing live, the plan has %d", len(arenaSeg.Planned), rep.Buffers)
	}
	for _, bl := range arenaSeg.Planned {
		if bl.State != StateFree {
			t.Errorf("planned buffer %+v active with nothing live", bl)
		}
	}
}

// TestSnapshotTiledFamilyAndOrphan: the segments tile their memory when
// a family's members keep outputs (which share memory by design) and
// when a Replan leaves an orphan live in the arena, shown where it is.
func TestSnapshotTiledFamilyAndOrphan(t *testing.T) {
	b := newTestBridge(t)
	f, ps := recordFamily(t, b, []uint64{8, 4, 2, 1})
	if err := f.Plan(0); err != nil {
		t.Fatal(err)
	}
	for i, s := range f.Members() {
		if err := s.Serve(ps[i].stream, true); err != nil {
			t.Fatal(err)
		}
		ps[i].run() // its output kept
		if err := s.End(false); err != nil {
			t.Fatal(err)
		}
	}
	snap, err := b.Snapshot(0)
	if err != nil {
		t.Fatal(err)
	}
	checkSnapshotTiled(t, snap)
	for _, sg := range snap.Segments {
		if sg.Kind != SegmentArena {
			continue
		}
		planned, shown := 0, 0
		for _, bl := range sg.Planned {
			if bl.State == StateActive {
				planned++
			}
		}
		for _, bl := range sg.Blocks {
			if bl.State == StateActive {
				shown++
			}
		}
		if planned != 4 || shown == 0 {
			t.Errorf("family arena: %d planned buffers live, %d shown; want the 4 members' outputs, at least one shown", planned, shown)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}

	p := &program{t: t, b: b, stream: 0x78, layers: 10, extra: 4096}
	s := recordAndPlan(t, b, p)
	p.extra = 0
	_, out := serveRun(t, s, p)
	if err := s.Replan(0); err != nil {
		t.Fatal(err)
	}
	snap, err = b.Snapshot(0)
	if err != nil {
		t.Fatal(err)
	}
	checkSnapshotTiled(t, snap)
	var orphan *BlockState
	for _, sg := range snap.Segments {
		for i, bl := range sg.Blocks {
			if sg.Kind == SegmentArena && bl.Address == uint64(out) {
				orphan = &sg.Blocks[i]
			}
		}
	}
	if orphan == nil || orphan.State != StateActive || orphan.Size < 8192 || orphan.Name != "test/orphan" {
		t.Errorf("the orphan at %#x: %+v; want an active block of at least 8192 bytes named test/orphan", uint64(out), orphan)
	}
}

// TestSnapshotOOM: a failed allocation while recording is an oom entry
// with the request's size.
func TestSnapshotOOM(t *testing.T) {
	b := New(Config{Sim: true, SimMemory: 64 << 20, SpillAddressSpace: 256 << 20})
	t.Cleanup(func() { b.Close() })
	if err := b.RecordHistory(true, 8); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Alloc(1<<30, 0, 0); err == nil {
		t.Fatal("a 1 GiB allocation on a 64 MiB device succeeded")
	}
	snap, err := b.Snapshot(0)
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Trace) != 1 || snap.Trace[0].Action != ActionOOM || snap.Trace[0].Size != 1<<30 {
		t.Fatalf("trace after an out-of-memory failure: %+v", snap.Trace)
	}
}

// TestSnapshotConcurrent: allocations on several goroutines while history
// is turned on and off and snapshots are taken: no deadlock, and every
// snapshot's history pairs each free with an allocation of its size.
func TestSnapshotConcurrent(t *testing.T) {
	b := New(Config{Sim: true, SimMemory: 1 << 30, SpillAddressSpace: 256 << 20})
	t.Cleanup(func() { b.Close() })
	done := make(chan error, 4)
	for g := range 4 {
		go func() {
			for i := range 300 {
				size := uint64(1000 + 512*g + i%7)
				p, err := b.Alloc(size, 0, uintptr(0x50+g))
				if err != nil {
					done <- err
					return
				}
				if err := b.Free(p, 0); err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
	}
	for i := range 40 {
		if err := b.RecordHistory(i%3 != 2, 64); err != nil {
			t.Fatal(err)
		}
		snap, err := b.Snapshot(0)
		if err != nil {
			t.Fatal(err)
		}
		sizes := map[uint64]uint64{}
		for _, e := range snap.Trace {
			switch e.Action {
			case ActionAlloc:
				sizes[e.Addr] = e.Size
			case ActionFreeRequested:
				if s, ok := sizes[e.Addr]; ok && s != e.Size {
					t.Fatalf("free of %#x with %d bytes, allocated with %d", e.Addr, e.Size, s)
				}
				delete(sizes, e.Addr)
			}
		}
	}
	for range 4 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

// TestHistoryArenaSegments: while history is recorded, a planned arena
// mapped or closed is a segment_alloc or segment_free of each of its
// regions (the segments snapshots list for it), so that memory_viz can
// replay the segments' history.
func TestHistoryArenaSegments(t *testing.T) {
	b := newTestBridge(t)
	const stream = 0x42
	if err := b.RecordHistory(true, 0); err != nil {
		t.Fatal(err)
	}
	s := plannedSnapStep(t, b, stream)
	snap, err := b.Snapshot(0)
	if err != nil {
		t.Fatal(err)
	}
	var arenaSegs []SegmentState
	for _, sg := range snap.Segments {
		if sg.Kind == SegmentArena {
			arenaSegs = append(arenaSegs, sg)
		}
	}
	if len(arenaSegs) == 0 {
		t.Fatal("no arena segment in the snapshot")
	}
	events := func(tr []TraceEntry, action string) map[uint64]uint64 {
		m := map[uint64]uint64{}
		for _, e := range tr {
			if e.Action == action {
				m[e.Addr] = e.Size
			}
		}
		return m
	}
	allocs := events(snap.Trace, ActionSegmentAlloc)
	for _, sg := range arenaSegs {
		if allocs[sg.Address] != sg.TotalSize {
			t.Errorf("arena segment %#x (%d bytes): segment_alloc events %v", sg.Address, sg.TotalSize, allocs)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	snap, err = b.Snapshot(0)
	if err != nil {
		t.Fatal(err)
	}
	frees := events(snap.Trace, ActionSegmentFree)
	for _, sg := range arenaSegs {
		if frees[sg.Address] != sg.TotalSize {
			t.Errorf("closed arena segment %#x (%d bytes): segment_free events %v", sg.Address, sg.TotalSize, frees)
		}
	}
}

// TestHistoryFirstSegment: history turned on before a device is opened;
// its first allocation's segment gets a segment_alloc before the alloc
// (before, the history began after that allocation had mapped it), and
// entries are numbered (Seq) from 1.
func TestHistoryFirstSegment(t *testing.T) {
	b := New(Config{Sim: true, SimMemory: 64 << 20})
	defer b.Close()
	if err := b.RecordHistory(true, 0); err != nil {
		t.Fatal(err)
	}
	p, _, seq, err := b.AllocSeq(4096, 0, 0x11, true)
	if err != nil {
		t.Fatal(err)
	}
	snap, err := b.Snapshot(0)
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Trace) != 2 || snap.Trace[0].Action != ActionSegmentAlloc || snap.Trace[1].Action != ActionAlloc ||
		snap.Trace[1].Addr != uint64(p) || snap.Trace[0].Seq != 1 || snap.Trace[1].Seq != seq || seq != 2 {
		t.Fatalf("trace %+v (alloc seq %d); want segment_alloc (seq 1) then the alloc (seq 2)", snap.Trace, seq)
	}
	if len(snap.Segments) != 1 || !snap.Segments[0].Small {
		t.Errorf("segments %+v: want one, small (it serves a 4 KiB request)", snap.Segments)
	}
}

// TestHistorySegmentGrown: a spill segment grown in place (a second
// request of 1–10 MiB on its stream) is a segment_map of the range added
// at its end, as PyTorch records its expandable segments, not a
// segment_free of a segment whose blocks are still live; given back, it
// is one segment_free of its whole size.
func TestHistorySegmentGrown(t *testing.T) {
	b := New(Config{Sim: true, SimMemory: 256 << 20})
	defer b.Close()
	if err := b.RecordHistory(true, 0); err != nil {
		t.Fatal(err)
	}
	const stream = 0x21
	p, err := b.Alloc(3<<20, 0, stream)
	if err != nil {
		t.Fatal(err)
	}
	q, err := b.Alloc(3<<20, 0, stream)
	if err != nil {
		t.Fatal(err)
	}
	if q != p+3<<20 {
		t.Fatalf("second 3 MiB at %#x, want %#x (the first one's segment grown in place)", q, p+3<<20)
	}
	snap, err := b.Snapshot(0)
	if err != nil {
		t.Fatal(err)
	}
	var segs []string
	for _, e := range snap.Trace {
		if e.Action != ActionAlloc && e.Action != ActionFreeRequested && e.Action != ActionFreeCompleted {
			segs = append(segs, fmt.Sprintf("%s %#x+%d", e.Action, e.Addr, e.Size))
		}
	}
	want := []string{
		fmt.Sprintf("%s %#x+%d", ActionSegmentAlloc, uint64(p), 4<<20),
		fmt.Sprintf("%s %#x+%d", ActionSegmentMap, uint64(p)+4<<20, 2<<20),
	}
	if !slices.Equal(segs, want) {
		t.Fatalf("segment events %v, want %v", segs, want)
	}
	for _, x := range []cuda.DevicePtr{p, q} {
		if err := b.Free(x, 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.EmptyCache(); err != nil {
		t.Fatal(err)
	}
	snap, err = b.Snapshot(0)
	if err != nil {
		t.Fatal(err)
	}
	last := snap.Trace[len(snap.Trace)-1]
	if last.Action != ActionSegmentFree || last.Addr != uint64(p) || last.Size != 6<<20 {
		t.Errorf("after EmptyCache the last event is %+v, want a segment_free of %#x, 6 MiB", last, uint64(p))
	}
}

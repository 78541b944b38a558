package bridge

import (
	"testing"

	"github.com/arenaplan/arenaplan/cuda"
)

// snapStep runs a model-like step on stream: activations freed two layers
// later, a workspace per layer, one output kept (returned).
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

	if !b.FastPathAllowed() {
		t.Fatal("FastPathAllowed false before recording")
	}
	if err := b.RecordHistory(true, 0); err != nil {
		t.Fatal(err)
	}
	if b.FastPathAllowed() || !b.Recording() {
		t.Fatal("recording history: the fast path must stay shut")
	}
	if _, keep, err := b.AllocCacheable(1024, 0, 0x41); err != nil || keep {
		t.Fatalf("AllocCacheable while recording: keepable %v, %v", keep, err)
	}

	if err := s.Serve(stream, true); err != nil {
		t.Fatal(err)
	}
	out = snapStep(t, b, stream)
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
	if len(arenaSeg.Blocks) != rep.Buffers {
		t.Fatalf("arena segment has %d blocks, the plan %d buffers", len(arenaSeg.Blocks), rep.Buffers)
	}
	active := 0
	for _, bl := range arenaSeg.Blocks {
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

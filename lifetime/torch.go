package lifetime

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"unsafe"
)

// This file turns a PyTorch memory snapshot (the pickle that
// torch.cuda.memory._snapshot() returns, saved with pickle.dump) into
// traces. The pickle is decoded by pickle.go into plain values once, and
// those values are converted once into the typed events below.
//
// Time axis. Logical time counts the alloc and free_requested events of a
// device's event list, in order, starting at 0: the k-th such event happens
// at time k. A buffer is born at the time of its alloc. It dies at the time
// of its free_requested, unless the list has a free_completed for it: then
// it lives until that completion, which PyTorch emits once every stream
// that used the block is done with it. free_completed events do not count
// on the time axis (so that the axis is the one the shipped CSVs use); a
// completion ends a lifetime at max(time of the free_requested, 1 + time of
// the last alloc before the completion). That is the earliest End that
// still overlaps every buffer allocated while the block was waiting, and
// when the completion directly follows its request (as in every snapshot in
// ../shared/data) it equals the free_requested time, so the lifetimes, the
// CSVs and the lower bound agree exactly. Blocks never freed live to the
// end of the trace, End = (number of counted events) + 1, as in the CSVs and
// in Recorder. Frees of blocks not allocated within the trace (allocated
// before recording began) are not buffers of the trace.
//
// Reserved bytes. The snapshot's segments are the allocator's state after
// the trace. Reserved bytes before the trace are those segments' total,
// less the bytes of segment_alloc (and segment_map) events in the trace,
// plus those of segment_free (and segment_unmap); replaying the events
// forward from there gives the peak reserved during the trace.
//
// Live at start. Blocks live before the trace began are either still live
// after it and untouched by it (active blocks in the snapshot's segments
// whose address no event of the trace mentions), or were freed during it
// without being allocated in it. The first are counted with the block size
// the snapshot gives; the second with the event's size rounded up to
// PyTorch's 512-byte block granularity (the snapshot no longer has them;
// large blocks can be a little bigger, so this may undercount slightly).
// TorchStats.Reserved() is then the peak reserved less those bytes, the
// part of the allocator's memory the trace's own buffers needed.

// Limits on what a snapshot may make us hold.
const (
	maxTorchDevices = 1 << 10
	maxTorchEvents  = 1 << 25 // over all devices
	maxTorchBlocks  = 1 << 25 // over all segments
	// torchBlockRound is PyTorch's kMinBlockSize: allocations are served in
	// multiples of it.
	torchBlockRound = 512
)

type torchAction uint8

const (
	torchOther torchAction = iota
	torchAlloc
	torchFreeRequested
	torchFreeCompleted
	torchSegmentAlloc
	torchSegmentFree
)

var torchActions = map[string]torchAction{
	"alloc":          torchAlloc,
	"free_requested": torchFreeRequested,
	"free_completed": torchFreeCompleted,
	"segment_alloc":  torchSegmentAlloc,
	"segment_free":   torchSegmentFree,
	// Expandable segments grow and shrink by mapping pages.
	"segment_map":   torchSegmentAlloc,
	"segment_unmap": torchSegmentFree,
}

// torchEvent is one entry of a device's event list, the fields we use.
type torchEvent struct {
	action torchAction
	addr   int64
	size   int64
	stream int64
}

// What converting a snapshot holds, counted against maxTraceMemory with
// the decoded pickle: an event, an entry of torchConverter.events, the
// maps of torchTrace's replay per event (up to two keys of 40 bytes with
// the maps' slack), a segment, a block.
var (
	torchEventBytes    = uint64(unsafe.Sizeof(torchEvent{}))
	torchEventMapBytes = uint64(64)
	torchReplayBytes   = uint64(96)
	torchSegmentBytes  = uint64(unsafe.Sizeof(torchSegment{}))
	torchBlockBytes    = uint64(unsafe.Sizeof(torchBlock{}))
)

// torchSegment is one segment of the snapshot, the fields we use.
type torchSegment struct {
	device    int64
	totalSize int64
	blocks    []torchBlock
}

type torchBlock struct {
	addr   int64
	size   int64
	active bool // allocated (possibly with a free pending) at snapshot time
}

// ReadTorchSnapshot reads a pickled torch.cuda.memory._snapshot() and
// returns one trace per device whose event list is not empty, in device
// order. Each trace's Torch field says what the caching allocator reserved.
// With several devices the names are name + "[cuda:N]".
func ReadTorchSnapshot(r io.Reader, name string) ([]*Trace, error) {
	return readTorchSnapshot(r, name, -1)
}

// readTorchSnapshot is ReadTorchSnapshot of an input of size bytes, or -1
// where unknown.
func readTorchSnapshot(r io.Reader, name string, size int) ([]*Trace, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	head, err := br.Peek(headBytes)
	if err != nil && err != io.EOF && err != bufio.ErrBufferFull {
		return nil, fmt.Errorf("torch: %w", err)
	}
	if err := checkPickleHead(head); err != nil {
		return nil, fmt.Errorf("torch: %w", err)
	}
	v, size, cost, err := decodePickleFrom(&limitReader{r: br, left: MaxFileSize}, size)
	if err != nil {
		return nil, fmt.Errorf("torch: %w", err)
	}
	// What the decoded pickle holds is still held while it is converted.
	traces, err := torchTraces(v, name, size, &decodeBudget{used: cost})
	if err != nil {
		return nil, fmt.Errorf("torch: %w", err)
	}
	return traces, nil
}

// checkPickleHead refuses an input that does not start as a pickle of
// protocol 2 to 5 does (what torch.cuda.memory._snapshot() is saved as).
func checkPickleHead(head []byte) error {
	switch {
	case len(head) == 0:
		return errors.New("empty input: want a pickled memory snapshot")
	case len(head) < 2 || head[0] != 0x80 || head[1] < 2 || head[1] > 5:
		return fmt.Errorf("not a pickled memory snapshot: a pickle of protocol 2 to 5 starts with 0x80 and the protocol, this input with % x", head[:min(len(head), 8)])
	}
	return nil
}

// torchBudget counts the list items the converter walks (events, segments,
// blocks) against the size of the input, one item per minTorchItemBytes.
// A list the file spells out costs several input bytes per item: a real
// snapshot spends 64 to 134 bytes per event (../shared/data/torch), and no
// valid event dict can be written in fewer than 6 bytes (an alloc or free
// one, with its address and size, in fewer than 15). Only a list referenced
// again through the pickle memo yields items the file did not pay for: one
// 67 KB pickle can name a 32768-item list 1024 times, 33 M events that cost
// 11.5 GB. Walking more items than the budget allows is refused, so that
// converting a snapshot costs time and memory proportional to its size.
type torchBudget struct {
	left, size int
}

// minTorchItemBytes is the input bytes each walked list item costs.
const minTorchItemBytes = 8

func newTorchBudget(size int) *torchBudget {
	return &torchBudget{left: size / minTorchItemBytes, size: size}
}

func (b *torchBudget) spend(n int, what string) error {
	if b.left -= n; b.left < 0 {
		return fmt.Errorf("%s: more list items than a snapshot of %d bytes can hold (one per %d bytes): lists repeated through pickle memo references", what, b.size, minTorchItemBytes)
	}
	return nil
}

func torchTraces(v any, name string, size int, mem *decodeBudget) ([]*Trace, error) {
	budget := newTorchBudget(size)
	top, ok := v.(*pickleDict)
	if !ok {
		return nil, fmt.Errorf("snapshot is a %s, not a dict", pickleTypeName(v))
	}
	dtv, ok := top.get("device_traces")
	if !ok {
		return nil, errors.New("snapshot has no device_traces (record it with torch.cuda.memory._record_memory_history)")
	}
	dtl, ok := dtv.(*pickleList)
	if !ok {
		return nil, fmt.Errorf("device_traces is a %s, not a list", pickleTypeName(dtv))
	}
	if len(dtl.items) > maxTorchDevices {
		return nil, fmt.Errorf("device_traces has %d devices, more than %d", len(dtl.items), maxTorchDevices)
	}

	var segs []torchSegment
	segv, hasSegs := top.get("segments")
	if hasSegs {
		var err error
		if segs, err = torchSegments(segv, budget); err != nil {
			return nil, err
		}
		// The segments, and their copies by device below.
		if err := mem.spendOn("segments", 2*torchSegmentBytes*uint64(len(segs))); err != nil {
			return nil, err
		}
		for i := range segs {
			if err := mem.spendOn("segments", torchBlockBytes*uint64(len(segs[i].blocks))); err != nil {
				return nil, err
			}
		}
	}

	conv := torchConverter{events: map[*pickleDict]torchEvent{}, mem: mem}
	type devEvents struct {
		dev    int
		events []torchEvent
	}
	var devs []devEvents
	for dev, lv := range dtl.items {
		l, ok := lv.(*pickleList)
		if !ok {
			return nil, fmt.Errorf("device_traces[%d] is a %s, not a list", dev, pickleTypeName(lv))
		}
		if len(l.items) == 0 {
			continue
		}
		if err := budget.spend(len(l.items), fmt.Sprintf("device_traces[%d]", dev)); err != nil {
			return nil, err
		}
		evs, err := conv.eventList(l, dev)
		if err != nil {
			return nil, err
		}
		devs = append(devs, devEvents{dev, evs})
	}
	if len(devs) == 0 {
		return nil, errors.New("snapshot has no trace events (was recording enabled during the step?)")
	}
	// Each device reads only its own segments, so that many devices times
	// many segments does not cost their product.
	byDev := map[int64][]torchSegment{}
	for _, sg := range segs {
		byDev[sg.device] = append(byDev[sg.device], sg)
	}
	traces := make([]*Trace, 0, len(devs))
	for _, d := range devs {
		n := name
		if len(devs) > 1 {
			n = fmt.Sprintf("%s[cuda:%d]", name, d.dev)
		}
		t, err := torchTrace(n, d.dev, d.events, byDev[int64(d.dev)], hasSegs, mem)
		if err != nil {
			return nil, err
		}
		traces = append(traces, t)
	}
	return traces, nil
}

// torchConverter converts event dicts once each: a hostile pickle can make
// one memoized dict appear many times, and converting it again each time
// would let a small file cost a lot of work.
type torchConverter struct {
	events map[*pickleDict]torchEvent
	total  int
	mem    *decodeBudget
}

func (c *torchConverter) eventList(l *pickleList, dev int) ([]torchEvent, error) {
	if c.total += len(l.items); c.total > maxTorchEvents {
		return nil, fmt.Errorf("more than %d trace events", maxTorchEvents)
	}
	// The events, and what replaying them holds (torchTrace).
	if err := c.mem.spendOn(fmt.Sprintf("device_traces[%d]", dev), (torchEventBytes+torchReplayBytes)*uint64(len(l.items))); err != nil {
		return nil, err
	}
	evs := make([]torchEvent, len(l.items))
	for i, ev := range l.items {
		d, ok := ev.(*pickleDict)
		if !ok {
			return nil, fmt.Errorf("device_traces[%d][%d] is a %s, not a dict", dev, i, pickleTypeName(ev))
		}
		if e, ok := c.events[d]; ok {
			evs[i] = e
			continue
		}
		e, err := torchEventOf(d)
		if err != nil {
			return nil, fmt.Errorf("device_traces[%d][%d]: %w", dev, i, err)
		}
		if err := c.mem.spendOn(fmt.Sprintf("device_traces[%d][%d]", dev, i), torchEventMapBytes); err != nil {
			return nil, err
		}
		c.events[d] = e
		evs[i] = e
	}
	return evs, nil
}

func torchEventOf(d *pickleDict) (torchEvent, error) {
	var e torchEvent
	av, ok := d.get("action")
	if !ok {
		return e, errors.New("event has no action")
	}
	a, ok := av.(string)
	if !ok {
		return e, fmt.Errorf("action is a %s, not a str", pickleTypeName(av))
	}
	e.action = torchActions[a]
	if e.action == torchOther {
		return e, nil // oom, snapshot, ...: nothing to replay
	}
	var err error
	if e.addr, err = torchInt(d, "addr", true); err != nil {
		return e, err
	}
	if e.size, err = torchInt(d, "size", true); err != nil {
		return e, err
	}
	if e.size < 0 || e.size > MaxSize {
		return e, fmt.Errorf("%s event: size %d is out of range", a, e.size)
	}
	if e.stream, err = torchInt(d, "stream", false); err != nil {
		return e, err
	}
	return e, nil
}

// absInt is |v| as an unsigned number (MinInt64 included).
func absInt(v int64) uint64 {
	if v < 0 {
		return -uint64(v)
	}
	return uint64(v)
}

// torchInt returns an int field of a dict; a missing optional field is 0.
func torchInt(d *pickleDict, key string, required bool) (int64, error) {
	v, ok := d.get(key)
	if !ok {
		if required {
			return 0, fmt.Errorf("no %q field", key)
		}
		return 0, nil
	}
	switch x := v.(type) {
	case int64:
		return x, nil
	case bool:
		// Python's bool is an int; pickle writes them as NEWTRUE/NEWFALSE.
		if x {
			return 1, nil
		}
		return 0, nil
	case pickleBigInt:
		return 0, fmt.Errorf("field %q does not fit in 64 bits", key)
	case nil:
		if !required {
			return 0, nil
		}
	}
	return 0, fmt.Errorf("field %q is a %s, not an int", key, pickleTypeName(v))
}

func torchSegments(v any, budget *torchBudget) ([]torchSegment, error) {
	l, ok := v.(*pickleList)
	if !ok {
		return nil, fmt.Errorf("segments is a %s, not a list", pickleTypeName(v))
	}
	if err := budget.spend(len(l.items), "segments"); err != nil {
		return nil, err
	}
	segs := make([]torchSegment, 0, len(l.items))
	nblocks := 0
	for i, sv := range l.items {
		sd, ok := sv.(*pickleDict)
		if !ok {
			return nil, fmt.Errorf("segments[%d] is a %s, not a dict", i, pickleTypeName(sv))
		}
		var s torchSegment
		var err error
		if s.device, err = torchInt(sd, "device", false); err != nil {
			return nil, fmt.Errorf("segments[%d]: %w", i, err)
		}
		if s.totalSize, err = torchInt(sd, "total_size", true); err != nil {
			return nil, fmt.Errorf("segments[%d]: %w", i, err)
		}
		if s.totalSize < 0 || s.totalSize > MaxSize {
			return nil, fmt.Errorf("segments[%d]: total_size %d is out of range", i, s.totalSize)
		}
		if bv, ok := sd.get("blocks"); ok {
			bl, ok := bv.(*pickleList)
			if !ok {
				return nil, fmt.Errorf("segments[%d]: blocks is a %s, not a list", i, pickleTypeName(bv))
			}
			if nblocks += len(bl.items); nblocks > maxTorchBlocks {
				return nil, fmt.Errorf("more than %d blocks in segments", maxTorchBlocks)
			}
			if err := budget.spend(len(bl.items), fmt.Sprintf("segments[%d].blocks", i)); err != nil {
				return nil, err
			}
			s.blocks = make([]torchBlock, len(bl.items))
			for j, bv := range bl.items {
				bd, ok := bv.(*pickleDict)
				if !ok {
					return nil, fmt.Errorf("segments[%d].blocks[%d] is a %s, not a dict", i, j, pickleTypeName(bv))
				}
				b := &s.blocks[j]
				if b.addr, err = torchInt(bd, "address", true); err != nil {
					return nil, fmt.Errorf("segments[%d].blocks[%d]: %w", i, j, err)
				}
				if b.size, err = torchInt(bd, "size", true); err != nil {
					return nil, fmt.Errorf("segments[%d].blocks[%d]: %w", i, j, err)
				}
				if b.size < 0 || b.size > MaxSize {
					return nil, fmt.Errorf("segments[%d].blocks[%d]: size %d is out of range", i, j, b.size)
				}
				st, _ := bd.get("state")
				state, _ := st.(string)
				// "active_allocated" and "active_pending_free" are both still
				// allocated; "inactive" is cached free space.
				b.active = state == "active_allocated" || state == "active_pending_free"
			}
		}
		segs = append(segs, s)
	}
	return segs, nil
}

// torchTrace replays one device's events into a trace and its TorchStats;
// segs are the segments of that device.
func torchTrace(name string, dev int, evs []torchEvent, segs []torchSegment, hasSegs bool, mem *decodeBudget) (*Trace, error) {
	t := &Trace{Name: name}
	// The buffers are counted first, so that Buffers is made once, of
	// exactly their number, and names go into an arena: the trace holds
	// 128 bytes a buffer and its name's, nothing more.
	nb := 0
	for _, e := range evs {
		if e.action == torchAlloc && e.size > 0 {
			nb++
		}
	}
	if nb > 0 {
		if err := mem.spendOn(name, bufferBytes*uint64(nb)); err != nil {
			return nil, err
		}
		t.Buffers = make([]Buffer, 0, nb)
	}
	var (
		names   arena[byte]
		nameBuf []byte
	)
	var (
		now       int64 = 0               // counted events so far
		lastAlloc int64 = -1              // time of the latest alloc
		live            = map[int64]int{} // addr -> buffer index, not yet freed
		pending         = map[int64]int{} // addr -> buffer index, free requested, not completed
		touched         = map[int64]bool{}
		// preFreed holds addresses of blocks from before the trace whose
		// free was requested but not completed, so a completion is not
		// counted twice.
		preFreed    = map[int64]bool{}
		liveAtStart int64
		segDelta    int64 // segment bytes allocated less freed during the trace
	)
	for i, e := range evs {
		switch e.action {
		case torchAlloc:
			touched[e.addr] = true
			delete(pending, e.addr) // the block was evidently free again
			delete(preFreed, e.addr)
			if j, ok := live[e.addr]; ok {
				// Two allocs of one address without a free between them:
				// the free was lost, so end the older block here.
				t.Buffers[j].End = now
				delete(live, e.addr)
			}
			if e.size > 0 {
				j := len(t.Buffers)
				live[e.addr] = j
				// The name is fmt's "0x%x@alloc#%d" of the address and i.
				nameBuf = append(nameBuf[:0], "0x"...)
				if e.addr < 0 {
					nameBuf = append(nameBuf, '-')
				}
				nameBuf = strconv.AppendUint(nameBuf, absInt(e.addr), 16)
				nameBuf = append(nameBuf, "@alloc#"...)
				nameBuf = strconv.AppendInt(nameBuf, int64(i), 10)
				if mem.used += names.add(nameBuf); mem.used > maxTraceMemory {
					return nil, fmt.Errorf("%s: %w", name, traceMemoryError(j, string(nameBuf)))
				}
				t.Buffers = append(t.Buffers, Buffer{
					ID:     ID(j),
					Name:   lastString(&names, len(nameBuf)),
					Size:   e.size,
					Start:  now,
					Stream: e.stream,
				})
			}
			lastAlloc = now
			now++
		case torchFreeRequested:
			touched[e.addr] = true
			if j, ok := live[e.addr]; ok {
				t.Buffers[j].End = now
				delete(live, e.addr)
				pending[e.addr] = j
			} else if _, ok := pending[e.addr]; !ok && !preFreed[e.addr] {
				liveAtStart += RoundUp(max(e.size, 1), torchBlockRound)
				preFreed[e.addr] = true
			}
			now++
		case torchFreeCompleted:
			touched[e.addr] = true
			if j, ok := pending[e.addr]; ok {
				t.Buffers[j].End = max(t.Buffers[j].End, lastAlloc+1)
				delete(pending, e.addr)
			} else if j, ok := live[e.addr]; ok {
				// A completion without a request: it ends the block all the same.
				t.Buffers[j].End = max(t.Buffers[j].Start+1, lastAlloc+1)
				delete(live, e.addr)
			} else if preFreed[e.addr] {
				delete(preFreed, e.addr)
			} else {
				liveAtStart += RoundUp(max(e.size, 1), torchBlockRound)
			}
		case torchSegmentAlloc:
			segDelta += e.size
		case torchSegmentFree:
			segDelta -= e.size
		}
	}
	for _, j := range live {
		t.Buffers[j].End = now + 1
	}

	st := &TorchStats{Device: dev, HasSegments: hasSegs, LiveAtStart: liveAtStart}
	if hasSegs {
		var reservedAfter int64
		var kept []torchBlock
		for _, s := range segs {
			if s.device != int64(dev) {
				continue
			}
			reservedAfter += s.totalSize
			for _, b := range s.blocks {
				if b.active && !touched[b.addr] {
					liveAtStart += b.size
					kept = append(kept, b)
				}
			}
		}
		if len(kept) > 0 {
			if err := mem.spendOn(name, 8*uint64(len(kept))); err != nil {
				return nil, err
			}
			sort.Slice(kept, func(i, j int) bool { return kept[i].addr < kept[j].addr })
			st.Kept = make([]int64, len(kept))
			for i, b := range kept {
				st.Kept[i] = b.size
			}
		}
		reserved := reservedAfter - segDelta
		peak := reserved
		ok := reserved >= 0
		for _, e := range evs {
			switch e.action {
			case torchSegmentAlloc:
				reserved += e.size
			case torchSegmentFree:
				reserved -= e.size
			}
			peak = max(peak, reserved)
			ok = ok && reserved >= 0
		}
		st.LiveAtStart = liveAtStart
		if ok {
			st.ReservedPeak = peak
		} else {
			// Segment events and the final state contradict each other
			// (events were lost): report no segment data rather than a
			// made-up number.
			st.HasSegments = false
		}
	}
	t.Torch = st
	if err := t.Validate(); err != nil {
		return nil, err
	}
	return t, nil
}

package spill

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/arenaplan/arenaplan/cuda"
)

// devSource is a SegmentSource over the device's cuMemAlloc that records
// what it was asked.
type devSource struct {
	dev    cuda.Device
	live   map[cuda.DevicePtr]uint64
	allocs []uint64 // sizes asked for, in order
	frees  int
	fail   error // AllocSegment's answer while set
}

func (d *devSource) AllocSegment(size uint64, st cuda.Stream) (cuda.DevicePtr, error) {
	if d.fail != nil {
		return 0, d.fail
	}
	p, err := d.dev.Alloc(size)
	if err != nil {
		return 0, err
	}
	d.live[p] = size
	d.allocs = append(d.allocs, size)
	return p, nil
}

func (d *devSource) FreeSegment(p cuda.DevicePtr, size uint64, st cuda.Stream) error {
	if d.live[p] != size {
		return fmt.Errorf("free of %#x with %d bytes: not a live segment of that size", uint64(p), size)
	}
	delete(d.live, p)
	d.frees++
	return d.dev.Free(p)
}

// A user pool with a source sub-allocates the segments it asks for in
// PyTorch's sizes, keeps them while held (EmptyCache included), gives
// the free ones back at release and the others at their last free.
func TestUserPoolExternalSegments(t *testing.T) {
	e := newSimEnv(t, 1*GiB)
	s := newSpill(t, e)
	st := e.Stream(t)
	src := &devSource{dev: e.Dev, live: map[cuda.DevicePtr]uint64{}}
	p, err := s.NewUserPool("pool 1", src)
	if err != nil {
		t.Fatal(err)
	}
	var small []cuda.DevicePtr
	for range 8 {
		a, err := s.AllocIn(p, 100<<10, st)
		if err != nil {
			t.Fatal(err)
		}
		small = append(small, a)
	}
	mid, err := s.AllocIn(p, 3*MiB, st)
	if err != nil {
		t.Fatal(err)
	}
	big, err := s.AllocIn(p, 30*MiB+1, st)
	if err != nil {
		t.Fatal(err)
	}
	// Eight 100 KiB blocks share one 2 MiB segment; 3 MiB takes 20 MiB;
	// 30 MiB+1 is rounded to 32 MiB.
	if want := []uint64{2 * MiB, 20 * MiB, 32 * MiB}; fmt.Sprint(src.allocs) != fmt.Sprint(want) {
		t.Fatalf("segments asked for: %v, want %v", src.allocs, want)
	}
	for _, a := range append(small, mid, big) {
		if _, ok := src.live[segmentOf(t, s, a)]; !ok {
			t.Fatalf("block %#x is not in a segment of the source", uint64(a))
		}
	}
	// Default allocations never land in the user pool's segments.
	other := mustAlloc(t, s, 100<<10, st)
	for seg := range src.live {
		if other >= seg && uint64(other) < uint64(seg)+src.live[seg] {
			t.Fatalf("a default allocation %#x landed in the user pool's segment %#x", uint64(other), uint64(seg))
		}
	}
	if err := s.Free(big); err != nil {
		t.Fatal(err)
	}
	if err := s.EmptyCache(); err != nil {
		t.Fatal(err)
	}
	if src.frees != 0 {
		t.Fatalf("EmptyCache gave back %d segments of a held user pool", src.frees)
	}
	if err := s.PausePools(p); err == nil {
		t.Fatal("PausePools of a pool with external segments succeeded")
	}
	if got := s.GraphPools(); len(got) != 0 {
		t.Fatalf("GraphPools lists %v: a user pool is not a graph's", got)
	}
	us, err := s.UserPoolStats(p)
	if err != nil {
		t.Fatal(err)
	}
	if us.Segments != 3 || us.Live != 9 || us.Released {
		t.Fatalf("UserPoolStats = %+v, want 3 segments, 9 live", us)
	}

	if err := s.ReleaseUserPool(p); err != nil {
		t.Fatal(err)
	}
	if src.frees != 1 || len(src.live) != 2 {
		t.Fatalf("release gave back %d segments (%d left), want the free 32 MiB one", src.frees, len(src.live))
	}
	if _, err := s.AllocIn(p, 512, st); err == nil {
		t.Fatal("AllocIn of a released pool succeeded")
	}
	if err := s.ReleaseUserPool(p); !errors.Is(err, ErrUnknown) {
		t.Fatalf("second release: %v, want ErrUnknown", err)
	}
	if err := s.Free(mid); err != nil {
		t.Fatal(err)
	}
	if src.frees != 2 {
		t.Fatalf("the 20 MiB segment's last free gave back %d segments in all, want 2", src.frees)
	}
	for i, a := range small {
		if err := s.Free(a); err != nil {
			t.Fatal(err)
		}
		if want := i == len(small)-1; (len(src.live) == 0) != want {
			t.Fatalf("after %d of %d small frees: %d segments live", i+1, len(small), len(src.live))
		}
	}
	if err := s.Free(other); err != nil {
		t.Fatal(err)
	}
	if got := s.Stats(); got.Live != 0 || got.InUse != 0 {
		t.Fatalf("stats after everything freed: %+v", got)
	}
}

// segmentOf returns the base of the segment holding p.
func segmentOf(t *testing.T, s *Allocator, p cuda.DevicePtr) cuda.DevicePtr {
	t.Helper()
	for _, seg := range s.Segments() {
		if uint64(p) >= seg.Addr && uint64(p) < seg.Addr+seg.Size {
			return cuda.DevicePtr(seg.Addr)
		}
	}
	t.Fatalf("%#x is in no segment", uint64(p))
	return 0
}

// A source that fails or returns a bad address makes AllocIn fail with the
// state unchanged; a user pool without a source uses the allocator's own
// memory and gives it back after its last free; Close gives external
// segments back.
func TestUserPoolFailuresAndOwnMemory(t *testing.T) {
	e := newSimEnv(t, 1*GiB)
	s := newSpill(t, e)
	st := e.Stream(t)
	src := &devSource{dev: e.Dev, live: map[cuda.DevicePtr]uint64{}, fail: errors.New("no memory here")}
	p, err := s.NewUserPool("failing", src)
	if err != nil {
		t.Fatal(err)
	}
	before := s.Stats()
	if _, err := s.AllocIn(p, 4096, st); err == nil || !errors.Is(err, src.fail) {
		t.Fatalf("AllocIn with a failing source: %v", err)
	}
	if after := s.Stats(); after.Mapped != before.Mapped || after.Live != before.Live {
		t.Fatalf("a failed AllocIn changed the stats: %+v -> %+v", before, after)
	}
	src.fail = nil
	if _, err := s.AllocIn(p, 4096, st); err != nil {
		t.Fatal(err)
	}

	own, err := s.NewUserPool("own", nil)
	if err != nil {
		t.Fatal(err)
	}
	a, err := s.AllocIn(own, 5*MiB, st)
	if err != nil {
		t.Fatal(err)
	}
	mapped := s.Stats().Mapped
	if err := s.ReleaseUserPool(own); err != nil {
		t.Fatal(err)
	}
	if err := s.Free(a); err != nil {
		t.Fatal(err)
	}
	mustAlloc(t, s, 512, st) // sees the work queued on the segment done: unmapped (a 2 MiB segment mapped)
	if got := s.Stats().Mapped; got >= mapped {
		t.Fatalf("mapped %d after the released pool's last free and an Alloc, was %d", got, mapped)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if len(src.live) != 0 {
		t.Fatalf("Close left %d external segments with their source", len(src.live))
	}
}

// badSource returns a misaligned address.
type badSource struct{ freed int }

func (b *badSource) AllocSegment(uint64, cuda.Stream) (cuda.DevicePtr, error) {
	return 0x1000_0001, nil
}
func (b *badSource) FreeSegment(cuda.DevicePtr, uint64, cuda.Stream) error {
	b.freed++
	return nil
}

func TestUserPoolMisalignedSegment(t *testing.T) {
	e := newSimEnv(t, 1*GiB)
	s := newSpill(t, e)
	st := e.Stream(t)
	src := &badSource{}
	p, err := s.NewUserPool("bad", src)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.AllocIn(p, 4096, st); err == nil {
		t.Fatal("a misaligned segment was used")
	}
	if src.freed != 1 {
		t.Fatalf("the misaligned segment was given back %d times, want 1", src.freed)
	}
}

// orderLog is a device that logs, in order, synchronizations, events
// recorded and seen complete, and unmaps.
type orderLog struct {
	cuda.Device
	log *[]string
}

func (d orderLog) Synchronize() error {
	*d.log = append(*d.log, "sync")
	return d.Device.Synchronize()
}

func (d orderLog) MemUnmap(p cuda.DevicePtr, size uint64) error {
	*d.log = append(*d.log, "unmap")
	return d.Device.MemUnmap(p, size)
}

func (d orderLog) NewEvent(timing bool) (cuda.Event, error) {
	ev, err := d.Device.NewEvent(timing)
	if err != nil {
		return nil, err
	}
	return orderEvent{ev, d.log}, nil
}

type orderStream struct {
	cuda.Stream
	log *[]string
}

func (st orderStream) Synchronize() error {
	*st.log = append(*st.log, "stream sync")
	return st.Stream.Synchronize()
}

type orderEvent struct {
	cuda.Event
	log *[]string
}

func (e orderEvent) Record(st cuda.Stream) error {
	*e.log = append(*e.log, "record")
	return e.Event.Record(st)
}

func (e orderEvent) Query() error {
	err := e.Event.Query()
	if err == nil {
		*e.log = append(*e.log, "done")
	}
	return err
}

// A block is freed as soon as its last kernel is queued, and cuMemUnmap
// does not wait for queued work: a segment is unmapped only after the
// work queued on it before its last free is done. A released user pool's
// segment waits for an event recorded at that free (seen at a later
// Alloc), or, wholly free at the release, for its stream there;
// EmptyCache for the whole device.
func TestSpillUnmapsOnlyAfterQueuedWork(t *testing.T) {
	e := newSimEnv(t, 1*GiB)
	var log []string
	s, err := New(orderLog{e.Dev, &log})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	st := e.Stream(t)
	p, err := s.NewUserPool("pool 1", nil)
	if err != nil {
		t.Fatal(err)
	}
	a, err := s.AllocIn(p, 40*MiB, st)
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.AllocIn(p, 40*MiB, st)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.ReleaseUserPool(p); err != nil {
		t.Fatal(err)
	}
	mapped := s.Stats().Mapped
	log = nil
	mustFree(t, s, a)
	mustValid(t, s)
	if fmt.Sprint(log) != "[record]" || s.Stats().Mapped != mapped {
		t.Fatalf("the last free of a released pool's segment: %v, %d mapped (was %d); want an event recorded, nothing unmapped yet",
			log, s.Stats().Mapped, mapped)
	}
	c := mustAlloc(t, s, 4*MiB, st)
	if fmt.Sprint(log) != "[record done unmap]" {
		t.Fatalf("the next Alloc: %v, want the event seen complete, then the unmap", log)
	}
	mustValid(t, s)
	log = nil
	mustFree(t, s, b)
	mustFree(t, s, c)
	if err := s.EmptyCache(); err != nil {
		t.Fatal(err)
	}
	if len(log) < 3 || log[0] != "record" || log[1] != "sync" || slices.Index(log, "unmap") < 2 {
		t.Fatalf("EmptyCache after the frees: %v, want the device synchronized before any unmap", log)
	}
	if got := s.Stats(); got.Mapped != 0 || got.Segments != 0 {
		t.Fatalf("after EmptyCache: %d mapped in %d segments, want none", got.Mapped, got.Segments)
	}
	mustValid(t, s)

	// Released wholly free: its stream waited for once, both segments
	// unmapped then (the stream wrapped to see it waited for).
	q, err := s.NewUserPool("pool 2", nil)
	if err != nil {
		t.Fatal(err)
	}
	var two []cuda.DevicePtr
	for range 2 {
		a, err := s.AllocIn(q, 40*MiB, orderStream{st, &log})
		if err != nil {
			t.Fatal(err)
		}
		two = append(two, a)
	}
	for _, a := range two {
		mustFree(t, s, a)
	}
	log = nil
	if err := s.ReleaseUserPool(q); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(log) != "[stream sync unmap unmap]" || s.Stats().Mapped != 0 {
		t.Fatalf("release of a wholly free pool: %v, %d mapped; want its stream waited for, then the unmap", log, s.Stats().Mapped)
	}
	mustValid(t, s)
}

package arena

import (
	"bytes"
	"errors"
	"testing"

	"github.com/arenaplan/arenaplan/lifetime"
)

func TestGrowInPlace(t *testing.T) {
	e := newSimEnv(t, 64*MiB)
	gran, _ := e.Dev.Granularity(false)
	tr := &lifetime.Trace{Name: "grow", Buffers: []lifetime.Buffer{
		{ID: 0, Name: "a", Size: 3 * MiB, Start: 0, End: 1, Tag: "private"},
	}}
	a := newArena(t, e, tr, fixedPlan(tr, []int64{0}), WithRoom(8*MiB), WithHandleSize(gran))
	if lo, hi, ok := a.Within(mustPtr(t, a, 0).Add(MiB), mustPtr(t, a, 0).Add(9*MiB)); !ok || lo != MiB || hi != 3*MiB {
		t.Fatalf("Within: [%d, %d) %v", lo, hi, ok)
	}
	p := mustPtr(t, a, 0)
	want := bytes.Repeat([]byte{0x5a}, 3*MiB)
	if err := e.Dev.CopyHtoD(p, want); err != nil {
		t.Fatal(err)
	}
	free := e.Free(t)
	if err := a.Grow(7 * MiB); err != nil {
		t.Fatal(err)
	}
	if a.Size() != 7*MiB || mustPtr(t, a, 0) != p {
		t.Fatalf("after Grow: size %d, buffer at %#x (was %#x)", a.Size(), mustPtr(t, a, 0), p)
	}
	if used := free - e.Free(t); used != uint64(lifetime.RoundUp(7*MiB, int64(gran))-lifetime.RoundUp(3*MiB, int64(gran))) {
		t.Fatalf("Grow mapped %d bytes", used)
	}
	// The old bytes stay; the new ones are memory at the next addresses.
	got := readBuf(t, e, a, tr, 0)
	if !bytes.Equal(got, want) {
		t.Fatal("Grow changed the arena's contents")
	}
	tail := bytes.Repeat([]byte{0xc3}, 4*MiB)
	if err := e.Dev.CopyHtoD(p.Add(3*MiB), tail); err != nil {
		t.Fatalf("writing the grown part: %v", err)
	}
	// Pause and resume cover the grown part too.
	if err := a.Pause(); err != nil {
		t.Fatal(err)
	}
	if err := a.Grow(8 * MiB); err != nil {
		t.Fatal(err) // paused: mapped at Resume
	}
	if a.Mapped() != 0 {
		t.Fatalf("a paused arena maps %d bytes after Grow", a.Mapped())
	}
	if err := a.Resume(); err != nil {
		t.Fatal(err)
	}
	if a.Mapped() != uint64(lifetime.RoundUp(8*MiB, int64(gran))) {
		t.Fatalf("resumed: %d bytes mapped", a.Mapped())
	}
	// Past the room: refused, the arena as it was.
	if err := a.Grow(32 * MiB); !errors.Is(err, ErrOutOfMemory) {
		t.Fatalf("Grow past the room: %v", err)
	}
	if a.Size() != 8*MiB || a.Grow(4*MiB) != nil || a.Size() != 8*MiB {
		t.Fatalf("size %d after a refused and a smaller Grow", a.Size())
	}
}

func TestGrowRefusesBackedUpRegion(t *testing.T) {
	e := newSimEnv(t, 64*MiB)
	tr := &lifetime.Trace{Name: "kept", Buffers: []lifetime.Buffer{
		{ID: 0, Name: "w", Size: MiB, Start: 0, End: 1, Tag: "weight"},
	}}
	a := newArena(t, e, tr, fixedPlan(tr, []int64{0}), WithRoom(8*MiB), WithPolicy("weight", Backup))
	if err := a.Grow(2 * MiB); err == nil {
		t.Fatal("Grow extended a region that is backed up on Pause")
	}
	b := newArena(t, e, tr, fixedPlan(tr, []int64{0}))
	if err := b.Grow(16 * MiB); !errors.Is(err, ErrOutOfMemory) {
		t.Fatalf("Grow without room: %v", err)
	}
}

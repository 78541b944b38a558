package arena

import (
	"encoding/binary"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/arenaplan/arenaplan/cuda/devtest"
	"github.com/arenaplan/arenaplan/lifetime"
)

// The tests in this file run on the CUDA driver when cuda.Open(0)
// succeeds and skip with a message otherwise. Build them here and run them
// on a GPU machine:
//
//	CGO_ENABLED=0 go test -c -o .dev/arena.test ./arena
//	.dev/arena.test -test.run 'GPU' -test.v

func TestMain(m *testing.M) { devtest.Main(m) }

func TestGPUArena(t *testing.T) {
	e := devtest.GPU(t)
	t.Logf("device %s", e.Dev.Name())
	for _, c := range arenaCases {
		t.Run(c.name, func(t *testing.T) {
			devtest.BindGPU(t)
			c.run(t, e, false)
		})
	}
}

// TestGPUPauseLarge pauses and resumes 1 GiB and 16 GiB arenas: the free
// memory the driver reports must rise by the arena size, and the region
// must work again after Resume. It logs one canonical line per size.
func TestGPUPauseLarge(t *testing.T) {
	e := devtest.GPU(t)
	for _, c := range []struct {
		name   string
		size   int64
		policy Policy
	}{
		{"1GiB", 1 * GiB, Drop},
		{"16GiB", 16 * GiB, Drop},
		{"1GiB", 1 * GiB, Backup},
	} {
		t.Run(c.name+"-"+c.policy.String(), func(t *testing.T) {
			devtest.BindGPU(t)
			pauseLarge(t, e, c.name, c.size, c.policy)
		})
	}
}

func pauseLarge(t *testing.T, e *env, name string, size int64, policy Policy) {
	free, _, err := e.Dev.MemGetInfo()
	if err != nil {
		t.Fatal(err)
	}
	if uint64(size)+GiB > free {
		t.Skipf("%s arena needs more than the %d MiB free", name, free>>20)
	}
	tr := &lifetime.Trace{Name: "large-" + name, Buffers: []lifetime.Buffer{{Name: "big", Tag: "big",
		Size: size, Start: 0, End: 1}}}
	p := fixedPlan(tr, []int64{0})
	t0 := time.Now()
	a, err := New(e.Dev, tr, p, WithPolicy("big", policy))
	if err != nil {
		t.Fatal(err)
	}
	newMs := ms(time.Since(t0))
	defer a.Close()
	s := e.Stream(t)
	ptr := mustPtr(t, a, 0)
	words := uint64(size / 4)
	if err := e.Dev.Memset32(ptr, 0xab, words, s); err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	free0 := e.Free(t)
	t0 = time.Now()
	if err := a.Pause(); err != nil {
		t.Fatal(err)
	}
	pause := time.Since(t0)
	free1 := e.Free(t)
	returned := free1 - free0
	t0 = time.Now()
	if err := a.Resume(); err != nil {
		t.Fatal(err)
	}
	resume := time.Since(t0)
	checkDelta(t, "pause returned", returned, uint64(size), false)
	// The last word: restored for Backup, anything for Drop; then the
	// memory must take new work at the same address.
	last := make([]byte, 4)
	if err := e.Dev.CopyDtoH(last, ptr.Add(uint64(size)-4)); err != nil {
		t.Fatal(err)
	}
	if v := binary.LittleEndian.Uint32(last); policy == Backup && v != 0xab {
		t.Errorf("backup: last word %#x after resume, want 0xab", v)
	}
	if err := e.Dev.Memset32(ptr, 0xcd, words, s); err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if err := e.Dev.CopyDtoH(last, ptr.Add(uint64(size)-4)); err != nil || binary.LittleEndian.Uint32(last) != 0xcd {
		t.Errorf("after resume: last word %x, %v", last, err)
	}
	// A second cycle: a Backup region reuses the page-locked memory of
	// the first, so only the copies remain.
	t0 = time.Now()
	if err := a.Pause(); err != nil {
		t.Fatal(err)
	}
	pause2 := time.Since(t0)
	t0 = time.Now()
	if err := a.Resume(); err != nil {
		t.Fatal(err)
	}
	resume2 := time.Since(t0)
	if err := e.Dev.CopyDtoH(last, ptr.Add(uint64(size)-4)); err != nil {
		t.Fatal(err)
	}
	if v := binary.LittleEndian.Uint32(last); policy == Backup && v != 0xcd {
		t.Errorf("backup, second cycle: last word %#x after resume, want 0xcd", v)
	}
	extra := ""
	if policy == Backup {
		extra = " policy=backup"
	}
	t.Logf("PAUSE size=%s pause_ms=%.2f resume_ms=%.2f again: pause_ms=%.2f resume_ms=%.2f returned_MiB=%d%s (new_ms=%.2f handles=%d)",
		name, ms(pause), ms(resume), ms(pause2), ms(resume2), returned>>20, extra, newMs, len(a.regions[0].chunks))
	fmt.Fprintf(os.Stderr, "PAUSE size=%s pause_ms=%.2f resume_ms=%.2f again: pause_ms=%.2f resume_ms=%.2f returned_MiB=%d%s\n",
		name, ms(pause), ms(resume), ms(pause2), ms(resume2), returned>>20, extra)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

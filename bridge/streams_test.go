package bridge

import (
	"testing"
	"time"
)

// streamState counts what the bridge, its spill allocator and the
// device keep per stream handle.
func streamState(t *testing.T, b *Bridge) (bridgeStreams, trees, foreign int) {
	t.Helper()
	d := b.devices[0]
	d.mu.Lock()
	bridgeStreams = len(d.streams)
	d.mu.Unlock()
	trees = d.spill.Stats().FreeLists
	if f, ok := d.dev.(interface{ ForeignStreams() int }); ok {
		foreign = f.ForeignStreams()
	}
	return
}

// TestManyStreams: allocating and freeing on many distinct stream handles
// (a program that makes a stream per request) keeps the per-stream state
// bounded.
func TestManyStreams(t *testing.T) {
	n := 20000
	if testing.Short() {
		n = 5000
	}
	b := New(Config{Sim: true, SimMemory: 1 << 30, SpillAddressSpace: 1 << 30})
	defer b.Close()
	t0 := time.Now()
	for i := range n {
		h := uintptr(0x1000_0000 + i*0x100)
		p, err := b.Alloc(4096, 0, h)
		if err != nil {
			t.Fatalf("stream %d: %v", i, err)
		}
		if err := b.Free(p, 0); err != nil {
			t.Fatal(err)
		}
	}
	bs, trees, foreign := streamState(t, b)
	t.Logf("%d streams in %v: bridge cache %d, spill trees %d, device foreign streams %d", n, time.Since(t0), bs, trees, foreign)
	st, _ := b.Stats(0)
	if bs > maxStreams || trees > st.Spill.Segments || foreign > 4096 {
		t.Errorf("%d streams: bridge cache %d (most %d), spill free lists %d for %d segments, device foreign streams %d (most 4096)",
			n, bs, maxStreams, trees, st.Spill.Segments, foreign)
	}
	// A stream seen long ago is the same stream: its freed block is
	// reused, not a new segment mapped.
	p, err := b.Alloc(4096, 0, 0x1000_0000)
	if err != nil {
		t.Fatal(err)
	}
	segs := st.Spill.Segments
	if err := b.Free(p, 0); err != nil {
		t.Fatal(err)
	}
	q, err := b.Alloc(4096, 0, 0x1000_0000)
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := b.Stats(0); q != p || st.Spill.Segments > segs+1 {
		t.Errorf("the first stream's block %#x not reused (got %#x, %d segments)", uint64(p), uint64(q), st.Spill.Segments)
	}
}

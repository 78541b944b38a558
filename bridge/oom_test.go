package bridge

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/arenaplan/arenaplan/arena"
	"github.com/arenaplan/arenaplan/cuda"
)

// TestAllocMappedOrOutOfMemory: near the device's capacity every
// allocation either returns memory mapped for its whole size or fails
// with arena.ErrOutOfMemory, and it fails only when the device could not
// hold it: what stays mapped once the cache is trimmed, plus the request
// rounded to the allocator's chunk, passes the device's memory.
func TestAllocMappedOrOutOfMemory(t *testing.T) {
	const total = 256 << 20
	var sim *cuda.Sim
	b := New(Config{Open: func(int) (cuda.Device, error) {
		var err error
		sim, err = cuda.OpenSim(cuda.SimConfig{TotalMemory: total, Guest: true})
		return sim, err
	}})
	t.Cleanup(func() { b.Close() })
	rng := rand.New(rand.NewPCG(1, 2))
	type live struct {
		p    cuda.DevicePtr
		size uint64
	}
	var held []live
	var fails int
	for i := 0; i < 3000; i++ {
		if len(held) > 0 && rng.IntN(3) == 0 {
			k := rng.IntN(len(held))
			if err := b.Free(held[k].p, 0); err != nil {
				t.Fatal(err)
			}
			held = append(held[:k], held[k+1:]...)
			continue
		}
		size := uint64(1+rng.IntN(64)) << 20
		if rng.IntN(8) == 0 {
			size = uint64(total/2 + rng.IntN(total))
		}
		stream := uintptr(rng.IntN(3))
		p, err := b.Alloc(size, 0, stream)
		if err != nil {
			if !errors.Is(err, arena.ErrOutOfMemory) {
				t.Fatalf("allocation %d of %d bytes: %v, want out of memory", i, size, err)
			}
			st, _ := b.Stats(0)
			const chunk = 2 << 20
			if need := st.Spill.Mapped + (size+chunk-1)/chunk*chunk; need <= total {
				t.Fatalf("allocation %d of %d bytes refused with %d mapped (%d in use) of %d: %v",
					i, size, st.Spill.Mapped, st.Spill.InUse, total, err)
			}
			fails++
			continue
		}
		// Mapped for its whole size: its first and last bytes can be written.
		for _, at := range []uint64{0, size - 1} {
			if err := sim.CopyHtoD(p.Add(at), []byte{1}); err != nil {
				t.Fatalf("allocation %d of %d bytes at %#x: byte %d: %v", i, size, uint64(p), at, err)
			}
		}
		for _, h := range held {
			if uint64(p) < uint64(h.p)+h.size && uint64(h.p) < uint64(p)+size {
				t.Fatalf("allocation %d [%#x, +%d) overlaps a live one [%#x, +%d)", i, uint64(p), size, uint64(h.p), h.size)
			}
		}
		held = append(held, live{p, size})
	}
	if fails == 0 {
		t.Fatal("no request was refused: the sequence does not reach the device's capacity")
	}
	t.Logf("%d of 3000 requests refused as out of memory", fails)
}

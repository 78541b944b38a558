package bridge

import (
	"fmt"

	"github.com/arenaplan/arenaplan/cuda"
)

// zeroTokens hands out distinct addresses for 0-byte requests from a range
// of virtual addresses that is reserved and never mapped: PyTorch needs a
// distinct address per live allocation, never the bytes behind it. Its
// owner's lock (Device.mu) guards it.
type zeroTokens struct {
	dev  cuda.Device
	base cuda.DevicePtr
	size uint64

	next uint64           // first never-used token
	free []cuda.DevicePtr // given back
	live map[cuda.DevicePtr]bool
}

const (
	zeroStride = 256     // each token is an aligned address of its own
	zeroSpace  = 1 << 26 // 262144 tokens live at once
)

func newZeroTokens(dev cuda.Device) (*zeroTokens, error) {
	base, err := dev.AddressReserve(zeroSpace, 0)
	if err != nil {
		return nil, fmt.Errorf("reserving addresses for 0-byte allocations: %w", err)
	}
	return &zeroTokens{dev: dev, base: base, size: zeroSpace, live: map[cuda.DevicePtr]bool{}}, nil
}

func (z *zeroTokens) owns(p cuda.DevicePtr) bool {
	return p >= z.base && uint64(p-z.base) < z.size
}

func (z *zeroTokens) take() (cuda.DevicePtr, error) {
	var p cuda.DevicePtr
	switch {
	case len(z.free) > 0:
		p, z.free = z.free[len(z.free)-1], z.free[:len(z.free)-1]
	case z.next < z.size:
		p = z.base.Add(z.next)
		z.next += zeroStride
	default:
		return 0, fmt.Errorf("bridge: %d 0-byte allocations live at once: no distinct address left", z.size/zeroStride)
	}
	z.live[p] = true
	return p, nil
}

func (z *zeroTokens) give(p cuda.DevicePtr) error {
	if !z.live[p] {
		return fmt.Errorf("bridge: free of 0-byte allocation %#x: not live", uint64(p))
	}
	delete(z.live, p)
	z.free = append(z.free, p)
	return nil
}

func (z *zeroTokens) close() error {
	return z.dev.AddressFree(z.base, z.size)
}

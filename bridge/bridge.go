package bridge

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
)

// Bridge is the process's allocator: one device state per device ordinal,
// opened on first use.
type Bridge struct {
	cfg Config

	mu       sync.Mutex
	devices  map[int]*Device
	steps    map[int]*Step
	families map[int]*Family
	nextID   int
	closed   bool
	captures int // CapturesUnderway's count; -1 until it is called

	regionsOpen atomic.Int32 // threads inside a region, on any device
	onPause     func()       // OnPauseChange's hook

	mempools memPools // NewMemPool's pools; their routings count in regionsOpen (mempool.go)

	hist history // allocation history for snapshots (snapshot.go)

	// opened holds the devices of ordinals below len(open), read
	// without b.mu: every allocation looks its device up.
	opened [16]atomic.Pointer[Device]
}

// New returns a Bridge; devices open on first use.
func New(cfg Config) *Bridge {
	return &Bridge{cfg: cfg, devices: map[int]*Device{}, steps: map[int]*Step{}, families: map[int]*Family{}, captures: -1}
}

// CapturesUnderway says how many CUDA graph captures are underway in the
// process now, as the host counts them (the Python package wraps
// torch.cuda.CUDAGraph.capture_begin and capture_end). Until the first
// call every allocation on a stream other than the legacy one asks the
// driver whether its stream is capturing; afterwards only while the count
// is above 0. A capture begun behind the host's back is then not seen: its
// allocations come from the default pool, as with PyTorch's own allocator.
func (b *Bridge) CapturesUnderway(n int) {
	b.mu.Lock()
	b.captures = max(n, 0)
	devs := make([]*Device, 0, len(b.devices))
	for _, d := range b.devices {
		d.spill.ForeignCaptures(b.captures)
		devs = append(devs, d)
	}
	b.mu.Unlock()
	if n <= 0 {
		for _, d := range devs {
			d.mu.Lock()
			d.closeDeferred()
			d.mu.Unlock()
		}
	}
}

// ErrClosed is returned by every call after Close.
var ErrClosed = errors.New("bridge: closed")

func (b *Bridge) threadID() int {
	if b.cfg.ThreadID != nil {
		return b.cfg.ThreadID()
	}
	return gettid()
}

// Stats returns device ordinal's counters.
func (b *Bridge) Stats(ordinal int) (DeviceStats, error) {
	d, err := b.device(ordinal)
	if err != nil {
		return DeviceStats{}, err
	}
	d.mu.Lock()
	st := d.st
	st.PlannedLive = len(d.planned)
	st.ArenaBytes, st.ArenaMapped, st.Arenas = d.arenas()
	st.ReservedPeak = max(d.reservedPeak, d.spill.MappedPeak(false)+st.ArenaMapped)
	if d.lastCloseErr != nil {
		st.CloseError = d.lastCloseErr.Error()
	}
	d.mu.Unlock()
	st.Spill = d.spill.Stats()
	return st, nil
}

// Close closes every step and device. PyTorch never calls it (the process
// just exits); tests and Go programs do.
func (b *Bridge) Close() error {
	b.mu.Lock()
	closed := b.closed
	b.mu.Unlock()
	if closed {
		return ErrClosed
	}
	var errs []error
	b.mu.Lock()
	fams := make([]*Family, 0, len(b.families))
	for _, f := range b.families {
		fams = append(fams, f)
	}
	b.mu.Unlock()
	for _, f := range fams {
		if err := f.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	for _, s := range b.stepsOf(nil) {
		if err := s.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	b.mu.Lock()
	b.closed = true
	devs := b.devices
	b.devices = nil
	for i := range b.opened {
		b.opened[i].Store(nil)
	}
	b.mu.Unlock()
	for _, d := range devs {
		d.mu.Lock()
		d.closeDeferred()
		errs = append(errs, d.lastCloseErr)
		d.mu.Unlock()
		errs = append(errs, d.zero.close(), d.spill.Close(), d.heap.close(), d.dev.Close())
	}
	return errors.Join(errs...)
}

func fmtBytes(n uint64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

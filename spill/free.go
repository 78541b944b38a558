package spill

import (
	"errors"
	"fmt"

	"github.com/arenaplan/arenaplan/cuda"
)

// Free returns the block at p. If other streams used it (RecordStream), it
// becomes reusable once their work is ordered before its next use: see
// the type's documentation. Freeing an address that is not allocated is an
// error and changes nothing.
func (s *Allocator) Free(p cuda.DevicePtr) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("spill: Free(%#x): %w", p, ErrClosed)
	}
	b := s.live[p]
	if b == nil {
		return fmt.Errorf("spill: Free(%#x): %w allocation (never allocated, or freed already)", p, ErrUnknown)
	}
	delete(s.live, p)
	s.st.InUse -= b.size
	s.st.Requested -= b.req
	s.st.Live--
	s.st.Frees++
	switch {
	case len(b.uses) == 0:
		// Later work on its own stream is ordered after every use.
		seg := b.seg
		s.release(b)
		if seg.pool.refs <= 0 && seg.pool.user != nil {
			s.dropReleased(seg, false) // a released user pool's segment goes back once free
		}
	case len(s.captures) > 0:
		return s.deferFree(b)
	default:
		return s.recordEvents(b)
	}
	return nil
}

// RecordStream says that work on st uses the block at p (PyTorch's
// record_stream): its free then waits for that work.
func (s *Allocator) RecordStream(p cuda.DevicePtr, st cuda.Stream) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("spill: RecordStream(%#x): %w", p, ErrClosed)
	}
	b := s.live[p]
	if b == nil {
		return fmt.Errorf("spill: RecordStream(%#x): %w allocation", p, ErrUnknown)
	}
	if st == nil || st.Handle() == b.seg.handle {
		return nil
	}
	for _, u := range b.uses {
		if u.Handle() == st.Handle() {
			return nil
		}
	}
	b.uses = append(b.uses, st)
	return nil
}

// recordEvents records an event on every stream that used b, outside any
// capture; b is reusable once they all completed.
func (s *Allocator) recordEvents(b *block) error {
	b.state = stPending
	s.st.Waiting += b.size
	s.st.CrossStreamFrees++
	for _, u := range b.uses {
		var ev cuda.Event
		if n := len(s.events); n > 0 {
			ev, s.events = s.events[n-1], s.events[:n-1]
		} else {
			var err error
			if ev, err = s.dev.NewEvent(false); err != nil {
				return s.syncFallback(b, err)
			}
		}
		if err := ev.Record(u); err != nil {
			ev.Close()
			return s.syncFallback(b, err)
		}
		b.events = append(b.events, ev)
	}
	s.pending = append(s.pending, b)
	return nil
}

// syncFallback waits for b's streams when an event could not be used.
func (s *Allocator) syncFallback(b *block, cause error) error {
	for _, u := range b.uses {
		s.st.Syncs++
		if err := u.Synchronize(); err != nil {
			// The block stays out of use: better leaked than reused early.
			return fmt.Errorf("spill: Free(%#x): recording an event failed (%v) and so did waiting: %w", b.addr, cause, err)
		}
	}
	s.events = append(s.events, b.events...)
	s.st.Waiting -= b.size
	s.release(b)
	return nil
}

// processPending releases the pending blocks whose events completed.
func (s *Allocator) processPending() error {
	keep := s.pending[:0]
	var first error
	for _, b := range s.pending {
		done := true
		for _, ev := range b.events {
			s.st.EventQueries++
			if err := ev.Query(); err != nil {
				done = false
				if !errors.Is(err, cuda.ErrorNotReady) && first == nil {
					first = err
				}
				break
			}
		}
		if !done {
			keep = append(keep, b)
			continue
		}
		s.events = append(s.events, b.events...)
		s.st.Waiting -= b.size
		s.release(b)
	}
	clear(s.pending[len(keep):])
	s.pending = keep
	return first
}

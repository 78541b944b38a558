package cuda

import "fmt"

// This file is what a library loaded into another program needs: streams
// that the host program made (PyTorch passes its cudaStream_t to an
// allocator) and a driver that runs on the host's threads.

// Foreign returns the Stream for handle h, a CUstream that another part of
// the process made (cudaStream_t and CUstream are the same handle). The
// Streams it returns for one h are interchangeable but not always the same
// value (it keeps at most maxForeign of them, whatever the number of
// handles a program uses): key maps by Handle. The Stream is not owned:
// Close on it fails with ErrorNotPermitted.
//
// Handle 0 is the legacy default stream. It is never captured, and
// CaptureInfo answers CaptureNone for it without asking the driver:
// querying it while another stream captures in global mode would
// invalidate that capture.
func (d *Driver) Foreign(h uintptr) (Stream, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, &Error{Op: "Foreign", Code: ErrorInvalidContext}
	}
	if s, ok := d.foreign[h]; ok {
		return s, nil
	}
	if d.foreign == nil || len(d.foreign) >= maxForeign {
		// A driverStream is its handle: forgetting them loses nothing.
		d.foreign = map[uintptr]*driverStream{}
	}
	s := &driverStream{d: d, h: h, foreign: true}
	d.foreign[h] = s
	return s, nil
}

// Handle returns the CUstream.
func (s *driverStream) Handle() uintptr { return s.h }

// OpenGuest is Open for a library loaded into a program that owns the
// threads and the CUDA context (PyTorch loading an allocator): it retains
// device ordinal's primary context, which the host's runtime also uses,
// but locks no thread. Every call then runs on the calling thread; wrap a
// series of calls in MakeCurrent where the thread's current context may be
// another device's.
func OpenGuest(ordinal int) (*Driver, error) {
	d, err := openLibrary(DriverLibrary, ordinal)
	if err != nil {
		return nil, err
	}
	d.guest = true
	return d, nil
}

// MakeCurrent makes the device's primary context current on the calling
// thread and returns a function that restores what was current before.
// It costs one cuCtxGetCurrent when the context is current already.
func (d *Driver) MakeCurrent() (restore func(), err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, &Error{Op: fnNames[fnCtxSetCurrent], Code: ErrorInvalidContext}
	}
	if r := d.call(fnCtxGetCurrent, d.out(0)); r != Success {
		return nil, d.err(fnCtxGetCurrent, r)
	}
	prev := uintptr(d.u64(0))
	if prev == d.ctx {
		return func() {}, nil
	}
	if err := d.check(fnCtxSetCurrent, d.ctx); err != nil {
		return nil, err
	}
	return func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		if !d.closed {
			d.call(fnCtxSetCurrent, prev)
		}
	}, nil
}

// Foreign returns the simulated stream for handle h: the stream NewStream
// made with that Handle, the legacy default stream for 0 (never captured;
// work on it runs at once), or else a new stream registered under h, as
// if another part of the process had made it. Close on it fails with
// ErrorNotPermitted. As the driver's, it keeps a bounded number of them:
// past maxForeign, those not capturing are forgotten (a later call makes
// a new one; the old value keeps working).
func (s *Sim) Foreign(h uintptr) (Stream, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.live("Foreign"); err != nil {
		return nil, err
	}
	if st, ok := s.byHandle[h]; ok && !st.closed {
		return st, nil
	}
	st := &simStream{sim: s, handle: h, foreign: true}
	if s.byHandle == nil {
		s.byHandle = map[uintptr]*simStream{}
	}
	if len(s.byHandle) >= max(maxForeign, s.foreignSweep) {
		for k, o := range s.byHandle {
			if o.foreign && o.capture == nil {
				delete(s.byHandle, k)
			}
		}
		// Streams that stay (owned, or capturing) do not make every
		// later call sweep.
		s.foreignSweep = 2 * len(s.byHandle)
	}
	s.byHandle[h] = st
	return st, nil
}

// maxForeign bounds the foreign streams a device keeps.
const maxForeign = 4096

// Handle returns the stream's simulated CUstream value (0 for the legacy
// default stream).
func (st *simStream) Handle() uintptr { return st.handle }

func (st *simStream) String() string { return fmt.Sprintf("sim stream %#x", st.handle) }

// ForeignStreams counts the foreign streams the simulation keeps now
// (Foreign keeps a bounded number).
func (s *Sim) ForeignStreams() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, st := range s.byHandle {
		if st.foreign {
			n++
		}
	}
	return n
}

package lifetime

import "fmt"

// Recorder builds a Trace during a dry run. Time starts at 0 and advances
// only with Tick. A buffer allocated at time t is live from t; a buffer
// freed at time t is live through t and dead from t+1, so the inputs an
// operation frees and the outputs it allocates in the same tick never share
// memory. Buffers never freed live to the end of the trace.
//
// A Recorder is not safe for concurrent use.
type Recorder struct {
	name  string
	now   int64
	bufs  []Buffer
	freed []bool
}

// NewRecorder returns an empty recorder for a trace of the given name.
func NewRecorder(name string) *Recorder { return &Recorder{name: name} }

// Option sets an optional attribute of a recorded buffer.
type Option func(*Buffer)

// Name names the buffer.
func Name(s string) Option { return func(b *Buffer) { b.Name = s } }

// Tag sets the buffer's role tag ("weight", "input", ...).
func Tag(s string) Option { return func(b *Buffer) { b.Tag = s } }

// Align sets the buffer's required alignment in bytes.
func Align(n int64) Option { return func(b *Buffer) { b.Align = n } }

// Stream sets the stream the buffer is allocated on.
func Stream(s int64) Option { return func(b *Buffer) { b.Stream = s } }

// Now returns the current logical time.
func (r *Recorder) Now() int64 { return r.now }

// Tick advances logical time by one.
func (r *Recorder) Tick() { r.now++ }

// Alloc records a buffer of size bytes born now and returns its ID.
func (r *Recorder) Alloc(size int64, opts ...Option) ID {
	id := ID(len(r.bufs))
	b := Buffer{ID: id, Size: size, Start: r.now, End: -1}
	for _, o := range opts {
		o(&b)
	}
	if b.Name == "" {
		b.Name = fmt.Sprintf("buf%d", id)
	}
	r.bufs = append(r.bufs, b)
	r.freed = append(r.freed, false)
	return id
}

// Free records that buffer id dies after the current tick. Freeing an
// unknown id or freeing twice is an error and changes nothing.
func (r *Recorder) Free(id ID) error {
	if id < 0 || int(id) >= len(r.bufs) {
		return fmt.Errorf("lifetime: free of unknown buffer id %d", id)
	}
	if r.freed[id] {
		return fmt.Errorf("lifetime: double free of %s", Label(int(id), r.bufs[id].Name))
	}
	r.freed[id] = true
	r.bufs[id].End = r.now + 1
	return nil
}

// Live reports whether id was allocated and not yet freed.
func (r *Recorder) Live(id ID) bool {
	return id >= 0 && int(id) < len(r.bufs) && !r.freed[id]
}

// Trace returns the recorded trace. Buffers still live end at the current
// time + 1. The recorder may keep recording afterwards; the returned trace
// is a copy.
func (r *Recorder) Trace() *Trace {
	t := &Trace{Name: r.name, Buffers: make([]Buffer, len(r.bufs))}
	copy(t.Buffers, r.bufs)
	for i := range t.Buffers {
		if !r.freed[i] {
			t.Buffers[i].End = r.now + 1
		}
	}
	return t
}

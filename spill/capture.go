package spill

import (
	"fmt"

	"github.com/arenaplan/arenaplan/cuda"
)

// Capture is a stream capture begun through the allocator: while it is
// underway, allocations on its streams come from its pool, and blocks that
// other streams used are reused as soon as the capture graph proves it
// safe (capture-time reuse, after PyTorch PR #162186).
//
// # Capture-time reuse
//
// A block freed during the capture whose streams (its own and those
// RecordStream added) are all in this capture is deferred with markers:
// the current terminal nodes of each of those streams
// (cuda.Device.CaptureInfo). At each allocation on a stream S of the
// capture, the allocator walks the capture graph backwards from S's
// terminals (cuda.Graph.Dependencies) and keeps the visited set per
// (capture, stream), so every node is visited at most once per stream; a
// deferred block allocated on S whose markers were all visited is freed
// for reuse on S. That is sound because work captured on S from now on
// depends on all of S's terminals, which come after every marker, and a
// block is only reused on its own stream. A block that cannot be proven
// (one of its streams is not capturing, or captures elsewhere) waits until
// no capture is underway and then for events on its streams. At End every
// block still deferred for this capture is freed: its streams joined.
// WithCaptureReuse(false) skips the walk: deferred blocks wait for End.
// The walk only reads the graph; it never adds nodes or changes the
// streams' dependencies (a caller who replaces dependencies with
// DepsSet, dropping nodes, voids the argument).
type Capture struct {
	s        *Allocator
	id       uint64
	origin   cuda.Stream
	pool     *Pool
	ended    bool
	released bool
	joined   bool // begun by its owner (JoinCapture): ended by Ended
	auto     bool // joined by the allocator itself (WithForeignCaptures)
	// By stream handle: the host may hand the allocator a new Stream
	// for the same handle (cuda.Device.Foreign's answers are not kept).
	visited  map[uintptr]map[cuda.GraphNode]struct{}
	deferred map[uintptr][]*block
	stack    []cuda.GraphNode
}

// NewSharedPool returns a private pool for several captures, one after
// another. Share a pool only between graphs that are replayed one after
// another, never concurrently, and in the order they were captured: a
// later graph may reuse memory that an earlier one freed during its
// capture, and relies on that earlier graph having finished with it. The
// allocator cannot check replay order; it checks that two captures do not
// use one pool at once. Call Release when no more captures will use it;
// its memory stays mapped while any graph captured into it is alive.
func (s *Allocator) NewSharedPool() (*Pool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, fmt.Errorf("spill: NewSharedPool: %w", ErrClosed)
	}
	p := s.newPool(true)
	p.refs = 1
	return p, nil
}

// Release drops the owner's reference to a shared pool. Its memory goes
// back (EmptyCache) once every graph captured into it was released too.
func (p *Pool) Release() error {
	s := p.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if !p.private || p.refs <= 0 {
		return fmt.Errorf("spill: Pool.Release: %s: %w (released already, or not a shared pool)", p, ErrUnknown)
	}
	p.refs--
	return nil
}

// BeginCapture begins capturing st in the given mode (cuda.Device.
// BeginCapture) and routes the capture's allocations to pool, or to a new
// private pool when pool is nil. The capture holds a reference to the pool
// for its graph: call Capture.Release once the graph and every exec made
// from it are destroyed, and not before.
func (s *Allocator) BeginCapture(st cuda.Stream, mode cuda.CaptureMode, pool *Pool) (*Capture, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, fmt.Errorf("spill: BeginCapture: %w", ErrClosed)
	}
	if err := s.checkPool("BeginCapture", pool); err != nil {
		return nil, err
	}
	if err := s.dev.BeginCapture(st, mode); err != nil {
		return nil, fmt.Errorf("spill: BeginCapture: %w", err)
	}
	info, err := s.dev.CaptureInfo(st)
	if err != nil || info.Status != cuda.CaptureActive {
		s.dev.EndCapture(st)
		if err == nil {
			err = fmt.Errorf("capture status %v right after BeginCapture", info.Status)
		}
		return nil, fmt.Errorf("spill: BeginCapture: %w", err)
	}
	return s.register(st, info.ID, pool), nil
}

// checkPool checks that pool (nil: a new one) can take a capture now.
func (s *Allocator) checkPool(op string, pool *Pool) error {
	if pool == nil {
		return nil
	}
	if pool.s != s || !pool.private || !s.pools[pool] {
		return fmt.Errorf("spill: %s: %s is not a live shared pool of this allocator", op, pool)
	}
	if pool.refs <= 0 {
		return fmt.Errorf("spill: %s: %s was released", op, pool)
	}
	if pool.capturing != nil {
		return fmt.Errorf("spill: %s: %s is in use by capture %d; captures sharing a pool must run one after another",
			op, pool, pool.capturing.id)
	}
	return nil
}

// register records capture id on st, allocating from pool (nil: new).
func (s *Allocator) register(st cuda.Stream, id uint64, pool *Pool) *Capture {
	if pool == nil {
		pool = s.newPool(true)
	}
	pool.refs++
	c := &Capture{s: s, id: id, origin: st, pool: pool,
		visited:  map[uintptr]map[cuda.GraphNode]struct{}{},
		deferred: map[uintptr][]*block{}}
	pool.capturing = c
	s.captures[c.id] = c
	return c
}

// ID is the driver's capture id.
func (c *Capture) ID() uint64 { return c.id }

// Pool is the pool the capture allocates from.
func (c *Capture) Pool() *Pool { return c.pool }

// End ends the capture (cuda.Device.EndCapture) and returns its graph.
// Blocks still deferred for it are freed into its pool. When the capture
// failed there is no graph, and the capture's reference to the pool is
// dropped at once (Release is then not needed, and an error).
func (c *Capture) End() (cuda.Graph, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if c.ended {
		return nil, fmt.Errorf("spill: Capture.End: capture %d ended already", c.id)
	}
	if c.joined {
		return nil, fmt.Errorf("spill: Capture.End: capture %d was begun by its owner, who ends it (then call Ended)", c.id)
	}
	g, err := s.dev.EndCapture(c.origin)
	rerr := s.finish(c, err != nil)
	if err != nil {
		return nil, fmt.Errorf("spill: Capture.End: capture %d: %w", c.id, err)
	}
	if rerr != nil {
		return g, fmt.Errorf("spill: Capture.End: capture %d: %w", c.id, rerr)
	}
	return g, nil
}

// Capturing says whether a capture this allocator knows of (begun or
// joined here) is underway.
func (s *Allocator) Capturing() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.captures) > 0
}

// JoinCapture registers a capture that its owner began on st (PyTorch's
// torch.cuda.graph, say) without beginning one: from now on allocations on
// the capture's streams come from pool, or from a new private pool when
// pool is nil, as with BeginCapture. The owner ends the capture; call
// Ended after that. It fails when st is not capturing or the capture is
// known already.
func (s *Allocator) JoinCapture(st cuda.Stream, pool *Pool) (*Capture, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, fmt.Errorf("spill: JoinCapture: %w", ErrClosed)
	}
	if err := s.checkPool("JoinCapture", pool); err != nil {
		return nil, err
	}
	info, err := s.dev.CaptureInfo(st)
	if err != nil {
		return nil, fmt.Errorf("spill: JoinCapture: %w", err)
	}
	if info.Status != cuda.CaptureActive {
		return nil, fmt.Errorf("spill: JoinCapture: the stream is not capturing (status %v)", info.Status)
	}
	if c := s.captures[info.ID]; c != nil {
		return nil, fmt.Errorf("spill: JoinCapture: capture %d is known already", info.ID)
	}
	c := s.register(st, info.ID, pool)
	c.joined = true
	return c, nil
}

// Ended says that the owner of a joined capture has ended it (or that it
// failed: then the capture's reference to its pool is dropped at once, as
// End does). Blocks still deferred for it are freed into its pool.
func (c *Capture) Ended(failed bool) error {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if !c.joined {
		return fmt.Errorf("spill: Capture.Ended: capture %d was begun with BeginCapture: call End", c.id)
	}
	if c.ended {
		return fmt.Errorf("spill: Capture.Ended: capture %d ended already", c.id)
	}
	if err := s.finish(c, failed); err != nil {
		return fmt.Errorf("spill: Capture.Ended: capture %d: %w", c.id, err)
	}
	return nil
}

// finish is the allocator's side of a capture's end.
func (s *Allocator) finish(c *Capture, failed bool) error {
	c.ended = true
	delete(s.captures, c.id)
	c.pool.capturing = nil
	for _, list := range c.deferred {
		for _, b := range list {
			s.st.Waiting -= b.size
			s.release(b)
		}
	}
	c.deferred, c.visited = nil, nil
	if failed {
		c.released = true
		c.pool.refs--
	}
	if len(s.captures) == 0 {
		return s.flushUntilNone()
	}
	return nil
}

// sweepJoined finishes the captures that joinForeign joined and whose
// owners have ended them (their stream no longer captures with that id).
func (s *Allocator) sweepJoined() error {
	for _, c := range s.captures {
		if !c.auto {
			continue
		}
		info, err := s.dev.CaptureInfo(c.origin)
		if err != nil {
			return err
		}
		if info.Status == cuda.CaptureActive && info.ID == c.id {
			continue
		}
		if err := s.finish(c, info.Status == cuda.CaptureInvalidated && info.ID == c.id); err != nil {
			return err
		}
	}
	return nil
}

// Release says the capture's graph and every exec made from it are
// destroyed: the pool no longer needs to keep that graph's memory.
func (c *Capture) Release() error {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case !c.ended:
		return fmt.Errorf("spill: Capture.Release: capture %d is still underway", c.id)
	case c.released:
		return fmt.Errorf("spill: Capture.Release: capture %d released already", c.id)
	}
	c.released = true
	c.pool.refs--
	return nil
}

// flushUntilNone: no capture is underway any more; blocks that waited for
// that now wait for events on their streams.
func (s *Allocator) flushUntilNone() error {
	list := s.untilNone
	s.untilNone = nil
	var first error
	for _, b := range list {
		s.st.Waiting -= b.size
		if err := s.recordEvents(b); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// deferFree handles the free, during a capture, of a block that other
// streams used.
func (s *Allocator) deferFree(b *block) error {
	b.state = stDeferred
	s.st.Waiting += b.size
	c := b.seg.pool.capturing
	if c != nil {
		var markers []cuda.GraphNode
		ok := true
		for _, st := range append([]cuda.Stream{b.seg.stream}, b.uses...) {
			info, err := s.dev.CaptureInfo(st)
			if err != nil {
				return fmt.Errorf("spill: Free(%#x): %w", b.addr, err)
			}
			if info.Status != cuda.CaptureActive || info.ID != c.id {
				ok = false
				break
			}
			markers = append(markers, info.Terminals...)
		}
		if ok {
			if !s.cfg.noReuse {
				b.markers = dedupNodes(markers)
			}
			c.deferred[b.seg.handle] = append(c.deferred[b.seg.handle], b)
			return nil
		}
	}
	s.untilNone = append(s.untilNone, b)
	return nil
}

func dedupNodes(ns []cuda.GraphNode) []cuda.GraphNode {
	if len(ns) < 2 {
		return ns
	}
	seen := make(map[cuda.GraphNode]struct{}, len(ns))
	out := ns[:0]
	for _, n := range ns {
		if _, dup := seen[n]; !dup {
			seen[n] = struct{}{}
			out = append(out, n)
		}
	}
	return out
}

// reclaim extends the visited set of (c, st) backwards from st's current
// terminals and frees the deferred blocks of st whose markers it holds.
func (s *Allocator) reclaim(c *Capture, st cuda.Stream, info cuda.CaptureInfo) error {
	h := st.Handle()
	list := c.deferred[h]
	if len(list) == 0 {
		return nil // nothing to prove; the walk can wait
	}
	vis := c.visited[h]
	if vis == nil || s.cfg.freshWalk {
		vis = map[cuda.GraphNode]struct{}{}
		c.visited[h] = vis
	}
	stack := c.stack[:0]
	for _, n := range info.Terminals {
		if _, ok := vis[n]; !ok {
			vis[n] = struct{}{}
			stack = append(stack, n)
		}
	}
	for len(stack) > 0 {
		n := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		s.st.NodesVisited++
		deps, err := info.Graph.Dependencies(n)
		if err != nil {
			c.stack = stack[:0]
			return err
		}
		for _, d := range deps {
			if _, ok := vis[d]; !ok {
				vis[d] = struct{}{}
				stack = append(stack, d)
			}
		}
	}
	c.stack = stack[:0]
	keep := list[:0]
	for _, b := range list {
		if b.markers == nil || !allIn(b.markers, vis) {
			keep = append(keep, b)
			continue
		}
		s.st.Waiting -= b.size
		s.st.CaptureReuses++
		s.release(b)
	}
	clear(list[len(keep):])
	c.deferred[h] = keep
	return nil
}

func allIn(ns []cuda.GraphNode, set map[cuda.GraphNode]struct{}) bool {
	for _, n := range ns {
		if _, ok := set[n]; !ok {
			return false
		}
	}
	return true
}

// Mapped returns the physical bytes mapped in the pool's segments: what
// the graphs captured into it hold, used or cached.
func (p *Pool) Mapped() uint64 {
	s := p.s
	s.mu.Lock()
	defer s.mu.Unlock()
	var n uint64
	for seg := range s.segments {
		if seg.pool == p {
			n += seg.size
		}
	}
	return n
}

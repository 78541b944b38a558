package bridge

import (
	"testing"

	"github.com/arenaplan/arenaplan/cuda"
)

// trainStep is a forward and a backward: the forward saves an activation
// per layer (its outputs, with the loss input), the backward frees them in
// reverse order as it makes a gradient per layer (its outputs).
type trainStep struct {
	p      *program
	layers int
	saved  []cuda.DevicePtr
	out    cuda.DevicePtr
	grads  []cuda.DevicePtr
}

const actSize, tmpSize, gradSize = 1 << 20, 3 << 20, 256 << 10

func (s *trainStep) forward() {
	s.saved = s.saved[:0]
	for range s.layers {
		tmp := s.p.alloc(tmpSize)
		s.saved = append(s.saved, s.p.alloc(actSize))
		s.p.free(tmp)
	}
	s.out = s.p.alloc(4096)
}

func (s *trainStep) backward() {
	s.grads = s.grads[:0]
	for i := s.layers - 1; i >= 0; i-- {
		tmp := s.p.alloc(tmpSize)
		s.grads = append(s.grads, s.p.alloc(gradSize))
		s.p.free(tmp)
		s.p.free(s.saved[i])
	}
}

// newChain makes a chain of two members, fw and bw.
func newChain(t *testing.T, b *Bridge, name string) (*Family, *Step, *Step) {
	t.Helper()
	f, err := b.NewChain(0, name)
	if err != nil {
		t.Fatal(err)
	}
	fw, err := f.NewMember("fw")
	if err != nil {
		t.Fatal(err)
	}
	bw, err := f.NewMember("bw")
	if err != nil {
		t.Fatal(err)
	}
	return f, fw, bw
}

// runMembers runs each member in turn on p's stream, recorded or served
// (strict or not), body(i) making member i's allocations.
func runMembers(t *testing.T, p *program, members []*Step, serve, strict bool, body func(i int)) {
	t.Helper()
	for i, m := range members {
		var err error
		if serve {
			err = m.Serve(p.stream, strict)
		} else {
			err = m.Record(p.stream)
		}
		if err != nil {
			t.Fatal(err)
		}
		body(i)
		if err := m.End(false); err != nil {
			t.Fatal(err)
		}
	}
}

// TestChainHandsActivationsOn: a forward and a backward recorded as a
// chain are planned on one timeline: the saved activations are one buffer
// from the forward's allocation to the backward's free, the backward's
// temporaries reuse the forward's dead ones, and the arena is the joint
// peak of live bytes, well under two separate arenas; serving both again
// gives every buffer its planned address, with no hand-off overwritten
// before its free.
func TestChainHandsActivationsOn(t *testing.T) {
	b := newTestBridge(t)
	f, fw, bw := newChain(t, b, "train")
	const layers = 6
	st := &trainStep{p: &program{t: t, b: b, stream: 0x55}, layers: layers}
	run := func(serve bool) ([]cuda.DevicePtr, []cuda.DevicePtr) {
		for i, m := range []*Step{fw, bw} {
			var err error
			if serve {
				err = m.Serve(st.p.stream, true)
			} else {
				err = m.Record(st.p.stream)
			}
			if err != nil {
				t.Fatal(err)
			}
			st.p.addrs, st.p.sizes = nil, nil
			if i == 0 {
				st.forward()
			} else {
				st.backward()
			}
			if err := m.End(false); err != nil {
				t.Fatal(err)
			}
		}
		return append([]cuda.DevicePtr(nil), st.saved...), append([]cuda.DevicePtr(nil), st.grads...)
	}
	run(false)
	for _, g := range st.grads {
		st.p.free(g)
	}
	st.p.free(st.out)
	if err := f.Plan(0); err != nil {
		t.Fatal(err)
	}
	r := f.Report()
	// The joint peak: at the forward's end every activation and the
	// output; in the backward, at layer i, the activations not yet freed,
	// the gradients made, the output and one temporary.
	var peak int64
	for i := layers - 1; i >= 0; i-- {
		live := int64(i+1)*actSize + int64(layers-i)*gradSize + 4096 + tmpSize
		peak = max(peak, live)
	}
	peak = max(peak, int64(layers-1)*actSize+tmpSize+actSize)
	if !r.Chain || r.LowerBound != peak {
		t.Fatalf("chain report: chain %v, lower bound %d; want a chain with the joint peak %d", r.Chain, r.LowerBound, peak)
	}
	if r.Arena != r.LowerBound {
		t.Fatalf("chain arena %d, want its lower bound %d", r.Arena, r.LowerBound)
	}
	if sep := r.Members[0].LowerBound + r.Members[1].LowerBound; r.Arena >= sep {
		t.Fatalf("chain arena %d is no smaller than two arenas (%d)", r.Arena, sep)
	}
	saved, grads := run(true)
	for _, g := range grads {
		st.p.free(g)
	}
	st.p.free(st.out)
	saved2, grads2 := run(true)
	for i := range saved {
		if saved[i] != saved2[i] || grads[i] != grads2[i] {
			t.Fatalf("second served run moved buffers: saved %#x/%#x grads %#x/%#x", uint64(saved[i]), uint64(saved2[i]), uint64(grads[i]), uint64(grads2[i]))
		}
	}
	stats, _ := b.Stats(0)
	if stats.Divergences != 0 || stats.ArenaBytes != uint64(r.Arena) {
		t.Fatalf("served runs: %d divergences, %d arena bytes; want 0 and %d", stats.Divergences, stats.ArenaBytes, r.Arena)
	}
	// A saved activation is disjoint from every gradient made before its
	// free (the backward frees layer i's after making gradient
	// layers-1-i).
	for i, s := range saved2 {
		for _, g := range grads2[:layers-i] {
			if uint64(s) < uint64(g)+gradSize && uint64(g) < uint64(s)+actSize {
				t.Fatalf("saved activation %#x overlaps gradient %#x", uint64(s), uint64(g))
			}
		}
	}
	if err := f.Save(t.TempDir() + "/chain.plan"); err == nil {
		t.Fatal("Save of a chain: want an error")
	}
}

// TestChainBackwardTakesReleasedOutputs: a forward's output that the
// backward frees before its first allocation (logits a loss graph
// consumed) ends there on the joint timeline, and the backward's first
// buffer (its incoming gradient, as large) takes its memory: the arena is
// the joint peak, one such buffer less than if the output lived on, and
// served runs place the gradient over the output's memory.
func TestChainBackwardTakesReleasedOutputs(t *testing.T) {
	b := newTestBridge(t)
	f, fw, bw := newChain(t, b, "released")
	const saved, logits, grad = 1 << 20, 4 << 20, 256 << 10
	p := &program{t: t, b: b, stream: 0x56}
	var s, l, tan, g cuda.DevicePtr
	run := func(serve bool) {
		runMembers(t, p, []*Step{fw, bw}, serve, true, func(i int) {
			if i == 0 {
				s, l = p.alloc(saved), p.alloc(logits)
			} else {
				p.free(l) // let go of before the backward: freed as it begins
				tan = p.alloc(logits)
				g = p.alloc(grad)
				p.free(tan)
				p.free(s)
			}
		})
	}
	run(false)
	p.free(g)
	if err := f.Plan(0); err != nil {
		t.Fatal(err)
	}
	r := f.Report()
	if want := int64(saved + logits + grad); r.LowerBound != want || r.Arena != want {
		t.Fatalf("arena %d, lower bound %d; want both %d (the output's memory reused by the backward)", r.Arena, r.LowerBound, want)
	}
	run(true)
	if !(uint64(tan) < uint64(l)+logits && uint64(l) < uint64(tan)+logits) {
		t.Fatalf("served: the incoming gradient at %#x, the released output at %#x; want them to share memory", uint64(tan), uint64(l))
	}
	p.free(g)
	if st, _ := b.Stats(0); st.Divergences != 0 {
		t.Fatalf("%d divergences", st.Divergences)
	}
}

// TestChainKeepsOutOfAnotherMembersLiveBuffer: an allocation a capture of
// the forward makes that its recording did not (a library's workspace,
// kept for good) takes a planned buffer out of its turn; the backward's
// buffer planned over that range must not be served there while it lives.
func TestChainKeepsOutOfAnotherMembersLiveBuffer(t *testing.T) {
	b := newTestBridge(t)
	f, fw, bw := newChain(t, b, "workspace")
	const mib = 1 << 20
	p := &program{t: t, b: b, stream: 0x57}
	var ws, a, c cuda.DevicePtr
	run := func(serve bool) {
		var x cuda.DevicePtr
		runMembers(t, p, []*Step{fw, bw}, serve, false, func(i int) {
			if i == 0 {
				if serve {
					ws = p.alloc(mib) // the extra allocation: it takes a's planned buffer
				}
				a, x = p.alloc(mib), p.alloc(mib)
			} else {
				p.free(a)
				p.free(x)
				c = p.alloc(2 * mib) // planned over a's and x's buffers
				p.free(c)
			}
		})
	}
	run(false)
	if err := f.Plan(0); err != nil {
		t.Fatal(err)
	}
	if r := f.Report(); r.Arena != 2*mib {
		t.Fatalf("arena %d, want %d", r.Arena, 2*mib)
	}
	run(true)
	if uint64(c) < uint64(ws)+mib && uint64(ws) < uint64(c)+2*mib {
		t.Fatalf("the backward's buffer at %#x overlaps the forward's live allocation at %#x", uint64(c), uint64(ws))
	}
	if st, _ := b.Stats(0); st.Divergences == 0 {
		t.Fatal("no divergence: the backward's buffer should have left its planned range")
	}
	p.free(ws)
}

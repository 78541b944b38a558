// Package tracegen draws random lifetime traces shaped like the real ones
// in ../shared/data: a workload runs in steps (one training iteration or
// micro-batch each); a step's forward half allocates activations, most of
// them short-lived (read by the next operator or two) and some saved for
// the backward half, which frees them in reverse order while allocating
// short-lived gradients; operators also take scratch workspaces for one
// tick; a few buffers (optimizer state, caches) live across many steps.
// Sizes repeat the way layers do: most buffers reuse a size recently seen.
//
// It exists for scaling benchmarks of the planners; the same Options give
// the same trace on every machine.
package tracegen

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/arenaplan/arenaplan/lifetime"
)

// Options shape a generated trace. The zero value of every field but
// Buffers picks the default.
type Options struct {
	Buffers int    // how many buffers to draw (required, > 0)
	Seed    uint64 // the random seed
	// StepBuffers is roughly how many buffers one step allocates
	// (default 2000): it bounds how long saved activations live.
	StepBuffers int
}

// Generate draws a trace of exactly opt.Buffers buffers.
func Generate(opt Options) (*lifetime.Trace, error) {
	if opt.Buffers <= 0 {
		return nil, fmt.Errorf("tracegen: %d buffers: need at least one", opt.Buffers)
	}
	if opt.StepBuffers <= 0 {
		opt.StepBuffers = 2000
	}
	rng := rand.New(rand.NewPCG(opt.Seed, 0x61726e61706c616e))
	t := &lifetime.Trace{Name: fmt.Sprintf("gen-%d-seed%d", opt.Buffers, opt.Seed)}
	g := &gen{rng: rng, t: t, want: opt.Buffers}
	for len(t.Buffers) < opt.Buffers {
		g.step(opt.StepBuffers)
	}
	t.Buffers = t.Buffers[:opt.Buffers]
	// Buffers cut off by the last step may end beyond every other time;
	// that is harmless, every lifetime is still well formed.
	return t, nil
}

type gen struct {
	rng    *rand.Rand
	t      *lifetime.Trace
	want   int
	now    int64
	recent []int64 // sizes seen lately, for reuse
	// Long-lived buffers end at a time already drawn.
}

// size draws a size: usually one of the recent ones, else a new one from
// a log-normal around 1 MiB (rounded to 512 bytes, PyTorch's block).
func (g *gen) size() int64 {
	if len(g.recent) > 0 && g.rng.Float64() < 0.6 {
		return g.recent[g.rng.IntN(len(g.recent))]
	}
	s := int64(math.Exp(g.rng.NormFloat64()*1.8 + math.Log(1<<20)))
	s = max(512, min(s, 1<<31))
	s = (s + 511) / 512 * 512
	if len(g.recent) < 16 {
		g.recent = append(g.recent, s)
	} else {
		g.recent[g.rng.IntN(len(g.recent))] = s
	}
	return s
}

func (g *gen) add(size, start, end int64) {
	if len(g.t.Buffers) >= g.want {
		return
	}
	g.t.Buffers = append(g.t.Buffers, lifetime.Buffer{
		ID: lifetime.ID(len(g.t.Buffers)), Name: fmt.Sprintf("b%d", len(g.t.Buffers)),
		Size: size, Start: start, End: end,
	})
}

// step emits one forward and backward pass of about n buffers.
func (g *gen) step(n int) {
	ops := max(n/5, 2) // forward operators; each emits about 2.5 buffers over both halves
	type saved struct{ size, start int64 }
	var keep []saved
	// A few long-lived buffers per step (optimizer state, caches): they
	// outlive the step by up to three more.
	for range 1 + g.rng.IntN(3) {
		g.add(g.size(), g.now, g.now+int64(n)*int64(1+g.rng.IntN(4)))
	}
	for range ops {
		g.now++
		// The operator's output, read by the next one or few.
		g.add(g.size(), g.now, g.now+1+int64(g.rng.ExpFloat64()*1.5))
		if g.rng.Float64() < 0.3 { // a workspace for this tick only
			g.add(g.size()/4+512, g.now, g.now+1)
		}
		if g.rng.Float64() < 0.45 { // saved for the backward pass
			keep = append(keep, saved{g.size(), g.now})
		}
	}
	for i := len(keep) - 1; i >= 0; i-- {
		g.now++
		g.add(keep[i].size, keep[i].start, g.now+1) // freed after its gradient op
		g.add(keep[i].size, g.now, g.now+1+int64(g.rng.ExpFloat64()))
		if g.rng.Float64() < 0.3 {
			g.add(g.size()/4+512, g.now, g.now+1)
		}
	}
	g.now += 2
}

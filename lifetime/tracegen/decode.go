package tracegen

import (
	"fmt"
	"math/rand/v2"

	"github.com/arenaplan/arenaplan/lifetime"
)

// Model is the transformer a decode trace is drawn from. The zero value of
// every field picks the default: a Qwen2.5-1.5B shape cut to 8 layers,
// batch 1, 1024 tokens of context.
type Model struct {
	Layers  int // default 8
	Batch   int // default 1
	Context int // tokens in the KV cache, the positions attention reads (default 1024)
	Hidden  int // default 1536
	Heads   int // query heads (default 12)
	KVHeads int // key/value heads (default 2)
	HeadDim int // default 128
	MLP     int // the MLP's inner width (default 8960)
	Vocab   int // default 151936
}

func (m *Model) defaults() {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&m.Layers, 8)
	def(&m.Batch, 1)
	def(&m.Context, 1024)
	def(&m.Hidden, 1536)
	def(&m.Heads, 12)
	def(&m.KVHeads, 2)
	def(&m.HeadDim, 128)
	def(&m.MLP, 8960)
	def(&m.Vocab, 151936)
}

// DecodeOptions shape the trace of one decode step of a grouped-query
// attention transformer whose attention expands each layer's KV cache to
// every query head (Hugging Face's repeat_kv) before it reads it. The
// expanded keys and values are the largest buffers of the step by far, and
// each outlives the next Lag expansions, so that Lag+1 of them are live at
// once across each layer boundary, among the many small buffers of the
// norms, projections, rotary embedding and MLP. The zero value of every
// field picks the default: a Qwen2.5-1.5B-shaped model cut to 8 layers,
// bf16, batch 1, 1024 tokens of context.
type DecodeOptions struct {
	Model
	Elem       int64 // bytes per element of activations (default 2, bf16)
	Lag        int   // expansions each expansion outlives (default 2)
	WithLogits bool  // end with the language-model head and its logits
	// Transposed adds the copy of the expanded keys that a batched
	// matrix product of queries and transposed keys makes (PyTorch's
	// math attention), live only while the scores are computed.
	Transposed bool
	// FreeDelay is how many operators after the Lag-th next expansion is
	// made an expansion is freed (default 0: by that operator).
	FreeDelay int
	// Seed, when not 0, draws each expansion's delay from 0 to FreeDelay
	// instead (the same seed gives the same trace).
	Seed uint64
	// StaticCache keeps the KV cache outside the step, updated in place.
	// By default each layer's cache update concatenates the new key and
	// value to the old cache (Hugging Face's DynamicCache): the longer
	// cache is made in the step and outlives it.
	StaticCache bool
}

func (o *DecodeOptions) defaults() {
	o.Model.defaults()
	if o.Lag <= 0 {
		o.Lag = 2
	}
	if o.Elem <= 0 {
		o.Elem = 2
	}
}

// decoder builds a decode trace operator by operator: each tensor is live
// from the operator that makes it to one past the last operator that
// reads it.
type decoder struct {
	t   *lifetime.Trace
	now int64
	// due holds buffers to free at a later operator: at due[i].at, the
	// buffer due[i].id is read for the last time.
	due []struct {
		id int
		at int64
	}
}

// alloc makes a tensor at the current operator and returns its index; its
// end is set by use.
func (g *decoder) alloc(name string, size int64) int {
	g.t.Buffers = append(g.t.Buffers, lifetime.Buffer{
		ID: lifetime.ID(len(g.t.Buffers)), Name: name, Size: size,
		Start: g.now, End: g.now + 1, Tag: "intermediate",
	})
	return len(g.t.Buffers) - 1
}

// op advances to the next operator.
func (g *decoder) op() {
	g.now++
	kept := g.due[:0]
	for _, d := range g.due {
		if d.at <= g.now {
			g.use(d.id)
		} else {
			kept = append(kept, d)
		}
	}
	g.due = kept
}

// useLater marks a tensor as read by the operator delay operators after
// the current one.
func (g *decoder) useLater(id, delay int) {
	if delay <= 0 {
		g.use(id)
		return
	}
	g.due = append(g.due, struct {
		id int
		at int64
	}{id, g.now + int64(delay)})
}

// use marks tensors as read by the current operator.
func (g *decoder) use(ids ...int) {
	for _, i := range ids {
		g.t.Buffers[i].End = max(g.t.Buffers[i].End, g.now+1)
	}
}

// node is the next operator: it makes one tensor from the ones it reads.
func (g *decoder) node(name string, size int64, reads ...int) int {
	g.op()
	id := g.alloc(name, size)
	g.use(reads...)
	return id
}

// Decode draws the trace of one decode step (see DecodeOptions). It is
// fully determined by its options.
func Decode(opt DecodeOptions) (*lifetime.Trace, error) {
	opt.defaults()
	if opt.Heads%opt.KVHeads != 0 {
		return nil, fmt.Errorf("tracegen: %d heads is not a multiple of %d key/value heads", opt.Heads, opt.KVHeads)
	}
	b, e := int64(opt.Batch), opt.Elem
	hid := b * int64(opt.Hidden) * e
	hid32 := b * int64(opt.Hidden) * 4
	kvd := b * int64(opt.KVHeads*opt.HeadDim) * e
	mlp := b * int64(opt.MLP) * e
	expanded := b * int64(opt.Heads) * int64(opt.Context+1) * int64(opt.HeadDim) * e
	cache := b * int64(opt.KVHeads) * int64(opt.Context+1) * int64(opt.HeadDim) * e
	scores := b * int64(opt.Heads) * int64(opt.Context+1) * 4
	g := &decoder{t: &lifetime.Trace{Name: fmt.Sprintf("decode-l%d-b%d-s%d", opt.Layers, opt.Batch, opt.Context)}}
	var rng *rand.Rand
	if opt.Seed != 0 {
		rng = rand.New(rand.NewPCG(opt.Seed, 0x6b762d6578706e64))
	}
	delay := func() int {
		if rng == nil {
			return opt.FreeDelay
		}
		return rng.IntN(opt.FreeDelay + 1)
	}

	// rmsnorm in float32: cast, square, mean, rsqrt, scale, cast back.
	rmsnorm := func(name string, x int) int {
		f := g.node(name+".f32", hid32, x)
		sq := g.node(name+".sq", hid32, f)
		mean := g.node(name+".mean", b*4, sq)
		rs := g.node(name+".rsqrt", b*4, mean)
		n := g.node(name+".norm", hid32, f, rs)
		return g.node(name+".out", hid, n)
	}
	// rotary embedding: x*cos + rotate_half(x)*sin.
	rotary := func(name string, x int, size int64) int {
		c := g.node(name+".cos", size, x)
		h := g.node(name+".half", size, x)
		s := g.node(name+".sin", size, h)
		return g.node(name+".rot", size, c, s)
	}

	g.op()
	h := g.alloc("embed", hid)
	var expansions []int // the expanded keys and values, in order
	var caches []int     // the grown caches, live beyond the step
	for l := range opt.Layers {
		p := fmt.Sprintf("l%d.", l)
		ln := rmsnorm(p+"ln1", h)
		q := g.node(p+"q", hid, ln)
		k := g.node(p+"k", kvd, ln)
		v := g.node(p+"v", kvd, ln)
		q = rotary(p+"q", q, hid)
		k = rotary(p+"k", k, kvd)
		// The cache update reads the new key and value; the expansions
		// read the cache.
		if opt.StaticCache {
			g.op()
			g.use(k, v)
		} else {
			kc := g.node(p+"kcache", cache, k)
			vc := g.node(p+"vcache", cache, v)
			caches = append(caches, kc, vc)
		}
		expand := func(name string) int {
			g.op()
			x := g.alloc(p+name, expanded)
			// An expansion outlives the next opt.Lag ones: it is freed
			// only when a later one has been made.
			expansions = append(expansions, x)
			if n := len(expansions); n > opt.Lag {
				g.useLater(expansions[n-1-opt.Lag], delay())
			}
			return x
		}
		kx := expand("kx")
		vx := expand("vx")
		var kt int
		if opt.Transposed {
			kt = g.node(p+"kt", expanded, kx)
		}
		sc := g.node(p+"scores", scores, q, kx)
		if opt.Transposed {
			g.use(kt)
		}
		pr := g.node(p+"probs", scores, sc)
		at := g.node(p+"attn", hid, pr, vx)
		o := g.node(p+"o", hid, at)
		h1 := g.node(p+"resid1", hid, h, o)
		ln2 := rmsnorm(p+"ln2", h1)
		gate := g.node(p+"gate", mlp, ln2)
		up := g.node(p+"up", mlp, ln2)
		act := g.node(p+"act", mlp, gate)
		prod := g.node(p+"prod", mlp, act, up)
		down := g.node(p+"down", hid, prod)
		h = g.node(p+"resid2", hid, h1, down)
	}
	// The last expansions are freed with the step's end.
	g.op()
	for _, x := range expansions[max(0, len(expansions)-opt.Lag):] {
		g.use(x)
	}
	for _, d := range g.due {
		g.use(d.id)
	}
	ln := rmsnorm("norm", h)
	if opt.WithLogits {
		lg := g.node("logits", b*int64(opt.Vocab)*e, ln)
		g.op()
		g.use(lg)
	} else {
		g.op()
		g.use(ln)
	}
	// The grown caches are the step's outputs: they live to its end.
	g.op()
	for _, c := range caches {
		g.use(c)
	}
	return g.t, nil
}

// DecodeFamilyBatches are the batch sizes of the decode family: nine
// members, the largest first.
var DecodeFamilyBatches = []int{64, 48, 32, 24, 16, 8, 4, 2, 1}

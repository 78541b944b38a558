package tracegen

import (
	"fmt"

	"github.com/arenaplan/arenaplan/lifetime"
)

// TorchDecodeOptions shape the trace of one decode step as PyTorch's
// caching allocator records it (a memory snapshot's allocations and
// frees, logical time counting both): the step of bench/torch_startup.py,
// a Qwen2.5-1.5B-shaped model in bf16 whose attention expands each
// layer's static KV cache to the query heads (repeat_interleave) and
// runs scaled_dot_product_attention's math path with a boolean mask.
// Unlike Decode it follows the program's references: a tensor dies when
// its last reference does, so the locals of the layer loop (the norm's
// output, q, k, v, the expansions, the attention output) live until the
// next layer rebinds them, across the next layer's largest buffers; the
// sizes are the requested ones (a row of float32 norms is 4·Batch
// bytes), which an alignment of 256 rounds up. The zero value of every
// field picks the default: 8 layers, batch 1, 1024 cached positions.
type TorchDecodeOptions struct {
	Model
	// Attention is the path scaled_dot_product_attention takes: "math"
	// (the default: q, k and v upcast to float32), "math16" (the math
	// path in bf16) or "efficient" (the memory-efficient kernel).
	Attention string
}

// recorder builds a trace event by event, as a snapshot orders them.
type recorder struct {
	t   *lifetime.Trace
	now int64
}

func (r *recorder) alloc(name string, size int64) int {
	r.now++
	r.t.Buffers = append(r.t.Buffers, lifetime.Buffer{
		ID: lifetime.ID(len(r.t.Buffers)), Name: name, Size: size,
		Start: r.now, End: -1, Tag: "intermediate",
	})
	return len(r.t.Buffers) - 1
}

func (r *recorder) free(ids ...int) {
	for _, i := range ids {
		r.now++
		r.t.Buffers[i].End = r.now
	}
}

// TorchDecode draws the trace of one decode step as PyTorch records it
// (see TorchDecodeOptions); about 48 buffers a layer. It is fully
// determined by its options.
func TorchDecode(opt TorchDecodeOptions) (*lifetime.Trace, error) {
	opt.Model.defaults()
	if opt.Heads%opt.KVHeads != 0 {
		return nil, fmt.Errorf("tracegen: %d heads is not a multiple of %d key/value heads", opt.Heads, opt.KVHeads)
	}
	const bf16, f32 = 2, 4
	b := int64(opt.Batch)
	w, hd := int64(opt.Hidden), int64(opt.Heads)*int64(opt.HeadDim)
	kvd := int64(opt.KVHeads) * int64(opt.HeadDim)
	l := int64(opt.Context)
	expanded := b * hd * l // elements of a key or value expanded to every head
	r := &recorder{t: &lifetime.Trace{Name: fmt.Sprintf("torch-decode-l%d-b%d-s%d", opt.Layers, opt.Batch, opt.Context)}}

	// F.rms_norm of a bf16 row: computed in float32, cast back.
	rms := func(name string) int {
		up := r.alloc(name+".f32", b*w*f32)
		sq := r.alloc(name+".pow", b*w*f32)
		mean := r.alloc(name+".mean", b*f32)
		r.free(sq)
		eps := r.alloc(name+".add", b*f32)
		r.free(mean)
		rs := r.alloc(name+".rsqrt", b*f32)
		r.free(eps)
		n := r.alloc(name+".mul", b*w*f32)
		r.free(up, rs)
		nw := r.alloc(name+".weight", b*w*f32)
		r.free(n)
		out := r.alloc(name+".out", b*w*bf16)
		r.free(nw)
		return out
	}
	// repeat_interleave(repeats: int, dim=1): the repeats as a tensor,
	// their cumulative sum, the index, then index_select's output.
	expand := func(name string) int {
		rep := r.alloc(name+".repeats", 8)
		cum := r.alloc(name+".cumsum", int64(opt.KVHeads)*8)
		idx := r.alloc(name+".index", int64(opt.Heads)*8)
		r.free(cum)
		out := r.alloc(name, expanded*bf16)
		r.free(rep, idx)
		return out
	}

	x := r.alloc("embed", b*w*bf16)
	mask := r.alloc("mask", l)
	// The loop's locals, rebound layer by layer: each dies once the next
	// layer has made its successor.
	h, q, k, v, kf, vf, a := -1, -1, -1, -1, -1, -1, -1
	rebind := func(old *int, nu int) {
		if *old >= 0 {
			r.free(*old)
		}
		*old = nu
	}
	for li := range opt.Layers {
		p := fmt.Sprintf("l%d.", li)
		rebind(&h, rms(p+"ln1"))
		rebind(&q, r.alloc(p+"q", b*hd*bf16))
		rebind(&k, r.alloc(p+"k", b*kvd*bf16))
		rebind(&v, r.alloc(p+"v", b*kvd*bf16))
		rebind(&kf, expand(p+"kx"))
		rebind(&vf, expand(p+"vx"))
		var o16 int
		switch opt.Attention {
		case "", "math", "math16":
			// The math path: the boolean mask made additive, q, k and v
			// upcast to float32 (bf16 in "math16"), q and the transposed
			// k scaled, the scores, their softmax, the product with v,
			// cast back to bf16.
			e := int64(f32)
			if opt.Attention == "math16" {
				e = bf16
			}
			bias := r.alloc(p+"sdpa.bias", l*bf16)
			not := r.alloc(p+"sdpa.not", l)
			r.free(not)
			var q32, k32, v32 int = -1, -1, -1
			if e == f32 {
				q32 = r.alloc(p+"sdpa.q32", b*hd*f32)
				k32 = r.alloc(p+"sdpa.k32", expanded*f32)
				v32 = r.alloc(p+"sdpa.v32", expanded*f32)
			}
			qs := r.alloc(p+"sdpa.qscaled", b*hd*e)
			kts := r.alloc(p+"sdpa.kscaled", expanded*e)
			sc := r.alloc(p+"sdpa.scores", b*int64(opt.Heads)*l*e)
			r.free(kts)
			pr := r.alloc(p+"sdpa.softmax", b*int64(opt.Heads)*l*e)
			r.free(sc)
			o32 := r.alloc(p+"sdpa.out32", b*hd*e)
			r.free(pr)
			if e == f32 {
				o16 = r.alloc(p+"sdpa.out", b*hd*bf16)
				r.free(o32, qs, q32, k32, v32, bias)
			} else {
				o16 = o32
				r.free(qs, bias)
			}
		case "efficient":
			// The mask as an additive bias, the output and its
			// log-sum-exp (padded to 32 rows).
			bias := r.alloc(p+"sdpa.bias", l*bf16)
			not := r.alloc(p+"sdpa.not", l)
			r.free(not)
			o16 = r.alloc(p+"sdpa.out", b*hd*bf16)
			lse := r.alloc(p+"sdpa.lse", b*int64(opt.Heads)*32*f32)
			r.free(lse, bias)
		default:
			return nil, fmt.Errorf("tracegen: attention %q: want math, math16 or efficient", opt.Attention)
		}
		rebind(&a, o16)
		o := r.alloc(p+"o", b*w*bf16)
		x1 := r.alloc(p+"resid1", b*w*bf16)
		r.free(o)
		rebind(&x, x1)
		rebind(&h, rms(p+"ln2"))
		g := r.alloc(p+"gate", b*int64(opt.MLP)*bf16)
		s := r.alloc(p+"silu", b*int64(opt.MLP)*bf16)
		r.free(g)
		u := r.alloc(p+"up", b*int64(opt.MLP)*bf16)
		m := r.alloc(p+"prod", b*int64(opt.MLP)*bf16)
		r.free(s, u)
		dn := r.alloc(p+"down", b*w*bf16)
		r.free(m)
		x2 := r.alloc(p+"resid2", b*w*bf16)
		r.free(dn)
		rebind(&x, x2)
	}
	hn := rms("norm")
	logits := r.alloc("logits", b*int64(opt.Vocab)*bf16)
	r.free(hn)
	// The step returns: its locals die, the logits outlive it.
	for _, id := range []int{x, mask, h, q, k, v, kf, vf, a} {
		if id >= 0 {
			r.free(id)
		}
	}
	r.now++
	r.t.Buffers[logits].End = r.now
	return r.t, nil
}

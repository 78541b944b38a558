package kernels

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/arenaplan/arenaplan/launch"
)

// f32s returns the n float32s at p as a slice aliasing simulated device
// memory (little-endian hosts only, as every Go port the project builds for).
func f32s(mem launch.SimMemory, p launch.DevicePtr, n uint64) ([]float32, error) {
	if n == 0 {
		return nil, nil
	}
	if p%4 != 0 {
		return nil, fmt.Errorf("pointer %#x is not 4-byte aligned", uint64(p))
	}
	b, err := mem.Bytes(p, 4*n)
	if err != nil {
		return nil, err
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), n), nil
}

func u32s(mem launch.SimMemory, p launch.DevicePtr, n uint64) ([]uint32, error) {
	if p%4 != 0 {
		return nil, fmt.Errorf("pointer %#x is not 4-byte aligned", uint64(p))
	}
	b, err := mem.Bytes(p, 4*n)
	if err != nil {
		return nil, err
	}
	return unsafe.Slice((*uint32)(unsafe.Pointer(&b[0])), n), nil
}

func want(args []launch.KernelArg, kinds ...launch.ArgKind) error {
	if len(args) != len(kinds) {
		return fmt.Errorf("%d arguments, want %d", len(args), len(kinds))
	}
	for i, k := range kinds {
		if args[i].Kind != k {
			return fmt.Errorf("argument %d is %v, want kind %d", i, args[i], k)
		}
	}
	return nil
}

const (
	ptr = launch.ArgPtr
	u32 = launch.ArgU32
	f32 = launch.ArgF32
)

// embed: x[b][i] = wte[tok_b][i] + wpe[pos][i] with step = {pos, tok...}.
func embed(mem launch.SimMemory, grid, block launch.Dim3, args []launch.KernelArg) error {
	if err := want(args, ptr, ptr, ptr, ptr, u32, u32, u32); err != nil {
		return err
	}
	width, vocab, maxPos := uint64(args[4].AsU32()), uint64(args[5].AsU32()), uint64(args[6].AsU32())
	batch := uint64(grid.Y)
	if vocab == 0 || maxPos == 0 {
		return fmt.Errorf("embed: vocab %d, max_pos %d", vocab, maxPos)
	}
	cols := min(width, uint64(grid.X)*uint64(block.X))
	step, err := u32s(mem, args[3].AsPtr(), 1+batch)
	if err != nil {
		return err
	}
	pos := min(uint64(step[0]), maxPos-1)
	x, err := f32s(mem, args[0].AsPtr(), batch*width)
	if err != nil {
		return err
	}
	wpe, err := f32s(mem, args[2].AsPtr().Add(4*pos*width), width)
	if err != nil {
		return err
	}
	for b := uint64(0); b < batch; b++ {
		tok := min(uint64(step[1+b]), vocab-1)
		wte, err := f32s(mem, args[1].AsPtr().Add(4*tok*width), width)
		if err != nil {
			return err
		}
		for i := uint64(0); i < cols; i++ {
			x[b*width+i] = wte[i] + wpe[i]
		}
	}
	return nil
}

// GELU is GPT-2's activation, the tanh approximation, in float64.
func GELU(x float64) float64 {
	const k = 0.7978845608028654 // sqrt(2/pi)
	return 0.5 * x * (1 + math.Tanh(k*(x+0.044715*x*x*x)))
}

// LayerNorm writes (x-mean)/sqrt(var+eps)*g+b into dst (float64
// statistics, two passes).
func LayerNorm(dst, x, g, b []float32, eps float32) {
	var s float64
	for _, v := range x {
		s += float64(v)
	}
	mean := s / float64(len(x))
	var q float64
	for _, v := range x {
		d := float64(v) - mean
		q += d * d
	}
	rstd := 1 / math.Sqrt(q/float64(len(x))+float64(eps))
	for i, v := range x {
		dst[i] = float32((float64(v)-mean)*rstd*float64(g[i]) + float64(b[i]))
	}
}

// linear: out[b][o] = f(xn[b] . w[o] + bias[o]) (+ resid[b][o]); see
// kernels.cu.
func linear(mem launch.SimMemory, grid, block launch.Dim3, args []launch.KernelArg) error {
	if err := want(args, ptr, ptr, ptr, ptr, ptr, ptr, ptr, u32, u32, u32, u32, f32); err != nil {
		return err
	}
	in, out := uint64(args[7].AsU32()), uint64(args[8].AsU32())
	batch, mode, eps := uint64(args[9].AsU32()), args[10].AsU32(), args[11].AsF32()
	if in%4 != 0 {
		return fmt.Errorf("linear: in_dim %d is not a multiple of 4", in)
	}
	if block.X%32 != 0 {
		return fmt.Errorf("linear: block %d is not a multiple of 32", block.X)
	}
	// Rows the grid covers: one warp each, grid-stride.
	if uint64(grid.X)*uint64(block.X/32) == 0 {
		return nil
	}
	y, err := f32s(mem, args[0].AsPtr(), batch*out)
	if err != nil {
		return err
	}
	x, err := f32s(mem, args[1].AsPtr(), batch*in)
	if err != nil {
		return err
	}
	w, err := f32s(mem, args[2].AsPtr(), out*in)
	if err != nil {
		return err
	}
	var bias, resid, g, beta []float32
	if p := args[3].AsPtr(); p != 0 {
		if bias, err = f32s(mem, p, out); err != nil {
			return err
		}
	}
	if mode&ModeResidual != 0 {
		if resid, err = f32s(mem, args[4].AsPtr(), batch*out); err != nil {
			return err
		}
	}
	if p := args[5].AsPtr(); p != 0 {
		if g, err = f32s(mem, p, in); err != nil {
			return err
		}
		if beta, err = f32s(mem, args[6].AsPtr(), in); err != nil {
			return err
		}
	}
	// The kernel reads all of x (and resid) before it writes y only row by
	// row; the reference works on copies so that aliasing cannot differ.
	xs := make([]float32, batch*in)
	for b := uint64(0); b < batch; b++ {
		row := x[b*in : (b+1)*in]
		if g != nil {
			LayerNorm(xs[b*in:(b+1)*in], row, g, beta, eps)
		} else {
			copy(xs[b*in:], row)
		}
	}
	ys := make([]float32, batch*out)
	for o := uint64(0); o < out; o++ {
		wr := w[o*in : (o+1)*in]
		for b := uint64(0); b < batch; b++ {
			xr := xs[b*in : (b+1)*in]
			var acc float64
			for i, wv := range wr {
				acc += float64(wv) * float64(xr[i])
			}
			if bias != nil {
				acc += float64(bias[o])
			}
			if mode&ModeGELU != 0 {
				acc = GELU(acc)
			}
			if resid != nil {
				acc += float64(resid[b*out+o])
			}
			ys[b*out+o] = float32(acc)
		}
	}
	copy(y, ys)
	return nil
}

// linearLN is linear with a layer norm, which linear_ln requires, in
// blocks of at most LinearLNMaxBlock threads.
func linearLN(mem launch.SimMemory, grid, block launch.Dim3, args []launch.KernelArg) error {
	if len(args) > 6 && (args[5].AsPtr() == 0 || args[6].AsPtr() == 0) {
		return fmt.Errorf("linear_ln: no layer-norm gain or bias")
	}
	if block.X > LinearLNMaxBlock {
		return fmt.Errorf("linear_ln: block %d: at most %d threads", block.X, LinearLNMaxBlock)
	}
	return linear(mem, grid, block, args)
}

// linearStaged is linear in linear_st's launch shape: at most
// LinearStagedMaxBlock threads a block (a multiple of 32), one grid row,
// and no more than LinearStagedMaxRows output rows a block; a layer norm's
// gain and bias both set or both null.
func linearStaged(mem launch.SimMemory, grid, block launch.Dim3, args []launch.KernelArg) error {
	if err := want(args, ptr, ptr, ptr, ptr, ptr, ptr, ptr, u32, u32, u32, u32, f32); err != nil {
		return err
	}
	if block.X > LinearStagedMaxBlock || block.X%32 != 0 || block.Y != 1 || block.Z != 1 {
		return fmt.Errorf("linear_st: block %v: want a multiple of 32 threads, at most %d, in x", block, LinearStagedMaxBlock)
	}
	out := uint64(args[8].AsU32())
	if grid.Y != 1 || grid.Z != 1 || grid.X == 0 {
		return fmt.Errorf("linear_st: grid %v: want blocks in x only", grid)
	}
	if rows := (out + uint64(grid.X) - 1) / uint64(grid.X); rows > LinearStagedMaxRows {
		return fmt.Errorf("linear_st: %d output rows over %d blocks is %d a block: at most %d", out, grid.X, rows, LinearStagedMaxRows)
	}
	if (args[5].AsPtr() == 0) != (args[6].AsPtr() == 0) {
		return fmt.Errorf("linear_st: a layer norm's gain and bias must both be set or both be null")
	}
	return linear(mem, grid, block, args)
}

// attention: write k, v at pos into the caches, then attend over 0..pos.
func attention(mem launch.SimMemory, grid, block launch.Dim3, args []launch.KernelArg) error {
	if err := want(args, ptr, ptr, ptr, ptr, ptr, ptr, ptr, u32, u32, u32, u32, f32); err != nil {
		return err
	}
	width, heads, kvLen := uint64(args[7].AsU32()), uint64(args[8].AsU32()), uint64(args[9].AsU32())
	splits, scale := uint64(args[10].AsU32()), float64(args[11].AsF32())
	if heads == 0 || width%heads != 0 || (width/heads)%4 != 0 || kvLen == 0 || splits == 0 || uint64(grid.Z) != splits {
		return fmt.Errorf("attention: width %d, heads %d, kv_len %d, splits %d, grid %v", width, heads, kvLen, splits, grid)
	}
	hd := width / heads
	batch := uint64(grid.Y)
	nh := min(uint64(grid.X), heads)
	out, err := f32s(mem, args[0].AsPtr(), batch*width)
	if err != nil {
		return err
	}
	qkv, kc, vc, pos, err := attentionInputs(mem, args, batch, width, kvLen)
	if err != nil {
		return err
	}
	// The workspace of per-split partials and the counters are the CUDA
	// kernel's business; the reference checks that the counters are zero,
	// as every launch leaves them.
	if _, err := f32s(mem, args[5].AsPtr(), batch*heads*splits*(hd+2)); err != nil {
		return err
	}
	counters, err := u32s(mem, args[6].AsPtr(), batch*heads)
	if err != nil {
		return err
	}
	for i, c := range counters {
		if c != 0 {
			return fmt.Errorf("attention: counter %d is %d, not 0", i, c)
		}
	}
	p := make([]float64, pos+1)
	o := make([]float64, hd)
	for b := uint64(0); b < batch; b++ {
		for h := uint64(0); h < nh; h++ {
			q := qkv[b*3*width+h*hd:][:hd]
			base := b*kvLen*width + h*hd
			copy(kc[base+pos*width:][:hd], qkv[b*3*width+width+h*hd:][:hd])
			copy(vc[base+pos*width:][:hd], qkv[b*3*width+2*width+h*hd:][:hd])
			mx := math.Inf(-1)
			for t := uint64(0); t <= pos; t++ {
				k := kc[base+t*width:][:hd]
				var a float64
				for d, qv := range q {
					a += float64(qv) * float64(k[d])
				}
				p[t] = a * scale
				mx = max(mx, p[t])
			}
			var sum float64
			for t := range p {
				p[t] = math.Exp(p[t] - mx)
				sum += p[t]
			}
			clear(o)
			for t := uint64(0); t <= pos; t++ {
				v := vc[base+t*width:][:hd]
				for d := range o {
					o[d] += p[t] * float64(v[d])
				}
			}
			dst := out[b*width+h*hd:][:hd]
			for d := range o {
				dst[d] = float32(o[d] / sum)
			}
		}
	}
	return nil
}

// AttentionPartStride is how many floats attention_part leaves per (batch
// row, head, split): {m, l, 0, 0} and the head's hd floats of o.
func AttentionPartStride(hd int) int { return hd + 4 }

// attentionShape validates the shape arguments shared by attention_part and
// attention_combine and returns the head size.
func attentionShape(name string, width, heads, splits uint64) (uint64, error) {
	if heads == 0 || width%heads != 0 || (width/heads)%4 != 0 || width/heads > MaxAttentionHead || splits == 0 {
		return 0, fmt.Errorf("%s: width %d, heads %d, splits %d", name, width, heads, splits)
	}
	return width / heads, nil
}

// attentionInputs are the arguments 1 to 4 that attention and
// attention_part share: qkv, the key and value caches, and the position
// pos = step[0], clamped to the cache.
func attentionInputs(mem launch.SimMemory, args []launch.KernelArg, batch, width, kvLen uint64) (qkv, kc, vc []float32, pos uint64, err error) {
	if qkv, err = f32s(mem, args[1].AsPtr(), batch*3*width); err != nil {
		return
	}
	if kc, err = f32s(mem, args[2].AsPtr(), batch*kvLen*width); err != nil {
		return
	}
	if vc, err = f32s(mem, args[3].AsPtr(), batch*kvLen*width); err != nil {
		return
	}
	step, err := u32s(mem, args[4].AsPtr(), 1)
	if err != nil {
		return
	}
	return qkv, kc, vc, min(uint64(step[0]), kvLen-1), nil
}

// attentionPart: write k, v at pos into the caches; per (b, h, split) the
// chunk's max score m, l = sum exp(score-m) and o = sum exp(score-m)*v.
func attentionPart(mem launch.SimMemory, grid, block launch.Dim3, args []launch.KernelArg) error {
	if err := want(args, ptr, ptr, ptr, ptr, ptr, u32, u32, u32, u32, f32); err != nil {
		return err
	}
	width, heads, kvLen := uint64(args[5].AsU32()), uint64(args[6].AsU32()), uint64(args[7].AsU32())
	splits, scale := uint64(args[8].AsU32()), float64(args[9].AsF32())
	hd, err := attentionShape("attention_part", width, heads, splits)
	if err != nil {
		return err
	}
	lanes := uint64(attentionLanes(int(hd)))
	switch {
	case kvLen == 0 || uint64(grid.Z) != splits:
		return fmt.Errorf("attention_part: kv_len %d, splits %d, grid %v", kvLen, splits, grid)
	case block.X%32 != 0 || block.X > MaxAttentionPartBlock || uint64(block.X) < lanes:
		return fmt.Errorf("attention_part: block %d: want a multiple of 32, at least %d, at most %d", block.X, lanes, MaxAttentionPartBlock)
	}
	batch, nh := uint64(grid.Y), min(uint64(grid.X), heads)
	stride := uint64(AttentionPartStride(int(hd)))
	part, err := f32s(mem, args[0].AsPtr(), batch*heads*splits*stride)
	if err != nil {
		return err
	}
	qkv, kc, vc, pos, err := attentionInputs(mem, args, batch, width, kvLen)
	if err != nil {
		return err
	}
	n := pos + 1
	chunk := (n + splits - 1) / splits
	sc := make([]float64, chunk)
	o := make([]float64, hd)
	for b := uint64(0); b < batch; b++ {
		for h := uint64(0); h < nh; h++ {
			q := qkv[b*3*width+h*hd:][:hd]
			base := b*kvLen*width + h*hd
			copy(kc[base+pos*width:][:hd], qkv[b*3*width+width+h*hd:][:hd])
			copy(vc[base+pos*width:][:hd], qkv[b*3*width+2*width+h*hd:][:hd])
			for s := uint64(0); s < splits; s++ {
				t0 := min(s*chunk, n)
				t1 := min(t0+chunk, n)
				m := math.Inf(-1)
				for t := t0; t < t1; t++ {
					k := kc[base+t*width:][:hd]
					var a float64
					for d, qv := range q {
						a += float64(qv) * float64(k[d])
					}
					sc[t-t0] = a * scale
					m = max(m, sc[t-t0])
				}
				// m as stored: l and o are relative to the float32 m.
				m32 := float32(m)
				var l float64
				clear(o)
				for t := t0; t < t1; t++ {
					e := math.Exp(sc[t-t0] - float64(m32))
					l += e
					v := vc[base+t*width:][:hd]
					for d := range o {
						o[d] += e * float64(v[d])
					}
				}
				p := part[((b*heads+h)*splits+s)*stride:][:stride]
				p[0], p[1], p[2], p[3] = m32, float32(l), 0, 0
				for d := range o {
					p[4+d] = float32(o[d])
				}
			}
		}
	}
	return nil
}

// attentionCombine: out[b][h*hd+d] = sum_k w_k o_k[d] / sum_k w_k l_k with
// w_k = exp(m_k - max m) over attention_part's splits.
func attentionCombine(mem launch.SimMemory, grid, block launch.Dim3, args []launch.KernelArg) error {
	if err := want(args, ptr, ptr, u32, u32, u32); err != nil {
		return err
	}
	width, heads, splits := uint64(args[2].AsU32()), uint64(args[3].AsU32()), uint64(args[4].AsU32())
	hd, err := attentionShape("attention_combine", width, heads, splits)
	if err != nil {
		return err
	}
	if uint64(block.X) < hd/4 {
		return fmt.Errorf("attention_combine: block %d: want at least %d threads", block.X, hd/4)
	}
	batch, nh := uint64(grid.Y), min(uint64(grid.X), heads)
	stride := uint64(AttentionPartStride(int(hd)))
	out, err := f32s(mem, args[0].AsPtr(), batch*width)
	if err != nil {
		return err
	}
	part, err := f32s(mem, args[1].AsPtr(), batch*heads*splits*stride)
	if err != nil {
		return err
	}
	o := make([]float64, hd)
	for b := uint64(0); b < batch; b++ {
		for h := uint64(0); h < nh; h++ {
			ps := part[(b*heads+h)*splits*stride:][:splits*stride]
			mx := math.Inf(-1)
			for k := uint64(0); k < splits; k++ {
				mx = max(mx, float64(ps[k*stride]))
			}
			var l float64
			clear(o)
			for k := uint64(0); k < splits; k++ {
				p := ps[k*stride:][:stride]
				if math.IsInf(float64(p[0]), -1) {
					continue
				}
				w := math.Exp(float64(p[0]) - mx)
				l += w * float64(p[1])
				for d := range o {
					o[d] += w * float64(p[4+d])
				}
			}
			dst := out[b*width+h*hd:][:hd]
			for d := range o {
				dst[d] = float32(o[d] / l)
			}
		}
	}
	return nil
}

// linearFew is linear without a layer norm, which linear_few requires
// (it reads neither ln_g nor ln_b).
func linearFew(mem launch.SimMemory, grid, block launch.Dim3, args []launch.KernelArg) error {
	if len(args) > 6 && (args[5].AsPtr() != 0 || args[6].AsPtr() != 0) {
		return fmt.Errorf("linear_few: a layer norm's gain or bias is set: linear_few applies none")
	}
	if block.X > LinearFewMaxBlock {
		return fmt.Errorf("linear_few: block %d: at most %d threads", block.X, LinearFewMaxBlock)
	}
	return linear(mem, grid, block, args)
}

// linearLN1 is linear with a layer norm in linear_ln1's launch shape: the
// gain and bias set, rows of at most LinearLN1MaxIn floats, at most
// LinearLN1MaxBlock threads a block.
func linearLN1(mem launch.SimMemory, grid, block launch.Dim3, args []launch.KernelArg) error {
	if err := want(args, ptr, ptr, ptr, ptr, ptr, ptr, ptr, u32, u32, u32, u32, f32); err != nil {
		return err
	}
	if args[5].AsPtr() == 0 || args[6].AsPtr() == 0 {
		return fmt.Errorf("linear_ln1: no layer-norm gain or bias")
	}
	if in := args[7].AsU32(); in > LinearLN1MaxIn {
		return fmt.Errorf("linear_ln1: in_dim %d: at most %d", in, LinearLN1MaxIn)
	}
	if block.X > LinearLN1MaxBlock {
		return fmt.Errorf("linear_ln1: block %d: at most %d threads", block.X, LinearLN1MaxBlock)
	}
	return linear(mem, grid, block, args)
}

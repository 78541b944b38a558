// The kernels as of commit 1d2141d (before the rewrite of linear and the
// attention prefetch), renamed old_*, for kernels/bench/bench.cu.
// Generated: git show 1d2141d:kernels/kernels.cu | sed -E 's/\b(warp_sum|...)\b/old_\1/g'
// Kernels of the built-in workloads (package graphexec: gpt2-decode, mlp).
//
// Storage is fp32 throughout. Every kernel is deterministic: reductions run
// in a fixed order (per-thread loops, then xor-shuffle trees, then warps in
// index order), so two runs on the same inputs give the same bits, eager or
// replayed. Each kernel has a Go reference in reference.go that the
// simulated device runs; the references compute the same function, not the
// same bits (they use float64 where convenient and Go's math.Tanh/Exp).
//
// Built to PTX on a GPU machine, and the PTX committed:
//
//	nvcc -ptx -arch=compute_80 -O3 -o kernels/kernels.ptx kernels/kernels.cu
//
// compute_80 PTX is JIT-compiled by the driver for the GPU it runs on
// (H100/H200 included). Scalars that change every step (the decode
// position, the tokens) are read from device memory (the "step" tensor), so
// a captured graph stays valid while they change.
#include <stdint.h>

#define WARP 32
#define MAXB 8  // batch rows a old_linear kernel's warp accumulates at once
#define LOADS 8 // 16-byte weight loads a lane has in flight

__device__ __forceinline__ float old_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float old_warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// old_block_sum returns the sum of v over the block to every thread. red needs
// 32 floats; the block size is a multiple of 32.
__device__ float old_block_sum(float v, float *red) {
    int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, nw = blockDim.x / WARP;
    v = old_warp_sum(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float s = 0.f;
    for (int i = 0; i < nw; i++) s += red[i];
    return s;
}

__device__ float old_block_max(float v, float *red) {
    int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, nw = blockDim.x / WARP;
    v = old_warp_max(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float m = red[0];
    for (int i = 1; i < nw; i++) m = fmaxf(m, red[i]);
    return m;
}

// old_gelu_tanh is GPT-2's activation (the tanh approximation).
__device__ __forceinline__ float old_gelu_tanh(float x) {
    const float k = 0.7978845608028654f; // sqrt(2/pi)
    return 0.5f * x * (1.f + tanhf(k * (x + 0.044715f * x * x * x)));
}

extern "C" {

// old_embed: x[b][i] = wte[tok_b][i] + wpe[pos][i], where step = {pos, tok_0,
// ..., tok_{batch-1}} lives in device memory. pos and the tokens are
// clamped into range so that no value makes the kernel read out of bounds.
// Grid (ceil(width/blockDim), batch).
__global__ void old_embed(float *__restrict__ x, const float *__restrict__ wte,
                      const float *__restrict__ wpe, const uint32_t *__restrict__ step,
                      uint32_t width, uint32_t vocab, uint32_t max_pos) {
    uint32_t b = blockIdx.y;
    uint32_t pos = min(step[0], max_pos - 1);
    uint32_t tok = min(step[1 + b], vocab - 1);
    uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < width)
        x[(size_t)b * width + i] = wte[(size_t)tok * width + i] + wpe[(size_t)pos * width + i];
}

// old_linear: out[b][o] = f(sum_i xn[b][i] * w[o][i] + bias[o]) for b < batch,
// o < out_dim, with w row-major [out_dim][in_dim] (a GEMV per batch row:
// every weight row is read once per MAXB batch rows, coalesced, 16 bytes a
// lane). xn is in, or, when ln_g is not null, in layer-normalized per row
// (gamma ln_g, beta ln_b, eps): the layer norm is fused into the matmul that
// consumes it. mode bit 0 applies GELU; bit 1 adds resid[b][o] afterwards
// (a residual connection). bias may be null. One warp per output row;
// in_dim is a multiple of 4 and every pointer 16-byte aligned.
__global__ void old_linear(float *__restrict__ out, const float *__restrict__ in,
                       const float *__restrict__ w, const float *__restrict__ bias,
                       const float *__restrict__ resid, const float *__restrict__ ln_g,
                       const float *__restrict__ ln_b, uint32_t in_dim, uint32_t out_dim,
                       uint32_t batch, uint32_t mode, float eps) {
    __shared__ float s_mean[MAXB], s_rstd[MAXB], s_red[WARP];
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, nw = blockDim.x / WARP;
    const uint32_t n4 = in_dim / 4;
    for (uint32_t b0 = 0; b0 < batch; b0 += MAXB) {
        const uint32_t nb = min((uint32_t)MAXB, batch - b0);
        if (ln_g != nullptr) {
            // One pass of sum and sum of squares per row, LOADS 16-byte
            // loads in flight per thread, reduced in a fixed order.
            for (uint32_t b = 0; b < nb; b++) {
                const float4 *x4 = reinterpret_cast<const float4 *>(in + (size_t)(b0 + b) * in_dim);
                float s = 0.f, q = 0.f;
                for (uint32_t i0 = 0; i0 < n4; i0 += LOADS * blockDim.x) {
                    float4 xv[LOADS];
#pragma unroll
                    for (int u = 0; u < LOADS; u++) {
                        const uint32_t i = i0 + u * blockDim.x + threadIdx.x;
                        xv[u] = i < n4 ? x4[i] : make_float4(0.f, 0.f, 0.f, 0.f);
                    }
#pragma unroll
                    for (int u = 0; u < LOADS; u++) {
                        s += (xv[u].x + xv[u].y) + (xv[u].z + xv[u].w);
                        q += (xv[u].x * xv[u].x + xv[u].y * xv[u].y) + (xv[u].z * xv[u].z + xv[u].w * xv[u].w);
                    }
                }
                const float mean = old_block_sum(s, s_red) / (float)in_dim;
                const float var = fmaxf(old_block_sum(q, s_red) / (float)in_dim - mean * mean, 0.f);
                if (threadIdx.x == 0) {
                    s_mean[b] = mean;
                    s_rstd[b] = rsqrtf(var + eps);
                }
            }
            __syncthreads();
        }
        for (uint32_t o = blockIdx.x * nw + warp; o < out_dim; o += gridDim.x * nw) {
            float acc[MAXB];
#pragma unroll
            for (int b = 0; b < MAXB; b++) acc[b] = 0.f;
            const float4 *w4 = reinterpret_cast<const float4 *>(w + (size_t)o * in_dim);
            // The epilogue's operands are loaded up front, so that their
            // latency hides behind the row's.
            float bo = 0.f, rv[MAXB];
#pragma unroll
            for (int b = 0; b < MAXB; b++) rv[b] = 0.f;
            if (lane == 0) {
                if (bias != nullptr) bo = __ldg(bias + o);
                if (mode & 2u) {
#pragma unroll
                    for (int b = 0; b < MAXB; b++)
                        if (b < nb) rv[b] = resid[(size_t)(b0 + b) * out_dim + o];
                }
            }
            // LOADS weight vectors per lane are issued back to back before
            // any is used, so that a row costs one memory latency, not one
            // per vector.
            for (uint32_t i0 = 0; i0 < n4; i0 += LOADS * WARP) {
                float4 wv[LOADS];
#pragma unroll
                for (int u = 0; u < LOADS; u++) {
                    const uint32_t i = i0 + u * WARP + lane;
                    wv[u] = i < n4 ? __ldg(w4 + i) : make_float4(0.f, 0.f, 0.f, 0.f);
                }
                float4 gv[LOADS], bv[LOADS];
                if (ln_g != nullptr) {
#pragma unroll
                    for (int u = 0; u < LOADS; u++) {
                        const uint32_t i = min(i0 + u * WARP + lane, n4 - 1);
                        gv[u] = __ldg(reinterpret_cast<const float4 *>(ln_g) + i);
                        bv[u] = __ldg(reinterpret_cast<const float4 *>(ln_b) + i);
                    }
                }
#pragma unroll
                for (int b = 0; b < MAXB; b++) {
                    if (b < nb) {
                        // A batch row's LOADS input vectors are loaded
                        // together too (beyond the row: zeros, and the
                        // weights there are zero).
                        const float4 *x4 = reinterpret_cast<const float4 *>(in + (size_t)(b0 + b) * in_dim);
                        float4 xv[LOADS];
#pragma unroll
                        for (int u = 0; u < LOADS; u++) {
                            const uint32_t i = i0 + u * WARP + lane;
                            xv[u] = i < n4 ? x4[i] : make_float4(0.f, 0.f, 0.f, 0.f);
                        }
                        float a = acc[b];
#pragma unroll
                        for (int u = 0; u < LOADS; u++) {
                            float4 x = xv[u];
                            if (ln_g != nullptr) {
                                const float m = s_mean[b], r = s_rstd[b];
                                x.x = (x.x - m) * r * gv[u].x + bv[u].x;
                                x.y = (x.y - m) * r * gv[u].y + bv[u].y;
                                x.z = (x.z - m) * r * gv[u].z + bv[u].z;
                                x.w = (x.w - m) * r * gv[u].w + bv[u].w;
                            }
                            a = fmaf(wv[u].x, x.x, a);
                            a = fmaf(wv[u].y, x.y, a);
                            a = fmaf(wv[u].z, x.z, a);
                            a = fmaf(wv[u].w, x.w, a);
                        }
                        acc[b] = a;
                    }
                }
            }
#pragma unroll
            for (int b = 0; b < MAXB; b++) acc[b] = old_warp_sum(acc[b]);
            if (lane == 0) {
#pragma unroll
                for (int b = 0; b < MAXB; b++) {
                    if (b < nb) {
                        float y = acc[b] + bo;
                        if (mode & 1u) y = old_gelu_tanh(y);
                        y += rv[b]; // 0 unless mode bit 1
                        out[(size_t)(b0 + b) * out_dim + o] = y;
                    }
                }
            }
        }
        __syncthreads(); // s_mean/s_rstd are rewritten for the next rows
    }
}

// old_attention: one decode step of multi-head old_attention, split over the
// cache positions (flash-decoding). Block (h, b, s) of grid (heads, batch,
// splits) takes head h of batch row b and the s-th of `splits` equal chunks
// of positions 0..pos, pos = step[0] (clamped). qkv[b] holds q, k, v (each
// width wide, head h at h*hd). The current k and v are written into the
// caches kc, vc ([batch][kv_len][width]) at pos by the blocks of split 0;
// every block reads them for position pos from qkv itself, so no block
// reads what another writes. Each block leaves its chunk's max score, sum
// of exponentials and unnormalised output in ws ((hd+2) floats per block);
// the last block of (b, h) to finish (counted in counters[b*heads+h], which
// it resets to 0) combines the chunks in split order, so the result does
// not depend on which block finishes last.
// Dynamic shared memory: (hd + roundup(ceil(kv_len/splits), 4) + 4*blockDim)
// floats;
// hd is a multiple of 4, hd/4 <= blockDim, blockDim a multiple of 32.
__global__ void old_attention(float *__restrict__ out, const float *__restrict__ qkv, float *kc,
                          float *vc, const uint32_t *__restrict__ step, float *ws,
                          uint32_t *counters, uint32_t width, uint32_t heads, uint32_t kv_len,
                          uint32_t splits, float scale) {
    extern __shared__ float sm[];
    __shared__ bool s_last;
    const uint32_t hd = width / heads, h = blockIdx.x, b = blockIdx.y, s = blockIdx.z;
    const uint32_t pos = min(step[0], kv_len - 1), n = pos + 1;
    const uint32_t chunk = (n + splits - 1) / splits;
    const uint32_t t0 = min(s * chunk, n), t1 = min(t0 + chunk, n);
    const uint32_t pmax = ((kv_len + splits - 1) / splits + 3) & ~3u; // 16-byte multiple
    float *s_q = sm;           // hd
    float *s_p = sm + hd;      // ceil(kv_len/splits), rounded up to a multiple of 4
    float *s_o = s_p + pmax;   // 4*blockDim, read and written as float4
    const float *q = qkv + (size_t)b * 3 * width + h * hd;
    const float *knew = q + width, *vnew = q + 2 * width;
    const size_t base = (size_t)b * kv_len * width + h * hd;
    for (uint32_t d = threadIdx.x; d < hd; d += blockDim.x) {
        s_q[d] = q[d];
        if (s == 0) {
            kc[base + (size_t)pos * width + d] = knew[d];
            vc[base + (size_t)pos * width + d] = vnew[d];
        }
    }
    __syncthreads();

    const uint32_t hd4 = hd / 4;
    const float4 *q4 = reinterpret_cast<const float4 *>(s_q);
    float mx = -INFINITY;
    for (uint32_t t = t0 + threadIdx.x; t < t1; t += blockDim.x) {
        const float4 *k4 = reinterpret_cast<const float4 *>(t == pos ? knew : kc + base + (size_t)t * width);
        float a = 0.f;
#pragma unroll 16
        for (uint32_t d = 0; d < hd4; d++) {
            const float4 kv = k4[d], qv = q4[d];
            a = fmaf(qv.x, kv.x, a);
            a = fmaf(qv.y, kv.y, a);
            a = fmaf(qv.z, kv.z, a);
            a = fmaf(qv.w, kv.w, a);
        }
        a *= scale;
        s_p[t - t0] = a;
        mx = fmaxf(mx, a);
    }
    mx = old_block_max(mx, s_o);
    float sum = 0.f;
    for (uint32_t t = t0 + threadIdx.x; t < t1; t += blockDim.x) {
        const float e = __expf(s_p[t - t0] - mx);
        s_p[t - t0] = e;
        sum += e;
    }
    sum = old_block_sum(sum, s_o);
    __syncthreads(); // s_p complete; s_o free again

    const uint32_t groups = blockDim.x / hd4;
    const uint32_t d4 = threadIdx.x % hd4, g = threadIdx.x / hd4;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    if (g < groups) {
#pragma unroll 4
        for (uint32_t t = t0 + g; t < t1; t += groups) {
            const float4 v = reinterpret_cast<const float4 *>(t == pos ? vnew : vc + base + (size_t)t * width)[d4];
            const float p = s_p[t - t0];
            acc.x = fmaf(p, v.x, acc.x);
            acc.y = fmaf(p, v.y, acc.y);
            acc.z = fmaf(p, v.z, acc.z);
            acc.w = fmaf(p, v.w, acc.w);
        }
        reinterpret_cast<float4 *>(s_o)[g * hd4 + d4] = acc;
    }
    __syncthreads();
    const size_t bh = (size_t)b * heads + h;
    float *pw = ws + (bh * splits + s) * (hd + 2);
    for (uint32_t d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = 0.f;
        for (uint32_t gg = 0; gg < groups; gg++) o += s_o[gg * hd + d];
        pw[2 + d] = o;
    }
    if (threadIdx.x == 0) {
        pw[0] = mx;
        pw[1] = sum;
    }
    __threadfence(); // the partials are visible device-wide before the count
    __syncthreads();
    if (threadIdx.x == 0) s_last = atomicAdd(&counters[bh], 1u) == splits - 1;
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    const float *pb = ws + bh * splits * (hd + 2);
    float m = -INFINITY;
    for (uint32_t k = 0; k < splits; k++) m = fmaxf(m, __ldcg(pb + k * (hd + 2)));
    for (uint32_t d = threadIdx.x; d < hd; d += blockDim.x) {
        float l = 0.f, o = 0.f;
        for (uint32_t k = 0; k < splits; k++) {
            const float *pk = pb + k * (hd + 2);
            const float mk = __ldcg(pk);
            const float wk = mk == -INFINITY ? 0.f : __expf(mk - m);
            l = fmaf(wk, __ldcg(pk + 1), l);
            o = fmaf(wk, __ldcg(pk + 2 + d), o);
        }
        out[(size_t)b * width + h * hd + d] = o / l;
    }
    if (threadIdx.x == 0) counters[bh] = 0;
}

} // extern "C"

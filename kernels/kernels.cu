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
#define MAXB 8 // batch rows a linear kernel's warp accumulates at once

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// block_sum returns the sum of v over the block to every thread. red needs
// 32 floats; the block size is a multiple of 32.
__device__ float block_sum(float v, float *red) {
    int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, nw = blockDim.x / WARP;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float s = 0.f;
    for (int i = 0; i < nw; i++) s += red[i];
    return s;
}

__device__ float block_max(float v, float *red) {
    int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, nw = blockDim.x / WARP;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float m = red[0];
    for (int i = 1; i < nw; i++) m = fmaxf(m, red[i]);
    return m;
}

// gelu_tanh is GPT-2's activation (the tanh approximation).
__device__ __forceinline__ float gelu_tanh(float x) {
    const float k = 0.7978845608028654f; // sqrt(2/pi)
    return 0.5f * x * (1.f + tanhf(k * (x + 0.044715f * x * x * x)));
}

extern "C" {

// embed: x[b][i] = wte[tok_b][i] + wpe[pos][i], where step = {pos, tok_0,
// ..., tok_{batch-1}} lives in device memory. pos and the tokens are
// clamped into range so that no value makes the kernel read out of bounds.
// Grid (ceil(width/blockDim), batch).
__global__ void embed(float *__restrict__ x, const float *__restrict__ wte,
                      const float *__restrict__ wpe, const uint32_t *__restrict__ step,
                      uint32_t width, uint32_t vocab, uint32_t max_pos) {
    uint32_t b = blockIdx.y;
    uint32_t pos = min(step[0], max_pos - 1);
    uint32_t tok = min(step[1 + b], vocab - 1);
    uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < width)
        x[(size_t)b * width + i] = wte[(size_t)tok * width + i] + wpe[(size_t)pos * width + i];
}

// linear: out[b][o] = f(sum_i xn[b][i] * w[o][i] + bias[o]) for b < batch,
// o < out_dim, with w row-major [out_dim][in_dim] (a GEMV per batch row:
// every weight row is read once per MAXB batch rows, coalesced, 16 bytes a
// lane). xn is in, or, when ln_g is not null, in layer-normalized per row
// (gamma ln_g, beta ln_b, eps): the layer norm is fused into the matmul that
// consumes it. mode bit 0 applies GELU; bit 1 adds resid[b][o] afterwards
// (a residual connection). bias may be null. One warp per output row;
// in_dim is a multiple of 4 and every pointer 16-byte aligned.
__global__ void linear(float *__restrict__ out, const float *__restrict__ in,
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
            // Two-pass statistics per row, in a fixed order.
            for (uint32_t b = 0; b < nb; b++) {
                const float *x = in + (size_t)(b0 + b) * in_dim;
                float s = 0.f;
                for (uint32_t i = threadIdx.x; i < in_dim; i += blockDim.x) s += x[i];
                float mean = block_sum(s, s_red) / (float)in_dim;
                float v = 0.f;
                for (uint32_t i = threadIdx.x; i < in_dim; i += blockDim.x) {
                    float d = x[i] - mean;
                    v += d * d;
                }
                float var = block_sum(v, s_red) / (float)in_dim;
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
#pragma unroll 4
            for (uint32_t i = lane; i < n4; i += WARP) {
                const float4 wv = __ldg(w4 + i);
                float4 gv, bv;
                if (ln_g != nullptr) {
                    gv = __ldg(reinterpret_cast<const float4 *>(ln_g) + i);
                    bv = __ldg(reinterpret_cast<const float4 *>(ln_b) + i);
                }
#pragma unroll
                for (int b = 0; b < MAXB; b++) {
                    if (b < nb) {
                        float4 xv = reinterpret_cast<const float4 *>(in + (size_t)(b0 + b) * in_dim)[i];
                        if (ln_g != nullptr) {
                            const float m = s_mean[b], r = s_rstd[b];
                            xv.x = (xv.x - m) * r * gv.x + bv.x;
                            xv.y = (xv.y - m) * r * gv.y + bv.y;
                            xv.z = (xv.z - m) * r * gv.z + bv.z;
                            xv.w = (xv.w - m) * r * gv.w + bv.w;
                        }
                        float a = acc[b];
                        a = fmaf(wv.x, xv.x, a);
                        a = fmaf(wv.y, xv.y, a);
                        a = fmaf(wv.z, xv.z, a);
                        a = fmaf(wv.w, xv.w, a);
                        acc[b] = a;
                    }
                }
            }
#pragma unroll
            for (int b = 0; b < MAXB; b++) acc[b] = warp_sum(acc[b]);
            if (lane == 0) {
                const float bo = bias != nullptr ? bias[o] : 0.f;
#pragma unroll
                for (int b = 0; b < MAXB; b++) {
                    if (b < nb) {
                        float y = acc[b] + bo;
                        if (mode & 1u) y = gelu_tanh(y);
                        const size_t at = (size_t)(b0 + b) * out_dim + o;
                        if (mode & 2u) y += resid[at];
                        out[at] = y;
                    }
                }
            }
        }
        __syncthreads(); // s_mean/s_rstd are rewritten for the next rows
    }
}

// attention: one decode step of multi-head attention for head blockIdx.x of
// batch row blockIdx.y. qkv[b] holds q, k, v (each width wide, head h at
// h*hd). The current k and v are first written into the caches
// kc, vc ([batch][kv_len][width]) at pos = step[0] (clamped), then q
// attends over cache positions 0..pos: out[b][h*hd+d] = sum_t p_t v[t][d],
// p = softmax(scale * q.k_t). Dynamic shared memory: (hd + kv_len +
// 4*blockDim) floats. hd is a multiple of 4 and at most blockDim*... (host
// checks); blockDim a multiple of 32.
__global__ void attention(float *__restrict__ out, const float *__restrict__ qkv, float *kc,
                          float *vc, const uint32_t *__restrict__ step, uint32_t width,
                          uint32_t heads, uint32_t kv_len, float scale) {
    extern __shared__ float sm[];
    const uint32_t hd = width / heads, h = blockIdx.x, b = blockIdx.y;
    const uint32_t pos = min(step[0], kv_len - 1);
    float *s_q = sm;             // hd
    float *s_p = sm + hd;        // kv_len
    float *s_o = s_p + kv_len;   // 4*blockDim: partial outputs, reductions
    const float *q = qkv + (size_t)b * 3 * width + h * hd;
    const size_t base = (size_t)b * kv_len * width + h * hd;
    for (uint32_t d = threadIdx.x; d < hd; d += blockDim.x) {
        s_q[d] = q[d];
        kc[base + (size_t)pos * width + d] = q[width + d];
        vc[base + (size_t)pos * width + d] = q[2 * width + d];
    }
    __syncthreads(); // the block's cache writes and s_q are visible to it

    const uint32_t hd4 = hd / 4;
    const float4 *q4 = reinterpret_cast<const float4 *>(s_q);
    float mx = -INFINITY;
    for (uint32_t t = threadIdx.x; t <= pos; t += blockDim.x) {
        const float4 *k4 = reinterpret_cast<const float4 *>(kc + base + (size_t)t * width);
        float a = 0.f;
#pragma unroll 4
        for (uint32_t d = 0; d < hd4; d++) {
            const float4 kv = k4[d], qv = q4[d];
            a = fmaf(qv.x, kv.x, a);
            a = fmaf(qv.y, kv.y, a);
            a = fmaf(qv.z, kv.z, a);
            a = fmaf(qv.w, kv.w, a);
        }
        a *= scale;
        s_p[t] = a;
        mx = fmaxf(mx, a);
    }
    mx = block_max(mx, s_o);
    float sum = 0.f;
    for (uint32_t t = threadIdx.x; t <= pos; t += blockDim.x) {
        const float e = __expf(s_p[t] - mx);
        s_p[t] = e;
        sum += e;
    }
    sum = block_sum(sum, s_o);
    __syncthreads(); // s_p complete; s_o free again

    // Output: hd4 threads per cache row (16 bytes each), groups of rows.
    const uint32_t groups = blockDim.x / hd4;
    const uint32_t d4 = threadIdx.x % hd4, g = threadIdx.x / hd4;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    if (g < groups) {
#pragma unroll 4
        for (uint32_t t = g; t <= pos; t += groups) {
            const float4 v = reinterpret_cast<const float4 *>(vc + base + (size_t)t * width)[d4];
            const float p = s_p[t];
            acc.x = fmaf(p, v.x, acc.x);
            acc.y = fmaf(p, v.y, acc.y);
            acc.z = fmaf(p, v.z, acc.z);
            acc.w = fmaf(p, v.w, acc.w);
        }
        reinterpret_cast<float4 *>(s_o)[g * hd4 + d4] = acc;
    }
    __syncthreads();
    const float inv = 1.f / sum;
    for (uint32_t d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = 0.f;
        for (uint32_t gg = 0; gg < groups; gg++) o += s_o[gg * hd + d];
        out[(size_t)b * width + h * hd + d] = o * inv;
    }
}

} // extern "C"

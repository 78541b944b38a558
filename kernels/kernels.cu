// Kernels of the built-in workloads (package workloads: gpt2-decode, mlp).
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
#define MAXB 8  // batch rows a linear kernel's warp accumulates at once
#define KPRE 16 // float4s of its first key an attention thread loads up front (hd <= 64)
#define VPRE 8  // value vectors an attention thread loads up front

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

// gelu_tanh is GPT-2's activation (the tanh approximation), computed as
// 0.5*x*(1 + tanh(u)) = x / (1 + exp(-2u)): one exponential and one
// reciprocal, no cancellation (for large |u| the exponential goes to 0 or
// infinity and the result to x or 0).
__device__ __forceinline__ float gelu_tanh(float x) {
    const float k2 = 2.f * 0.7978845608028654f; // 2*sqrt(2/pi)
    return x * __frcp_rn(1.f + __expf(-k2 * (x + 0.044715f * x * x * x)));
}

// Programmatic dependent launch (sm_90 builds only: kernels_90.ptx has the
// instructions, the compute_80 kernels.ptx has neither): a linear lets the
// next kernel's blocks start at once and waits for the previous kernel's
// memory only after it has issued its weight loads. Without the launch
// attribute both are no-ops.
//
// The rule, audited for every kernel here: a kernel launched with
// programmatic serialization may run while its predecessor still runs, so
// before griddepcontrol.wait it must neither read memory that an earlier
// kernel writes (activations, residuals, the step's position) nor write
// anything (the planner reuses addresses: its output may be a buffer the
// predecessor still reads). linear reads only its weights and bias before
// PDL_WAIT (they are written by host copies before any step) and stores
// nothing before it; every thread waits in its first batch-row chunk,
// before any activation (attention_part and attention_combine: see
// there). embed and attention have neither instruction; the executor
// launches only kernels that execute griddepcontrol.wait with the
// attribute (kernels.PDLEntries), so they wait for their predecessor's
// completion as usual. launch_dependents at linear's start is always safe: it only lets
// the next grid be scheduled; that grid's own wait still waits for this
// whole grid to complete and its memory to be visible (and so, by
// induction, for every earlier kernel).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define PDL_LAUNCH_DEPENDENTS() asm volatile("griddepcontrol.launch_dependents;" ::: "memory")
#define PDL_WAIT() asm volatile("griddepcontrol.wait;" ::: "memory")
#else
#define PDL_LAUNCH_DEPENDENTS()
#define PDL_WAIT()
#endif

// PDL_WAIT_IF(c) is griddepcontrol.wait behind a branch on c, which must be
// true for every thread that goes on to read an earlier kernel's memory.
// Why the branch: ptxas schedules the wait as early as it can, above the
// independent loads that precede it in the source within one basic block
// (in the SASS: ACQBULK first, then every weight and cache load of the
// prologue, so none of them overlapped the predecessor). A branch on a
// value it cannot fold ends the block, and the prologue's loads stay above
// the wait (scripts/gpu-floor.sh COMPILE=1 checks it in the SASS).
// Measured on an H100, gpt2-decode replayed (µs a step, batch 1 / 8): 421 /
// 871 before, 374 / 816 with linear's and attention_part's waits so placed.
#define PDL_WAIT_IF(c)   \
    do {                 \
        if (c) PDL_WAIT(); \
    } while (0)


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

} // extern "C"

// sel is c ? a : b as a select instruction. Written as a ternary on two
// elements of an array, the choice may become an index into the array,
// which then lives in local memory.
__device__ __forceinline__ float sel(bool c, float a, float b) {
    float r;
    asm("{\n\t.reg .pred p;\n\tsetp.ne.u32 p, %1, 0;\n\tselp.f32 %0, %2, %3, p;\n\t}"
        : "=f"(r)
        : "r"((unsigned)c), "f"(a), "f"(b));
    return r;
}

// halve is reduce_scatter's halving step of H values (lane bit 32*H/NB)
// and the steps after it; a template each, so that every index into v is
// a constant. (A loop over H, even under #pragma unroll, left linear_st's
// 16 and 32 values in local memory: a 128-byte stack frame, 176 local
// loads.)
template <int NB, int H>
__device__ __forceinline__ void halve(float (&v)[NB], int lane, int &idx) {
    if constexpr (H >= 1) {
        constexpr int off = 32 * H / NB;
        const bool up = (lane & off) != 0;
        if (up) idx += H;
#pragma unroll
        for (int k = 0; k < H; k++) {
            const float keep = sel(up, v[k + H], v[k]);
            const float send = sel(up, v[k], v[k + H]);
            v[k] = keep + __shfl_xor_sync(0xffffffffu, send, off);
        }
        halve<NB, H / 2>(v, lane, idx);
    }
}

// reduce_scatter sums each of v[0..NB) over the warp's 32 lanes in
// log2(NB) halving steps (each lane keeps half of its values and adds its
// partner's half of the other) and 5-log2(NB) plain xor steps: NB-1 +
// 5-log2(NB) shuffles (9 for 8 rows) instead of 5*NB. It returns the sum of
// v[idx], where idx is made of the lane's bits 4, 3, ... (highest first);
// lanes that differ only in their low 5-log2(NB) bits hold the same value.
// The order of the adds is fixed, so the result is deterministic.
template <int NB>
__device__ __forceinline__ float reduce_scatter(float (&v)[NB], int lane, int &idx) {
    idx = 0;
    halve<NB, NB / 2>(v, lane, idx);
#pragma unroll
    for (int off = 16 / NB; off > 0; off >>= 1) v[0] += __shfl_xor_sync(0xffffffffu, v[0], off);
    return v[0];
}

// load_tile issues lane's T 16-byte loads of chunk c of weight row o
// (zeros beyond the row or past the last row), all before any is used;
// with COH coherent ones (ld.global.cg: L2, not L1), which ptxas does not
// move across griddepcontrol.wait (see linear_ln1).
template <int T, bool COH = false>
__device__ __forceinline__ void load_tile(float4 (&wv)[T], const float4 *__restrict__ w4, uint32_t o,
                                          uint32_t c, uint32_t n4, uint32_t out_dim, int lane) {
    const bool row = o < out_dim;
    const float4 *p = w4 + (size_t)(row ? o : 0) * n4;
#pragma unroll
    for (int u = 0; u < T; u++) {
        const uint32_t i = c * (T * WARP) + u * WARP + lane;
        wv[u] = row && i < n4 ? (COH ? __ldcg(p + i) : __ldg(p + i)) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
}

// linear_rows computes batch rows b0..b0+nb-1 (nb <= NB) of linear. Each
// warp takes rows o = blockIdx.x*nw + warp, o + gridDim.x*nw, ...; a row is
// read in chunks ("tiles") of T float4s per lane (8; 2 for narrow rows of
// one batch row, 6 in linear_ln at one batch row; 4 from 3 batch rows on,
// to bound the registers), and the next tile (of the same row, or the
// first of the warp's next row) is loaded before the
// current one is used, so a warp always has a tile in flight. The first
// tile is loaded before the layer-norm statistics are computed, so that
// its memory latency hides behind them. Batch rows reuse each weight tile
// from registers. With ST (staged, LN only) the block normalises its nb
// input rows once into shared memory (xs, nb*in_dim floats) after the
// statistics, and the tiles read them from there instead of normalising
// every row again for every weight row. With R > 1 a warp takes R adjacent
// rows at once (rows R*g .. R*g+R-1 for its index g, striding as above):
// each input vector read serves R weight tiles, the sums of every row in
// the same order as with R = 1. linear_ln uses R = 2 from 3 batch rows on
// (H100, gpt2-decode replayed: b8 817 -> 781 µs, b4 588 -> 566; R = 2 for
// linear's rows was slower, 850 and 618).
template <int NB, bool LN, int T, bool ST = false, int R = 1>
__device__ __forceinline__ void linear_rows(float *__restrict__ out, const float *__restrict__ in,
                                            const float *__restrict__ w, const float *__restrict__ bias,
                                            const float *__restrict__ resid, const float *__restrict__ ln_g,
                                            const float *__restrict__ ln_b, uint32_t in_dim,
                                            uint32_t out_dim, uint32_t b0, uint32_t nb, uint32_t mode,
                                            float eps, float *s_mean, float *s_rstd, float4 *xs) {
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, nw = blockDim.x / WARP;
    const uint32_t n4 = in_dim / 4;
    const uint32_t nc = (n4 + T * WARP - 1) / (T * WARP);
    const uint32_t stride = gridDim.x * nw * R;
    const float4 *w4 = reinterpret_cast<const float4 *>(w);
    uint32_t o = (blockIdx.x * nw + warp) * R, c = 0;
    float4 wn[R][T];
#pragma unroll
    for (int r = 0; r < R; r++) load_tile(wn[r], w4, o + r, 0, n4, out_dim, lane);
    // The epilogue's operands of row o for this lane's batch row (lane
    // j*(32/NB) writes batch row j), loaded up front too.
    const int wb = lane / (WARP / NB); // batch row this lane would write
    float bo[R], rv[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        bo[r] = rv[r] = 0.f;
        if (o + r < out_dim && bias != nullptr) bo[r] = __ldg(bias + o + r);
    }
    // Weights and bias above; activations (in, resid) below. Every thread
    // runs chunk 0 first, so one wait covers the kernel.
    PDL_WAIT_IF(b0 == 0);
#pragma unroll
    for (int r = 0; r < R; r++)
        if (o + r < out_dim && (mode & 2u) && wb < (int)nb) rv[r] = __ldg(resid + (size_t)(b0 + wb) * out_dim + o + r);
    if (LN) {
        // Statistics: one warp per batch row, one pass of sum and sum of
        // squares, reduced in a fixed order.
        for (uint32_t b = warp; b < nb; b += nw) {
            const float4 *x4 = reinterpret_cast<const float4 *>(in + (size_t)(b0 + b) * in_dim);
            float s = 0.f, q = 0.f;
            for (uint32_t i0 = 0; i0 < n4; i0 += 4 * WARP) {
                float4 xv[4];
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    const uint32_t i = i0 + u * WARP + lane;
                    xv[u] = i < n4 ? __ldg(x4 + i) : make_float4(0.f, 0.f, 0.f, 0.f);
                }
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    s += (xv[u].x + xv[u].y) + (xv[u].z + xv[u].w);
                    q += (xv[u].x * xv[u].x + xv[u].y * xv[u].y) + (xv[u].z * xv[u].z + xv[u].w * xv[u].w);
                }
            }
            s = warp_sum(s);
            q = warp_sum(q);
            if (lane == 0) {
                const float mean = s / (float)in_dim;
                const float var = fmaxf(q / (float)in_dim - mean * mean, 0.f);
                s_mean[b] = mean;
                s_rstd[b] = rsqrtf(var + eps);
            }
        }
        __syncthreads();
        if (ST) {
            // The same expression as the per-tile path below.
            for (uint32_t b = 0; b < nb; b++) {
                const float4 *x4 = reinterpret_cast<const float4 *>(in + (size_t)(b0 + b) * in_dim);
                const float m = s_mean[b], r = s_rstd[b];
                for (uint32_t i = threadIdx.x; i < n4; i += blockDim.x) {
                    float4 x = __ldg(x4 + i);
                    const float4 gv = __ldg(reinterpret_cast<const float4 *>(ln_g) + i);
                    const float4 bv = __ldg(reinterpret_cast<const float4 *>(ln_b) + i);
                    x.x = (x.x - m) * r * gv.x + bv.x;
                    x.y = (x.y - m) * r * gv.y + bv.y;
                    x.z = (x.z - m) * r * gv.z + bv.z;
                    x.w = (x.w - m) * r * gv.w + bv.w;
                    xs[b * n4 + i] = x;
                }
            }
            __syncthreads();
        }
    }
    float mean[NB], rstd[NB];
#pragma unroll
    for (int b = 0; b < NB; b++) {
        mean[b] = LN && b < (int)nb ? s_mean[b] : 0.f;
        rstd[b] = LN && b < (int)nb ? s_rstd[b] : 0.f;
    }
    float acc[R][NB];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int b = 0; b < NB; b++) acc[r][b] = 0.f;
    while (o < out_dim) {
        float4 wv[R][T];
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int u = 0; u < T; u++) wv[r][u] = wn[r][u];
        uint32_t o2 = o, c2 = c + 1;
        if (c2 == nc) {
            c2 = 0;
            o2 += stride;
        }
#pragma unroll
        for (int r = 0; r < R; r++) load_tile(wn[r], w4, o2 + r, c2, n4, out_dim, lane);
        const uint32_t ib = c * (T * WARP) + lane;
        if (NB == 1 && !LN && R == 1) {
            // One batch row: four independent chains (x, y, z, w), so that
            // the tile's FMAs are not one dependent chain.
            const float4 *x4 = reinterpret_cast<const float4 *>(in + (size_t)b0 * in_dim);
            float4 xv[T];
#pragma unroll
            for (int u = 0; u < T; u++) {
                const uint32_t i = ib + u * WARP;
                xv[u] = i < n4 ? __ldg(x4 + i) : make_float4(0.f, 0.f, 0.f, 0.f);
            }
            float px = 0.f, py = 0.f, pz = 0.f, pw = 0.f;
#pragma unroll
            for (int u = 0; u < T; u++) {
                px = fmaf(wv[0][u].x, xv[u].x, px);
                py = fmaf(wv[0][u].y, xv[u].y, py);
                pz = fmaf(wv[0][u].z, xv[u].z, pz);
                pw = fmaf(wv[0][u].w, xv[u].w, pw);
            }
            acc[0][0] += (px + py) + (pz + pw);
        } else {
            // Batch rows outer: a row's T input vectors (normalised with the
            // tile's gamma and beta) are loaded together, then used.
            float4 gv[T], bv[T];
            if (LN && !ST) {
#pragma unroll
                for (int u = 0; u < T; u++) {
                    const uint32_t ic = min(ib + u * WARP, n4 - 1);
                    gv[u] = __ldg(reinterpret_cast<const float4 *>(ln_g) + ic);
                    bv[u] = __ldg(reinterpret_cast<const float4 *>(ln_b) + ic);
                }
            }
#pragma unroll
            for (int b = 0; b < NB; b++) {
                if (b < (int)nb) {
                    const float4 *x4 = ST ? xs + b * n4 : reinterpret_cast<const float4 *>(in + (size_t)(b0 + b) * in_dim);
                    float4 xv[T];
#pragma unroll
                    for (int u = 0; u < T; u++) {
                        const uint32_t i = ib + u * WARP;
                        xv[u] = i < n4 ? (ST ? x4[i] : __ldg(x4 + i)) : make_float4(0.f, 0.f, 0.f, 0.f);
                    }
#pragma unroll
                    for (int u = 0; u < T; u++) {
                        if (LN && !ST) {
                            const float m = mean[b], rs = rstd[b];
                            xv[u].x = (xv[u].x - m) * rs * gv[u].x + bv[u].x;
                            xv[u].y = (xv[u].y - m) * rs * gv[u].y + bv[u].y;
                            xv[u].z = (xv[u].z - m) * rs * gv[u].z + bv[u].z;
                            xv[u].w = (xv[u].w - m) * rs * gv[u].w + bv[u].w;
                        }
                    }
#pragma unroll
                    for (int r = 0; r < R; r++) {
                        float a = acc[r][b];
#pragma unroll
                        for (int u = 0; u < T; u++) {
                            a = fmaf(wv[r][u].x, xv[u].x, a);
                            a = fmaf(wv[r][u].y, xv[u].y, a);
                            a = fmaf(wv[r][u].z, xv[u].z, a);
                            a = fmaf(wv[r][u].w, xv[u].w, a);
                        }
                        acc[r][b] = a;
                    }
                }
            }
        }
        if (c2 == 0) {
            // Row o is done: reduce, apply the epilogue, store, and load
            // the next row's epilogue operands.
#pragma unroll
            for (int r = 0; r < R; r++) {
                int idx;
                float y = reduce_scatter<NB>(acc[r], lane, idx);
                if (lane % (WARP / NB) == 0 && idx < (int)nb && o + r < out_dim) {
                    y += bo[r];
                    if (mode & 1u) y = gelu_tanh(y);
                    y += rv[r]; // 0 unless mode bit 1
                    out[(size_t)(b0 + idx) * out_dim + o + r] = y;
                }
#pragma unroll
                for (int b = 0; b < NB; b++) acc[r][b] = 0.f;
                bo[r] = rv[r] = 0.f;
                if (o2 + r < out_dim) {
                    if (bias != nullptr) bo[r] = __ldg(bias + o2 + r);
                    if ((mode & 2u) && wb < (int)nb) rv[r] = __ldg(resid + (size_t)(b0 + wb) * out_dim + o2 + r);
                }
            }
        }
        o = o2;
        c = c2;
    }
    if (LN) __syncthreads(); // s_mean/s_rstd are rewritten for the next rows
}

// linear_sk_tile loads lane's part of tile c of float4s [k0, k1) of weight
// rows o..o+R-1 (zeros past k1 or the last row), all before any is used.
template <int T, int R>
__device__ __forceinline__ void linear_sk_tile(float4 (&wv)[R][T], const float4 *__restrict__ w4, uint32_t o,
                                               uint32_t c, uint32_t k0, uint32_t k1, uint32_t n4,
                                               uint32_t out_dim, int lane) {
#pragma unroll
    for (int r = 0; r < R; r++) {
        const bool row = o + r < out_dim;
        const float4 *p = w4 + (size_t)(row ? o + r : 0) * n4;
#pragma unroll
        for (int u = 0; u < T; u++) {
            const uint32_t i = k0 + c * (T * WARP) + u * WARP + lane;
            wv[r][u] = row && i < k1 ? __ldg(p + i) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
    }
}

// linear_rows_sk computes batch rows b0..b0+nb-1 (nb <= NB) of linear
// without a layer norm, a block taking R output rows at once (rows
// blockIdx.x*R .., striding by gridDim.x*R) and its nw warps splitting the
// rows' inputs: warp w reads float4s [w*n4/nw, (w+1)*n4/nw) of each of the
// R rows, in tiles of T float4s a lane, the next tile loaded before the
// current one is used. Each input vector read serves R weight tiles (at 8
// batch rows, one row a warp read 8 input float4s from L1 for every weight
// float4). The warps' sums are added in warp order through s_red
// (nw*R*NB floats); warp 0 applies the epilogue. Fixed order throughout:
// deterministic.
template <int NB, int T, int R>
__device__ __forceinline__ void linear_rows_sk(float *__restrict__ out, const float *__restrict__ in,
                                               const float *__restrict__ w, const float *__restrict__ bias,
                                               const float *__restrict__ resid, uint32_t in_dim,
                                               uint32_t out_dim, uint32_t b0, uint32_t nb, uint32_t mode,
                                               float *s_red) {
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, nw = blockDim.x / WARP;
    const uint32_t n4 = in_dim / 4;
    const uint32_t k0 = warp * n4 / nw, k1 = (warp + 1) * n4 / nw; // this warp's float4s of a row
    const uint32_t nc = (k1 - k0 + T * WARP - 1) / (T * WARP);      // its tiles (0 when k0 == k1)
    const uint32_t stride = gridDim.x * R;
    const float4 *w4 = reinterpret_cast<const float4 *>(w);
    uint32_t o = blockIdx.x * R;
    float4 wn[R][T];
    if (nc > 0) linear_sk_tile<T, R>(wn, w4, o, 0, k0, k1, n4, out_dim, lane);
    // Warp 0's lane r*NB+b applies the epilogue of row o+r, batch row b:
    // its bias (a weight) before the wait, its residual after.
    const int er = lane / NB, eb = lane % NB;
    const bool elane = warp == 0 && er < R;
    float bo = elane && o + er < out_dim && bias != nullptr ? __ldg(bias + o + er) : 0.f;
    PDL_WAIT_IF(b0 == 0);
    float rv = elane && o + er < out_dim && (mode & 2u) && eb < (int)nb ? __ldg(resid + (size_t)(b0 + eb) * out_dim + o + er) : 0.f;
    for (; o < out_dim; o += stride) { // block-uniform
        float acc[R][NB];
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int b = 0; b < NB; b++) acc[r][b] = 0.f;
        for (uint32_t c = 0; c < nc; c++) {
            float4 wv[R][T];
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int u = 0; u < T; u++) wv[r][u] = wn[r][u];
            // The next tile: of these rows, or the first of the next ones
            // (zeros past the last row).
            if (c + 1 < nc) linear_sk_tile<T, R>(wn, w4, o, c + 1, k0, k1, n4, out_dim, lane);
            else linear_sk_tile<T, R>(wn, w4, o + stride, 0, k0, k1, n4, out_dim, lane);
            const uint32_t ib = k0 + c * (T * WARP) + lane;
#pragma unroll
            for (int b = 0; b < NB; b++) {
                if (b < (int)nb) {
                    const float4 *x4 = reinterpret_cast<const float4 *>(in + (size_t)(b0 + b) * in_dim);
                    float4 xv[T];
#pragma unroll
                    for (int u = 0; u < T; u++) {
                        const uint32_t i = ib + u * WARP;
                        xv[u] = i < k1 ? __ldg(x4 + i) : make_float4(0.f, 0.f, 0.f, 0.f);
                    }
#pragma unroll
                    for (int r = 0; r < R; r++) {
                        float a = acc[r][b];
#pragma unroll
                        for (int u = 0; u < T; u++) {
                            a = fmaf(wv[r][u].x, xv[u].x, a);
                            a = fmaf(wv[r][u].y, xv[u].y, a);
                            a = fmaf(wv[r][u].z, xv[u].z, a);
                            a = fmaf(wv[r][u].w, xv[u].w, a);
                        }
                        acc[r][b] = a;
                    }
                }
            }
        }
#pragma unroll
        for (int r = 0; r < R; r++) {
            int idx;
            const float y = reduce_scatter<NB>(acc[r], lane, idx);
            if (lane % (WARP / NB) == 0) s_red[(warp * R + r) * NB + idx] = y;
        }
        __syncthreads();
        if (elane) {
            float y = 0.f;
            for (int ww = 0; ww < nw; ww++) y += s_red[(ww * R + er) * NB + eb];
            if (o + er < out_dim && eb < (int)nb) {
                y += bo;
                if (mode & 1u) y = gelu_tanh(y);
                y += rv; // 0 unless mode bit 1
                out[(size_t)(b0 + eb) * out_dim + o + er] = y;
            }
            const uint32_t on = o + stride;
            bo = on + er < out_dim && bias != nullptr ? __ldg(bias + on + er) : 0.f;
            rv = on + er < out_dim && (mode & 2u) && eb < (int)nb ? __ldg(resid + (size_t)(b0 + eb) * out_dim + on + er) : 0.f;
        }
        __syncthreads(); // s_red is rewritten for the next rows
    }
}

// Rows a block of linear takes at once from 3 batch rows on (R of
// linear_rows_sk; kernels.LinearSplitKRows), and the float4s a lane reads
// of each per tile.
#define LINEAR_SK_R 4
#define LINEAR_T1 8
#define LINEAR_SK_T 2

extern "C" {

// linear: out[b][o] = f(sum_i xn[b][i] * w[o][i] + bias[o]) for b < batch,
// o < out_dim, with w row-major [out_dim][in_dim] (a GEMV per batch row:
// every weight row is read once per MAXB batch rows, coalesced, 16 bytes a
// lane). xn is in, or, when ln_g is not null, in layer-normalized per row
// (gamma ln_g, beta ln_b, eps): the layer norm is fused into the matmul that
// consumes it. mode bit 0 applies GELU; bit 1 adds resid[b][o] afterwards
// (a residual connection). bias may be null. One warp per output row
// (grid-stride over the rows), except without a layer norm from 3 batch
// rows on: one block per LINEAR_SK_R rows, its warps splitting the inputs
// (linear_rows_sk; H100, gpt2-decode replayed: b4 565 -> 539 µs a step, b8
// 778 -> 772). Any grid; in_dim is a
// multiple of 4, every pointer 16-byte aligned, the block size a multiple
// of 32, at most 1024.
__global__ void linear(float *__restrict__ out, const float *__restrict__ in,
                       const float *__restrict__ w, const float *__restrict__ bias,
                       const float *__restrict__ resid, const float *__restrict__ ln_g,
                       const float *__restrict__ ln_b, uint32_t in_dim, uint32_t out_dim,
                       uint32_t batch, uint32_t mode, float eps) {
    __shared__ float s_mean[MAXB], s_rstd[MAXB];
    __shared__ float s_red[WARP * LINEAR_SK_R * MAXB];
    PDL_LAUNCH_DEPENDENTS();
    const bool narrow = in_dim <= 2 * 4 * WARP; // a row is at most 2 float4s a lane
    for (uint32_t b0 = 0; b0 < batch; b0 += MAXB) {
        const uint32_t nb = min((uint32_t)MAXB, batch - b0);
#define LINEAR_ROWS(NB, LN, T)                                                                     \
    linear_rows<NB, LN, T>(out, in, w, bias, resid, ln_g, ln_b, in_dim, out_dim, b0, nb, mode, eps, \
                           s_mean, s_rstd, nullptr)
        if (ln_g != nullptr) {
            if (nb == 1) LINEAR_ROWS(1, true, 8);
            else if (nb == 2) LINEAR_ROWS(2, true, 8);
            else if (nb <= 4) LINEAR_ROWS(4, true, 4);
            else LINEAR_ROWS(8, true, 4);
        } else {
            if (nb == 1 && narrow) LINEAR_ROWS(1, false, 2);
            else if (nb == 1) LINEAR_ROWS(1, false, LINEAR_T1);
            else if (nb == 2) LINEAR_ROWS(2, false, 8);
            else if (nb <= 4)
                linear_rows_sk<4, LINEAR_SK_T, LINEAR_SK_R>(out, in, w, bias, resid, in_dim, out_dim, b0, nb, mode, s_red);
            else linear_rows_sk<8, LINEAR_SK_T, LINEAR_SK_R>(out, in, w, bias, resid, in_dim, out_dim, b0, nb, mode, s_red);
        }
#undef LINEAR_ROWS
    }
}

// linear_ln: linear with the layer norm always applied (ln_g, ln_b not
// null), the block normalising its batch rows once into dynamic shared
// memory (min(batch, MAXB)*in_dim floats, which the launch must give)
// instead of once per weight row; otherwise as linear, the same
// parameters and the same function. A kernel of its own so that its
// registers do not raise linear's (fewer resident warps for every linear).
// At most 128 threads a block, registers bounded for four blocks resident
// per multiprocessor, launched within one wave (at most 3.5 blocks a
// multiprocessor: workloads' lnGrid). Measured on an H100 (gpt2-decode
// replayed, µs a step at batch 1 / 8): this bound with 528 blocks
// 421.1 / 871.0; a bound of 2 with 528 blocks 422.2 / 867.4; 3
// with 396 or 462 blocks 432.8 / 883.7 and 424.6 / 874.8; 3 without a grid
// cap (576 to 1024 blocks, before) 449.6 / 968.2; 4 with 1056 blocks
// 448.9 / 966.3.
#define LINEAR_LN_LB 4
// LINEAR_LN_T1: float4s a lane reads of a weight row per tile at one batch
// row. 6, not 8 as at two: a GPT-2 small row (768 floats, 192 float4s) is
// one tile of 6 with every lane busy, where 8 leave a quarter of the lanes
// loading nothing and multiplying zeros. H100, gpt2-decode replayed at
// batch 1: 314 -> 311 µs a step. A row of another width is read in more
// tiles.
#define LINEAR_LN_T1 6
__global__ void __launch_bounds__(128, LINEAR_LN_LB) linear_ln(float *__restrict__ out, const float *__restrict__ in,
                                           const float *__restrict__ w, const float *__restrict__ bias,
                                           const float *__restrict__ resid, const float *__restrict__ ln_g,
                                           const float *__restrict__ ln_b, uint32_t in_dim, uint32_t out_dim,
                                           uint32_t batch, uint32_t mode, float eps) {
    __shared__ float s_mean[MAXB], s_rstd[MAXB];
    extern __shared__ float4 s_xs[];
    PDL_LAUNCH_DEPENDENTS();
    for (uint32_t b0 = 0; b0 < batch; b0 += MAXB) {
        const uint32_t nb = min((uint32_t)MAXB, batch - b0);
#define LINEAR_ROWS_ST(NB, T)                                                                          \
    linear_rows<NB, true, T, true, (NB >= 4 ? 2 : 1)>(out, in, w, bias, resid, ln_g, ln_b, in_dim, out_dim, b0, nb, mode, eps, \
                                   s_mean, s_rstd, s_xs)
        if (nb == 1) LINEAR_ROWS_ST(1, LINEAR_LN_T1);
        else if (nb == 2) LINEAR_ROWS_ST(2, 8);
        else if (nb <= 4) LINEAR_ROWS_ST(4, 4);
        else LINEAR_ROWS_ST(8, 4);
#undef LINEAR_ROWS_ST
    }
}

// linear_few: linear without a layer norm (ln_g and ln_b are not read),
// one batch row at a time: linear's code for one row in a kernel of its
// own, its registers bounded for LINEAR_FEW_LB blocks of 128 threads a
// multiprocessor. linear holds 255 registers a thread for its
// split-input rows (3 batch rows and more), which leaves room for two of
// its blocks a multiprocessor and none for the next kernel's to become
// resident and load before their wait. H100, gpt2-decode replayed at
// batch 1 (projection and MLP out): 331 -> 315 µs a step. Any batch;
// otherwise as linear.
#define LINEAR_FEW_LB 4
#define LINEAR_FEW_T LINEAR_T1
__global__ void __launch_bounds__(128, LINEAR_FEW_LB) linear_few(float *__restrict__ out, const float *__restrict__ in,
                                             const float *__restrict__ w, const float *__restrict__ bias,
                                             const float *__restrict__ resid, const float *__restrict__ ln_g,
                                             const float *__restrict__ ln_b, uint32_t in_dim, uint32_t out_dim,
                                             uint32_t batch, uint32_t mode, float eps) {
    PDL_LAUNCH_DEPENDENTS();
    const bool narrow = in_dim <= 2 * 4 * WARP; // a row is at most 2 float4s a lane
    for (uint32_t b0 = 0; b0 < batch; b0++) {
        if (narrow)
            linear_rows<1, false, 2>(out, in, w, bias, resid, nullptr, nullptr, in_dim, out_dim, b0, 1, mode, eps,
                                     nullptr, nullptr, nullptr);
        else
            linear_rows<1, false, LINEAR_FEW_T>(out, in, w, bias, resid, nullptr, nullptr, in_dim, out_dim, b0, 1, mode,
                                                eps, nullptr, nullptr, nullptr);
    }
}

} // extern "C"

// ---- linear_ln1: a layer-norm linear at one batch row, each warp on its own ----
//
// Why: after its wait, linear_ln at one batch row takes three dependent
// steps before its first multiply: one warp reads the input row for the
// statistics while the others wait at a barrier, then every thread reads
// it again with the gain and bias to normalise it into shared memory, and
// a second barrier. For rows of at most 4*32*LN1_MAXX floats a warp can
// hold the whole row in registers, in the layout of its weight tile (lane
// i holds float4s i, i+32, ...), so each warp reads it once, takes the
// statistics with shuffles and normalises it in place: one round trip
// after the wait, no shared memory, no barrier. The gain and bias are
// parameters (written before any step), so they are loaded before the
// wait with the warp's first weight row.

#define LN1_MAXX 6 // float4s a lane: rows of at most 768 floats (kernels.LinearLN1MaxIn)

// ln1_rows is linear_ln1 for rows of X float4s a lane (lane i holds
// float4s i, i+32, ... of a row; zeros past it). For each batch row: the
// warp's first weight row, its bias, and the layer norm's gain and beta are
// loaded (parameters: for batch row 0 before the wait); then the input row
// and the residual (after it); the statistics by shuffles, the row
// normalised in place; then each of the warp's output rows o0, o0+stride,
// ..., the next one's tile loaded before the current one is used.
template <int X>
__device__ __forceinline__ void ln1_rows(float *__restrict__ out, const float *__restrict__ in,
                                         const float *__restrict__ w, const float *__restrict__ bias,
                                         const float *__restrict__ resid, const float *__restrict__ ln_g,
                                         const float *__restrict__ ln_b, uint32_t in_dim, uint32_t out_dim,
                                         uint32_t batch, uint32_t mode, float eps) {
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, nw = blockDim.x / WARP;
    const uint32_t n4 = in_dim / 4, stride = gridDim.x * nw, o0 = blockIdx.x * nw + warp;
    const float4 *w4 = reinterpret_cast<const float4 *>(w);
    const float4 *g4 = reinterpret_cast<const float4 *>(ln_g), *b4 = reinterpret_cast<const float4 *>(ln_b);
    const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
    for (uint32_t b = 0; b < batch; b++) {
        float4 wn[X], gv[X], bv[X];
        load_tile<X, true>(wn, w4, o0, 0, n4, out_dim, lane);
#pragma unroll
        for (int u = 0; u < X; u++) {
            const uint32_t i = u * WARP + lane;
            gv[u] = i < n4 ? __ldca(g4 + i) : zero;
            bv[u] = i < n4 ? __ldca(b4 + i) : zero;
        }
        float bn = o0 < out_dim && bias != nullptr ? __ldcg(bias + o0) : 0.f;
        // Parameters above, activations below. Every load here is a
        // coherent one (ld.cg, ld.ca): ptxas keeps those on their side of
        // griddepcontrol.wait, where it moved __ldg's non-coherent loads
        // across it both ways (nvcc 11.8's SASS: the wait above the weight
        // loads, or the input row's loads above the wait).
        PDL_WAIT_IF(b == 0);
        const float4 *x4 = reinterpret_cast<const float4 *>(in) + (size_t)b * n4;
        float4 xv[X];
#pragma unroll
        for (int u = 0; u < X; u++) {
            const uint32_t i = u * WARP + lane;
            xv[u] = i < n4 ? __ldcg(x4 + i) : zero;
        }
        float rn = o0 < out_dim && (mode & 2u) ? __ldcg(resid + (size_t)b * out_dim + o0) : 0.f;
        float s = 0.f, q = 0.f;
#pragma unroll
        for (int u = 0; u < X; u++) {
            s += (xv[u].x + xv[u].y) + (xv[u].z + xv[u].w);
            q += (xv[u].x * xv[u].x + xv[u].y * xv[u].y) + (xv[u].z * xv[u].z + xv[u].w * xv[u].w);
        }
        s = warp_sum(s);
        q = warp_sum(q);
        const float mean = s / (float)in_dim;
        const float rstd = rsqrtf(fmaxf(q / (float)in_dim - mean * mean, 0.f) + eps);
#pragma unroll
        for (int u = 0; u < X; u++) { // zeros past the row stay zeros (gain and beta 0 there)
            xv[u].x = (xv[u].x - mean) * rstd * gv[u].x + bv[u].x;
            xv[u].y = (xv[u].y - mean) * rstd * gv[u].y + bv[u].y;
            xv[u].z = (xv[u].z - mean) * rstd * gv[u].z + bv[u].z;
            xv[u].w = (xv[u].w - mean) * rstd * gv[u].w + bv[u].w;
        }
        for (uint32_t o = o0; o < out_dim; o += stride) { // warp-uniform
            float4 wv[X];
#pragma unroll
            for (int u = 0; u < X; u++) wv[u] = wn[u];
            const float bo = bn, rv = rn;
            const uint32_t on = o + stride;
            load_tile<X>(wn, w4, on, 0, n4, out_dim, lane);
            bn = on < out_dim && bias != nullptr ? __ldg(bias + on) : 0.f;
            rn = on < out_dim && (mode & 2u) ? __ldcg(resid + (size_t)b * out_dim + on) : 0.f;
            float px = 0.f, py = 0.f, pz = 0.f, pw = 0.f;
#pragma unroll
            for (int u = 0; u < X; u++) {
                px = fmaf(wv[u].x, xv[u].x, px);
                py = fmaf(wv[u].y, xv[u].y, py);
                pz = fmaf(wv[u].z, xv[u].z, pz);
                pw = fmaf(wv[u].w, xv[u].w, pw);
            }
            float y = warp_sum((px + py) + (pz + pw));
            if (lane == 0) {
                y += bo;
                if (mode & 1u) y = gelu_tanh(y);
                y += rv; // 0 unless mode bit 1
                out[(size_t)b * out_dim + o] = y;
            }
        }
    }
}

#define LINEAR_LN1_LB 4 // blocks a multiprocessor the registers are bounded for

extern "C" {

// linear_ln1: linear_ln's function (the layer norm always applied: ln_g
// and ln_b not null) for in_dim <= 4*32*LN1_MAXX (kernels.LinearLN1MaxIn),
// one batch row at a time, each warp normalising the row itself in
// registers (see above). One warp an output row, grid-stride; no dynamic
// shared memory. At most 128 threads a block, a multiple of 32; in_dim a
// multiple of 4, every pointer 16-byte aligned. A wider row traps (the Go
// reference refuses such a launch).
__global__ void __launch_bounds__(128, LINEAR_LN1_LB)
    linear_ln1(float *__restrict__ out, const float *__restrict__ in, const float *__restrict__ w,
               const float *__restrict__ bias, const float *__restrict__ resid, const float *__restrict__ ln_g,
               const float *__restrict__ ln_b, uint32_t in_dim, uint32_t out_dim, uint32_t batch, uint32_t mode,
               float eps) {
    PDL_LAUNCH_DEPENDENTS();
    const uint32_t n4 = in_dim / 4;
    if (n4 <= 2 * WARP) ln1_rows<2>(out, in, w, bias, resid, ln_g, ln_b, in_dim, out_dim, batch, mode, eps);
    else if (n4 <= 4 * WARP) ln1_rows<4>(out, in, w, bias, resid, ln_g, ln_b, in_dim, out_dim, batch, mode, eps);
    else if (n4 <= LN1_MAXX * WARP)
        ln1_rows<LN1_MAXX>(out, in, w, bias, resid, ln_g, ln_b, in_dim, out_dim, batch, mode, eps);
    else __trap(); // outside the contract
}

} // extern "C"

// ---- linear_st: the block's weight rows staged in shared memory before the wait ----
//
// Why: under programmatic dependent launch a kernel's blocks become
// resident while their predecessor still runs, but a kernel whose weights
// are loaded into registers a tile at a time only gets its first tile in
// flight before griddepcontrol.wait; the rest is loaded after, on the
// step's critical path. linear_st copies all of a block's weight rows into
// shared memory with cp.async before it waits (16 bytes a request, no
// registers held), so a kernel's whole weight read overlaps its
// predecessor, and after the wait only the activations (small, in L2) are
// read. Its footprint is chosen so that two consecutive kernels fit on a
// multiprocessor together: 128 threads of at most 128 registers, at most
// ST_MAXR rows a block, launched as about two blocks a multiprocessor.

#define ST_MAXR 16     // weight rows a block of linear_st takes at most
#define ST_THREADS 128 // most threads a block of linear_st
#define ST_LB 4 // blocks a multiprocessor the registers are bounded for

// cp_async16 copies 16 bytes from global to shared memory without holding
// registers (cp.async, sm_80 and later); cp_async_wait_all waits for this
// thread's copies. The copies bypass L1 (.cg): every weight is read once.
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
#else
    *reinterpret_cast<float4 *>(smem) = *reinterpret_cast<const float4 *>(gmem);
#endif
}

__device__ __forceinline__ void cp_async_wait_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_all;" ::: "memory");
#endif
}

// st_rows computes batch rows b0..b0+nb-1 (nb <= NB) of the block's nr
// output rows r0.. from the weights staged in s_w ([nr][n4] float4s). The
// block's threads split the inputs: thread t takes float4 columns t, t +
// blockDim, ...; for each column it reads the batch rows' inputs once (L1;
// normalised in registers with the layer norm's statistics when LN) and
// multiplies them with RG staged weight rows at a time. The partial sums of
// the RG*NB outputs are reduced within each warp (reduce_scatter), then
// across the warps in index order through s_red, and thread j < RG*NB
// applies the epilogue of row j/NB, batch row j%NB. Fixed order
// throughout: deterministic.
template <int NB, int RG, bool LN>
__device__ __forceinline__ void st_rows(float *__restrict__ out, const float *__restrict__ in,
                                        const float4 *s_w, const float *s_bias, const float *__restrict__ resid,
                                        const float *__restrict__ ln_g, const float *__restrict__ ln_b,
                                        uint32_t n4, uint32_t out_dim, uint32_t r0, uint32_t nr, uint32_t b0,
                                        uint32_t nb, uint32_t mode, const float *s_mean, const float *s_rstd,
                                        float (*s_red)[WARP]) {
    static_assert(RG * NB <= WARP && ((RG * NB) & (RG * NB - 1)) == 0, "RG*NB: a power of two, at most 32");
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, nw = blockDim.x / WARP;
    const float4 *x4 = reinterpret_cast<const float4 *>(in) + (size_t)b0 * n4;
    const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
    for (uint32_t g0 = 0; g0 < nr; g0 += RG) { // block-uniform
        float acc[RG * NB];
#pragma unroll
        for (int j = 0; j < RG * NB; j++) acc[j] = 0.f;
        for (uint32_t c = threadIdx.x; c < n4; c += blockDim.x) {
            float4 xv[NB];
#pragma unroll
            for (int b = 0; b < NB; b++) xv[b] = b < (int)nb ? __ldg(x4 + (size_t)b * n4 + c) : zero;
            if (LN) {
                const float4 gv = __ldg(reinterpret_cast<const float4 *>(ln_g) + c);
                const float4 bv = __ldg(reinterpret_cast<const float4 *>(ln_b) + c);
#pragma unroll
                for (int b = 0; b < NB; b++) {
                    if (b < (int)nb) {
                        const float m = s_mean[b], r = s_rstd[b];
                        xv[b].x = (xv[b].x - m) * r * gv.x + bv.x;
                        xv[b].y = (xv[b].y - m) * r * gv.y + bv.y;
                        xv[b].z = (xv[b].z - m) * r * gv.z + bv.z;
                        xv[b].w = (xv[b].w - m) * r * gv.w + bv.w;
                    }
                }
            }
#pragma unroll
            for (int r = 0; r < RG; r++) {
                if (g0 + r < nr) {
                    const float4 wv = s_w[(size_t)(g0 + r) * n4 + c];
#pragma unroll
                    for (int b = 0; b < NB; b++) {
                        float a = acc[r * NB + b];
                        a = fmaf(wv.x, xv[b].x, a);
                        a = fmaf(wv.y, xv[b].y, a);
                        a = fmaf(wv.z, xv[b].z, a);
                        a = fmaf(wv.w, xv[b].w, a);
                        acc[r * NB + b] = a;
                    }
                }
            }
        }
        int idx;
        const float y = reduce_scatter<RG * NB>(acc, lane, idx);
        if (lane % (WARP / (RG * NB)) == 0) s_red[warp][idx] = y;
        __syncthreads();
        if (threadIdx.x < RG * NB) {
            const uint32_t r = threadIdx.x / NB, b = threadIdx.x % NB;
            float v = 0.f;
            for (int w = 0; w < nw; w++) v += s_red[w][threadIdx.x];
            if (g0 + r < nr && b < nb) {
                const uint32_t o = r0 + g0 + r;
                v += s_bias[g0 + r];
                if (mode & 1u) v = gelu_tanh(v);
                if (mode & 2u) v += __ldg(resid + (size_t)(b0 + b) * out_dim + o);
                out[(size_t)(b0 + b) * out_dim + o] = v;
            }
        }
        __syncthreads(); // s_red is rewritten by the next group
    }
}

#define ST_RG8 4 // rows a group at 5 to 8 batch rows (RG*NB = 32)

extern "C" {

// linear_st: the function of linear (the same parameters; bias may be
// null; ln_g and ln_b both null or both set), its weights staged in
// shared memory. Block i of the grid takes output rows [i*nr, i*nr+nr) ∩
// [0, out_dim), nr = ceil(out_dim/gridDim.x) <= ST_MAXR, and copies them
// (nr*in_dim floats, contiguous) into its dynamic shared memory, which the
// launch must give (nr*in_dim*4 bytes), before it waits for its
// predecessor; then it computes every batch row from them, MAXB rows at a
// time. blockDim a multiple of 32, at most ST_THREADS; in_dim a multiple
// of 4, every pointer 16-byte aligned.
__global__ void __launch_bounds__(ST_THREADS, ST_LB)
    linear_st(float *__restrict__ out, const float *__restrict__ in, const float *__restrict__ w,
              const float *__restrict__ bias, const float *__restrict__ resid, const float *__restrict__ ln_g,
              const float *__restrict__ ln_b, uint32_t in_dim, uint32_t out_dim, uint32_t batch, uint32_t mode,
              float eps) {
    extern __shared__ float4 s_w[];
    __shared__ float s_red[ST_THREADS / WARP][WARP];
    __shared__ float s_bias[ST_MAXR];
    __shared__ float s_mean[MAXB], s_rstd[MAXB];
    PDL_LAUNCH_DEPENDENTS();
    const uint32_t n4 = in_dim / 4;
    const uint32_t rows = (out_dim + gridDim.x - 1) / gridDim.x;
    const uint32_t r0 = blockIdx.x * rows;
    const uint32_t nr = r0 < out_dim ? min(rows, out_dim - r0) : 0u;
    // Weights and bias (written before any step) above the wait.
    const float4 *src = reinterpret_cast<const float4 *>(w) + (size_t)r0 * n4;
    if (rows > ST_MAXR) __trap(); // outside the contract (the Go reference rejects such a launch)
    for (uint32_t i = threadIdx.x; i < nr * n4; i += blockDim.x) cp_async16(s_w + i, src + i);
    if (threadIdx.x < nr) s_bias[threadIdx.x] = bias != nullptr ? __ldg(bias + r0 + threadIdx.x) : 0.f;
    PDL_WAIT_IF(rows != 0); // always true (gridDim.x >= 1, out_dim >= 1); activations below
    cp_async_wait_all();
    const bool ln = ln_g != nullptr;
    for (uint32_t b0 = 0; b0 < batch; b0 += MAXB) {
        const uint32_t nb = min((uint32_t)MAXB, batch - b0);
        if (ln) {
            // Statistics: a warp a batch row, one pass of sum and sum of
            // squares, reduced in a fixed order.
            const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, nw = blockDim.x / WARP;
            for (uint32_t b = warp; b < nb; b += nw) {
                const float4 *x4 = reinterpret_cast<const float4 *>(in) + (size_t)(b0 + b) * n4;
                float s = 0.f, q = 0.f;
                for (uint32_t i0 = lane; i0 < n4; i0 += 8 * WARP) {
                    float4 v[8]; // loaded together: one round trip for a row of up to 1024 floats
#pragma unroll
                    for (int u = 0; u < 8; u++)
                        v[u] = i0 + u * WARP < n4 ? __ldg(x4 + i0 + u * WARP) : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
                    for (int u = 0; u < 8; u++) {
                        s += (v[u].x + v[u].y) + (v[u].z + v[u].w);
                        q += (v[u].x * v[u].x + v[u].y * v[u].y) + (v[u].z * v[u].z + v[u].w * v[u].w);
                    }
                }
                s = warp_sum(s);
                q = warp_sum(q);
                if (lane == 0) {
                    const float mean = s / (float)in_dim;
                    s_mean[b] = mean;
                    s_rstd[b] = rsqrtf(fmaxf(q / (float)in_dim - mean * mean, 0.f) + eps);
                }
            }
        }
        __syncthreads(); // the statistics, and every thread's staged rows, visible
#define ST_ROWS(NB, RG)                                                                                      \
    do {                                                                                                     \
        if (ln) st_rows<NB, RG, true>(out, in, s_w, s_bias, resid, ln_g, ln_b, n4, out_dim, r0, nr, b0, nb, \
                                      mode, s_mean, s_rstd, s_red);                                          \
        else st_rows<NB, RG, false>(out, in, s_w, s_bias, resid, ln_g, ln_b, n4, out_dim, r0, nr, b0, nb,   \
                                    mode, s_mean, s_rstd, s_red);                                            \
    } while (0)
        if (nb == 1) ST_ROWS(1, 16);
        else if (nb == 2) ST_ROWS(2, 16);
        else if (nb <= 4) ST_ROWS(4, 8);
        else ST_ROWS(8, ST_RG8);
#undef ST_ROWS
    }
}

} // extern "C"

extern "C" {

// attention: split attention in one kernel, which gpt2-decode no longer
// launches (attention_part and attention_combine below replaced it); its
// Go reference is what they are tested against. One decode step of
// multi-head attention, split over the
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
__global__ void attention(float *__restrict__ out, const float *__restrict__ qkv, float *kc,
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
    const uint32_t hd4 = hd / 4;
    const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
    // Before anything waits: this thread's first key (when the head is at
    // most KPRE float4s wide) and its first VPRE value vectors are loaded
    // into registers, so that the cache reads of both phases are in flight
    // together, behind the query's load and the barrier.
    const uint32_t groups = blockDim.x / hd4;
    const uint32_t d4 = threadIdx.x % hd4, g = threadIdx.x / hd4;
    float4 vpre[VPRE];
#pragma unroll
    for (int r = 0; r < VPRE; r++) {
        const uint32_t t = t0 + g + r * groups;
        vpre[r] = g < groups && t < t1
                      ? reinterpret_cast<const float4 *>(t == pos ? vnew : vc + base + (size_t)t * width)[d4]
                      : zero;
    }
    float4 kpre[KPRE];
    const uint32_t tk = t0 + threadIdx.x;
    if (hd4 <= KPRE) {
        const float4 *k4 = reinterpret_cast<const float4 *>(tk == pos ? knew : kc + base + (size_t)tk * width);
#pragma unroll
        for (int d = 0; d < KPRE; d++) kpre[d] = tk < t1 && d < (int)hd4 ? k4[d] : zero;
    }
    for (uint32_t d = threadIdx.x; d < hd; d += blockDim.x) {
        s_q[d] = q[d];
        if (s == 0) {
            kc[base + (size_t)pos * width + d] = knew[d];
            vc[base + (size_t)pos * width + d] = vnew[d];
        }
    }
    __syncthreads();

    const float4 *q4 = reinterpret_cast<const float4 *>(s_q);
    float mx = -INFINITY;
    uint32_t t = tk;
    if (hd4 <= KPRE && t < t1) {
        float a = 0.f;
#pragma unroll
        for (int d = 0; d < KPRE; d++) {
            if (d < (int)hd4) {
                const float4 kv = kpre[d], qv = q4[d];
                a = fmaf(qv.x, kv.x, a);
                a = fmaf(qv.y, kv.y, a);
                a = fmaf(qv.z, kv.z, a);
                a = fmaf(qv.w, kv.w, a);
            }
        }
        a *= scale;
        s_p[t - t0] = a;
        mx = fmaxf(mx, a);
        t += blockDim.x;
    }
    for (; t < t1; t += blockDim.x) {
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
    mx = block_max(mx, s_o);
    float sum = 0.f;
    for (uint32_t t = t0 + threadIdx.x; t < t1; t += blockDim.x) {
        const float e = __expf(s_p[t - t0] - mx);
        s_p[t - t0] = e;
        sum += e;
    }
    sum = block_sum(sum, s_o);
    __syncthreads(); // s_p complete; s_o free again

    float4 acc = zero;
    if (g < groups) {
        // Positions t0+g, t0+g+groups, ... in order: the prefetched ones
        // first, then the rest.
        uint32_t t = t0 + g;
#pragma unroll
        for (int r = 0; r < VPRE; r++, t += groups) {
            if (t < t1) {
                const float4 v = vpre[r];
                const float p = s_p[t - t0];
                acc.x = fmaf(p, v.x, acc.x);
                acc.y = fmaf(p, v.y, acc.y);
                acc.z = fmaf(p, v.z, acc.z);
                acc.w = fmaf(p, v.w, acc.w);
            }
        }
#pragma unroll 4
        for (; t < t1; t += groups) {
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

// Split-KV attention in two kernels (flash-decoding): attention_part over
// blocks of cache positions, attention_combine over their partials. Both
// wait for their predecessor (griddepcontrol.wait) and may be launched with
// programmatic serialization; attention_part loads its first round of keys
// and values before it waits. That is safe by the rule above: what it reads
// before the wait (the step's position, cache rows other than pos) was
// written before the step's first kernel (embed), which is launched plainly
// and so starts only after everything before it has completed; the rows it
// reads are written by this kernel alone (at pos, after the wait), in an
// earlier step. It writes nothing before the wait.

#define APRE 8     // keys (and values) a thread of attention_part loads per round
#define APART 256  // most threads per attention_part block

// combine_partials is attention_combine's body for thread d4 of block (h,
// b), its loads issued U partials at a time.
template <int U>
__device__ __forceinline__ void combine_partials(float *__restrict__ out, const float *__restrict__ part,
                                                 uint32_t width, uint32_t heads, uint32_t splits) {
    const uint32_t h = blockIdx.x, b = blockIdx.y, d4 = threadIdx.x;
    const uint32_t hd = width / heads, stride = hd + 4;
    const float *pb = part + ((size_t)b * heads + h) * splits * stride;
    float M = -INFINITY;
    float L = 0.f;
    float4 O = make_float4(0.f, 0.f, 0.f, 0.f);
    // The first U partials' loads issued at once, and kept in registers
    // for both passes (at most U splits: one round trip to L2, this
    // kernel's cost); more are loaded U at a time. The sums in split order.
    float2 ml[U];
    float4 o[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
        const float *pk = pb + (size_t)min((uint32_t)u, splits - 1) * stride;
        ml[u] = __ldcg(reinterpret_cast<const float2 *>(pk));
        o[u] = __ldcg(reinterpret_cast<const float4 *>(pk + 4) + d4);
    }
#pragma unroll
    for (int u = 0; u < U; u++) M = fmaxf(M, ml[u].x); // the clamped ones repeat the last
    for (uint32_t k0 = U; k0 < splits; k0 += U) {
        float mk[U];
#pragma unroll
        for (int u = 0; u < U; u++) mk[u] = k0 + u < splits ? __ldcg(pb + (size_t)(k0 + u) * stride) : -INFINITY;
#pragma unroll
        for (int u = 0; u < U; u++) M = fmaxf(M, mk[u]);
    }
    for (uint32_t k0 = 0; k0 < splits; k0 += U) {
        if (k0 != 0) {
#pragma unroll
            for (int u = 0; u < U; u++) {
                const float *pk = pb + (size_t)min(k0 + u, splits - 1) * stride;
                ml[u] = __ldcg(reinterpret_cast<const float2 *>(pk));
                o[u] = __ldcg(reinterpret_cast<const float4 *>(pk + 4) + d4);
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (k0 + u < splits) {
                const float wk = ml[u].x == -INFINITY ? 0.f : __expf(ml[u].x - M);
                L = fmaf(wk, ml[u].y, L);
                O.x = fmaf(wk, o[u].x, O.x);
                O.y = fmaf(wk, o[u].y, O.y);
                O.z = fmaf(wk, o[u].z, O.z);
                O.w = fmaf(wk, o[u].w, O.w);
            }
        }
    }
    reinterpret_cast<float4 *>(out + (size_t)b * width + h * hd)[d4] = make_float4(O.x / L, O.y / L, O.z / L, O.w / L);
}


extern "C" {

// attention_part: block (h, b, s) of grid (heads, batch, splits) takes
// head h of batch row b and the s-th of `splits` chunks of ceil(n/splits)
// positions of 0..pos (n = pos+1, pos = step[0] clamped to kv_len-1; the
// last chunks may be short or empty). qkv[b] holds q, k, v (each width
// wide, head h at h*hd). The blocks of split 0 write the current k and v
// into the caches kc, vc ([batch][kv_len][width]) at pos; every block reads
// position pos from qkv itself, so no block reads what another writes. The
// block leaves its chunk's partial in part[((b*heads+h)*splits+s)*(hd+4)]:
// {m, l, 0, 0, o[0..hd)} with m the chunk's largest scaled score
// (q.k*scale), l = sum_t exp(score_t - m) and o = sum_t exp(score_t - m)*v_t;
// an empty chunk leaves {-inf, 0, 0, 0, 0...}.
//
// A key is read by `lanes` adjacent threads (the power of two >= hd/4), a
// float4 each, so a group of lanes reads a key row of the cache as one
// coalesced 16*hd-byte access; the block's groups take positions
// t0+g, t0+g+groups, ... A thread keeps its key's and value's float4s and
// its scores in registers; each group runs its own softmax (max m,
// sum l, accumulator o) over rounds of APRE positions, rescaling between
// rounds, and the groups are combined in index order through shared
// memory. Fixed order throughout: deterministic. hd is a multiple of 4, at
// most 128; blockDim a multiple of 32, at most APART.
__global__ void attention_part(float *__restrict__ part, const float *__restrict__ qkv, float *kc, float *vc,
                               const uint32_t *__restrict__ step, uint32_t width, uint32_t heads,
                               uint32_t kv_len, uint32_t splits, float scale) {
    __shared__ float4 s_acc[APART];
    __shared__ float s_m[APART], s_l[APART];
    PDL_LAUNCH_DEPENDENTS();
    const uint32_t hd = width / heads, hd4 = hd / 4, h = blockIdx.x, b = blockIdx.y, s = blockIdx.z;
    uint32_t lanes = 1;
    while (lanes < hd4) lanes <<= 1;
    const uint32_t groups = blockDim.x / lanes, g = threadIdx.x / lanes, d4 = threadIdx.x % lanes;
    const bool dlive = d4 < hd4;
    const uint32_t pos = min(step[0], kv_len - 1), n = pos + 1;
    const uint32_t chunk = (n + splits - 1) / splits;
    const uint32_t t0 = min(s * chunk, n), t1 = min(t0 + chunk, n);
    const size_t base = (size_t)b * kv_len * width + h * hd; // cache row 0 of (b, h)
    const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
    const float4 *k4 = reinterpret_cast<const float4 *>(kc + base) + d4;
    const float4 *v4 = reinterpret_cast<const float4 *>(vc + base) + d4;
    const uint32_t w4 = width / 4; // float4s between cache rows
    float4 kr[APRE], vr[APRE];
    // Round 0's keys and values other than pos, before the wait.
#pragma unroll
    for (int r = 0; r < APRE; r++) {
        const uint32_t t = t0 + g + r * groups;
        const bool ok = dlive && t < t1 && t != pos;
        kr[r] = ok ? __ldg(k4 + (size_t)t * w4) : zero;
        vr[r] = ok ? __ldg(v4 + (size_t)t * w4) : zero;
    }
    PDL_WAIT_IF(t0 <= t1); // always true (t1 = min(t0 + chunk, n)); qkv below
    const float *q = qkv + (size_t)b * 3 * width + h * hd;
    const float *knew = q + width, *vnew = q + 2 * width;
    const float4 qv = dlive ? __ldcg(reinterpret_cast<const float4 *>(q) + d4) : zero;
#pragma unroll
    for (int r = 0; r < APRE; r++) {
        const uint32_t t = t0 + g + r * groups;
        if (dlive && t < t1 && t == pos) {
            kr[r] = __ldcg(reinterpret_cast<const float4 *>(knew) + d4);
            vr[r] = __ldcg(reinterpret_cast<const float4 *>(vnew) + d4);
        }
    }
    if (s == 0) {
        for (uint32_t d = threadIdx.x; d < hd; d += blockDim.x) {
            kc[base + (size_t)pos * width + d] = __ldcg(knew + d);
            vc[base + (size_t)pos * width + d] = __ldcg(vnew + d);
        }
    }
    float m = -INFINITY, l = 0.f;
    float4 acc = zero;
    // Rounds are block-uniform (every lane runs every round: the shuffles
    // below take the whole warp).
    for (uint32_t r0 = t0; r0 < t1; r0 += groups * APRE) {
        if (r0 != t0) {
#pragma unroll
            for (int r = 0; r < APRE; r++) {
                const uint32_t t = r0 + g + r * groups;
                const bool ok = dlive && t < t1;
                kr[r] = ok ? (t == pos ? __ldcg(reinterpret_cast<const float4 *>(knew) + d4) : __ldg(k4 + (size_t)t * w4)) : zero;
                vr[r] = ok ? (t == pos ? __ldcg(reinterpret_cast<const float4 *>(vnew) + d4) : __ldg(v4 + (size_t)t * w4)) : zero;
            }
        }
        float sc[APRE];
        float mr = -INFINITY;
#pragma unroll
        for (int r = 0; r < APRE; r++) {
            float a = qv.x * kr[r].x;
            a = fmaf(qv.y, kr[r].y, a);
            a = fmaf(qv.z, kr[r].z, a);
            a = fmaf(qv.w, kr[r].w, a);
            for (uint32_t o = lanes / 2; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
            const uint32_t t = r0 + g + r * groups;
            sc[r] = t < t1 ? a * scale : -INFINITY;
            mr = fmaxf(mr, sc[r]);
        }
        const float mn = fmaxf(m, mr);
        const float f = m == -INFINITY ? 0.f : __expf(m - mn);
        l *= f;
        acc.x *= f;
        acc.y *= f;
        acc.z *= f;
        acc.w *= f;
#pragma unroll
        for (int r = 0; r < APRE; r++) {
            const float e = sc[r] == -INFINITY ? 0.f : __expf(sc[r] - mn);
            l += e;
            acc.x = fmaf(e, vr[r].x, acc.x);
            acc.y = fmaf(e, vr[r].y, acc.y);
            acc.z = fmaf(e, vr[r].z, acc.z);
            acc.w = fmaf(e, vr[r].w, acc.w);
        }
        m = mn;
    }
    if (d4 == 0) {
        s_m[g] = m;
        s_l[g] = l;
    }
    s_acc[threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.x < hd4) {
        float M = -INFINITY;
        for (uint32_t gg = 0; gg < groups; gg++) M = fmaxf(M, s_m[gg]);
        float L = 0.f;
        float4 O = zero;
        for (uint32_t gg = 0; gg < groups; gg++) {
            const float wg = s_m[gg] == -INFINITY ? 0.f : __expf(s_m[gg] - M);
            const float4 a = s_acc[gg * lanes + threadIdx.x];
            L = fmaf(wg, s_l[gg], L);
            O.x = fmaf(wg, a.x, O.x);
            O.y = fmaf(wg, a.y, O.y);
            O.z = fmaf(wg, a.z, O.z);
            O.w = fmaf(wg, a.w, O.w);
        }
        float *pw = part + (((size_t)b * heads + h) * splits + s) * (hd + 4);
        reinterpret_cast<float4 *>(pw + 4)[threadIdx.x] = O;
        if (threadIdx.x == 0) *reinterpret_cast<float4 *>(pw) = make_float4(M, L, 0.f, 0.f);
    }
}

// attention_combine: out[b][h*hd + d] = sum_k w_k*o_k[d] / sum_k w_k*l_k
// over the splits' partials {m_k, l_k, o_k} of (b, h) that attention_part
// left in part, w_k = exp(m_k - max_k m_k) (0 for an empty chunk), summed
// in split order. Grid (heads, batch); blockDim >= hd/4 (a float4 of the
// head each).
__global__ void attention_combine(float *__restrict__ out, const float *__restrict__ part, uint32_t width,
                                  uint32_t heads, uint32_t splits) {
    PDL_LAUNCH_DEPENDENTS();
    PDL_WAIT(); // part below
    if (threadIdx.x >= width / heads / 4) return;
    // U = 8 where it covers every split (H100, gpt2-decode replayed, batch
    // 8's 5 splits: 765 µs a step, 774 with 16), else 16 (batch 1's 16:
    // 342, 345 with 8).
    if (splits <= 8) combine_partials<8>(out, part, width, heads, splits);
    else combine_partials<16>(out, part, width, heads, splits);
}

} // extern "C"

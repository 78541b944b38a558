// Microbenchmark of the kernels of kernels.cu against a baseline, in the
// launch shapes that workloads/builtin.go uses, timed as CUDA graph
// replays with events. Build and run on a GPU machine:
//
//	nvcc -O3 -arch=sm_90 -o /tmp/bench kernels/bench/bench.cu && /tmp/bench
//
// The baseline ("old") is kernels.cu itself unless OLD_KERNELS names a
// file of earlier kernels renamed old_*, for example those of commit
// 1d2141d (before the rewrite of linear and the attention prefetch):
//
//	git show 1d2141d:kernels/kernels.cu | sed -E 's/\b(warp_sum|warp_max|block_sum|block_max|gelu_tanh|embed|linear|attention)\b/old_\1/g' >/tmp/old_kernels.cu
//	nvcc -O3 -arch=sm_90 -DOLD_KERNELS='"/tmp/old_kernels.cu"' -o /tmp/bench kernels/bench/bench.cu
//
// It prints, per case, the time per graph node (median of 15 timings of
// 20 back-to-back replays each) and, for the GEMVs and attention, the
// bytes each launch must read over that time. Weights rotate over enough
// copies to exceed the L2 (except mlp, whose 16 MB of weights stay in L2 as
// in the workload). Outputs of old and new kernels are compared.
#include "../kernels.cu"
#ifdef OLD_KERNELS
#include OLD_KERNELS
#else
#define old_linear linear
#define old_attention attention
#endif

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));    \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

__global__ void empty_kernel() {}

// linear_small is linear's one-batch-row, narrow-row path alone (T = 2,
// no layer norm) as its own entry: a much smaller kernel than linear, to
// tell code size and registers from the work itself.
__global__ void linear_small(float *__restrict__ out, const float *__restrict__ in, const float *__restrict__ w,
                             const float *__restrict__ bias, const float *__restrict__ resid,
                             const float *__restrict__ ln_g, const float *__restrict__ ln_b, uint32_t in_dim,
                             uint32_t out_dim, uint32_t batch, uint32_t mode, float eps) {
    __shared__ float s_mean[MAXB], s_rstd[MAXB];
    linear_rows<1, false, 2>(out, in, w, bias, resid, ln_g, ln_b, in_dim, out_dim, 0, 1, mode, eps, s_mean, s_rstd);
}

// touch: out[i] = in[i] + 1 for i < n: the least a node can do that reads
// what the node before it wrote.
__global__ void touch(float *__restrict__ out, const float *__restrict__ in, uint32_t n) {
    const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] + 1.f;
}

__global__ void fill(float *p, size_t n, uint32_t seed, float center, float a) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t x = (uint32_t)i * 2654435761u ^ seed;
        x ^= x >> 13;
        x *= 0x5bd1e995u;
        x ^= x >> 15;
        p[i] = center + a * ((x & 0xffffff) / 8388608.f - 1.f);
    }
}

static cudaStream_t st;

static float *dalloc(size_t n, uint32_t seed, float center = 0.f, float a = 1.f) {
    float *p;
    CK(cudaMalloc(&p, n * 4));
    fill<<<1024, 256, 0, st>>>(p, n, seed, center, a);
    CK(cudaGetLastError());
    return p;
}

// time_graph captures body once and returns the median µs per replay.
static double time_graph(const std::function<void()> &body) {
    cudaGraph_t g;
    cudaGraphExec_t x;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    body();
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&x, g, 0));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int i = 0; i < 5; i++) CK(cudaGraphLaunch(x, st));
    std::vector<double> ts;
    const int reps = 20;
    for (int k = 0; k < 15; k++) {
        CK(cudaEventRecord(e0, st));
        for (int i = 0; i < reps; i++) CK(cudaGraphLaunch(x, st));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        ts.push_back(ms * 1e3 / reps);
    }
    CK(cudaGetLastError());
    CK(cudaGraphExecDestroy(x));
    CK(cudaGraphDestroy(g));
    std::sort(ts.begin(), ts.end());
    return ts[ts.size() / 2];
}

static double maxrel(const float *a, const float *b, size_t n, bool *identical) {
    std::vector<float> ha(n), hb(n);
    CK(cudaMemcpy(ha.data(), a, n * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hb.data(), b, n * 4, cudaMemcpyDeviceToHost));
    double m = 0, d = 0;
    *identical = true;
    for (size_t i = 0; i < n; i++) {
        m = std::max(m, (double)fabsf(ha[i]));
        d = std::max(d, (double)fabsf(ha[i] - hb[i]));
        if (!(ha[i] == hb[i])) *identical = false;
        if (std::isnan(ha[i]) || std::isnan(hb[i])) d = INFINITY;
    }
    return d / (m > 0 ? m : 1);
}

typedef void (*linear_fn)(float *, const float *, const float *, const float *, const float *,
                          const float *, const float *, uint32_t, uint32_t, uint32_t, uint32_t, float);

static void launch_linear(linear_fn f, dim3 grid, dim3 block, float *out, const float *in, const float *w,
                          const float *bias, const float *resid, const float *g, const float *b,
                          uint32_t in_dim, uint32_t out_dim, uint32_t batch, uint32_t mode) {
    f<<<grid, block, 0, st>>>(out, in, w, bias, resid, g, b, in_dim, out_dim, batch, mode, 1e-5f);
}

static dim3 builtin_grid(uint32_t out_dim) { return dim3(std::min((out_dim + 3) / 4, 1024u)); }

int main(int argc, char **argv) {
    // Sections: c copy, f floors, m mlp, g GEMVs, a attention (default all).
    const char *sec = argc > 1 ? argv[1] : "cfmga";
    auto on = [&](char c) { return strchr(sec, c) != nullptr; };
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);

    // Copy bandwidth (read + write) of 1 GiB, device to device.
    if (on('c')) {
        size_t n = 1ull << 28;
        float *a = dalloc(n, 1), *b = dalloc(n, 2);
        double us = time_graph([&] { CK(cudaMemcpyAsync(b, a, n * 4, cudaMemcpyDeviceToDevice, st)); });
        printf("copy 1 GiB d2d: %.1f us, %.0f GB/s (read+write)\n", us, 2.0 * n * 4 / us / 1e3);
        CK(cudaFree(a));
        CK(cudaFree(b));
    }

    // Graph node floor: 64 empty kernels.
    for (int shape = 0; shape < 2 && on('f'); shape++) {
        dim3 g = shape ? dim3(64) : dim3(1), b = shape ? dim3(128) : dim3(32);
        double us = time_graph([&] {
            for (int i = 0; i < 64; i++) empty_kernel<<<g, b, 0, st>>>();
        });
        printf("floor: 64-node graph of empty kernels <<<%u,%u>>>: %.1f us/replay, %.3f us/node\n", g.x, b.x, us, us / 64);
    }

    // Dependent floor: 64 nodes each reading the previous one's 256 floats.
    if (on('f')) {
        float *t[2];
        for (int j = 0; j < 2; j++) t[j] = dalloc(256, 40 + j);
        double us = time_graph([&] {
            for (int i = 0; i < 64; i++) touch<<<64, 128, 0, st>>>(t[(i + 1) % 2], t[i % 2], 256);
        });
        printf("floor: 64-node chain of touch <<<64,128>>> (read 256 floats the previous node wrote, write 256): %.1f us/replay, %.3f us/node\n", us, us / 64);
    }

    // mlp: 64 layers of 256x256 + bias + GELU, b1, weights in L2.
    if (on('m')) {
        const uint32_t W = 256, L = 64;
        float *w = dalloc((size_t)L * W * W, 11, 0.f, sqrtf(6.5f / W));
        float *bias = dalloc((size_t)L * W, 12, 0.f, 0.1f);
        float *x = dalloc(W, 13);
        float *h[3][2];
        for (int v = 0; v < 3; v++)
            for (int j = 0; j < 2; j++) CK(cudaMalloc(&h[v][j], W * 4));
        for (int v = 0; v < 3; v++) {
            linear_fn f = v == 2 ? linear_small : v ? linear : old_linear;
            struct Shape {
                uint32_t g, b;
            } shapes[] = {{64, 128}, {32, 256}, {128, 64}, {256, 32}};
            for (auto s : shapes) {
                if (v != 1 && s.g != 64) continue;
                auto body = [&] {
                    const float *in = x;
                    for (uint32_t l = 0; l < L; l++) {
                        float *out = h[v][l % 2];
                        launch_linear(f, dim3(s.g), dim3(s.b), out, in, w + (size_t)l * W * W, bias + l * W, nullptr,
                                      nullptr, nullptr, W, W, 1, 1);
                        in = out;
                    }
                };
                double us = time_graph(body);
                printf("mlp 64x256 b1 %s <<<%u,%u>>>: %.1f us/replay, %.3f us/node\n", v == 2 ? "linear_small" : v ? "new" : "old", s.g, s.b, us,
                       us / L);
                body();
            }
        }
        CK(cudaStreamSynchronize(st));
        bool same;
        double d = maxrel(h[0][1], h[1][1], W, &same);
        printf("mlp new vs old: max diff / max |old| = %.2e, identical %d\n", d, same);
        // The same chain launched with programmatic dependent launch (an
        // executor change this repository does not have: the committed PTX
        // is compute_80, where linear has no griddepcontrol).
        float *hp[2];
        for (int j = 0; j < 2; j++) CK(cudaMalloc(&hp[j], W * 4));
        auto body = [&] {
            const float *in = x;
            for (uint32_t l = 0; l < L; l++) {
                float *out = hp[l % 2];
                cudaLaunchConfig_t cfg = {};
                cfg.gridDim = dim3(64);
                cfg.blockDim = dim3(128);
                cfg.stream = st;
                cudaLaunchAttribute at[1];
                at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
                at[0].val.programmaticStreamSerializationAllowed = 1;
                cfg.attrs = at;
                cfg.numAttrs = 1;
                CK(cudaLaunchKernelEx(&cfg, linear, out, in, (const float *)(w + (size_t)l * W * W),
                                      (const float *)(bias + l * W), (const float *)nullptr, (const float *)nullptr,
                                      (const float *)nullptr, W, W, 1u, 1u, 1e-5f));
                in = out;
            }
        };
        double us = time_graph(body);
        body();
        CK(cudaStreamSynchronize(st));
        d = maxrel(h[0][1], hp[1], W, &same);
        printf("mlp 64x256 b1 new+PDL <<<64,128>>>: %.1f us/replay, %.3f us/node; vs old: diff %.2e identical %d\n", us,
               us / L, d, same);
    }

    // GPT-2 GEMVs at batch 1 and 8 in builtin.go's launch shape.
    struct G {
        const char *name;
        uint32_t in, out, mode;
        bool ln, bias;
    } gs[] = {
        {"ln1+qkv", 768, 2304, 0, true, true},       {"proj+residual", 768, 768, 2, false, true},
        {"ln2+fc+gelu", 768, 3072, 1, true, true},   {"fc_proj+residual", 3072, 768, 2, false, true},
        {"ln_f+logits", 768, 50257, 0, true, false},
    };
    const size_t pool = 160ull << 20; // floats: 640 MB of weights to rotate over
    float *wpool = dalloc(pool, 21, 0.f, 0.0346f);
    float *gam = dalloc(3072, 22, 1.f, 0.1f), *bet = dalloc(3072, 23, 0.f, 0.05f);
    float *bias = dalloc(50257, 24, 0.f, 0.01f);
    float *xin = dalloc(8 * 3072, 25), *res = dalloc(8 * 3072, 26);
    float *y0, *y1;
    CK(cudaMalloc(&y0, 8ull * 50257 * 4));
    CK(cudaMalloc(&y1, 8ull * 50257 * 4));
    for (uint32_t B : {1u, 8u}) {
        if (!on('g') || (B == 1 && on('8'))) continue;
        for (auto &s : gs) {
            const size_t wn = (size_t)s.in * s.out;
            const int copies = (int)std::min<size_t>(64, std::max<size_t>(1, pool / wn));
            const int launches = std::max(copies, 8);
            double us[2];
            for (int v = 0; v < 2; v++) {
                linear_fn f = v ? linear : old_linear;
                us[v] = time_graph([&] {
                            for (int k = 0; k < launches; k++)
                                launch_linear(f, builtin_grid(s.out), dim3(128), v ? y1 : y0, xin, wpool + (k % copies) * wn,
                                              s.bias ? bias : nullptr, res, s.ln ? gam : nullptr, s.ln ? bet : nullptr,
                                              s.in, s.out, B, s.mode);
                        }) /
                        launches;
            }
            CK(cudaStreamSynchronize(st));
            bool same;
            double d = maxrel(y0, y1, (size_t)B * s.out, &same);
            const double bytes = wn * 4.0 + B * (s.in + s.out) * 4.0;
            printf("gemv b%u %-17s %5ux%-5u old %7.2f us %6.0f GB/s | new %7.2f us %6.0f GB/s | %.2fx | diff %.1e\n", B,
                   s.name, s.out, s.in, us[0], bytes / us[0] / 1e3, us[1], bytes / us[1] / 1e3, us[0] / us[1], d);
        }
    }
    CK(cudaFree(wpool));

    // Attention, GPT-2 small head shape, kv_len 1024, at position 960.
    for (uint32_t B : {1u, 8u}) {
        if (!on('a')) break;
        const uint32_t W = 768, H = 12, T = 1024, hd = W / H, pos = 960;
        const uint32_t splits = std::max(1u, std::min((264 + H * B - 1) / (H * B), (T + 31) / 32));
        const uint32_t chunk = ((T + splits - 1) / splits + 3) & ~3u;
        const uint32_t shared = 4 * (hd + chunk + 4 * 128);
        const int copies = B == 1 ? 12 : 3;
        const size_t cn = (size_t)B * T * W;
        float *kc = dalloc(cn * copies, 31), *vc = dalloc(cn * copies, 32);
        float *qkv = dalloc((size_t)B * 3 * W, 33);
        float *ws;
        uint32_t *cnt, *step;
        CK(cudaMalloc(&ws, 4ull * B * H * splits * (hd + 2)));
        CK(cudaMalloc(&cnt, 4ull * B * H));
        CK(cudaMemset(cnt, 0, 4ull * B * H));
        CK(cudaMalloc(&step, 4 * 9));
        uint32_t hs[9] = {pos};
        CK(cudaMemcpy(step, hs, sizeof hs, cudaMemcpyHostToDevice));
        const float scale = 1.f / sqrtf((float)hd);
        double us[2];
        for (int v = 0; v < 2; v++) {
            us[v] = time_graph([&] {
                        for (int k = 0; k < copies * 2; k++) {
                            const int c = k % copies;
                            if (v)
                                attention<<<dim3(H, B, splits), 128, shared, st>>>(v ? y1 : y0, qkv, kc + c * cn, vc + c * cn,
                                                                                 step, ws, cnt, W, H, T, splits, scale);
                            else
                                old_attention<<<dim3(H, B, splits), 128, shared, st>>>(y0, qkv, kc + c * cn, vc + c * cn,
                                                                                     step, ws, cnt, W, H, T, splits, scale);
                        }
                    }) /
                    (copies * 2);
        }
        CK(cudaStreamSynchronize(st));
        bool same;
        double d = maxrel(y0, y1, (size_t)B * W, &same);
        const double bytes = 2.0 * B * (pos + 1) * W * 4;
        printf("attention b%u splits %u: old %7.2f us %6.0f GB/s | new %7.2f us %6.0f GB/s | %.2fx | diff %.1e identical %d\n",
               B, splits, us[0], bytes / us[0] / 1e3, us[1], bytes / us[1] / 1e3, us[0] / us[1], d, same);
        CK(cudaFree(kc));
        CK(cudaFree(vc));
    }
    CK(cudaDeviceSynchronize());
    printf("bench done\n");
    return 0;
}

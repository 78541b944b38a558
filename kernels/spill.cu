// Kernels of the spill-demo workload (package workloads): tiny on purpose, the demo is
// about memory, not speed. Build the PTX on a GPU machine with
//
//	nvcc -ptx -arch=compute_80 -o spill.ptx spill.cu
//
// Products and sums are rounded separately (__fmul_rn, __fadd_rn: no fused
// multiply-add), exactly as the Go references in spill.go compute them.

// spill_fill(blk, x, n, a, b): blk[i] = x[i]*a + b.
extern "C" __global__ void spill_fill(float* __restrict__ blk, const float* __restrict__ x,
                                      unsigned n, float a, float b) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        blk[i] = __fadd_rn(__fmul_rn(x[i], a), b);
    }
}

// spill_accumulate(acc, blk, n, first): acc[i] = blk[i] when first is
// non-zero, else acc[i] + blk[i].
extern "C" __global__ void spill_accumulate(float* __restrict__ acc, const float* __restrict__ blk,
                                            unsigned n, unsigned first) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = blk[i];
        acc[i] = first ? v : __fadd_rn(acc[i], v);
    }
}

/*
 * cuda_hooks.cu — the instruments on the GPU (engine/hooks.c calls them
 * through backend.h's steer / copy / ffn_observe / stamp ops; cuda_instruments.cu
 * records them as commands, so they run inside a decode step's graph).
 *
 *   steer   one block per row: the projections h.u and |h|^2 summed in
 *           double, then the row rewritten with the same double-precision
 *           expression as hooks.c's steer_row (explicit _rn intrinsics: no
 *           contraction into FMAs, which the C side does not do either);
 *   ffn     three launches per layer:
 *             mass/histogram  one thread per neuron, rows in token order
 *                             (mass[i] += |a| in double, as on the CPU),
 *                             buckets in shared memory, then added globally;
 *             top-k           one block per row: radix select of the k-th
 *                             largest |a| on its float bits (4 passes of 8
 *                             bits), then ties at that value taken in index
 *                             order (a block scan): exactly the CPU's set
 *                             ("ties: lower index");
 *             overlap         one block walks the rows in order, counting
 *                             |top(t) & top(t-1)| (t-1 of the first row:
 *                             the previous call's last, kept per layer);
 *   copy    a device-to-device copy (captured rows into the staging buffer);
 *   stamp   one thread reads %globaltimer and adds the time since the last
 *           stamp to its phase's sum (ns, in device memory).
 * Inside a captured decode step (pdl) the kernels are launched as
 * programmatic dependents: each waits for its predecessor first thing
 * (griddepcontrol.wait) and lets its successor start launching at once, so
 * the next fused GEMV streams its weights while an instrument runs (its own
 * wait still covers everything the instrument writes).
 */
extern "C" {
#include "spark.h"
}
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_device.cuh"

#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

namespace {

constexpr int STEER_THREADS = 256;
constexpr int TOPK_THREADS = 1024;
constexpr int HIST_THREADS = 256;
static_assert(SPARK_FFN_BUCKETS == 64, "the histogram kernel keeps 64 buckets");

__device__ __forceinline__ void pdl_begin()
{
    spark_dev::pdl_wait();
    spark_dev::pdl_release();
}

template <typename... KArgs, typename... Args>
cudaError_t launch(bool pdl, unsigned grid, unsigned block, cudaStream_t st, void (*k)(KArgs...), Args... args)
{
    return spark_dev::launch_ex(pdl, dim3(grid), dim3(block), 0, st, k, args...);
}

/* Sum of v over the block (every thread gets it). sh: 32 doubles. */
__device__ double block_sum(double v, double *sh)
{
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    for (int o = 16; o; o >>= 1) v = __dadd_rn(v, __shfl_down_sync(0xffffffffu, v, o));
    __syncthreads(); /* earlier readers of sh are done */
    if (lane == 0) sh[w] = v;
    __syncthreads();
    if (w == 0) {
        v = lane < nw ? sh[lane] : 0.0;
        for (int o = 16; o; o >>= 1) v = __dadd_rn(v, __shfl_down_sync(0xffffffffu, v, o));
        if (lane == 0) sh[0] = v;
    }
    __syncthreads();
    return sh[0];
}

__device__ unsigned block_sum_u(unsigned v, unsigned *sh)
{
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    for (int o = 16; o; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    if (w == 0) {
        v = lane < nw ? sh[lane] : 0u;
        for (int o = 16; o; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
        if (lane == 0) sh[0] = v;
    }
    __syncthreads();
    return sh[0];
}

__global__ void steer_kernel(float *x, int dim, int mode, float strength, const float *dir, const float *unit)
{
    __shared__ double sh[32];
    pdl_begin();
    float *h = x + (size_t)blockIdx.x * (size_t)dim;
    if (mode == SPARK_STEER_ADD) {
        for (int i = threadIdx.x; i < dim; i += blockDim.x) h[i] = __fadd_rn(h[i], __fmul_rn(strength, dir[i]));
        return;
    }
    double pu = 0, hh = 0;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        double v = h[i];
        pu = __dadd_rn(pu, __dmul_rn(v, (double)unit[i]));
        hh = __dadd_rn(hh, __dmul_rn(v, v));
    }
    const double proj = block_sum(pu, sh);
    if (mode == SPARK_STEER_ABLATE) {
        const double sp = __dmul_rn((double)strength, proj);
        for (int i = threadIdx.x; i < dim; i += blockDim.x)
            h[i] = __double2float_rn(__dsub_rn((double)h[i], __dmul_rn(sp, (double)unit[i])));
        return;
    }
    if (mode == SPARK_STEER_CLAMP) {
        const double c = __dsub_rn((double)strength, proj);
        for (int i = threadIdx.x; i < dim; i += blockDim.x)
            h[i] = __double2float_rn(__dadd_rn((double)h[i], __dmul_rn(c, (double)unit[i])));
        return;
    }
    /* renorm */
    const double before = sqrt(block_sum(hh, sh));
    double aa = 0;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        double v = __dsub_rn((double)h[i], __dmul_rn(proj, (double)unit[i]));
        aa = __dadd_rn(aa, __dmul_rn(v, v));
    }
    const double after = sqrt(block_sum(aa, sh));
    const double scale = after > 0 ? before / after : 1.0;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        h[i] = __double2float_rn(__dmul_rn(__dsub_rn((double)h[i], __dmul_rn(proj, (double)unit[i])), scale));
}

/* hooks.c's bucket_of: floor(log2 |v|) - SPARK_FFN_BUCKET_MIN_EXP, clamped;
 * zero, NaN and subnormals (below the range anyway) in bucket 0. */
__device__ int bucket_of(float v)
{
    float a = fabsf(v);
    if (!(a > 0)) return 0;
    int e = (int)((__float_as_uint(a) >> 23) & 255u) - 127;
    int b = e - SPARK_FFN_BUCKET_MIN_EXP;
    return b < 0 ? 0 : b >= SPARK_FFN_BUCKETS ? SPARK_FFN_BUCKETS - 1 : b;
}

__global__ void ffn_mass_hist_kernel(const float *act, int n, int dim, double *mass, unsigned long long *hist)
{
    __shared__ unsigned bins[SPARK_FFN_BUCKETS];
    pdl_begin();
    for (int b = threadIdx.x; b < SPARK_FFN_BUCKETS; b += blockDim.x) bins[b] = 0;
    __syncthreads();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < dim) {
        double m = mass[i];
        for (int t = 0; t < n; t++) {
            float v = act[(size_t)t * dim + i];
            m = __dadd_rn(m, (double)fabsf(v));
            atomicAdd(&bins[bucket_of(v)], 1u);
        }
        mass[i] = m;
    }
    __syncthreads();
    for (int b = threadIdx.x; b < SPARK_FFN_BUCKETS; b += blockDim.x)
        if (bins[b]) atomicAdd(&hist[b], (unsigned long long)bins[b]);
}

/* sel[row][i] = 1 for the k largest |act[row][i]| (ties: lower index). */
__global__ void ffn_topk_kernel(const float *act, int dim, int k, unsigned char *sel)
{
    __shared__ unsigned hist[256];
    __shared__ unsigned s_prefix, s_k;
    __shared__ unsigned wsum[32];
    pdl_begin();
    const float *a = act + (size_t)blockIdx.x * dim;
    unsigned char *out = sel + (size_t)blockIdx.x * dim;
    const int tid = threadIdx.x;
    unsigned prefix = 0, mask = 0, krem = (unsigned)k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = tid; i < 256; i += blockDim.x) hist[i] = 0;
        __syncthreads();
        for (int i = tid; i < dim; i += blockDim.x) {
            unsigned b = __float_as_uint(a[i]) & 0x7fffffffu;
            if ((b & mask) == prefix) atomicAdd(&hist[(b >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (tid == 0) {
            unsigned r = krem;
            int d = 255;
            for (; d > 0; d--) {
                if (hist[d] >= r) break;
                r -= hist[d];
            }
            s_prefix = prefix | ((unsigned)d << shift);
            s_k = r;
        }
        __syncthreads();
        prefix = s_prefix;
        krem = s_k;
        mask |= 255u << shift;
        __syncthreads();
    }
    /* prefix: the k-th largest magnitude's bits; take the first krem equal ones */
    const int chunk = (dim + blockDim.x - 1) / blockDim.x;
    const int lo = min(dim, tid * chunk), hi = min(dim, lo + chunk);
    unsigned ties = 0;
    for (int i = lo; i < hi; i++) ties += (__float_as_uint(a[i]) & 0x7fffffffu) == prefix;
    const int lane = tid & 31, w = tid >> 5, nw = (blockDim.x + 31) >> 5;
    unsigned v = ties;
    for (int o = 1; o < 32; o <<= 1) {
        unsigned y = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += y;
    }
    if (lane == 31) wsum[w] = v;
    __syncthreads();
    if (w == 0) {
        unsigned s = lane < nw ? wsum[lane] : 0u;
        for (int o = 1; o < 32; o <<= 1) {
            unsigned y = __shfl_up_sync(0xffffffffu, s, o);
            if (lane >= o) s += y;
        }
        wsum[lane] = s;
    }
    __syncthreads();
    unsigned rank = v - ties + (w > 0 ? wsum[w - 1] : 0u);
    for (int i = lo; i < hi; i++) {
        unsigned b = __float_as_uint(a[i]) & 0x7fffffffu;
        unsigned char on = 0;
        if (b > prefix) on = 1;
        else if (b == prefix) on = rank++ < krem;
        out[i] = on;
    }
}

__global__ void ffn_overlap_kernel(const unsigned char *sel, int n, int dim, int k, unsigned char *prev,
                                   int32_t *has_prev, double *overlap)
{
    __shared__ unsigned sh[32];
    pdl_begin();
    const int hp = *has_prev;
    for (int t = 0; t < n; t++) {
        if (!t && !hp) continue;
        const unsigned char *cur = sel + (size_t)t * dim, *pv = t ? cur - dim : prev;
        unsigned c = 0;
        for (int i = threadIdx.x; i < dim; i += blockDim.x) c += cur[i] & pv[i];
        c = block_sum_u(c, sh);
        if (threadIdx.x == 0) *overlap = __dadd_rn(*overlap, (double)c / (double)k);
    }
    __syncthreads();
    const unsigned char *last = sel + (size_t)(n - 1) * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) prev[i] = last[i];
    if (threadIdx.x == 0) *has_prev = 1;
}

__global__ void stamp_kernel(unsigned long long *s, int phase)
{
    unsigned long long t;
    pdl_begin();
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    if (phase >= 0) s[1 + phase] += t - s[0];
    s[0] = t;
}

} // namespace

cudaError_t cu_hook(cudaStream_t st, const cu_hook_args *a, int pdl)
{
    cudaError_t e;
    switch (a->kind) {
    case CU_HOOK_STEER:
        if (a->n < 1) return cudaSuccess;
        return launch(pdl, a->n, STEER_THREADS, st, steer_kernel, a->x, a->dim, a->mode, a->strength, a->dir, a->unit);
    case CU_HOOK_COPY:
        return cudaMemcpyAsync(a->x, a->src, (size_t)a->count * sizeof(float), cudaMemcpyDeviceToDevice, st);
    case CU_HOOK_FFN:
        if (a->n < 1) return cudaSuccess;
        e = launch(pdl, (a->dim + HIST_THREADS - 1) / HIST_THREADS, HIST_THREADS, st, ffn_mass_hist_kernel, a->src, a->n,
                   a->dim, a->mass, a->hist);
        if (e == cudaSuccess)
            e = launch(pdl, a->n, TOPK_THREADS, st, ffn_topk_kernel, a->src, a->dim, a->top_k, a->scratch);
        if (e == cudaSuccess)
            e = launch(pdl, 1, TOPK_THREADS, st, ffn_overlap_kernel, (const unsigned char *)a->scratch, a->n, a->dim,
                       a->top_k, a->prev, a->has_prev, a->overlap);
        return e;
    case CU_HOOK_STAMP:
        return launch(pdl, 1, 1, st, stamp_kernel, a->stamps, a->phase);
    }
    return cudaErrorInvalidValue;
}

/*
 * cuda_device.cuh — device helpers more than one kernel file needs (the
 * decode kernels in cuda_kernels.cu, the persistent step in cuda_step.cu, the
 * coded-cache kernels in cuda_kv.cu). Included by .cu files only.
 */
#ifndef SPARK_BACKEND_CUDA_DEVICE_CUH
#define SPARK_BACKEND_CUDA_DEVICE_CUH

#include "backend/cuda/cuda_internal.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <string.h>

namespace spark_dev {

constexpr int WARP = 32;

/* an IEEE half's bits (the scales of Q8_0 / Q4_K / Q6_K, f16 weights) as a float */
__device__ __forceinline__ float h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }

/* A Q4_K superblock's 16-byte header in the device layout (cu_repack_rows):
 * bytes 0-3 d and dmin (f16, as in the file); bytes 4-11 byte j = sc_j |
 * (mn_j >> 4) << 6; bytes 12-15 nibble j = mn_j & 15 (j = 0..7). The same
 * 96 bits as the file's 6-bit scales and mins, placed so that sub-block j's
 * pair is a byte permute and four shifts / masks instead of the file's
 * case split (bench/cuda_runs.md run 27). w1..w3: header words 1..3. */
__device__ __forceinline__ void q4k_dev_scale_min(uint32_t w1, uint32_t w2, uint32_t w3, int j, uint32_t *sc,
                                                  uint32_t *mn)
{
    const uint32_t b = __byte_perm(w1, w2, (unsigned)j); /* byte j of bytes 4..11 */
    *sc = b & 63u;
    *mn = ((w3 >> (4 * j)) & 15u) | ((b >> 2) & 0x30u);
}

/* Sub-block j's d * scale (*a) and dmin * min (*m) from a Q4_K header in
 * the device layout (its 16 bytes as one load): y = a * q - m. */
__device__ __forceinline__ void q4k_dev_sub_scale(const uint4 &h, int j, float *a, float *m)
{
    uint32_t sc, mn;
    q4k_dev_scale_min(h.y, h.z, h.w, j, &sc, &mn);
    *a = h2f((uint16_t)h.x) * (float)sc;
    *m = h2f((uint16_t)(h.x >> 16)) * (float)mn;
}

/* A Q6_K 32-value unit in the device layout (cu_repack_rows), as bytes of
 * its 6-bit values q + 32 (0..63): lo[k] holds values 4k..4k+3, hi[k]
 * values 16 + 4k..16 + 4k + 3 (k = 0..3), one value a byte in order. The
 * unit is q (16 bytes: byte t = the low 4 bits of values t and 16 + t, as
 * a Q4_K sub-block's), h (8 bytes: byte b of h.x holds the top 2 bits of
 * value 4s + b at bits 2s..2s+1, h.y the same for values 16..31) and a
 * word s (bytes 0-1 the int8 scales of values 0..15 and 16..31, bytes
 * 2-3 the superblock's f16 d): y = d * scale * (value - 32). */
__device__ __forceinline__ void q6k_dev_unit(const uint4 &q, const uint2 &h, uint32_t (&lo)[4], uint32_t (&hi)[4])
{
    const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        /* the top bits of values 4k + b sit at bits 2k of byte b: to bits 4-5 */
        const uint32_t tl = k < 2 ? h.x << (4 - 2 * k) : h.x >> (2 * k - 4);
        const uint32_t th = k < 2 ? h.y << (4 - 2 * k) : h.y >> (2 * k - 4);
        lo[k] = (w[k] & 0x0f0f0f0fu) | (tl & 0x30303030u);
        hi[k] = ((w[k] >> 4) & 0x0f0f0f0fu) | (th & 0x30303030u);
    }
}

/* the unit's word s: d * scale of its two 16-value halves */
__device__ __forceinline__ void q6k_dev_scales(uint32_t s, float *a0, float *a1)
{
    const float d = h2f((uint16_t)(s >> 16));
    *a0 = d * (float)(int8_t)(s & 0xffu);
    *a1 = d * (float)(int8_t)((s >> 8) & 0xffu);
}

/* acc + 8 bf16 weights (w: pairs low half first) . x, x = (a, b) in order:
 * a bf16 is the top half of its float, so each is a shift or a mask */
__device__ __forceinline__ float dot_bf16x8(uint4 w, float4 a, float4 b, float acc)
{
    acc = fmaf(__uint_as_float(w.x << 16), a.x, acc);
    acc = fmaf(__uint_as_float(w.x & 0xffff0000u), a.y, acc);
    acc = fmaf(__uint_as_float(w.y << 16), a.z, acc);
    acc = fmaf(__uint_as_float(w.y & 0xffff0000u), a.w, acc);
    acc = fmaf(__uint_as_float(w.z << 16), b.x, acc);
    acc = fmaf(__uint_as_float(w.z & 0xffff0000u), b.y, acc);
    acc = fmaf(__uint_as_float(w.w << 16), b.z, acc);
    return fmaf(__uint_as_float(w.w & 0xffff0000u), b.w, acc);
}

__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* cos, sin of pair j's angle at position pos (half = R / 2 pairs rotated):
 * theta^(-2j/R) and the angle in double, as the CPU backend computes them. */
__device__ __forceinline__ void rope_cos_sin(int64_t pos, int j, int half, double theta, float *c, float *s)
{
    const double inv_freq = pow(theta, -2.0 * j / (2.0 * half)); /* divisor: the rotary width R */
    const double angle = (double)pos * inv_freq;
    *c = (float)cos(angle);
    *s = (float)sin(angle);
}

/* The block's 1 / RMS of x from each thread's partial sum of squares (ss)
 * over a.cols values; red: WARPS floats of scratch. The barrier it takes
 * also publishes what the threads stored before it. */
template <int WARPS>
__device__ __forceinline__ float block_rms_inv(const cu_fgemv_args &a, float ss, float *red)
{
    ss = warp_sum(ss);
    if (threadIdx.x % WARP == 0) red[threadIdx.x / WARP] = ss;
    __syncthreads();
    float tot = 0.0f;
#pragma unroll
    for (int w = 0; w < WARPS; w++) tot += red[w];
    return 1.0f / sqrtf(tot / (float)a.cols + a.eps);
}

/* A GEMV's x (a.cols floats) into shared memory xs4 by a block of THREADS,
 * RMS-normalised with a.nw when that is set (block 0 also writes the
 * normalised x to a.xn, as the unfused rmsnorm would); red: THREADS / WARP
 * floats of scratch. THROUGH_L2: read x through L2 only (__ldcg), for a
 * kernel in which other blocks have just written it (the persistent step);
 * a kernel launched after x's writer reads it normally. VPU > 0: x is
 * stored by "units" of VPU float4s, transposed: float4 k of unit i at
 * xs4[k * (c4 / VPU) + i], so lanes reading consecutive units' k-th float4
 * hit consecutive banks. Ends with a block barrier. */
template <int THREADS, bool THROUGH_L2, int VPU = 0>
__device__ __forceinline__ void load_norm_x(const cu_fgemv_args &a, float4 *xs4, float *red)
{
    constexpr int WARPS = THREADS / WARP;
    const int c4 = a.cols / 4;
    const int units = VPU ? c4 / VPU : 0;
    auto at = [&](int j) { return VPU ? (j % VPU) * units + j / VPU : j; };
    const float4 *x4 = (const float4 *)a.x;
    if (a.nw) {
        float ss = 0.0f;
        for (int i = threadIdx.x; i < c4; i += THREADS) {
            const float4 t = THROUGH_L2 ? __ldcg(x4 + i) : x4[i];
            ss = fmaf(t.x, t.x, ss);
            ss = fmaf(t.y, t.y, ss);
            ss = fmaf(t.z, t.z, ss);
            ss = fmaf(t.w, t.w, ss);
            xs4[at(i)] = t;
        }
        const float inv = block_rms_inv<WARPS>(a, ss, red);
        const float4 *nw4 = (const float4 *)a.nw;
        float4 *xn4 = blockIdx.x == 0 && a.xn ? (float4 *)a.xn : NULL;
        /* a thread's weights, up to NWP of them, loaded before its first
         * store to xn: a load after that store could alias it, so the
         * compiler would issue the round trips one after another (bench/
         * cuda_runs.md run 27) */
        constexpr int NWP = 4;
        for (int i0 = threadIdx.x; i0 < c4; i0 += NWP * THREADS) {
            float4 w[NWP];
#pragma unroll
            for (int k = 0; k < NWP; k++) {
                const int i = i0 + k * THREADS;
                w[k] = i >= c4 ? make_float4(0.0f, 0.0f, 0.0f, 0.0f) : THROUGH_L2 ? __ldg(nw4 + i) : nw4[i];
            }
#pragma unroll
            for (int k = 0; k < NWP; k++) {
                const int i = i0 + k * THREADS;
                if (i >= c4) break;
                float4 t = xs4[at(i)];
                t.x = t.x * inv * w[k].x;
                t.y = t.y * inv * w[k].y;
                t.z = t.z * inv * w[k].z;
                t.w = t.w * inv * w[k].w;
                xs4[at(i)] = t;
                if (xn4) xn4[i] = t;
            }
        }
    } else {
        for (int i = threadIdx.x; i < c4; i += THREADS) xs4[at(i)] = THROUGH_L2 ? __ldcg(x4 + i) : x4[i];
    }
    __syncthreads(); /* red may be reused by the caller; xs is read by every warp */
}

/* ---- decode attention: what the split-KV kernels share ---------------------- */

/* A cache element as float: f32, f16 or bf16 rows. */
__device__ __forceinline__ float kv_f(float x) { return x; }
__device__ __forceinline__ float kv_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float kv_f(__nv_bfloat16 x) { return __bfloat162float(x); }
/* A float as a cache element (round to nearest even). */
template <typename KV>
__device__ __forceinline__ KV kv_of(float x);
template <>
__device__ __forceinline__ float kv_of<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half kv_of<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 kv_of<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

/* The prefetched tile (k2, v2: cache elements as loaded) becomes the current
 * one (k, v). A 16-bit tile stays in its loaded form until here: converting
 * at the load would make the load's latency wait there, before the current
 * tile's scores (bench/cuda_runs.md run 40: 3.3x the key tiles' time). */
template <int KT, int E, typename S>
__device__ __forceinline__ void att_next_tile(float (&k)[KT][E], float (&v)[KT][E], const S (&k2)[KT][E],
                                              const S (&v2)[KT][E])
{
#pragma unroll
    for (int u = 0; u < KT; u++)
#pragma unroll
        for (int e = 0; e < E; e++) {
            k[u][e] = kv_f(k2[u][e]);
            v[u][e] = kv_f(v2[u][e]);
        }
}

/* One tile of KT keys for the G (<= GMAX) query heads a warp holds (lanes hold
 * E interleaved dims, d = lane + 32 e): the KT scores reduce side by side
 * (independent shuffle chains), then the running max m, sum l and acc are
 * rescaled once for the tile. Keys u >= nvalid are padding. */
template <int KT, int E, int GMAX>
__device__ __forceinline__ void att_tile(const float (&q)[GMAX][E], const float (&k)[KT][E], const float (&v)[KT][E],
                                         int G, int64_t nvalid, float (&acc)[GMAX][E], float (&m)[GMAX],
                                         float (&l)[GMAX])
{
#pragma unroll
    for (int g = 0; g < GMAX; g++) {
        if (g >= G) break;
        float sc[KT];
#pragma unroll
        for (int u = 0; u < KT; u++) {
            float t = 0.0f;
#pragma unroll
            for (int e = 0; e < E; e++) t = fmaf(q[g][e], k[u][e], t);
            sc[u] = t;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
#pragma unroll
            for (int u = 0; u < KT; u++) sc[u] += __shfl_xor_sync(0xffffffffu, sc[u], o);
        float mn = m[g];
#pragma unroll
        for (int u = 0; u < KT; u++)
            if (u < nvalid) mn = fmaxf(mn, sc[u]);
        const float c = expf(m[g] - mn);
        l[g] *= c;
#pragma unroll
        for (int e = 0; e < E; e++) acc[g][e] *= c;
#pragma unroll
        for (int u = 0; u < KT; u++) {
            if (u >= nvalid) break;
            const float pe = expf(sc[u] - mn);
            l[g] += pe;
#pragma unroll
            for (int e = 0; e < E; e++) acc[g][e] = fmaf(pe, v[u][e], acc[g][e]);
        }
        m[g] = mn;
    }
}

/* A warp's softmax state into the block's shared arrays (row `warp`); lane
 * l's acc[g][e] is dim l + WARP * e, or with LANE_DIMS dim E * l + e. */
template <int W, int E, int GMAX, bool LANE_DIMS = false>
__device__ __forceinline__ void att_store_warp(float (&sm_m)[W][GMAX], float (&sm_l)[W][GMAX],
                                               float (&sm_acc)[W][GMAX][E * WARP], int warp, int lane,
                                               const float (&m)[GMAX], const float (&l)[GMAX],
                                               const float (&acc)[GMAX][E])
{
#pragma unroll
    for (int g = 0; g < GMAX; g++) {
        if (lane == 0) {
            sm_m[warp][g] = m[g];
            sm_l[warp][g] = l[g];
        }
#pragma unroll
        for (int e = 0; e < E; e++) sm_acc[warp][g][LANE_DIMS ? E * lane + e : lane + WARP * e] = acc[g][e];
    }
}

/* The block's state for head g, dim d: its W warps' states merged (max M,
 * sum L, unnormalised output A; M = -inf and L = A = 0 when no warp saw a key). */
template <int W, int E, int GMAX>
__device__ __forceinline__ void att_merge_warps(const float (&sm_m)[W][GMAX], const float (&sm_l)[W][GMAX],
                                                const float (&sm_acc)[W][GMAX][E * WARP], int g, int d, float *M,
                                                float *L, float *A)
{
    float mx = -INFINITY;
    for (int w = 0; w < W; w++) mx = fmaxf(mx, sm_m[w][g]);
    float sl = 0.0f, sa = 0.0f;
    if (mx != -INFINITY) {
        for (int w = 0; w < W; w++) {
            const float f = expf(sm_m[w][g] - mx);
            sl += sm_l[w][g] * f;
            sa += sm_acc[w][g][d] * f;
        }
    }
    *M = mx;
    *L = sl;
    *A = sa;
}

/* ---- the bulk-copy engine and mbarriers (sm_90) ---------------------------
 * A shared-memory mbarrier counts one arrival (mbar_expect, with the bytes
 * to come) and completes its phase when the bulk copies signalling it have
 * landed; mbar_wait spins on that phase. */

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mbar_init(uint64_t *bar, uint32_t count)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
#endif
}

__device__ __forceinline__ void mbar_fence_init()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

__device__ __forceinline__ void mbar_expect(uint64_t *bar, uint32_t bytes)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
#endif
}

__device__ __forceinline__ void bulk_load(void *dst, const void *src, uint32_t bytes, uint64_t *bar)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(bar))
                 : "memory");
#endif
}

__device__ __forceinline__ void mbar_wait(uint64_t *bar, uint32_t parity)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    uint32_t done = 0;
    while (!done) {
        asm volatile("{\n\t.reg .pred p;\n\t"
                     "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                     "selp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(done)
                     : "r"(smem_u32(bar)), "r"(parity)
                     : "memory");
    }
#endif
}

/* Programmatic dependent launch (sm_90): `pdl_wait` blocks until the kernels
 * this one depends on have finished and their writes are visible (a no-op
 * when it was launched without the attribute); `pdl_release` lets the next
 * kernel in the stream start launching now. Every kernel that may be launched
 * with the attribute waits before it touches anything a predecessor writes
 * or reads (activations, this step's cache rows): only constant weights, and
 * what steps before this one wrote, are read earlier. That is safe because
 * every kernel of a chain waits before it finishes, so when a kernel starts,
 * all kernels before its direct predecessor have completed. */
__device__ __forceinline__ void pdl_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_release()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

/* SPARK_CUDA_TIMELINE (cuda_graph.cu's timeline_*): thread 0 of each block
 * writes %globaltimer (ns) at mark k (0 entry, 1 after the dependency wait,
 * 2 exit, 3.. inside; CU_TL_MARKS, cuda_internal.h) into the launch's
 * record; nothing when tl is NULL (the default: one uniform branch). */
__device__ __forceinline__ void tl_mark(unsigned long long *tl, int k)
{
    if (tl && threadIdx.x == 0) {
        unsigned long long t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        if (blockIdx.x < (unsigned)CU_TL_MAX_BLOCKS) tl[blockIdx.x * CU_TL_MARKS + k] = t;
    }
}

/* A launch, with the programmatic-dependent attribute when pdl, and as
 * clusters of `cluster` blocks along x when cluster > 1. */
template <typename... KArgs, typename... Args>
cudaError_t launch_cluster_ex(bool pdl, int cluster, dim3 grid, dim3 block, size_t smem, cudaStream_t st,
                              void (*k)(KArgs...), Args... args)
{
    cudaLaunchConfig_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cudaLaunchAttribute at[2];
    int n = 0;
    if (pdl) {
        at[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[n++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (cluster > 1) {
        at[n].id = cudaLaunchAttributeClusterDimension;
        at[n].val.clusterDim.x = (unsigned)cluster;
        at[n].val.clusterDim.y = 1;
        at[n++].val.clusterDim.z = 1;
    }
    cfg.attrs = at;
    cfg.numAttrs = n;
    return cudaLaunchKernelEx(&cfg, k, args...);
}

template <typename... KArgs, typename... Args>
cudaError_t launch_ex(bool pdl, dim3 grid, dim3 block, size_t smem, cudaStream_t st, void (*k)(KArgs...),
                      Args... args)
{
    return launch_cluster_ex(pdl, 1, grid, block, smem, st, k, args...);
}

} // namespace spark_dev

#endif

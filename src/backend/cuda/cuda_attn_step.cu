/*
 * cuda_attn_step.cu — a decode step's attention of one layer in one launch
 * (one token, f32 cache): rope of q and k, the k / v store, split-KV
 * attention and the merge of the splits with the head gate.
 *
 * Why: at batch 1 the attention of a short context is latency, not bytes
 * (~4 MB of cache a layer), and the unfused path pays three kernel
 * boundaries for it (rope_kv, attention, merge) plus a round trip of every
 * split's partial through global memory (bench/cuda_runs.md run 7: ~21 us a
 * layer). Here the splits of one KV head are the blocks of one thread-block
 * cluster: each block scores its share of the keys, leaves its partial
 * softmax state in shared memory, and after a cluster barrier every block
 * merges a slice of the head's outputs by reading its partners' shared
 * memory (distributed shared memory, sm_90). The cache rows of earlier
 * steps are loaded before the dependency wait, so they arrive while the qkv
 * GEMV before this kernel is still finishing.
 *
 * The block whose key range holds the current position ropes k, stores k
 * and v into the cache slot and keeps them in shared memory for its warp
 * whose first tile holds that slot; no other block reads it (rings hold >= window slots, full layers the
 * whole context). Every buffer ends as rope_kv + attention + merge leave it
 * (q and k roped in place in qkv, the cache row, the gated output).
 * Shapes it takes: <= 4 query heads per KV head, head_dim <= 256; the
 * backend uses it while the context is short (cuda_attention's step_ok).
 * The cache holds float32 rows or f16 / bf16 ones (a->kv_fmt): the kernel
 * is the same, its cache element type a template parameter; the current
 * row is rounded as it is stored and the attention reads it so rounded, as
 * every later step will (and as cuda_kv.cu's attention over those caches).
 */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_kv.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cooperative_groups.h>
#include <math.h>
#include <stdlib.h>

using namespace spark_dev;
namespace cg = cooperative_groups;

namespace {

constexpr int AS_WARPS = 8;  /* warps a block (4 measured slower: 15.5 vs 12.3 us a layer, run 8) */
constexpr int AS_G = 4;      /* query heads per KV head, at most */
constexpr int AS_CMAX = 16;  /* blocks a cluster, at most (16 is Hopper's non-portable size) */

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 /* (the kernel is empty on older targets) */
constexpr int AS_KT = 4; /* keys a warp scores together (as attention_kernel) */

/* cos, sin of rope pair t at position p: from the step's table when there
 * is one, else computed (the same double operations as the table). */
/* (out of line: the double-precision pow / cos / sin, executed only without
 * a table, were inlined at each use; 104.8 -> 89.3 KB of kernel code, which
 * bench/cuda_runs.md run 19 measured as no change end to end) */
__device__ __noinline__ void step_cos_sin_slow(int64_t p, int t, int half, double theta, float *c, float *s)
{
    rope_cos_sin(p, t, half, theta, c, s);
}

__device__ __forceinline__ void step_cos_sin(const cu_attn_args &a, int64_t p, int t, int half, float *c, float *s)
{
    if (a.rope_tab) {
        *c = a.rope_tab[t];
        *s = a.rope_tab[half + t];
    } else {
        step_cos_sin_slow(p, t, half, a.theta, c, s);
    }
}
#endif

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
/* Where a block of a cluster stands: its KV head, its split [jb, je) of the
 * keys the current position p attends to, and whether it owns row p. */
struct step_geo {
    int C, rank, kh, D, G, half, warp, lane;
    int64_t q_dim, kv_dim, p, jb, je;
    bool owner; /* this block stores the current k / v */
};

__device__ __forceinline__ step_geo step_geometry(const cu_attn_args &a, int C, int rank)
{
    step_geo s;
    s.C = C;
    s.rank = rank;
    s.kh = blockIdx.x / C;
    s.D = a.head_dim;
    s.G = a.n_head / a.n_head_kv;
    s.half = a.rot_dims / 2;
    s.warp = threadIdx.x / WARP;
    s.lane = threadIdx.x % WARP;
    s.q_dim = (int64_t)a.n_head * s.D;
    s.kv_dim = (int64_t)a.n_head_kv * s.D;
    s.p = *a.pos;
    const int64_t lo = a.window && s.p - a.window + 1 > 0 ? s.p - a.window + 1 : 0; /* sliding: 0 <= p - j < window */
    const int64_t per = (s.p - lo + 1 + C - 1) / C;
    s.jb = lo + (int64_t)rank * per;
    s.je = s.jb + per < s.p + 1 ? s.jb + per : s.p + 1; /* may be empty (short contexts) */
    s.owner = s.jb <= s.p && s.p < s.je;
    return s;
}

/* After the dependency wait: this KV head's G query heads, roped (pairs
 * (t, t + half)), into qs, and the heads' gates' sigmoids into gsig; the
 * owner ropes the current k and stores k and v into the cache slot of p,
 * and thread t < D returns dim t of k roped in *kt, and of k and v as the
 * cache holds them (rounded to KV) in *kcr, *vcr. Every global load is
 * issued before any is used, so the block waits for one round trip here
 * rather than one per value a thread ropes (run 17's timeline). The caller
 * ends this with a block barrier. */
template <int E, typename KV>
__device__ __forceinline__ void step_q_and_kv(const cu_attn_args &a, const step_geo &s, float (&qs)[AS_G][E * WARP],
                                              float (&gsig)[AS_G], float *kt, float *kcr, float *vcr)
{
    const int D = s.D, G = s.G, half = s.half;
    const float *qkv = a.qkv;
    constexpr int QI = (AS_G * E * WARP + AS_WARPS * WARP - 1) / (AS_WARPS * WARP); /* q values a thread */
    const float graw = a.gate && threadIdx.x < G ? a.gate[s.kh * G + threadIdx.x] : 0.0f;
    /* the owner's k[t], its rope partner and v[t] (thread t < D), loaded
     * here with q rather than after the q rope: run 17 found the owner the
     * block the others waited for at the cluster barrier, and issuing them
     * here took that wait from 0.83 to 0.51 us (run 19) */
    float ke0 = 0.0f, ke1 = 0.0f, ve = 0.0f;
    if (s.owner && threadIdx.x < D) {
        const float *kq = qkv + s.q_dim + (int64_t)s.kh * D, *vq = kq + s.kv_dim;
        const int t = threadIdx.x;
        ke0 = kq[t];
        if (t < 2 * half) ke1 = kq[t < half ? t + half : t - half];
        ve = vq[t];
    }
    float qa[QI], qb[QI], qc[QI], qsn[QI]; /* q[d], its rope partner, cos, sin */
#pragma unroll
    for (int r = 0; r < QI; r++) {
        const int i = threadIdx.x + r * AS_WARPS * WARP, d = i % D;
        qa[r] = qb[r] = qc[r] = qsn[r] = 0.0f;
        if (i >= G * D) continue;
        const float *hq = qkv + (int64_t)(s.kh * G + i / D) * D;
        qa[r] = hq[d];
        if (d < 2 * half) {
            const int t = d < half ? d : d - half;
            qb[r] = hq[d < half ? d + half : t];
            step_cos_sin(a, s.p, t, half, &qc[r], &qsn[r]);
        }
    }
    if (threadIdx.x < G) gsig[threadIdx.x] = a.gate ? 1.0f / (1.0f + expf(-graw)) : 1.0f;
#pragma unroll
    for (int r = 0; r < QI; r++) {
        const int i = threadIdx.x + r * AS_WARPS * WARP, d = i % D;
        if (i >= G * D) continue;
        /* as rope_kv_kernel: x0 * c - x1 * s, x1 * c + x0 * s (x0 = q[t], x1 = q[t + half]) */
        qs[i / D][d] = d >= 2 * half ? qa[r] : d < half ? qa[r] * qc[r] - qb[r] * qsn[r] : qa[r] * qc[r] + qb[r] * qsn[r];
    }
    *kt = *kcr = *vcr = 0.0f;
    if (s.owner && threadIdx.x < D) {
        const int64_t off = (s.p % a.slots) * s.kv_dim + (int64_t)s.kh * D;
        const int t = threadIdx.x;
        float y = ke0;
        if (t < 2 * half) {
            float c, sn;
            step_cos_sin(a, s.p, t < half ? t : t - half, half, &c, &sn);
            /* as rope_kv_kernel: y0 = x0 * c - x1 * s, y1 = x1 * c + x0 * s (x0 = k[u], x1 = k[u + half]) */
            y = t < half ? ke0 * c - ke1 * sn : ke0 * c + ke1 * sn;
        }
        *kt = y;
        const KV kr = kv_of<KV>(y), vr = kv_of<KV>(ve);
        ((KV *)a.kc)[off + t] = kr;
        ((KV *)a.vc)[off + t] = vr;
        *kcr = kv_f(kr);
        *vcr = kv_f(vr);
    }
}

/* A float at `local` in the shared memory of cluster block `rank` (mapa and
 * a shared::cluster load: no generic-address resolution). */
__device__ __forceinline__ float dsmem_load(const float *local, int rank)
{
    uint32_t remote;
    float v;
    asm("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_u32(local)), "r"(rank));
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
    return v;
}

/* From the block's partial (fin_m, fin_l: per head; fin_a: per head and
 * dim, unnormalised) in shared memory to the gated output: after a cluster
 * barrier, each output of this block's slice of the G x D reads every
 * partner's value, max and sum in one distributed-shared-memory round (by
 * mapa addresses) and weighs the splits in its own thread, in ascending
 * order (as the merge kernel). The merge took 2.7-2.9 us with the maxima
 * and sums read first by a few threads, a block barrier, then the values
 * through generic pointers; 1.7 us so (bench/cuda_runs.md run 24). Rank 0
 * writes q back roped, as rope_kv leaves it. */
template <int E>
__device__ __forceinline__ void step_cluster_merge(const cu_attn_args &a, const step_geo &s, cg::cluster_group &cl,
                                                   float (&fin_m)[AS_G], float (&fin_l)[AS_G],
                                                   float (&fin_a)[AS_G][E * WARP], const float (&qs)[AS_G][E * WARP],
                                                   const float (&gsig)[AS_G])
{
    const int C = s.C, D = s.D, G = s.G;
    tl_mark(a.tl, 5);
    cl.sync(); /* every block's partial is in its shared memory; every q read is done */
    tl_mark(a.tl, 6);
    if (s.rank == 0)
        for (int i = threadIdx.x; i < G * D; i += blockDim.x)
            ((float *)a.qkv)[(int64_t)(s.kh * G + i / D) * D + i % D] = qs[i / D][i % D];
    const int outs = G * D, slice = (outs + C - 1) / C;
    const int i_end = (s.rank + 1) * slice < outs ? (s.rank + 1) * slice : outs;
    for (int i = s.rank * slice + threadIdx.x; i < i_end; i += blockDim.x) {
        const int g = i / D, d = i % D;
        float part[AS_CMAX], pm[AS_CMAX], pl[AS_CMAX]; /* every partner's value, max and sum, requested at once */
#pragma unroll
        for (int c = 0; c < AS_CMAX; c++) {
            part[c] = pm[c] = pl[c] = 0.0f;
            if (c < C) {
                part[c] = dsmem_load(&fin_a[g][d], c);
                pm[c] = dsmem_load(&fin_m[g], c);
                pl[c] = dsmem_load(&fin_l[g], c);
            }
        }
        float M = -INFINITY;
#pragma unroll
        for (int c = 0; c < AS_CMAX; c++)
            if (c < C) M = fmaxf(M, pm[c]);
        float L = 0.0f, A = 0.0f;
#pragma unroll
        for (int c = 0; c < AS_CMAX; c++) {
            if (c >= C) break;
            const float w = pm[c] == -INFINITY ? 0.0f : expf(pm[c] - M); /* 0: an empty split */
            L += pl[c] * w;
            if (w != 0.0f) A += part[c] * w;
        }
        a.out[(int64_t)(s.kh * G + g) * D + d] = A / L * gsig[g];
    }
    tl_mark(a.tl, 7);
    /* no block leaves while a partner may still read its shared memory: an
     * execution barrier only (every value read from a partner was used
     * above); cl.sync()'s release would also fence this block's output
     * stores, ~a global round trip */
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\n\tbarrier.cluster.wait.aligned;" ::: "memory");
    tl_mark(a.tl, 2);
}
#endif

template <int E, typename KV>
__global__ void __launch_bounds__(AS_WARPS * WARP) attn_step_kernel(cu_attn_args a)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cg::cluster_group cl = cg::this_cluster();
    const step_geo s = step_geometry(a, (int)cl.num_blocks(), (int)cl.block_rank());
    const int D = s.D, G = s.G, lane = s.lane;
    const int64_t p = s.p, je = s.je;
    const KV *kc = (const KV *)a.kc, *vc = (const KV *)a.vc;

    /* the current position's k (roped) and v, stored by the owner: the
     * first tile's copy of row p is taken from here, not reloaded (a reload
     * made the owner the block the others waited for at the cluster
     * barrier: bench/cuda_runs.md run 17) */
    __shared__ float kcur[E * WARP], vcur[E * WARP];
    /* skip_p: row p left as zeros (the first tile's load, before the owner's store); the
     * elements as loaded (KV), converted only when the tile is scored (att_next_tile) */
    const KV zero = kv_of<KV>(0.0f);
    auto load = [&](int64_t j0, KV (&k)[AS_KT][E], KV (&v)[AS_KT][E], bool skip_p) {
        int64_t slot = j0 % a.slots; /* one 64-bit remainder a tile, the next keys' slots by a wrap */
#pragma unroll
        for (int u = 0; u < AS_KT; u++, slot = slot + 1 == a.slots ? 0 : slot + 1) {
            const int64_t j = j0 + u;
            const KV *kr = NULL, *vr = NULL;
            if (j < je && !(skip_p && j == p)) {
                const int64_t off = slot * s.kv_dim + (int64_t)s.kh * D;
                kr = kc + off;
                vr = vc + off;
            }
#pragma unroll
            for (int e = 0; e < E; e++) {
                const int d = lane + WARP * e;
                k[u][e] = kr && d < D ? kr[d] : zero;
                v[u][e] = vr && d < D ? vr[d] : zero;
            }
        }
    };

    /* the first tile: rows earlier steps wrote, so before the wait (row p,
     * the current position's, is patched in after the owner's store) */
    const int64_t first = s.jb + (int64_t)s.warp * AS_KT;
    const bool first_has_p = first < je && first <= p && p < first + AS_KT;
    KV k1[AS_KT][E], v1[AS_KT][E];
    tl_mark(a.tl, 0);
    load(first, k1, v1, true);
    if (a.pdl_early) pdl_release(); /* the next kernels may become resident now (see cu_attn_args) */
    pdl_wait();
    pdl_release();
    tl_mark(a.tl, 1);

    __shared__ float gsig[AS_G];
    __shared__ float qs[AS_G][E * WARP];
    float kt, kcr, vcr;
    step_q_and_kv<E, KV>(a, s, qs, gsig, &kt, &kcr, &vcr);
    if (s.owner && threadIdx.x < D) {
        kcur[threadIdx.x] = kcr;
        vcur[threadIdx.x] = vcr;
    }
    __syncthreads(); /* qs and kcur / vcur complete; the store visible to this block */
    float k[AS_KT][E], v[AS_KT][E];
    att_next_tile(k, v, k1, v1);
    if (s.owner && threadIdx.x < D) /* k roped in place (every k value was read above) */
        ((float *)a.qkv)[s.q_dim + (int64_t)s.kh * D + threadIdx.x] = kt;
    if (first_has_p)
#pragma unroll
        for (int u = 0; u < AS_KT; u++)
            if (first + u == p)
#pragma unroll
                for (int e = 0; e < E; e++) {
                    const int d = lane + WARP * e;
                    k[u][e] = d < D ? kcur[d] : 0.0f;
                    v[u][e] = d < D ? vcur[d] : 0.0f;
                }
    tl_mark(a.tl, 3);

    float q[AS_G][E], acc[AS_G][E], m[AS_G], l[AS_G];
#pragma unroll
    for (int g = 0; g < AS_G; g++) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
#pragma unroll
        for (int e = 0; e < E; e++) {
            const int d = lane + WARP * e;
            q[g][e] = g < G && d < D ? qs[g][d] * a.scale : 0.0f;
            acc[g][e] = 0.0f;
        }
    }

    /* a warp owns every AS_WARPS-th tile of AS_KT keys; the next tile's
     * loads are issued before the current one is scored */
    constexpr int STRIDE = AS_WARPS * AS_KT;
    for (int64_t j0 = first; j0 < je; j0 += STRIDE) {
        KV k2[AS_KT][E], v2[AS_KT][E];
        if (j0 + STRIDE < je) load(j0 + STRIDE, k2, v2, false);
        att_tile<AS_KT, E, AS_G>(q, k, v, G, je - j0, acc, m, l);
        att_next_tile(k, v, k2, v2);
    }

    /* the warps' states -> this block's partial (fin_*), in shared memory */
    __shared__ float sm_m[AS_WARPS][AS_G], sm_l[AS_WARPS][AS_G];
    __shared__ float sm_acc[AS_WARPS][AS_G][E * WARP];
    __shared__ float fin_m[AS_G], fin_l[AS_G], fin_a[AS_G][E * WARP];
    tl_mark(a.tl, 4);
    att_store_warp<AS_WARPS, E, AS_G>(sm_m, sm_l, sm_acc, s.warp, lane, m, l, acc);
    __syncthreads();
    /* att_merge_warps' arithmetic, its AS_WARPS x G rescale factors computed
     * once (a thread each) instead of once per output (run 19's timeline:
     * 1.7 us for this merge) */
    __shared__ float wf[AS_WARPS][AS_G], wmx[AS_G];
    if (threadIdx.x < AS_WARPS * G) {
        const int w = threadIdx.x / G, g = threadIdx.x % G;
        float mx = -INFINITY;
        for (int k = 0; k < AS_WARPS; k++) mx = fmaxf(mx, sm_m[k][g]);
        wf[w][g] = mx == -INFINITY ? 0.0f : expf(sm_m[w][g] - mx);
        if (w == 0) wmx[g] = mx;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < G * D; i += blockDim.x) {
        const int g = i / D, d = i % D;
        const float mx = wmx[g];
        float sl = 0.0f, sa = 0.0f;
        if (mx != -INFINITY) {
            for (int w = 0; w < AS_WARPS; w++) {
                const float f = wf[w][g];
                sl += sm_l[w][g] * f;
                sa += sm_acc[w][g][d] * f;
            }
        }
        fin_a[g][d] = sa;
        if (d == 0) {
            fin_m[g] = mx;
            fin_l[g] = sl;
        }
    }
    step_cluster_merge<E>(a, s, cl, fin_m, fin_l, fin_a, qs, gsig);
#endif
}

template <int E, typename KV>
cudaError_t launch_step(cudaStream_t st, const cu_attn_args *a, int cluster)
{
    return launch_cluster_ex(a->pdl != 0, cluster, dim3((unsigned)(a->n_head_kv * cluster)), dim3(AS_WARPS * WARP), 0,
                             st, attn_step_kernel<E, KV>, *a);
}

template <typename KV>
cudaError_t launch_step_dim(cudaStream_t st, const cu_attn_args *a, int cluster)
{
    const int D = a->head_dim;
    return D <= 32 ? launch_step<1, KV>(st, a, cluster)
           : D <= 64 ? launch_step<2, KV>(st, a, cluster)
           : D <= 128 ? launch_step<4, KV>(st, a, cluster)
                      : launch_step<8, KV>(st, a, cluster);
}

/* Whether clusters of c blocks of fn can run here. */
template <int E, typename KV>
bool cluster_runs(int c)
{
    void (*fn)(cu_attn_args) = attn_step_kernel<E, KV>;
    if (c > 8 && cudaFuncSetAttribute(fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    cudaLaunchConfig_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDim = dim3((unsigned)c);
    cfg.blockDim = dim3(AS_WARPS * WARP);
    cudaLaunchAttribute at;
    at.id = cudaLaunchAttributeClusterDimension;
    at.val.clusterDim.x = (unsigned)c;
    at.val.clusterDim.y = 1;
    at.val.clusterDim.z = 1;
    cfg.attrs = &at;
    cfg.numAttrs = 1;
    int n = 0;
    const bool ok = cudaOccupancyMaxActiveClusters(&n, fn, &cfg) == cudaSuccess && n > 0;
    cudaGetLastError();
    return ok;
}

template <typename KV>
bool cluster_runs_all(int c)
{
    return cluster_runs<1, KV>(c) && cluster_runs<2, KV>(c) && cluster_runs<4, KV>(c) && cluster_runs<8, KV>(c);
}

} // namespace

int cu_attn_step_cluster(int device, int want)
{
    int major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess || major < 9) {
        cudaGetLastError();
        return 0;
    }
    for (int c = want > AS_CMAX ? AS_CMAX : want; c >= 2; c /= 2)
        if (cluster_runs_all<float>(c) && cluster_runs_all<__half>(c) && cluster_runs_all<__nv_bfloat16>(c)) return c;
    return 0;
}

int cu_attn_step_ok(const cu_attn_args *a)
{
    return a->n == 1 && a->n_head_kv > 0 && a->n_head % a->n_head_kv == 0 && a->n_head / a->n_head_kv <= AS_G &&
           a->head_dim > 0 && a->head_dim <= 8 * WARP && a->rot_dims >= 0 && a->rot_dims <= a->head_dim &&
           a->rot_dims % 2 == 0 && (a->kv_fmt == CU_KV_F32 || a->kv_fmt == CU_KV_F16 || a->kv_fmt == CU_KV_BF16);
}

cudaError_t cu_attn_step(cudaStream_t st, const cu_attn_args *a, int cluster)
{
    if (cluster < 2 || cluster > AS_CMAX || !cu_attn_step_ok(a)) return cudaErrorInvalidValue;
    cudaError_t e = a->kv_fmt == CU_KV_F16    ? launch_step_dim<__half>(st, a, cluster)
                    : a->kv_fmt == CU_KV_BF16 ? launch_step_dim<__nv_bfloat16>(st, a, cluster)
                                              : launch_step_dim<float>(st, a, cluster);
    if (e != cudaSuccess) return e;
    return cudaGetLastError();
}

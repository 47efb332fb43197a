/*
 * cuda_step.cu — a whole single-token decode step as ONE persistent kernel
 * (sm_90): the "megakernel" behind SPARK_CUDA_MEGA=1 (opt-in: correct and
 * tested, but on the H200 still slower than the graph of fused kernels,
 * 4.40 vs 3.96 ms a token on the 4B shape; bench/cuda_runs.md run 5 has the
 * per-phase profile and what is left).
 *
 * Why: at batch 1 a step is a stream over every weight byte, but as ~7
 * kernels a layer each launch pays a ramp and a tail (~5 us) while the
 * memory system idles, and the attention and its neighbours move almost
 * no bytes at all. Here one block per SM runs the step's phases in order,
 * with a grid-wide barrier between phases, and each block streams its
 * share of the weight rows into a ring of shared-memory slots with the
 * Hopper bulk-copy engine (cp.async.bulk + mbarrier). The producer (thread
 * 0) keeps the ring full ACROSS phase boundaries: weights never depend on
 * activations, so the next matrix's rows are already arriving while the
 * barrier, the norm and the attention of the current layer run.
 *
 * Phases (built on the host from the fused command list, cuda_backend.cu):
 *   EMBED  h = embedding row of the token (and the step's rope cos/sin);
 *   GEMV   [rmsnorm x] . W (one or two row segments, or a gate/up pair
 *          with the erf-GELU product, or a residual add in the epilogue);
 *   ATTN   rope of q and k, the k/v store into the cache slot, split-KV
 *          attention over the cache, and the merge of the splits with the
 *          sigmoid head gate, done by whichever block finishes a KV head's
 *          splits last (an arrival counter), so no extra barrier.
 * Numbers follow the other kernels: fp32 activations and accumulation,
 * rope angles in double, exact erf GELU.
 */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_device.cuh"

#include <cuda_fp16.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

using namespace spark_dev;

namespace {

constexpr int MK_THREADS = 256, MK_WARPS = MK_THREADS / WARP;
constexpr int MK_SLOT = 40 * 1024; /* bytes of one ring slot: a chunk of whole weight rows */
constexpr int MK_MAX_SLOTS = 8;
constexpr int MK_GMAX = 8;         /* query heads per KV head */
constexpr int MK_MAX_ROPE = 4;     /* rope classes (angle tables) per step */
constexpr int MK_SMEM_LIMIT = 227 * 1024;

struct mk_rope {
    int half, off; /* pairs, offset into the cos/sin table */
    double theta;
};

struct mk_params {
    const cu_mk_phase *ph;
    int np;
    const int64_t *pos;
    const int32_t *ids;
    unsigned *bar;   /* [0] arrivals, [1] generation */
    int *cnt;        /* per KV head: splits finished (the last one merges) */
    float *ws;       /* split partials: n_head x splits x (head_dim + 2) */
    float2 *rope_cs; /* cos/sin of the step's position, per rope class and pair */
    mk_rope rope[MK_MAX_ROPE];
    int n_rope, n_cs;
    unsigned long long *prof; /* SPARK_CUDA_MEGA_PROF: block 0's ns per phase, [work, barrier] */
    int slots;       /* ring slots in use */
    int work_bytes;  /* shared memory for x / the attention's merge */
};

__device__ __forceinline__ float gelu_erf(float v) { return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f)); }

/* ---- the grid barrier ------------------------------------------------------- */
/* Every block of the (cooperatively launched, so co-resident) grid arrives;
 * the last one resets the count and bumps the generation the others spin on.
 * The fences make each block's writes visible to every block after it. */
__device__ __forceinline__ unsigned ld_acquire(const unsigned *p)
{
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ unsigned ld_relaxed(const unsigned *p)
{
    unsigned v;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ unsigned long long gtime()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ void grid_barrier(unsigned *bar, unsigned &gen)
{
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(&bar[0], 1u) == gridDim.x - 1) {
            atomicExch(&bar[0], 0u);
            __threadfence();
            atomicAdd(&bar[1], 1u);
        } else {
            while (ld_relaxed(&bar[1]) == gen) {
            }
        }
        __threadfence(); /* acquire: the others' writes before their arrival are visible now */
    }
    gen++;
    __syncthreads();
}

/* ---- the weight stream: rows of GEMV phases, chunk by chunk ---------------- */

/* A block's share of a GEMV phase: chunks of rpc rows (row pairs when
 * `pair`), dealt round-robin (chunk g to block g % blocks), so that at any
 * moment the whole GPU reads one window of the matrix: 132 streams from
 * far-apart addresses reach only ~3.3 TB/s, one moving window ~4.2. */
struct mk_rows {
    int64_t R;   /* rows of the phase */
    int rpc;     /* rows per chunk */
    int nchunks; /* this block's */
};

__device__ __forceinline__ mk_rows rows_of(const cu_mk_phase &p)
{
    const cu_fgemv_args &a = p.fg;
    mk_rows m;
    m.R = a.pair ? a.rows0 : a.rows0 + a.rows1;
    m.rpc = p.rpc;
    const int64_t total = (m.R + m.rpc - 1) / m.rpc;
    m.nchunks = total > blockIdx.x ? (int)((total - 1 - blockIdx.x) / gridDim.x + 1) : 0;
    return m;
}

/* First row of this block's chunk c. */
__device__ __forceinline__ int64_t chunk_row(const mk_rows &m, int c)
{
    return ((int64_t)c * gridDim.x + blockIdx.x) * m.rpc;
}

/* Producer state: the next chunk to issue, as (phase, chunk) and its
 * sequence number; every thread keeps a copy, thread 0 issues. */
struct mk_producer {
    int ph, chunk, nchunks;
    uint32_t seq;
};

/* Issue chunk `c` of GEMV phase `p` into ring slot `slot`. */
__device__ void issue_chunk(const cu_mk_phase &p, int c, char *slot, uint64_t *bar)
{
    const cu_fgemv_args &a = p.fg;
    const mk_rows m = rows_of(p);
    const int64_t r = chunk_row(m, c);
    const int64_t nr = m.R - r < m.rpc ? m.R - r : m.rpc;
    const uint8_t *w0 = (const uint8_t *)a.w0, *w1 = (const uint8_t *)a.w1;
    const uint32_t rb = (uint32_t)a.row_bytes;
    if (a.pair) {
        mbar_expect(bar, (uint32_t)(2 * nr * rb));
        bulk_load(slot, w0 + r * a.row_bytes, (uint32_t)(nr * rb), bar);
        bulk_load(slot + nr * rb, w1 + r * a.row_bytes, (uint32_t)(nr * rb), bar);
        return;
    }
    mbar_expect(bar, (uint32_t)(nr * rb));
    const int64_t in0 = r < a.rows0 ? (a.rows0 - r < nr ? a.rows0 - r : nr) : 0; /* rows from w0 */
    if (in0 > 0) bulk_load(slot, w0 + r * a.row_bytes, (uint32_t)(in0 * rb), bar);
    if (nr - in0 > 0)
        bulk_load(slot + in0 * rb, w1 + (r + in0 - a.rows0) * a.row_bytes, (uint32_t)((nr - in0) * rb), bar);
}

/* Keep the ring full: issue chunks until `slots` are in flight ahead of the
 * consumer's sequence number `cons`, walking on to later GEMV phases. */
__device__ void produce(const mk_params &P, mk_producer &pr, uint32_t cons, char *ring, uint64_t *bars)
{
    while (pr.ph < P.np && pr.seq < cons + (uint32_t)P.slots) {
        if (pr.chunk >= pr.nchunks) { /* on to the next GEMV phase */
            int q = pr.ph + 1;
            while (q < P.np && P.ph[q].kind != CU_MK_GEMV) q++;
            pr.ph = q;
            pr.chunk = 0;
            pr.nchunks = q < P.np ? rows_of(P.ph[q]).nchunks : 0;
            continue;
        }
        const int s = (int)(pr.seq % (uint32_t)P.slots);
        if (threadIdx.x == 0) issue_chunk(P.ph[pr.ph], pr.chunk, ring + (size_t)s * MK_SLOT, &bars[s]);
        pr.chunk++;
        pr.seq++;
    }
}

/* ---- GEMV phase --------------------------------------------------------------- */

/* acc += 4 bf16 weights (w) . 4 floats (x) */
__device__ __forceinline__ float dot4_bf16(uint2 w, float4 x, float acc)
{
    acc = fmaf(__uint_as_float(w.x << 16), x.x, acc);
    acc = fmaf(__uint_as_float(w.x & 0xffff0000u), x.y, acc);
    acc = fmaf(__uint_as_float(w.y << 16), x.z, acc);
    acc = fmaf(__uint_as_float(w.y & 0xffff0000u), x.w, acc);
    return acc;
}

/* One GEMV phase: consume this block's chunks in order, refilling the ring
 * as each slot frees. Warp w takes row w / wpr of a chunk and column
 * segment w % wpr; per-warp sums meet in `part` (double-buffered by chunk). */
constexpr int MK_RESID_ROWS = 256; /* residual rows a block reads ahead (else one by one) */

__device__ void run_gemv(const mk_params &P, const cu_mk_phase &p, mk_producer &pr, uint32_t &cons, char *ring,
                         uint64_t *bars, float4 *xs4, float (*part)[MK_WARPS][2], float *red, float *rs)
{
    const cu_fgemv_args a = p.fg; /* by value: the asm memory clobbers would reload fields */
    const mk_rows m = rows_of(p);
    /* the residual rows this block adds to, read now (their latency overlaps x's) */
    const bool rs_ok = a.resid && m.nchunks * m.rpc <= MK_RESID_ROWS;
    if (rs_ok)
        for (int i = threadIdx.x; i < m.nchunks * m.rpc; i += MK_THREADS) {
            const int64_t row = chunk_row(m, i / m.rpc) + i % m.rpc;
            if (row < m.R) rs[i] = __ldcg(a.resid + row);
        }
    load_norm_x<MK_THREADS, true>(a, xs4, red); /* other blocks just wrote x: through L2 */
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int wpr = MK_WARPS / m.rpc > 0 ? MK_WARPS / m.rpc : 1;
    const int ri = warp / wpr, sg = warp % wpr;
    const int units = a.cols / 4; /* 4 bf16 = 8 bytes */
    const int u0 = (int)((int64_t)units * sg / wpr), u1 = (int)((int64_t)units * (sg + 1) / wpr);
    for (int c = 0; c < m.nchunks; c++) {
        const int s = (int)(cons % (uint32_t)P.slots);
        const int64_t r = chunk_row(m, c);
        const int nr = (int)(m.R - r < m.rpc ? m.R - r : m.rpc);
        mbar_wait(&bars[s], (cons / (uint32_t)P.slots) & 1u);
        const char *slot = ring + (size_t)s * MK_SLOT;
        float acc0 = 0.0f, acc1 = 0.0f;
        if (ri < nr) {
            const uint2 *wr = (const uint2 *)(slot + (size_t)ri * a.row_bytes);
            if (a.pair) {
                const uint2 *wu = (const uint2 *)(slot + (size_t)(nr + ri) * a.row_bytes);
                for (int u = u0 + lane; u < u1; u += WARP) {
                    const float4 x = xs4[u];
                    acc0 = dot4_bf16(wr[u], x, acc0);
                    acc1 = dot4_bf16(wu[u], x, acc1);
                }
            } else {
                for (int u = u0 + lane; u < u1; u += WARP) acc0 = dot4_bf16(wr[u], xs4[u], acc0);
            }
        }
        acc0 = warp_sum(acc0);
        acc1 = warp_sum(acc1);
        if (lane == 0) {
            part[c & 1][warp][0] = acc0;
            part[c & 1][warp][1] = acc1;
        }
        __syncthreads(); /* the slot is consumed, the partial sums are in */
        cons++;
        produce(P, pr, cons, ring, bars);
        if ((int)threadIdx.x < nr) {
            const int t = threadIdx.x;
            float s0 = 0.0f, s1 = 0.0f;
            for (int j = 0; j < wpr; j++) {
                s0 += part[c & 1][t * wpr + j][0];
                s1 += part[c & 1][t * wpr + j][1];
            }
            const int64_t row = r + t;
            if (a.pair) {
                a.out0[row] = gelu_erf(s0) * s1;
                a.out1[row] = s1;
            } else if (row < a.rows0) {
                a.out0[row] = s0;
                if (a.resid) a.resid[row] = (rs_ok ? rs[c * m.rpc + t] : __ldcg(a.resid + row)) + s0;
            } else {
                a.out1[row - a.rows0] = s0;
            }
        }
    }
}

/* ---- EMBED phase (and the step's rope angles) -------------------------------- */

__device__ void run_embed(const mk_params &P, const cu_mk_phase &p)
{
    const int64_t id = *P.ids;
    const uint8_t *row = (const uint8_t *)p.table + id * p.row_bytes;
    const int64_t stride = (int64_t)gridDim.x * MK_THREADS;
    for (int64_t i = (int64_t)blockIdx.x * MK_THREADS + threadIdx.x; i < p.cols; i += stride) {
        float v;
        if (p.dtype == CU_BF16) v = __uint_as_float((uint32_t)((const uint16_t *)row)[i] << 16);
        else if (p.dtype == CU_F16) v = h2f(((const uint16_t *)row)[i]);
        else v = ((const float *)row)[i];
        p.out[i] = v;
    }
    /* cos/sin of this position for every rope class: angles in double, as
     * the rope kernels (inverse frequency theta^(-2j/R), R the rotary width) */
    const int64_t pos = *P.pos;
    for (int64_t i = (int64_t)blockIdx.x * MK_THREADS + threadIdx.x; i < P.n_cs; i += stride) {
        int k = 0;
        while (k + 1 < P.n_rope && i >= P.rope[k + 1].off) k++;
        const int j = (int)(i - P.rope[k].off), half = P.rope[k].half;
        float c, s;
        rope_cos_sin(pos, j, half, P.rope[k].theta, &c, &s);
        P.rope_cs[i] = make_float2(c, s);
    }
}

/* ---- ATTN phase ----------------------------------------------------------------- */

/* nh consecutive head vectors of qkv from src, roped with the class's
 * cos/sin (first `half` pairs), times mul, into dst[nh][D]. Every load of
 * a thread is issued before any is used: one memory round trip. */
template <int MAXI>
__device__ __forceinline__ void roped(float *dst, const float *src, int nh, int D, int half, const float2 *cs, float mul)
{
    float a[MAXI], b[MAXI];
    float2 c[MAXI];
#pragma unroll
    for (int k = 0; k < MAXI; k++) {
        const int i = threadIdx.x + k * MK_THREADS, d = i % D;
        const bool ok = i < nh * D;
        const int partner = d < half ? i + half : d < 2 * half ? i - half : i;
        a[k] = ok ? __ldcg(src + i) : 0.0f;
        b[k] = ok ? __ldcg(src + partner) : 0.0f;
        c[k] = ok && d < 2 * half ? __ldcg(cs + (d < half ? d : d - half)) : make_float2(1.0f, 0.0f);
    }
#pragma unroll
    for (int k = 0; k < MAXI; k++) {
        const int i = threadIdx.x + k * MK_THREADS, d = i % D;
        if (i >= nh * D) break;
        float v = a[k];
        if (d < half) v = a[k] * c[k].x - b[k] * c[k].y;
        else if (d < 2 * half) v = a[k] * c[k].x + b[k] * c[k].y;
        dst[i] = v * mul;
    }
}

/* One work item = (KV head kh, key split sp): the G query heads of kh over
 * the split's keys; lanes hold E interleaved dims (d = lane + 32 e). */
template <int E>
__device__ void attn_item(const mk_params &P, const cu_mk_phase &p, int kh, int sp, float *work, float *red)
{
    const cu_attn_args &a = p.at;
    const int D = a.head_dim, G = a.n_head / a.n_head_kv;
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int64_t q_dim = (int64_t)a.n_head * D, kv_dim = (int64_t)a.n_head_kv * D;
    const int64_t pos = *a.pos;
    int64_t lo = a.window ? pos - a.window + 1 : 0; /* sliding: 0 <= p - j < window */
    if (lo < 0) lo = 0;
    const int64_t keys = pos + 1 - lo;
    const int64_t per = (keys + a.splits - 1) / a.splits;
    const int64_t jb = lo + (int64_t)sp * per;
    const int64_t je = jb + per < pos + 1 ? jb + per : pos + 1;
    const bool mine_now = jb <= pos && pos < je; /* this split holds the new key: it stores k/v */
    const float2 *cs = P.rope_cs + P.rope[p.rope_class].off;
    const int half = P.rope[p.rope_class].half;

    /* shared layout: q [G][D] | k_now [D] | v_now [D] | merge area */
    float *qs = work, *kn = work + G * D, *vn = kn + D;
    float *mm = vn + D;                    /* [MK_WARPS][G] maxima */
    float *ll = mm + MK_WARPS * MK_GMAX;   /* [MK_WARPS][G] sums */
    float *aa = ll + MK_WARPS * MK_GMAX;   /* [MK_WARPS][G][D] */
    roped<MK_GMAX>(qs, a.qkv + (int64_t)kh * G * D, G, D, half, cs, a.scale);
    if (mine_now) {
        roped<1>(kn, a.qkv + q_dim + (int64_t)kh * D, 1, D, half, cs, 1.0f);
        const float *vr = a.qkv + q_dim + kv_dim + (int64_t)kh * D;
        for (int d = threadIdx.x; d < D; d += MK_THREADS) vn[d] = __ldcg(vr + d);
        __syncthreads();
        const int64_t off = (pos % a.slots) * kv_dim + (int64_t)kh * D;
        for (int d = threadIdx.x; d < D; d += MK_THREADS) {
            ((float *)a.kc)[off + d] = kn[d];
            ((float *)a.vc)[off + d] = vn[d];
        }
    }
    __syncthreads();

    float acc[MK_GMAX][E], m[MK_GMAX], l[MK_GMAX];
#pragma unroll
    for (int g = 0; g < MK_GMAX; g++) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
#pragma unroll
        for (int e = 0; e < E; e++) acc[g][e] = 0.0f;
    }
    /* keys in batches of KB per warp: every load of a batch is issued
     * before the first is used (one memory round trip per batch) */
    constexpr int KB = 4;
    for (int64_t j0 = jb + (int64_t)warp * KB; j0 < je; j0 += (int64_t)MK_WARPS * KB) {
        float k[KB][E], v[KB][E];
#pragma unroll
        for (int b = 0; b < KB; b++) {
            const int64_t j = j0 + b;
            const bool now = j == pos, in = j < je;
            const int64_t off = (j % a.slots) * kv_dim + (int64_t)kh * D;
#pragma unroll
            for (int e = 0; e < E; e++) {
                const int d = lane + 32 * e;
                const bool ok = in && d < D;
                k[b][e] = !ok ? 0.0f : now ? kn[d] : __ldcg(a.kc + off + d);
                v[b][e] = !ok ? 0.0f : now ? vn[d] : __ldcg(a.vc + off + d);
            }
        }
#pragma unroll
        for (int b = 0; b < KB; b++) {
            if (j0 + b >= je) break;
#pragma unroll
            for (int g = 0; g < MK_GMAX; g++) {
                if (g >= G) break;
                float sc = 0.0f;
#pragma unroll
                for (int e = 0; e < E; e++) {
                    const int d = lane + 32 * e;
                    sc = fmaf(d < D ? qs[g * D + d] : 0.0f, k[b][e], sc);
                }
                sc = warp_sum(sc);
                const float mn = fmaxf(m[g], sc);
                const float c = expf(m[g] - mn), pe = expf(sc - mn);
                l[g] = l[g] * c + pe;
#pragma unroll
                for (int e = 0; e < E; e++) acc[g][e] = fmaf(acc[g][e], c, pe * v[b][e]);
                m[g] = mn;
            }
        }
    }
#pragma unroll
    for (int g = 0; g < MK_GMAX; g++) {
        if (g >= G) break;
        if (lane == 0) {
            mm[warp * MK_GMAX + g] = m[g];
            ll[warp * MK_GMAX + g] = l[g];
        }
#pragma unroll
        for (int e = 0; e < E; e++) {
            const int d = lane + 32 * e;
            if (d < D) aa[((size_t)warp * G + g) * D + d] = acc[g][e];
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < G * D; i += MK_THREADS) {
        const int g = i / D, d = i % D;
        float M = -INFINITY;
        for (int w = 0; w < MK_WARPS; w++) M = fmaxf(M, mm[w * MK_GMAX + g]);
        float L = 0.0f, A = 0.0f;
        if (M != -INFINITY) {
            for (int w = 0; w < MK_WARPS; w++) {
                const float f = expf(mm[w * MK_GMAX + g] - M);
                L += ll[w * MK_GMAX + g] * f;
                A += aa[((size_t)w * G + g) * D + d] * f;
            }
        }
        float *ws = P.ws + ((int64_t)(kh * G + g) * a.splits + sp) * (D + 2);
        if (d == 0) {
            ws[0] = M;
            ws[1] = L;
        }
        ws[2 + d] = A;
    }

    /* the last split of this KV head to finish merges the G heads */
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        const int done = atomicAdd(&P.cnt[kh], 1);
        red[0] = done == a.splits - 1 ? 1.0f : 0.0f;
        if (done == a.splits - 1) {
            P.cnt[kh] = 0;
            __threadfence();
        }
    }
    __syncthreads();
    if (red[0] == 0.0f) return;
    /* weight of each split: exp(M_s - M) / L, per head (in `aa`, free now) */
    float *wt = aa;
    for (int g = warp; g < G; g += MK_WARPS) {
        const float *base = P.ws + (int64_t)(kh * G + g) * a.splits * (D + 2);
        float M = -INFINITY;
        for (int s = lane; s < a.splits; s += WARP) M = fmaxf(M, __ldcg(base + (int64_t)s * (D + 2)));
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
        float L = 0.0f;
        for (int s = lane; s < a.splits; s += WARP) {
            const float ms = __ldcg(base + (int64_t)s * (D + 2));
            const float f = ms == -INFINITY ? 0.0f : expf(ms - M);
            wt[g * a.splits + s] = f;
            L += f * __ldcg(base + (int64_t)s * (D + 2) + 1);
        }
        L = warp_sum(L);
        for (int s = lane; s < a.splits; s += WARP) wt[g * a.splits + s] /= L;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < G * D; i += MK_THREADS) {
        const int g = i / D, d = i % D, h = kh * G + g;
        const float *base = P.ws + (int64_t)h * a.splits * (D + 2) + 2 + d;
        float o = 0.0f;
#pragma unroll 8
        for (int s = 0; s < a.splits; s++) o = fmaf(wt[g * a.splits + s], __ldcg(base + (int64_t)s * (D + 2)), o);
        if (a.gate) o *= 1.0f / (1.0f + expf(-__ldcg(a.gate + h)));
        a.out[(int64_t)h * D + d] = o;
    }
    __syncthreads(); /* red[0] and the shared areas are reused */
}

__device__ void run_attn(const mk_params &P, const cu_mk_phase &p, float *work, float *red)
{
    const cu_attn_args &a = p.at;
    const int items = a.n_head_kv * a.splits;
    for (int it = blockIdx.x; it < items; it += gridDim.x) {
        const int kh = it / a.splits, sp = it % a.splits;
        switch ((a.head_dim + 31) / 32) {
        case 1: attn_item<1>(P, p, kh, sp, work, red); break;
        case 2: attn_item<2>(P, p, kh, sp, work, red); break;
        case 3: attn_item<3>(P, p, kh, sp, work, red); break;
        case 4: attn_item<4>(P, p, kh, sp, work, red); break;
        case 5: attn_item<5>(P, p, kh, sp, work, red); break;
        case 6: attn_item<6>(P, p, kh, sp, work, red); break;
        case 7: attn_item<7>(P, p, kh, sp, work, red); break;
        default: attn_item<8>(P, p, kh, sp, work, red); break;
        }
    }
}

/* ---- the kernel ------------------------------------------------------------------- */

__global__ void __launch_bounds__(MK_THREADS, 1) step_kernel(mk_params P)
{
    extern __shared__ __align__(128) char smem[];
    char *ring = smem;                                         /* slots x MK_SLOT */
    float *work = (float *)(smem + (size_t)P.slots * MK_SLOT);  /* x, or the attention's areas */
    uint64_t *bars = (uint64_t *)((char *)work + P.work_bytes); /* one per slot */
    __shared__ float part[2][MK_WARPS][2];
    __shared__ float red[MK_WARPS];
    __shared__ float rs[MK_RESID_ROWS];
    __shared__ unsigned gen0;

    if (threadIdx.x == 0) {
        for (int s = 0; s < P.slots; s++) mbar_init(&bars[s], 1);
        mbar_fence_init();
        gen0 = ld_acquire(&P.bar[1]);
    }
    __syncthreads();
    unsigned gen = gen0;
    mk_producer pr = {-1, 0, 0, 0};
    uint32_t cons = 0;
    produce(P, pr, cons, ring, bars); /* the first matrix's rows start now */

    const bool prof = P.prof && blockIdx.x == 0 && threadIdx.x == 0;
    unsigned long long t0 = prof ? gtime() : 0;
    for (int i = 0; i < P.np; i++) {
        const cu_mk_phase &p = P.ph[i];
        if (p.kind == CU_MK_GEMV) run_gemv(P, p, pr, cons, ring, bars, (float4 *)work, part, red, rs);
        else if (p.kind == CU_MK_ATTN) run_attn(P, p, work, red);
        else run_embed(P, p);
        unsigned long long t1 = prof ? gtime() : 0;
        if (i + 1 < P.np) grid_barrier(P.bar, gen);
        if (prof) {
            const unsigned long long t2 = gtime();
            P.prof[2 * i] += t1 - t0;
            P.prof[2 * i + 1] += t2 - t1;
            t0 = t2;
        }
    }
}

} // namespace

/* ---- host side -------------------------------------------------------------------- */

struct cu_mega {
    mk_params P;
    int *kinds;   /* host copy of each phase's kind (for the profile) */
    long launches;
    cu_mk_phase *d_ph;
    size_t smem;
    int sms;
    void *d_mem; /* barrier, counters, partials, angle table: one allocation */
};

static int rows_per_chunk(const cu_fgemv_args &a)
{
    const int64_t per_row = a.row_bytes * (a.pair ? 2 : 1);
    int64_t r = MK_SLOT / per_row;
    if (r > MK_WARPS) r = MK_WARPS;
    return (int)r;
}

int cu_mega_supported(int device)
{
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    int coop = 0;
    cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, device);
    return prop.major >= 9 && coop;
}

cu_mega *cu_mega_create(const cu_mk_phase *phases, int np, int sms, int64_t *d_pos, const int32_t *d_ids)
{
    if (np <= 0 || sms <= 0) return NULL;
    cu_mk_phase *ph = (cu_mk_phase *)malloc((size_t)np * sizeof *ph);
    if (!ph) return NULL;
    memcpy(ph, phases, (size_t)np * sizeof *ph);
    mk_params P;
    memset(&P, 0, sizeof P);
    size_t work = 0;
    int max_heads = 0, max_kv = 0, max_d = 0;
    bool ok = true;
    for (int i = 0; i < np && ok; i++) {
        cu_mk_phase &p = ph[i];
        if (p.kind == CU_MK_GEMV) {
            cu_fgemv_args &a = p.fg;
            ok = !a.stamps && !a.steer_dir && p.dtype == CU_BF16 && a.cols % 8 == 0 && a.row_bytes == (int64_t)a.cols * 2 && a.row_bytes % 16 == 0 &&
                 ((uintptr_t)a.w0 % 16) == 0 && (!a.w1 || ((uintptr_t)a.w1 % 16) == 0) && ((uintptr_t)a.x % 16) == 0 &&
                 (!a.nw || ((uintptr_t)a.nw % 16) == 0) && (!a.xn || ((uintptr_t)a.xn % 16) == 0) &&
                 a.row_bytes * (a.pair ? 2 : 1) <= MK_SLOT;
            if (!ok) break;
            p.rpc = rows_per_chunk(a);
            size_t xb = (size_t)a.cols * sizeof(float);
            if (xb > work) work = xb;
        } else if (p.kind == CU_MK_ATTN) {
            cu_attn_args &a = p.at;
            const int G = a.n_head_kv > 0 ? a.n_head / a.n_head_kv : 0;
            ok = a.n == 1 && G >= 1 && G <= MK_GMAX && a.n_head % a.n_head_kv == 0 && a.head_dim <= 256 &&
                 p.rot_dims <= a.head_dim && p.rot_dims % 2 == 0 && (a.window == 0 || a.slots >= a.window);
            if (!ok) break;
            /* enough splits to give every block work, each worth a few keys at capacity */
            const int64_t cap = a.window && a.window < a.slots ? a.window : a.slots;
            int splits = (int)((cap + 63) / 64);
            if (splits > sms / a.n_head_kv) splits = sms / a.n_head_kv;
            if (splits < 1) splits = 1;
            a.splits = splits;
            /* rope class */
            int k = 0;
            while (k < P.n_rope && !(P.rope[k].half == p.rot_dims / 2 && P.rope[k].theta == p.theta)) k++;
            if (k == P.n_rope) {
                if (P.n_rope == MK_MAX_ROPE) {
                    ok = false;
                    break;
                }
                P.rope[k].half = p.rot_dims / 2;
                P.rope[k].theta = p.theta;
                P.rope[k].off = P.n_cs;
                P.n_cs += p.rot_dims / 2;
                P.n_rope++;
            }
            p.rope_class = k;
            const size_t ab = ((size_t)(G + 2) * a.head_dim + 2 * MK_WARPS * MK_GMAX +
                               (size_t)MK_WARPS * G * a.head_dim) *
                              sizeof(float);
            if (ab > work) work = ab;
            if (a.n_head * splits > max_heads) max_heads = a.n_head * splits;
            if (a.n_head_kv > max_kv) max_kv = a.n_head_kv;
            if (a.head_dim > max_d) max_d = a.head_dim;
        } else if (p.kind == CU_MK_EMBED) {
            ok = (p.dtype == CU_BF16 || p.dtype == CU_F16 || p.dtype == CU_F32) && i == 0;
        } else {
            ok = false;
        }
    }
    if (ph[0].kind != CU_MK_EMBED) ok = false; /* the embed phase also computes the rope angles */
    work = (work + 127) / 128 * 128;
    int slots = (int)((MK_SMEM_LIMIT - 1024 - work - MK_MAX_SLOTS * 8) / MK_SLOT);
    if (slots > MK_MAX_SLOTS) slots = MK_MAX_SLOTS;
    if (!ok || slots < 2) {
        free(ph);
        return NULL;
    }
    /* device memory: barrier words, counters, partials, cos/sin table */
    size_t off_cnt = 64, off_ws = off_cnt + (size_t)(max_kv > 0 ? max_kv : 1) * sizeof(int);
    off_ws = (off_ws + 255) / 256 * 256;
    size_t ws_bytes = (size_t)max_heads * (size_t)(max_d + 2) * sizeof(float);
    size_t off_cs = (off_ws + ws_bytes + 255) / 256 * 256;
    size_t off_prof = (off_cs + (size_t)(P.n_cs > 0 ? P.n_cs : 1) * sizeof(float2) + 255) / 256 * 256;
    const bool prof = getenv("SPARK_CUDA_MEGA_PROF") != NULL;
    size_t total = off_prof + (prof ? (size_t)np * 2 * sizeof(unsigned long long) : 0);
    cu_mega *mk = (cu_mega *)calloc(1, sizeof *mk);
    if (!mk) {
        free(ph);
        return NULL;
    }
    char *mem = NULL;
    if (cudaMalloc((void **)&mem, total) != cudaSuccess || cudaMemset(mem, 0, total) != cudaSuccess ||
        cudaMalloc((void **)&mk->d_ph, (size_t)np * sizeof *ph) != cudaSuccess ||
        cudaMemcpy(mk->d_ph, ph, (size_t)np * sizeof *ph, cudaMemcpyHostToDevice) != cudaSuccess) {
        cudaGetLastError();
        if (mem) cudaFree(mem);
        if (mk->d_ph) cudaFree(mk->d_ph);
        free(mk);
        free(ph);
        return NULL;
    }
    mk->kinds = (int *)malloc((size_t)np * sizeof(int));
    for (int i = 0; mk->kinds && i < np; i++) mk->kinds[i] = ph[i].kind;
    free(ph);
    mk->d_mem = mem;
    P.prof = prof ? (unsigned long long *)(mem + off_prof) : NULL;
    P.ph = mk->d_ph;
    P.np = np;
    P.pos = d_pos;
    P.ids = d_ids;
    P.bar = (unsigned *)mem;
    P.cnt = (int *)(mem + off_cnt);
    P.ws = (float *)(mem + off_ws);
    P.rope_cs = (float2 *)(mem + off_cs);
    P.slots = slots;
    P.work_bytes = (int)work;
    mk->P = P;
    mk->smem = (size_t)slots * MK_SLOT + work + (size_t)slots * 8;
    mk->sms = sms;
    if (cudaFuncSetAttribute(step_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)mk->smem) != cudaSuccess) {
        cudaGetLastError();
        cu_mega_destroy(mk);
        return NULL;
    }
    int per_sm = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, step_kernel, MK_THREADS, mk->smem) != cudaSuccess ||
        per_sm < 1) {
        cudaGetLastError();
        cu_mega_destroy(mk);
        return NULL;
    }
    return mk;
}

cudaError_t cu_mega_launch(cu_mega *mk, cudaStream_t st)
{
    void *args[] = {&mk->P};
    mk->launches++;
    return cudaLaunchCooperativeKernel((const void *)step_kernel, dim3((unsigned)mk->sms), dim3(MK_THREADS), args,
                                       mk->smem, st);
}

/* SPARK_CUDA_MEGA_PROF: where block 0's time went, per step, by phase kind. */
static void print_profile(const cu_mega *mk)
{
    const int np = mk->P.np;
    unsigned long long *h = (unsigned long long *)malloc((size_t)np * 2 * sizeof *h);
    if (!h || !mk->kinds || !mk->launches ||
        cudaMemcpy(h, mk->P.prof, (size_t)np * 2 * sizeof *h, cudaMemcpyDeviceToHost) != cudaSuccess) {
        cudaGetLastError();
        free(h);
        return;
    }
    const char *names[] = {"embed", "gemv", "attn"};
    double work[3] = {0, 0, 0}, wait[3] = {0, 0, 0};
    int count[3] = {0, 0, 0};
    for (int i = 0; i < np; i++) {
        const int k = mk->kinds[i] < 3 && mk->kinds[i] >= 0 ? mk->kinds[i] : 0;
        work[k] += (double)h[2 * i];
        wait[k] += (double)h[2 * i + 1];
        count[k]++;
    }
    double all = 0;
    for (int k = 0; k < 3; k++) all += work[k] + wait[k];
    fprintf(stderr, "spark: persistent step profile (block 0, %ld steps): %.1f us a step\n", mk->launches,
            all / 1e3 / (double)mk->launches);
    for (int k = 0; k < 3; k++)
        if (count[k])
            fprintf(stderr, "spark:   %-5s x%3d: work %8.1f us, barrier %8.1f us a step\n", names[k], count[k],
                    work[k] / 1e3 / (double)mk->launches, wait[k] / 1e3 / (double)mk->launches);
    if (getenv("SPARK_CUDA_MEGA_PROF")[0] == '2')
        for (int i = 0; i < np; i++)
            fprintf(stderr, "spark:   phase %3d %-5s work %7.2f us barrier %7.2f us\n", i, names[mk->kinds[i] % 3],
                    (double)h[2 * i] / 1e3 / (double)mk->launches, (double)h[2 * i + 1] / 1e3 / (double)mk->launches);
    free(h);
}

void cu_mega_destroy(cu_mega *mk)
{
    if (!mk) return;
    if (mk->P.prof) {
        cudaDeviceSynchronize();
        print_profile(mk);
    }
    free(mk->kinds);
    if (mk->d_mem) cudaFree(mk->d_mem);
    if (mk->d_ph) cudaFree(mk->d_ph);
    free(mk);
}

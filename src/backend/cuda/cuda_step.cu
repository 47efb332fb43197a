/*
 * cuda_step.cu — a whole single-token decode step as ONE persistent kernel
 * (sm_90), run as a dataflow: the "megakernel" behind SPARK_CUDA_MEGA.
 *
 * Why: at batch 1 a step is a stream over every weight byte, and the
 * memory is idle whenever no weight load is in flight: at each kernel
 * boundary of the graph of fused kernels, and for the ~10 us of a layer's
 * attention, whose result the out projection needs (bench/cuda_runs.md runs
 * 17-20: a layer takes ~70 us where its bytes need ~49). Weights never
 * depend on activations, so here they never wait for them:
 *
 *   one block per SM; its producer warp copies the block's share of every
 *   matrix of the step, in order, into a ring of shared-memory slots with the
 *   bulk-copy engine (cp.async.bulk + mbarrier), waiting only for a free
 *   slot; its 8 consumer warps run the step's phases in order and multiply
 *   whatever has landed. A phase waits only for the one before it, through a
 *   counter each block bumps when its part is done (release / acquire), not
 *   a grid barrier; while consumers wait (the attention, a counter, x's
 *   load) the rings fill, ~21 MB over the GPU, so the memory keeps
 *   streaming through the attention (bench/flow_probe.cu measures this
 *   mechanism alone).
 *
 * Rows are dealt in chunks round-robin over the blocks (chunk c to block
 * c % blocks), so at any moment the GPU reads one moving window of a matrix.
 *
 * Phases (built on the host from the fused command list, cuda_graph.cu):
 *   EMBED  h = embedding row of the token, and the step's rope cos / sin;
 *   GEMV   [rmsnorm x] . W (one or two row segments, or a gate / up pair
 *          with the erf-GELU product, or a residual add in the epilogue);
 *   ATTN   for each (KV head, key split) on its own block: rope of q and k,
 *          the k / v store (the split holding the position), attention over
 *          the split's keys (pulled into L2 before the wait), a partial
 *          softmax state; the last split of a KV head to finish merges them
 *          with the sigmoid head gate.
 * Numbers follow the other kernels: fp32 activations and accumulation, rope
 * angles in double, exact erf GELU. Every buffer ends the step as the graph
 * path leaves it (xn, the GEMV outputs, the gated attention, the cache).
 */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_fmt.cuh"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

using namespace spark_dev;

namespace {

constexpr int MK_CW = 8;                          /* consumer warps */
constexpr int MK_CT = MK_CW * WARP;               /* consumer threads */
constexpr int MK_THREADS = MK_CT + WARP;          /* + the producer warp */
constexpr int MK_MAX_SLOTS = 16;
constexpr int MK_GMAX = 4;                        /* query heads per KV head */
constexpr int MK_KT = 4;                          /* keys a warp scores together */
constexpr int MK_MAX_ROPE = 4;                    /* rope classes (angle tables) per step */
constexpr int MK_MAX_SPLITS = 64;
constexpr int MK_SMEM_LIMIT = 227 * 1024;

struct mk_rope {
    int half, off; /* pairs, offset into the cos/sin table */
    double theta;
};

struct mk_params {
    const cu_mk_phase *ph;
    int np;
    unsigned epoch;  /* launches so far, this one included: phase i is done at cnt[i] == epoch * need */
    const int64_t *pos;
    const int32_t *ids;
    unsigned *cnt;   /* per phase: blocks (GEMV, EMBED) or KV heads (ATTN) done, never reset */
    int *acnt;       /* per KV head: splits of the current ATTN phase done (the last one resets it) */
    float *ws;       /* split partials: n_head x splits x (head_dim + 2) */
    float2 *rope_cs; /* cos/sin of the step's position, per rope class and pair */
    mk_rope rope[MK_MAX_ROPE];
    int n_rope, n_cs;
    int slots, slot_bytes; /* the ring */
    int work_bytes;        /* shared memory for x / the attention */
    int split_keys;        /* an attention split covers at least this many keys */
    unsigned long long *prof; /* SPARK_CUDA_MEGA_PROF: block 0's ns per phase, [wait, work] */
};

__device__ __forceinline__ float gelu_erf(float v) { return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f)); }

/* ---- synchronisation ------------------------------------------------------------ */

__device__ __forceinline__ unsigned ld_acquire(const unsigned *p)
{
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ unsigned long long gtime()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* the consumer warps only (the producer never joins) */
__device__ __forceinline__ void cons_sync() { asm volatile("bar.sync 1, %0;" ::"n"(MK_CT) : "memory"); }

__device__ __forceinline__ void mbar_arrive(uint64_t *bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}

/* how many arrivals phase i needs in one launch */
__device__ __forceinline__ unsigned need_of(const cu_mk_phase &p)
{
    return p.kind == CU_MK_ATTN ? (unsigned)p.at.n_head_kv : gridDim.x;
}

/* Thread 0 waits until phase i of this launch is done, then every consumer
 * thread may read what it wrote (the barrier extends thread 0's acquire). */
__device__ void wait_phase(const mk_params &P, int i)
{
    if (threadIdx.x == 0) {
        const unsigned want = P.epoch * need_of(P.ph[i]);
        while ((int)(ld_acquire(&P.cnt[i]) - want) < 0) {
        }
    }
    cons_sync();
}

/* After a barrier that follows this block's writes of phase i: one arrival.
 * (thread 0's fence after the barrier covers the other threads' writes, as
 * a grid barrier's does) */
__device__ __forceinline__ void signal_phase(const mk_params &P, int i)
{
    __threadfence();
    atomicAdd(&P.cnt[i], 1u);
}

/* ---- the weight stream ------------------------------------------------------------ */

/* A GEMV phase's chunks: `rpc` rows (row pairs when `pair`), chunk c to block
 * c % blocks. */
__device__ __forceinline__ int64_t rows_of(const cu_fgemv_args &a) { return a.pair ? a.rows0 : a.rows0 + a.rows1; }
__device__ __forceinline__ int64_t chunks_of(const cu_mk_phase &p) { return (rows_of(p.fg) + p.rpc - 1) / p.rpc; }

/* The producer (one thread): every chunk of this block, phase after phase. */
__device__ void produce_all(const mk_params &P, char *ring, uint64_t *full, uint64_t *empty)
{
    uint32_t seq = 0;
    for (int i = 0; i < P.np; i++) {
        const cu_mk_phase &p = P.ph[i];
        if (p.kind != CU_MK_GEMV) continue;
        const cu_fgemv_args &a = p.fg;
        const int64_t R = rows_of(a), nch = chunks_of(p);
        const uint8_t *w0 = (const uint8_t *)a.w0, *w1 = (const uint8_t *)a.w1;
        const uint32_t rb = (uint32_t)a.row_bytes;
        for (int64_t c = blockIdx.x; c < nch; c += gridDim.x, seq++) {
            const int s = (int)(seq % (uint32_t)P.slots);
            if (seq >= (uint32_t)P.slots) mbar_wait(&empty[s], ((seq / (uint32_t)P.slots) - 1) & 1u);
            char *slot = ring + (size_t)s * P.slot_bytes;
            const int64_t r = c * p.rpc;
            const int64_t nr = R - r < p.rpc ? R - r : p.rpc;
            if (a.pair) {
                mbar_expect(&full[s], (uint32_t)(2 * nr * rb));
                bulk_load(slot, w0 + r * a.row_bytes, (uint32_t)(nr * rb), &full[s]);
                bulk_load(slot + nr * rb, w1 + r * a.row_bytes, (uint32_t)(nr * rb), &full[s]);
                continue;
            }
            mbar_expect(&full[s], (uint32_t)(nr * rb));
            const int64_t in0 = r < a.rows0 ? (a.rows0 - r < nr ? a.rows0 - r : nr) : 0; /* rows from w0 */
            if (in0 > 0) bulk_load(slot, w0 + r * a.row_bytes, (uint32_t)(in0 * rb), &full[s]);
            if (nr - in0 > 0)
                bulk_load(slot + in0 * rb, w1 + (r + in0 - a.rows0) * a.row_bytes, (uint32_t)((nr - in0) * rb),
                          &full[s]);
        }
    }
}

/* ---- GEMV phase ------------------------------------------------------------------- */

/* x (RMS-normalised when a.nw; block 0 also writes it to a.xn) into shared
 * memory by units of VPU float4s, transposed (cuda_fmt.cuh). x was written
 * by other blocks in this launch: read through L2. */
template <int VPU>
__device__ void load_x(const cu_fgemv_args &a, float4 *xs4, float *red)
{
    const int c4 = a.cols / 4, nvec = c4 / VPU;
    const float4 *x4 = (const float4 *)a.x;
    float ss = 0.0f; /* (the same float operations as load_norm_x: the graph path's numbers) */
    for (int j = threadIdx.x; j < c4; j += MK_CT) {
        const float4 t = __ldcg(x4 + j);
        ss = fmaf(t.x, t.x, ss);
        ss = fmaf(t.y, t.y, ss);
        ss = fmaf(t.z, t.z, ss);
        ss = fmaf(t.w, t.w, ss);
        xs4[(j % VPU) * nvec + j / VPU] = t;
    }
    if (a.nw) {
        ss = warp_sum(ss);
        if (threadIdx.x % WARP == 0) red[threadIdx.x / WARP] = ss;
        cons_sync();
        float tot = 0.0f;
        for (int w = 0; w < 8; w++) tot += red[w]; /* load_norm_x's 8 warps of 256 threads, in order */
        const float inv = 1.0f / sqrtf(tot / (float)a.cols + a.eps);
        const float4 *nw4 = (const float4 *)a.nw;
        float4 *xn4 = blockIdx.x == 0 && a.xn ? (float4 *)a.xn : NULL;
        for (int j = threadIdx.x; j < c4; j += MK_CT) {
            float4 t = xs4[(j % VPU) * nvec + j / VPU];
            const float4 w = __ldg(nw4 + j);
            t.x = t.x * inv * w.x;
            t.y = t.y * inv * w.y;
            t.z = t.z * inv * w.z;
            t.w = t.w * inv * w.w;
            xs4[(j % VPU) * nvec + j / VPU] = t;
            if (xn4) xn4[j] = t;
        }
    }
    cons_sync();
}

/* Rows a warp multiplies together in a single matrix (so each x value it
 * reads serves all of them): the format's, as fgemv. A gate / up pair is
 * always one row of each. */
template <typename F>
__host__ __device__ constexpr int mk_rw(bool pair)
{
    return pair ? 2 : F::RW_SINGLE;
}

/* One GEMV phase: this block's chunks in order. A chunk holds rpc rows (row
 * pairs when a.pair: rpc gate rows, then rpc up rows); warp w takes row set
 * w / ks (RW consecutive rows, or one pair) and the (w % ks)-th of ks unit
 * segments; row sets of ks > 1 meet in `part` (double-buffered by chunk). */
template <typename F, bool PAIR>
__device__ void run_gemv(const mk_params &P, const cu_mk_phase &p, uint32_t &seq, const char *ring,
                         uint64_t *full, uint64_t *empty, float4 *xs4, float (*part)[MK_CW][2], float *red)
{
    constexpr int NR = mk_rw<F>(PAIR); /* rows a warp */
    constexpr int RW = PAIR ? 1 : NR;  /* consecutive rows of the chunk a warp (pairs: 1 of each matrix) */
    const cu_fgemv_args a = p.fg; /* by value: the asm memory clobbers would reload fields */
    load_x<F::VALS / 4>(a, xs4, red);
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int ks = p.ks, rs = warp / ks, sg = warp % ks;
    const int nvec = a.cols / F::VALS;
    const int u0 = nvec * sg / ks, u1 = nvec * (sg + 1) / ks;
    const int64_t R = rows_of(a), nch = chunks_of(p);
    const float *xsum = NULL; /* (Q4_K's float path is not taken here) */
    for (int64_t c = blockIdx.x; c < nch; c += gridDim.x, seq++) {
        const int s = (int)(seq % (uint32_t)P.slots);
        const int64_t r0 = c * p.rpc;
        const int nr = (int)(R - r0 < p.rpc ? R - r0 : p.rpc);
        mbar_wait(&full[s], (seq / (uint32_t)P.slots) & 1u);
        const uint8_t *slot = (const uint8_t *)(ring + (size_t)s * P.slot_bytes);
        const uint8_t *row[NR];
        bool ok[NR];
#pragma unroll
        for (int q = 0; q < NR; q++) {
            const int r = PAIR ? rs + q * nr : rs * RW + q; /* the row's place in the slot */
            ok[q] = PAIR ? rs < nr : rs * RW + q < nr;
            row[q] = slot + (size_t)r * a.row_bytes;
        }
        float acc[NR][2];
#pragma unroll
        for (int q = 0; q < NR; q++) acc[q][0] = acc[q][1] = 0.0f;
        if (ok[0]) {
            int u = u0 + lane;
            for (; u + WARP < u1; u += 2 * WARP) { /* two chains a row */
#pragma unroll
                for (int q = 0; q < NR; q++) {
                    if (!ok[q]) continue;
                    acc[q][0] = F::dot(F::load_shared(row[q], u, a.cols), xs4, xsum, u, nvec, acc[q][0]);
                    acc[q][1] = F::dot(F::load_shared(row[q], u + WARP, a.cols), xs4, xsum, u + WARP, nvec, acc[q][1]);
                }
            }
            if (u < u1) {
#pragma unroll
                for (int q = 0; q < NR; q++)
                    if (ok[q]) acc[q][0] = F::dot(F::load_shared(row[q], u, a.cols), xs4, xsum, u, nvec, acc[q][0]);
            }
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[s]); /* the slot may be refilled */
        float sum[NR];
#pragma unroll
        for (int q = 0; q < NR; q++) sum[q] = warp_sum(acc[q][0] + acc[q][1]);
        int set = -1; /* the row set this thread finishes */
        if (ks == 1) {
            if (lane == 0 && ok[0]) set = rs;
        } else {
            if (lane == 0) {
#pragma unroll
                for (int q = 0; q < NR; q++) part[seq & 1][warp][q] = sum[q];
            }
            cons_sync();
            const int sets = MK_CW / ks;
            if ((int)threadIdx.x < sets) {
                set = threadIdx.x;
#pragma unroll
                for (int q = 0; q < NR; q++) {
                    sum[q] = 0.0f;
                    for (int k = 0; k < ks; k++) sum[q] += part[seq & 1][set * ks + k][q];
                }
            }
        }
        if (set < 0) continue;
        if constexpr (PAIR) {
            if (set < nr) {
                const int64_t r = r0 + set;
                a.out0[r] = gelu_erf(sum[0]) * sum[1];
                a.out1[r] = sum[1];
            }
        } else {
#pragma unroll
            for (int q = 0; q < NR; q++) {
                if (set * RW + q >= nr) break;
                const int64_t r = r0 + set * RW + q;
                if (r < a.rows0) {
                    a.out0[r] = sum[q];
                    if (a.resid) a.resid[r] = __ldcg(a.resid + r) + sum[q];
                } else {
                    a.out1[r - a.rows0] = sum[q];
                }
            }
        }
    }
}

__device__ void run_gemv_any(const mk_params &P, const cu_mk_phase &p, uint32_t &seq, const char *ring,
                             uint64_t *full, uint64_t *empty, float4 *xs4, float (*part)[MK_CW][2], float *red)
{
    if (p.dtype == CU_Q8_0) {
        if (p.fg.pair) run_gemv<fmt_q8_0, true>(P, p, seq, ring, full, empty, xs4, part, red);
        else run_gemv<fmt_q8_0, false>(P, p, seq, ring, full, empty, xs4, part, red);
    } else {
        if (p.fg.pair) run_gemv<fmt_bf16, true>(P, p, seq, ring, full, empty, xs4, part, red);
        else run_gemv<fmt_bf16, false>(P, p, seq, ring, full, empty, xs4, part, red);
    }
}

/* ---- EMBED phase (and the step's rope angles) -------------------------------- */

__device__ void run_embed(const mk_params &P, const cu_mk_phase &p)
{
    const int64_t id = *P.ids;
    const uint8_t *row = (const uint8_t *)p.table + id * p.row_bytes;
    const int64_t stride = (int64_t)gridDim.x * MK_CT;
    for (int64_t i = (int64_t)blockIdx.x * MK_CT + threadIdx.x; i < p.cols; i += stride) {
        float v;
        if (p.dtype == CU_BF16) v = __uint_as_float((uint32_t)((const uint16_t *)row)[i] << 16);
        else if (p.dtype == CU_F16) v = h2f(((const uint16_t *)row)[i]);
        else v = ((const float *)row)[i];
        p.out[i] = v;
    }
    /* cos/sin of this position for every rope class: angles in double, as
     * the rope kernels (inverse frequency theta^(-2j/R), R the rotary width) */
    const int64_t pos = *P.pos;
    for (int64_t i = (int64_t)blockIdx.x * MK_CT + threadIdx.x; i < P.n_cs; i += stride) {
        int k = 0;
        while (k + 1 < P.n_rope && i >= P.rope[k + 1].off) k++;
        const int j = (int)(i - P.rope[k].off), half = P.rope[k].half;
        float c, s;
        rope_cos_sin(pos, j, half, P.rope[k].theta, &c, &s);
        P.rope_cs[i] = make_float2(c, s);
    }
}

/* ---- ATTN phase ----------------------------------------------------------------- */

/* The key range of split sp of `splits` at this position: [*jb, *je). */
__device__ __forceinline__ void split_range(const cu_attn_args &a, int64_t pos, int splits, int sp, int64_t *jb,
                                            int64_t *je)
{
    int64_t lo = a.window ? pos - a.window + 1 : 0; /* sliding: 0 <= p - j < window */
    if (lo < 0) lo = 0;
    const int64_t per = (pos + 1 - lo + splits - 1) / splits;
    *jb = lo + (int64_t)sp * per;
    *je = *jb + per < pos + 1 ? *jb + per : pos + 1;
}

/* Splits of a KV head's keys at this position: enough for every split to
 * hold split_keys keys, at most a block each (and MK_MAX_SPLITS). */
__device__ __forceinline__ int splits_of(const mk_params &P, const cu_attn_args &a, int64_t pos)
{
    int64_t lo = a.window ? pos - a.window + 1 : 0;
    if (lo < 0) lo = 0;
    const int64_t keys = pos + 1 - lo;
    int64_t s = (keys + P.split_keys - 1) / P.split_keys;
    const int64_t most = (int64_t)gridDim.x / a.n_head_kv < MK_MAX_SPLITS ? gridDim.x / a.n_head_kv : MK_MAX_SPLITS;
    if (s > most) s = most;
    return s < 1 ? 1 : (int)s;
}

/* One work item = (KV head kh, key split sp of `splits`): the G query heads
 * of kh over the split's keys; lanes hold E interleaved dims (d = lane + 32 e).
 * Called after the qkv phase is done (the caller waited). */
template <int E>
__device__ void attn_item(const mk_params &P, const cu_mk_phase &p, int ph_index, int kh, int sp, int splits,
                          float *work, float *red)
{
    const cu_attn_args &a = p.at;
    const int D = a.head_dim, G = a.n_head / a.n_head_kv;
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int64_t q_dim = (int64_t)a.n_head * D, kv_dim = (int64_t)a.n_head_kv * D;
    const int64_t pos = *a.pos;
    int64_t jb, je;
    split_range(a, pos, splits, sp, &jb, &je);
    const bool owner = jb <= pos && pos < je; /* this split holds the new key: it stores k / v */
    const float2 *cs = P.rope_cs + P.rope[p.rope_class].off;
    const int half = P.rope[p.rope_class].half;
    float *kc = (float *)a.kc, *vc = (float *)a.vc;

    /* shared: raw / roped q [G][D], k_now [D], v_now [D], gate [G], then the warps' states */
    float *qs = work, *kn = qs + MK_GMAX * D, *vn = kn + D, *gs = vn + D;
    typedef float warp_vals[MK_CW][MK_GMAX];
    warp_vals &sm_m = *reinterpret_cast<warp_vals *>(gs + MK_GMAX);
    warp_vals &sm_l = *reinterpret_cast<warp_vals *>(gs + MK_GMAX + MK_CW * MK_GMAX);
    float(&sm_acc)[MK_CW][MK_GMAX][E * WARP] =
        *reinterpret_cast<float(*)[MK_CW][MK_GMAX][E * WARP]>(gs + MK_GMAX + 2 * MK_CW * MK_GMAX);

    /* q of the G heads, and (owner) the new k / v, and the gates: one round trip */
    const float *qsrc = a.qkv + (int64_t)kh * G * D;
    for (int i = threadIdx.x; i < G * D; i += MK_CT) qs[i] = __ldcg(qsrc + i);
    if (owner)
        for (int d = threadIdx.x; d < D; d += MK_CT) {
            kn[d] = __ldcg(a.qkv + q_dim + (int64_t)kh * D + d);
            vn[d] = __ldcg(a.qkv + q_dim + kv_dim + (int64_t)kh * D + d);
        }
    if (a.gate && (int)threadIdx.x < G) gs[threadIdx.x] = __ldcg(a.gate + kh * G + threadIdx.x);
    cons_sync();
    /* rope (pairs (j, j + half), j < half), q scaled: each thread a pair */
    for (int i = threadIdx.x; i < (G + (owner ? 1 : 0)) * half; i += MK_CT) {
        const int h = i / half, j = i % half;
        float *v = h < G ? qs + h * D : kn;
        const float2 c = __ldcg(cs + j); /* written by the EMBED phase of this launch */
        const float x0 = v[j], x1 = v[j + half];
        v[j] = x0 * c.x - x1 * c.y;
        v[j + half] = x1 * c.x + x0 * c.y;
    }
    cons_sync();
    if (owner) {
        const int64_t off = (pos % a.slots) * kv_dim + (int64_t)kh * D;
        for (int d = threadIdx.x; d < D; d += MK_CT) {
            kc[off + d] = kn[d];
            vc[off + d] = vn[d];
        }
    }

    float q[MK_GMAX][E], acc[MK_GMAX][E], m[MK_GMAX], l[MK_GMAX];
#pragma unroll
    for (int g = 0; g < MK_GMAX; g++) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
#pragma unroll
        for (int e = 0; e < E; e++) {
            const int d = lane + WARP * e;
            q[g][e] = g < G && d < D ? qs[g * D + d] * a.scale : 0.0f;
            acc[g][e] = 0.0f;
        }
    }
    for (int64_t j0 = jb + (int64_t)warp * MK_KT; j0 < je; j0 += (int64_t)MK_CW * MK_KT) {
        float k[MK_KT][E], v[MK_KT][E];
#pragma unroll
        for (int u = 0; u < MK_KT; u++) {
            const int64_t j = j0 + u;
            const bool in = j < je, now = j == pos;
            const int64_t off = (j % a.slots) * kv_dim + (int64_t)kh * D;
#pragma unroll
            for (int e = 0; e < E; e++) {
                const int d = lane + WARP * e;
                const bool ok = in && d < D;
                k[u][e] = !ok ? 0.0f : now ? kn[d] : __ldcg(kc + off + d);
                v[u][e] = !ok ? 0.0f : now ? vn[d] : __ldcg(vc + off + d);
            }
        }
        att_tile<MK_KT, E, MK_GMAX>(q, k, v, G, je - j0, acc, m, l);
    }
    att_store_warp<MK_CW, E, MK_GMAX>(sm_m, sm_l, sm_acc, warp, lane, m, l, acc);
    cons_sync();
    /* the block's state per (head, dim): final when one split, else a partial */
    for (int i = threadIdx.x; i < G * D; i += MK_CT) {
        const int g = i / D, d = i % D;
        float M, L, A;
        att_merge_warps<MK_CW, E, MK_GMAX>(sm_m, sm_l, sm_acc, g, d, &M, &L, &A);
        if (splits == 1) {
            float o = L > 0.0f ? A / L : 0.0f;
            if (a.gate) o *= 1.0f / (1.0f + expf(-gs[g]));
            a.out[(int64_t)(kh * G + g) * D + d] = o;
            continue;
        }
        float *w = P.ws + ((int64_t)(kh * G + g) * splits + sp) * (D + 2);
        if (d == 0) {
            w[0] = M;
            w[1] = L;
        }
        w[2 + d] = A;
    }
    cons_sync();
    if (splits > 1) { /* the last split of this KV head to finish merges the G heads */
        if (threadIdx.x == 0) {
            __threadfence();
            const int done = atomicAdd(&P.acnt[kh], 1);
            red[0] = done == splits - 1 ? 1.0f : 0.0f;
            if (done == splits - 1) {
                P.acnt[kh] = 0; /* for the next ATTN phase (it starts after this one is done) */
                __threadfence();
            }
        }
        cons_sync();
        if (red[0] == 0.0f) return;
        /* thread t: dim t % D of head t / D (and the heads MK_CT / D later);
         * the splits' states merged online, 8 splits' loads at a time */
        for (int i = threadIdx.x; i < G * D; i += MK_CT) {
            const int g = i / D, d = i % D;
            const float *base = P.ws + (int64_t)(kh * G + g) * splits * (D + 2);
            float M = -INFINITY, L = 0.0f, A = 0.0f;
            for (int s0 = 0; s0 < splits; s0 += 8) {
                float ms[8], ls[8], as[8];
#pragma unroll
                for (int u = 0; u < 8; u++) {
                    const bool in = s0 + u < splits;
                    const float *b = base + (int64_t)(s0 + u) * (D + 2);
                    ms[u] = in ? __ldcg(b) : -INFINITY;
                    ls[u] = in ? __ldcg(b + 1) : 0.0f;
                    as[u] = in ? __ldcg(b + 2 + d) : 0.0f;
                }
#pragma unroll
                for (int u = 0; u < 8; u++) {
                    if (ms[u] == -INFINITY) continue;
                    const float mn = fmaxf(M, ms[u]);
                    const float c = M == -INFINITY ? 0.0f : expf(M - mn), f = expf(ms[u] - mn);
                    L = L * c + ls[u] * f;
                    A = A * c + as[u] * f;
                    M = mn;
                }
            }
            float o = L > 0.0f ? A / L : 0.0f;
            if (a.gate) o *= 1.0f / (1.0f + expf(-gs[g]));
            a.out[(int64_t)(kh * G + g) * D + d] = o;
        }
        cons_sync();
    }
    if (threadIdx.x == 0) signal_phase(P, ph_index);
}

/* Pull a split's cache rows (not the position's: it is written this step)
 * into L2, before the wait: they are constant until this phase runs. */
__device__ void attn_prefetch(const cu_attn_args &a, int64_t pos, int kh, int splits, int sp)
{
    int64_t jb, je;
    split_range(a, pos, splits, sp, &jb, &je);
    const int64_t kv_dim = (int64_t)a.n_head_kv * a.head_dim;
    const uint32_t bytes = (uint32_t)a.head_dim * 4;
    if (bytes % 16) return;
    for (int64_t j = jb + threadIdx.x / 2; j < je; j += MK_CT / 2) {
        if (j == pos) continue;
        const float *base = (threadIdx.x & 1 ? a.vc : a.kc) + (j % a.slots) * kv_dim + (int64_t)kh * a.head_dim;
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(base), "r"(bytes) : "memory");
    }
}

__device__ void run_attn(const mk_params &P, const cu_mk_phase &p, int i, float *work, float *red)
{
    const cu_attn_args &a = p.at;
    const int64_t pos = *a.pos;
    const int splits = splits_of(P, a, pos);
    const int items = a.n_head_kv * splits;
    const bool mine = (int)blockIdx.x < items;
    if (mine) attn_prefetch(a, pos, blockIdx.x / splits, splits, blockIdx.x % splits);
    wait_phase(P, i - 1);
    if (!mine) return;
    const int kh = blockIdx.x / splits, sp = blockIdx.x % splits;
    switch ((a.head_dim + 31) / 32) {
    case 1: attn_item<1>(P, p, i, kh, sp, splits, work, red); break;
    case 2: attn_item<2>(P, p, i, kh, sp, splits, work, red); break;
    case 3: attn_item<3>(P, p, i, kh, sp, splits, work, red); break;
    case 4: attn_item<4>(P, p, i, kh, sp, splits, work, red); break;
    case 5: attn_item<5>(P, p, i, kh, sp, splits, work, red); break;
    case 6: attn_item<6>(P, p, i, kh, sp, splits, work, red); break;
    case 7: attn_item<7>(P, p, i, kh, sp, splits, work, red); break;
    default: attn_item<8>(P, p, i, kh, sp, splits, work, red); break;
    }
}

/* ---- the kernel ------------------------------------------------------------------- */

/* (168 registers: 9 warps put 3 on one of the SM's four 16K-register
 * quarters; a cap of 208 left no block an SM, and the attention spills
 * ~150 bytes at 168) */
__global__ void __launch_bounds__(MK_THREADS, 1) step_kernel(mk_params P)
{
    extern __shared__ __align__(128) char smem[];
    char *ring = smem;                                           /* slots x slot_bytes */
    float *work = (float *)(smem + (size_t)P.slots * P.slot_bytes); /* x, or the attention's areas */
    __shared__ uint64_t full[MK_MAX_SLOTS], empty[MK_MAX_SLOTS];
    __shared__ float part[2][MK_CW][2];
    __shared__ float red[MK_CW];

    if (threadIdx.x == 0) {
        for (int s = 0; s < P.slots; s++) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], MK_CW);
        }
        mbar_fence_init();
    }
    __syncthreads();
    if (threadIdx.x >= MK_CT) { /* the producer warp */
        if (threadIdx.x == MK_CT) produce_all(P, ring, full, empty);
        return;
    }
    uint32_t seq = 0;
    const bool prof = P.prof && blockIdx.x == 0 && threadIdx.x == 0;
    for (int i = 0; i < P.np; i++) {
        const cu_mk_phase &p = P.ph[i];
        const unsigned long long t0 = prof ? gtime() : 0;
        unsigned long long t1 = t0;
        if (p.kind == CU_MK_ATTN) {
            run_attn(P, p, i, work, red); /* waits for phase i - 1 itself, after its prefetch */
        } else {
            if (i > 0) wait_phase(P, i - 1);
            t1 = prof ? gtime() : 0;
            if (p.kind == CU_MK_GEMV) run_gemv_any(P, p, seq, ring, full, empty, (float4 *)work, part, red);
            else run_embed(P, p);
            cons_sync(); /* this block's outputs are written */
            if (threadIdx.x == 0) signal_phase(P, i);
        }
        if (prof) {
            const unsigned long long t2 = gtime();
            P.prof[2 * i] += t1 - t0;
            P.prof[2 * i + 1] += t2 - t1;
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
    void *d_mem; /* counters, partials, angle table: one allocation */
};

static int env_int(const char *name, int dflt)
{
    const char *v = getenv(name);
    return v && atoi(v) > 0 ? atoi(v) : dflt;
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

/* Rows a chunk (row pairs for a gate / up pair): the most that fit a slot
 * with every warp busy, i.e. rows a warp (mk_rw) times a power of two up to
 * the consumer warps; the warps a row set then share is ks. */
static void chunk_shape(cu_mk_phase &p, int slot_bytes)
{
    const cu_fgemv_args &a = p.fg;
    const int rw = a.pair ? 1 : (p.dtype == CU_Q8_0 ? mk_rw<fmt_q8_0>(false) : mk_rw<fmt_bf16>(false));
    const int64_t set_bytes = a.row_bytes * (a.pair ? 2 : rw);
    int sets = MK_CW;
    while (sets > 1 && sets * set_bytes > slot_bytes) sets /= 2;
    p.rpc = sets * rw;
    p.ks = MK_CW / sets;
}

/* Check a phase and fill its launch fields; false: not taken. */
static bool take_phase(cu_mk_phase &p, int i, int slot_bytes, mk_params &P, size_t *work, int *max_heads,
                       int *max_kv, int *max_d, int sms)
{
    if (p.kind == CU_MK_GEMV) {
        const cu_fgemv_args &a = p.fg;
        /* bf16, or Q8_0 in cu_repack_rows' layout (quants, then the scales) */
        const bool bf16 = p.dtype == CU_BF16 && a.cols % 8 == 0 && a.row_bytes == (int64_t)a.cols * 2;
        const bool q8 = p.dtype == CU_Q8_0 && a.cols % 32 == 0 && a.row_bytes == (int64_t)a.cols / 32 * 34;
        if (a.stamps || a.steer_dir || !(bf16 || q8) || a.row_bytes % 16 || a.cols % 16 ||
            a.row_bytes * 2 > slot_bytes || (uintptr_t)a.w0 % 16 || (a.w1 && (uintptr_t)a.w1 % 16) ||
            (uintptr_t)a.x % 16 || (a.nw && (uintptr_t)a.nw % 16) || (a.xn && (uintptr_t)a.xn % 16))
            return false;
        chunk_shape(p, slot_bytes);
        const size_t xb = (size_t)a.cols * sizeof(float);
        if (xb > *work) *work = xb;
        return true;
    }
    if (p.kind == CU_MK_ATTN) {
        cu_attn_args &a = p.at;
        const int G = a.n_head_kv > 0 ? a.n_head / a.n_head_kv : 0;
        if (a.n != 1 || G < 1 || G > MK_GMAX || a.n_head % a.n_head_kv || a.head_dim > 256 ||
            p.rot_dims > a.head_dim || p.rot_dims % 2 || (a.window && a.slots < a.window) || i == 0 ||
            a.n_head_kv > sms)
            return false;
        int k = 0; /* the rope class */
        while (k < P.n_rope && !(P.rope[k].half == p.rot_dims / 2 && P.rope[k].theta == p.theta)) k++;
        if (k == P.n_rope) {
            if (P.n_rope == MK_MAX_ROPE) return false;
            P.rope[k].half = p.rot_dims / 2;
            P.rope[k].theta = p.theta;
            P.rope[k].off = P.n_cs;
            P.n_cs += p.rot_dims / 2;
            P.n_rope++;
        }
        p.rope_class = k;
        const int E = (a.head_dim + 31) / 32;
        const size_t ab = ((size_t)(MK_GMAX + 2) * a.head_dim + MK_GMAX + 2 * MK_CW * MK_GMAX +
                           (size_t)MK_CW * MK_GMAX * E * WARP) *
                          sizeof(float);
        if (ab > *work) *work = ab;
        int most = sms / a.n_head_kv < MK_MAX_SPLITS ? sms / a.n_head_kv : MK_MAX_SPLITS;
        if (a.n_head * most > *max_heads) *max_heads = a.n_head * most;
        if (a.n_head_kv > *max_kv) *max_kv = a.n_head_kv;
        if (a.head_dim > *max_d) *max_d = a.head_dim;
        return true;
    }
    return p.kind == CU_MK_EMBED && i == 0 && (p.dtype == CU_BF16 || p.dtype == CU_F16 || p.dtype == CU_F32);
}

/* SPARK_CUDA_VERBOSE: why the step is not taken (the graph path runs it instead) */
static void refuse(const char *why, int phase, cudaError_t e)
{
    cudaGetLastError();
    if (!getenv("SPARK_CUDA_VERBOSE")) return;
    if (e != cudaSuccess) fprintf(stderr, "spark: persistent step not used: %s: %s\n", why, cudaGetErrorString(e));
    else if (phase >= 0) fprintf(stderr, "spark: persistent step not used: phase %d: %s\n", phase, why);
    else fprintf(stderr, "spark: persistent step not used: %s\n", why);
}

cu_mega *cu_mega_create(const cu_mk_phase *phases, int np, int sms, int64_t *d_pos, const int32_t *d_ids)
{
    if (np <= 0 || sms <= 0 || phases[0].kind != CU_MK_EMBED) { /* embed also makes the rope angles */
        refuse("the step does not start with the embedding", -1, cudaSuccess);
        return NULL;
    }
    cu_mk_phase *ph = (cu_mk_phase *)malloc((size_t)np * sizeof *ph);
    if (!ph) return NULL;
    memcpy(ph, phases, (size_t)np * sizeof *ph);
    mk_params P;
    memset(&P, 0, sizeof P);
    /* SPARK_CUDA_MEGA_SLOT (KB) / _SLOTS: the ring's shape (bench/flow_probe.cu) */
    P.slot_bytes = env_int("SPARK_CUDA_MEGA_SLOT", 40) * 1024;
    P.split_keys = env_int("SPARK_CUDA_MEGA_SPLIT_KEYS", 64);
    size_t work = 0;
    int max_heads = 0, max_kv = 0, max_d = 0;
    bool ok = true;
    for (int i = 0; i < np && ok; i++) {
        ok = take_phase(ph[i], i, P.slot_bytes, P, &work, &max_heads, &max_kv, &max_d, sms);
        if (!ok) refuse(ph[i].kind == CU_MK_GEMV ? "a matrix it does not take (format, shape, alignment, instruments)"
                        : ph[i].kind == CU_MK_ATTN ? "an attention it does not take" : "an unknown phase",
                        i, cudaSuccess);
    }
    work = (work + 127) / 128 * 128;
    int slots = (int)((MK_SMEM_LIMIT - 2048 - (int64_t)work) / P.slot_bytes);
    const int want = env_int("SPARK_CUDA_MEGA_SLOTS", MK_MAX_SLOTS);
    if (slots > want) slots = want;
    if (slots > MK_MAX_SLOTS) slots = MK_MAX_SLOTS;
    if (!ok || slots < 2) {
        if (ok) refuse("no room for a ring of two slots", -1, cudaSuccess);
        free(ph);
        return NULL;
    }
    /* device memory: counters, split counters, partials, cos/sin table, profile */
    const size_t off_acnt = ((size_t)np * sizeof(unsigned) + 255) / 256 * 256;
    const size_t off_ws = off_acnt + ((size_t)(max_kv > 0 ? max_kv : 1) * sizeof(int) + 255) / 256 * 256;
    const size_t ws_bytes = (size_t)max_heads * (size_t)(max_d + 2) * sizeof(float);
    const size_t off_cs = (off_ws + ws_bytes + 255) / 256 * 256;
    const size_t off_prof = (off_cs + (size_t)(P.n_cs > 0 ? P.n_cs : 1) * sizeof(float2) + 255) / 256 * 256;
    const bool prof = getenv("SPARK_CUDA_MEGA_PROF") != NULL;
    const size_t total = off_prof + (prof ? (size_t)np * 2 * sizeof(unsigned long long) : 0);
    cu_mega *mk = (cu_mega *)calloc(1, sizeof *mk);
    if (!mk) {
        free(ph);
        return NULL;
    }
    char *mem = NULL;
    cudaError_t e = cudaMalloc((void **)&mem, total);
    if (e == cudaSuccess) e = cudaMemset(mem, 0, total);
    if (e == cudaSuccess) e = cudaMalloc((void **)&mk->d_ph, (size_t)np * sizeof *ph);
    if (e == cudaSuccess) e = cudaMemcpy(mk->d_ph, ph, (size_t)np * sizeof *ph, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) {
        refuse("device memory", -1, e);
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
    P.cnt = (unsigned *)mem;
    P.acnt = (int *)(mem + off_acnt);
    P.ws = (float *)(mem + off_ws);
    P.rope_cs = (float2 *)(mem + off_cs);
    P.slots = slots;
    P.work_bytes = (int)work;
    mk->P = P;
    mk->smem = (size_t)slots * P.slot_bytes + work;
    mk->sms = sms;
    e = cudaFuncSetAttribute(step_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)mk->smem);
    int per_sm = 0;
    if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, step_kernel, MK_THREADS, mk->smem);
    if (e != cudaSuccess || per_sm < 1) {
        refuse(e != cudaSuccess ? "the kernel's shared memory / occupancy" : "no block fits an SM", -1, e);
        cu_mega_destroy(mk);
        return NULL;
    }
    if (getenv("SPARK_CUDA_VERBOSE"))
        fprintf(stderr, "spark: persistent step: %d phases, %d blocks, ring %d x %d KB, %zu KB shared, split keys %d\n",
                np, sms, slots, P.slot_bytes / 1024, mk->smem / 1024, P.split_keys);
    return mk;
}

cudaError_t cu_mega_launch(cu_mega *mk, cudaStream_t st)
{
    mk->P.epoch = (unsigned)++mk->launches;
    void *args[] = {&mk->P};
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
    double wait[3] = {0, 0, 0}, work[3] = {0, 0, 0};
    int count[3] = {0, 0, 0};
    for (int i = 0; i < np; i++) {
        const int k = mk->kinds[i] < 3 && mk->kinds[i] >= 0 ? mk->kinds[i] : 0;
        wait[k] += (double)h[2 * i];
        work[k] += (double)h[2 * i + 1];
        count[k]++;
    }
    double all = 0;
    for (int k = 0; k < 3; k++) all += work[k] + wait[k];
    fprintf(stderr, "spark: persistent step profile (block 0, %ld steps): %.1f us a step\n", mk->launches,
            all / 1e3 / (double)mk->launches);
    for (int k = 0; k < 3; k++)
        if (count[k])
            fprintf(stderr, "spark:   %-5s x%3d: wait %8.1f us, work %8.1f us a step\n", names[k], count[k],
                    wait[k] / 1e3 / (double)mk->launches, work[k] / 1e3 / (double)mk->launches);
    if (getenv("SPARK_CUDA_MEGA_PROF")[0] == '2')
        for (int i = 0; i < np; i++)
            fprintf(stderr, "spark:   phase %3d %-5s wait %7.2f us work %7.2f us\n", i, names[mk->kinds[i] % 3],
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

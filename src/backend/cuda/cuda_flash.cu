/*
 * cuda_flash.cu — tiled tensor-core attention for prefill chunks (issue 6
 * item 3): n query tokens at positions pos0.., causal or sliding
 * (0 <= p - j < window), GQA, keys before pos0 from the cache (ring slot
 * j % slots; float32, or f16 / bf16 rows staged as their 16-bit elements),
 * the chunk's own keys from the qkv buffer (rounded to a 16-bit cache's
 * format, as they will be stored); an online softmax per query row, so no
 * n x keys matrix exists anywhere.
 *
 * Layout of the work. A block owns FL_BM = 64 query rows of ONE kv head:
 * row R of kv head kh is token R / G, query head kh * G + R % G (G = n_head /
 * n_head_kv), so every key/value tile a block loads serves all the heads of
 * its group. Each of 4 row groups owns 16 rows (one m16 tile of mma.sync
 * m16n8k16); for head_dim > 128 a row group is two warps, each taking half
 * of the dims (its half of q.k, summed with the other's through shared
 * memory, and its half of the output), which halves the output registers
 * and puts 8 warps on an SM whose shared memory holds one block. Key tiles
 * of BN keys stream through shared memory: the float32 rows are copied by
 * cp.async into a staging buffer while the previous tile is being
 * multiplied, then split into bf16 hi + lo halves.
 *
 * An f16 cache prefills 512 tokens of the 4B shape at 21.4k tok/s this way
 * against 18.4k through the coded kernels, 8192 at 17.3k against 10.5k
 * (H100, bench/cuda_runs.md run 41; f32: 21.9k / 17.5k).
 *
 * Measured (H200, 4B shape, bench/cuda_runs.md run 4): logits vs the CPU
 * within 9.1e-5 relative L2 (1500 tokens, 4 layers), test shapes 2.4e-5;
 * 51 TFLOP/s of useful attention work at 32k (153 TFLOP/s on the tensor
 * cores with the three products): mma.sync, not wgmma, and latency-bound
 * at 8 warps an SM.
 *
 * Precision. bf16 inputs alone would cost ~3e-3 relative in the scores; each
 * operand x is held as hi = bf16(x), lo = bf16(x - hi) (x == hi + lo to
 * ~2^-17) and a product A.B is taken as Ah.Bh + Ah.Bl + Al.Bh with fp32
 * accumulation (the dropped Al.Bl is ~2^-18 relative): S = Q.K^T that way,
 * and O += P.V likewise with P = exp2(S - m) split the same way. Scores are
 * kept in log2 units (q is scaled by head_dim^-0.5 * log2(e) before the
 * split) so the softmax uses exp2.
 *
 * Long key ranges with few row blocks are cut into key splits (flash-
 * decoding style): each split leaves (max, sum, unnormalised output) per
 * row in a workspace and a merge kernel combines them, applying the gate.
 */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_kv.h"

#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

namespace {

using spark_dev::kv_f;
using spark_dev::kv_of;
using spark_dev::smem_u32;

constexpr int FL_WARPS = 4, FL_BM = 16 * FL_WARPS; /* row groups of 16; each is 1 or 2 warps (NS) */
constexpr float LOG2E = 1.4426950408889634f;

template <int DP> struct fl_cfg {
    static constexpr int BN = DP >= 128 ? 32 : 64;   /* keys per tile */
    static constexpr int NS = DP >= 256 ? 2 : 1;     /* warps per row group: each takes DP / NS of the dims */
    static constexpr int THREADS = FL_WARPS * NS * 32;
    static constexpr int DW = DP / NS;               /* dims per warp */
    static constexpr int SX_FLOATS = NS > 1 ? NS * FL_WARPS * (BN / 2) * 32 : 0; /* partial scores exchanged */
    static constexpr int LD = DP + 8;                /* bf16 per smem row: 16-byte rows, conflict-free ldmatrix */
    static constexpr int Q_ELEMS = FL_BM * LD;       /* one of Qh, Ql */
    static constexpr int KV_ELEMS = BN * LD;         /* one of Kh, Kl, Vh, Vl */
    static constexpr int ST_FLOATS = BN * DP;        /* one of the float32 staging tiles (K, V) */
    static constexpr size_t SMEM = (size_t)(2 * Q_ELEMS + 4 * KV_ELEMS) * 2 + (size_t)(2 * ST_FLOATS + SX_FLOATS) * 4;
};

__device__ __forceinline__ void ldsm_x4(uint32_t r[4], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}

__device__ __forceinline__ void ldsm_x4_t(uint32_t r[4], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}

/* c += a (16x16, row) . b (16x8, col), bf16 in, fp32 accumulate */
__device__ __forceinline__ void mma16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* 16 bytes global -> shared, zero-filled when !valid (nothing is read then) */
__device__ __forceinline__ void cp16(void *dst, const void *src, bool valid)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_u32(dst)), "l"(src),
                 "r"(valid ? 16 : 0));
}
/* 8 bytes global -> shared (four 16-bit cache elements) */
__device__ __forceinline__ void cp8(void *dst, const void *src)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(smem_u32(dst)), "l"(src));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;"); }
__device__ __forceinline__ void cp_wait_all() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }

__device__ __forceinline__ uint32_t bf2_bits(__nv_bfloat162 v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    return u;
}

/* (a, b) -> hi = bf16x2(a, b), lo = bf16x2 of the remainders; a in the low half */
__device__ __forceinline__ void split2(float a, float b, uint32_t &hi, uint32_t &lo)
{
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    float2 f = __bfloat1622float2(h);
    hi = bf2_bits(h);
    lo = bf2_bits(__floats2bfloat162_rn(a - f.x, b - f.y));
}

__device__ __forceinline__ void split4_store(__nv_bfloat16 *hi, __nv_bfloat16 *lo, float4 v)
{
    uint2 h, l;
    split2(v.x, v.y, h.x, l.x);
    split2(v.z, v.w, h.y, l.y);
    *(uint2 *)hi = h;
    *(uint2 *)lo = l;
}

/* Dims d..d+3 of a staged key (or value) row of a 16-bit cache (KV) as
 * float: a cached row is staged as its elements; the chunk's own rows
 * (staged from the qkv rows in f32) are rounded to the cache's format here,
 * as they will be stored and as the CPU attends to them. */
template <typename KV>
__device__ __forceinline__ float4 staged4(const float *row, int d, bool from_cache)
{
    if (from_cache) {
        const KV *e = (const KV *)row + d;
        return make_float4(kv_f(e[0]), kv_f(e[1]), kv_f(e[2]), kv_f(e[3]));
    }
    float4 v = *(const float4 *)(row + d);
    return make_float4(kv_f(kv_of<KV>(v.x)), kv_f(kv_of<KV>(v.y)), kv_f(kv_of<KV>(v.z)), kv_f(kv_of<KV>(v.w)));
}

/* One block: FL_BM rows of kv head blockIdx.y, key split blockIdx.z. KV:
 * the cache's element type (float, __half, __nv_bfloat16). */
template <int DP, typename KV>
__global__ void __launch_bounds__(fl_cfg<DP>::THREADS) flash_kernel(cu_attn_args a)
{
    using C = fl_cfg<DP>;
    constexpr int BN = C::BN, LD = C::LD, V4 = DP / 4, NT = C::THREADS, NS = C::NS, DW = C::DW;
    extern __shared__ __align__(16) unsigned char fl_smem[];
    __nv_bfloat16 *Qh = (__nv_bfloat16 *)fl_smem, *Ql = Qh + C::Q_ELEMS;
    __nv_bfloat16 *Kh = Ql + C::Q_ELEMS, *Kl = Kh + C::KV_ELEMS, *Vh = Kl + C::KV_ELEMS, *Vl = Vh + C::KV_ELEMS;
    float *stK = (float *)(Vl + C::KV_ELEMS), *stV = stK + C::ST_FLOATS, *Sx = stV + C::ST_FLOATS;

    const int D = a.head_dim, G = a.n_head / a.n_head_kv, kh = blockIdx.y, split = blockIdx.z;
    const int tid = threadIdx.x, lane = tid % 32;
    /* warp -> row group rg (16 rows) and dim part hf (dims hf * DW .. + DW) */
    const int rg = (tid / 32) % FL_WARPS, hf = (tid / 32) / FL_WARPS, d_lo = hf * DW;
    const int64_t rows = (int64_t)a.n * G;
    const int64_t R0 = (int64_t)(gridDim.x - 1 - blockIdx.x) * FL_BM; /* the longest key ranges first */
    const int64_t q_dim = (int64_t)a.n_head * D, kv_dim = (int64_t)a.n_head_kv * D;
    const int64_t pos0 = *a.pos;
    const int64_t R_last = (R0 + FL_BM < rows ? R0 + FL_BM : rows) - 1;
    const int64_t p_min = pos0 + R0 / G, p_max = pos0 + R_last / G;

    /* this block's keys: [j_lo, j_hi), cut into equal splits of whole tiles */
    int64_t j_lo = a.window ? p_min - a.window + 1 : 0;
    if (j_lo < 0) j_lo = 0;
    const int64_t j_hi = p_max + 1;
    int64_t per = (j_hi - j_lo + a.splits - 1) / a.splits;
    per = (per + BN - 1) / BN * BN;
    const int64_t s_begin = j_lo + (int64_t)split * per;
    const int64_t s_end = s_begin + per < j_hi ? s_begin + per : j_hi;
    const int tiles = s_end > s_begin ? (int)((s_end - s_begin + BN - 1) / BN) : 0;

    /* staging copy of tile `it` (keys s_begin + it * BN ..) */
    auto issue = [&](int it) {
        const int64_t jt = s_begin + (int64_t)it * BN;
        for (int i = tid; i < BN * V4; i += NT) {
            int kk = i / V4, d = (i % V4) * 4;
            int64_t j = jt + kk;
            bool ok = j < s_end && d < D;
            if constexpr (sizeof(KV) == 2) {
                if (ok && j < pos0) { /* a cached 16-bit row: staged as it is, half the bytes */
                    int64_t slot = j < a.slots ? j : j % a.slots;
                    int64_t off = slot * kv_dim + (int64_t)kh * D + d;
                    cp8((KV *)(stK + kk * DP) + d, (const KV *)a.kc + off);
                    cp8((KV *)(stV + kk * DP) + d, (const KV *)a.vc + off);
                    continue;
                }
            }
            const float *kr = a.qkv, *vr = a.qkv;
            if (ok) {
                if (j >= pos0) {
                    kr = a.qkv + (j - pos0) * a.qkv_stride + q_dim + (int64_t)kh * D + d;
                    vr = kr + kv_dim;
                } else {
                    int64_t slot = j < a.slots ? j : j % a.slots;
                    int64_t off = slot * kv_dim + (int64_t)kh * D + d;
                    kr = a.kc + off;
                    vr = a.vc + off;
                }
            }
            cp16(stK + kk * DP + d, kr, ok);
            cp16(stV + kk * DP + d, vr, ok);
        }
        cp_commit();
    };
    if (tiles > 0) issue(0);

    /* Q rows, scaled into log2 units, split */
    const float qs = a.scale * LOG2E;
    for (int i = tid; i < FL_BM * V4; i += NT) {
        int r = i / V4, d = (i % V4) * 4;
        int64_t R = R0 + r;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (R < rows && d < D) {
            int64_t t = R / G;
            int h = kh * G + (int)(R % G);
            v = *(const float4 *)(a.qkv + t * a.qkv_stride + (int64_t)h * D + d);
            v.x *= qs;
            v.y *= qs;
            v.z *= qs;
            v.w *= qs;
        }
        split4_store(Qh + r * LD + d, Ql + r * LD + d, v);
    }

    /* this thread's two rows (g and g + 8 of the warp's m16 tile) */
    const int g = lane / 4, tq = lane % 4;
    int64_t prow[2];
#pragma unroll
    for (int k = 0; k < 2; k++) {
        int64_t R = R0 + rg * 16 + g + 8 * k;
        if (R >= rows) R = rows - 1; /* padding rows: any finite result, never written */
        prow[k] = pos0 + R / G;
    }
    float o[DW / 8][4]; /* dims d_lo + 8 i + 2 tq, + 1 */
#pragma unroll
    for (int i = 0; i < DW / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};

    const __nv_bfloat16 *qa_h = Qh + (rg * 16 + (lane % 8) + 8 * ((lane / 8) & 1)) * LD + 8 * (lane / 16);
    const __nv_bfloat16 *qa_l = qa_h + C::Q_ELEMS;
    const int k_off = ((lane % 8) + 8 * (lane / 16)) * LD + 8 * ((lane / 8) & 1); /* K: non-transposed x4 */
    const int v_off = ((lane % 8) + 8 * ((lane / 8) & 1)) * LD + 8 * (lane / 16); /* V: transposed x4 */

    for (int it = 0; it < tiles; it++) {
        const int64_t jt = s_begin + (int64_t)it * BN;
        cp_wait_all();
        __syncthreads(); /* staging holds tile it; every warp is done with tile it - 1 */
        for (int i = tid; i < BN * V4; i += NT) {
            int kk = i / V4, d = (i % V4) * 4;
            if constexpr (sizeof(KV) == 4) {
                split4_store(Kh + kk * LD + d, Kl + kk * LD + d, *(const float4 *)(stK + kk * DP + d));
                split4_store(Vh + kk * LD + d, Vl + kk * LD + d, *(const float4 *)(stV + kk * DP + d));
            } else {
                const int64_t j = jt + kk;
                const bool cached = j < pos0 && j < s_end && d < D; /* as issue() staged it */
                split4_store(Kh + kk * LD + d, Kl + kk * LD + d, staged4<KV>(stK + kk * DP, d, cached));
                split4_store(Vh + kk * LD + d, Vl + kk * LD + d, staged4<KV>(stV + kk * DP, d, cached));
            }
        }
        __syncthreads(); /* bf16 tile ready; staging free */
        if (it + 1 < tiles) issue(it + 1);

        /* S = Q . K^T (16 rows x BN keys per warp) */
        float s[BN / 8][4];
#pragma unroll
        for (int i = 0; i < BN / 8; i++) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll 2
        for (int kd = d_lo; kd < d_lo + DW; kd += 16) {
            if (kd >= D) break;
            uint32_t qh[4], ql[4];
            ldsm_x4(qh, qa_h + kd);
            ldsm_x4(ql, qa_l + kd);
#pragma unroll
            for (int nt = 0; nt < BN / 8; nt += 2) {
                uint32_t bh[4], bl[4];
                ldsm_x4(bh, Kh + nt * 8 * LD + k_off + kd);
                ldsm_x4(bl, Kl + nt * 8 * LD + k_off + kd);
                mma16816(s[nt], qh, bh[0], bh[1]);
                mma16816(s[nt + 1], qh, bh[2], bh[3]);
                mma16816(s[nt], qh, bl[0], bl[1]);
                mma16816(s[nt + 1], qh, bl[2], bl[3]);
                mma16816(s[nt], ql, bh[0], bh[1]);
                mma16816(s[nt + 1], ql, bh[2], bh[3]);
            }
        }

        if (NS > 1) {
            /* add the other dim part's partial scores: both warps of the row
             * group then hold the same sums (a + b == b + a), so the same
             * softmax; Sx[part][row group][element][lane] */
            float *mine = Sx + ((hf * FL_WARPS + rg) * (BN / 2)) * 32 + lane;
            const float *other = Sx + (((1 - hf) * FL_WARPS + rg) * (BN / 2)) * 32 + lane;
#pragma unroll
            for (int e = 0; e < BN / 2; e++) mine[e * 32] = s[e / 4][e % 4];
            asm volatile("bar.sync %0, %1;" ::"r"(1 + rg), "r"(NS * 32) : "memory");
#pragma unroll
            for (int e = 0; e < BN / 2; e++) s[e / 4][e % 4] += other[e * 32];
        }

        /* mask: key j valid for row p iff j < s_end, j <= p, and p - j < window */
        const bool full = jt + BN <= s_end && jt + BN - 1 <= p_min && (!a.window || p_max - jt < a.window);
        if (!full) {
#pragma unroll
            for (int nt = 0; nt < BN / 8; nt++)
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    int64_t j = jt + nt * 8 + 2 * tq + (c & 1), p = prow[c >> 1];
                    if (j >= s_end || j > p || (a.window && p - j >= a.window)) s[nt][c] = -INFINITY;
                }
        }

        /* online softmax, rows g (k = 0) and g + 8 (k = 1) */
#pragma unroll
        for (int k = 0; k < 2; k++) {
            float mx = m[k];
#pragma unroll
            for (int nt = 0; nt < BN / 8; nt++) mx = fmaxf(mx, fmaxf(s[nt][2 * k], s[nt][2 * k + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float mu = mx == -INFINITY ? 0.f : mx;
            const float corr = exp2f(m[k] - mu);
            m[k] = mx;
            float sum = 0.f;
#pragma unroll
            for (int nt = 0; nt < BN / 8; nt++) {
                s[nt][2 * k] = exp2f(s[nt][2 * k] - mu);
                s[nt][2 * k + 1] = exp2f(s[nt][2 * k + 1] - mu);
                sum += s[nt][2 * k] + s[nt][2 * k + 1];
            }
            l[k] = l[k] * corr + sum;
#pragma unroll
            for (int i = 0; i < DW / 8; i++) {
                o[i][2 * k] *= corr;
                o[i][2 * k + 1] *= corr;
            }
        }

        /* O += P . V */
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) {
            uint32_t ph[4], pl[4];
            split2(s[2 * kk][0], s[2 * kk][1], ph[0], pl[0]);
            split2(s[2 * kk][2], s[2 * kk][3], ph[1], pl[1]);
            split2(s[2 * kk + 1][0], s[2 * kk + 1][1], ph[2], pl[2]);
            split2(s[2 * kk + 1][2], s[2 * kk + 1][3], ph[3], pl[3]);
#pragma unroll
            for (int dt = 0; dt < DW / 8; dt += 2) {
                if (d_lo + dt * 8 < D) {
                    uint32_t bh[4], bl[4];
                    ldsm_x4_t(bh, Vh + kk * 16 * LD + v_off + d_lo + dt * 8);
                    ldsm_x4_t(bl, Vl + kk * 16 * LD + v_off + d_lo + dt * 8);
                    mma16816(o[dt], ph, bh[0], bh[1]);
                    mma16816(o[dt + 1], ph, bh[2], bh[3]);
                    mma16816(o[dt], ph, bl[0], bl[1]);
                    mma16816(o[dt + 1], ph, bl[2], bl[3]);
                    mma16816(o[dt], pl, bh[0], bh[1]);
                    mma16816(o[dt + 1], pl, bh[2], bh[3]);
                }
            }
        }
    }

    /* results: rows g, g + 8; columns dt * 8 + 2 tq, + 1 */
#pragma unroll
    for (int k = 0; k < 2; k++) {
        float L = l[k];
        L += __shfl_xor_sync(0xffffffffu, L, 1);
        L += __shfl_xor_sync(0xffffffffu, L, 2);
        const int64_t R = R0 + rg * 16 + g + 8 * k;
        if (R >= rows) continue;
        const int64_t t = R / G;
        const int h = kh * G + (int)(R % G);
        if (a.splits == 1) {
            float f = 1.0f / L;
            if (a.gate) f *= 1.0f / (1.0f + expf(-a.gate[t * a.n_head + h]));
            float *dst = a.out + (t * a.n_head + h) * D;
#pragma unroll
            for (int dt = 0; dt < DW / 8; dt++) {
                int d = d_lo + dt * 8 + 2 * tq;
                if (d < D) *(float2 *)(dst + d) = make_float2(o[dt][2 * k] * f, o[dt][2 * k + 1] * f);
            }
        } else {
            float *ws = a.ws + ((t * a.n_head + h) * a.splits + split) * (int64_t)(D + 2);
            if (tq == 0 && hf == 0) {
                ws[0] = m[k];
                ws[1] = L;
            }
#pragma unroll
            for (int dt = 0; dt < DW / 8; dt++) {
                int d = d_lo + dt * 8 + 2 * tq;
                if (d < D) {
                    ws[2 + d] = o[dt][2 * k];
                    ws[3 + d] = o[dt][2 * k + 1];
                }
            }
        }
    }
}

/* One block per (token, head): the splits' (max in log2 units, sum, output) merged. */
__global__ void flash_merge_kernel(float *out, const float *ws, int splits, int head_dim, const float *gate)
{
    const float *base = ws + (int64_t)blockIdx.x * splits * (head_dim + 2);
    float M = -INFINITY;
    for (int s = 0; s < splits; s++) M = fmaxf(M, base[(int64_t)s * (head_dim + 2)]);
    float gf = gate ? 1.0f / (1.0f + expf(-gate[blockIdx.x])) : 1.0f; /* block = token * n_head + head */
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float L = 0.0f, A = 0.0f;
        for (int s = 0; s < splits; s++) {
            const float *p = base + (int64_t)s * (head_dim + 2);
            if (p[0] == -INFINITY) continue;
            float f = exp2f(p[0] - M);
            L += p[1] * f;
            A += p[2 + d] * f;
        }
        out[(int64_t)blockIdx.x * head_dim + d] = A / L * gf;
    }
}

int pad_dim(int D) { return D <= 32 ? 32 : D <= 64 ? 64 : D <= 128 ? 128 : 256; }

template <int DP> size_t smem_of() { return fl_cfg<DP>::SMEM; }

size_t smem_for(int DP)
{
    switch (DP) {
    case 32: return smem_of<32>();
    case 64: return smem_of<64>();
    case 128: return smem_of<128>();
    default: return smem_of<256>();
    }
}

int bn_for(int DP) { return DP >= 128 ? fl_cfg<128>::BN : fl_cfg<64>::BN; }

template <int DP, typename KV> cudaError_t launch_flash(cudaStream_t st, const cu_attn_args *a)
{
    static int attr_set = 0; /* per instantiation; the attribute is per device function */
    const size_t smem = fl_cfg<DP>::SMEM;
    if (!attr_set) {
        cudaError_t e = cudaFuncSetAttribute(flash_kernel<DP, KV>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return e;
        attr_set = 1;
    }
    int G = a->n_head / a->n_head_kv;
    int64_t rows = (int64_t)a->n * G;
    dim3 grid((unsigned)((rows + FL_BM - 1) / FL_BM), (unsigned)a->n_head_kv, (unsigned)a->splits);
    flash_kernel<DP, KV><<<grid, fl_cfg<DP>::THREADS, smem, st>>>(*a);
    return cudaGetLastError();
}

} // namespace

static cudaError_t cu_flash_launch(cudaStream_t st, const cu_attn_args *a);
static int64_t t_pos0;

int cu_flash_enabled(void)
{
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("SPARK_CUDA_FLASH");
        on = !(e && e[0] == '0');
    }
    return on;
}

int cu_flash_ok(const cu_attn_args *a)
{
    if (a->n < CUDA_FLASH_MIN_N || a->head_dim <= 0 || a->head_dim > 256 || a->head_dim % 4 != 0) return 0;
    if (a->n_head_kv <= 0 || a->n_head % a->n_head_kv != 0 || a->n_head / a->n_head_kv > CUDA_MAX_GROUP) return 0;
    if (a->qkv_stride % 4 != 0 || (uintptr_t)a->qkv % 16 || (uintptr_t)a->kc % 16 || (uintptr_t)a->vc % 16) return 0;
    if (a->kv_fmt != CU_KV_F32 && a->kv_fmt != CU_KV_F16 && a->kv_fmt != CU_KV_BF16) return 0;
    return a->window >= 0 && a->slots > 0;
}

int cu_flash_splits(const cu_attn_args *a, int64_t pos0, int sms)
{
    t_pos0 = pos0;
    const int DP = pad_dim(a->head_dim);
    const int per_sm = (int)(227 * 1024 / smem_for(DP)) > 0 ? (int)(227 * 1024 / smem_for(DP)) : 1;
    const int64_t rows = (int64_t)a->n * (a->n_head / a->n_head_kv);
    const int64_t blocks = (rows + FL_BM - 1) / FL_BM * a->n_head_kv;
    /* the most keys one row block of the chunk reads */
    int64_t keys = pos0 + a->n;
    if (a->window && keys > (int64_t)a->window + FL_BM) keys = (int64_t)a->window + FL_BM;
    const int64_t slots = (int64_t)sms * per_sm;
    if (2 * blocks > slots) return 1; /* about a wave already: splitting only adds the merge */
    int64_t splits = (slots + blocks - 1) / blocks;
    int64_t most = keys / (4 * bn_for(DP)); /* at least 4 tiles a split */
    if (splits > most) splits = most;
    if (splits > 64) splits = 64;
    return splits < 1 ? 1 : (int)splits;
}

/* Timing instrument for the benchmarks (cu_flash_timing): every launch is
 * bracketed by events and waited for; the useful FLOPs (4 * head_dim per
 * query head and visible key: q.k and p.v, the hi/lo split not counted)
 * come from the position cu_flash_splits saw just before. */
static int t_on;
static double t_ms, t_flop;
static long t_calls;
static cudaEvent_t t_ev[2];

extern "C" void cu_flash_timing(int on, double *ms, double *flop, long *calls)
{
    if (ms) *ms = t_ms;
    if (flop) *flop = t_flop;
    if (calls) *calls = t_calls;
    t_ms = t_flop = 0;
    t_calls = 0;
    t_on = on;
}

static double useful_flop(const cu_attn_args *a, int64_t pos0)
{
    double keys = 0;
    for (int64_t t = 0; t < a->n; t++) {
        int64_t k = pos0 + t + 1;
        if (a->window && k > a->window) k = a->window;
        keys += (double)k;
    }
    return 4.0 * a->head_dim * a->n_head * keys;
}

cudaError_t cu_flash_attention(cudaStream_t st, const cu_attn_args *a)
{
    if (t_on) {
        if (!t_ev[0]) {
            cudaEventCreate(&t_ev[0]);
            cudaEventCreate(&t_ev[1]);
        }
        cudaEventRecord(t_ev[0], st);
    }
    cudaError_t e = cu_flash_launch(st, a);
    if (t_on && e == cudaSuccess) {
        cudaEventRecord(t_ev[1], st);
        cudaEventSynchronize(t_ev[1]);
        float ms = 0;
        cudaEventElapsedTime(&ms, t_ev[0], t_ev[1]);
        t_ms += ms;
        t_flop += useful_flop(a, t_pos0);
        t_calls++;
    }
    return e;
}

template <typename KV> static cudaError_t launch_flash_dim(cudaStream_t st, const cu_attn_args *a)
{
    switch (pad_dim(a->head_dim)) {
    case 32: return launch_flash<32, KV>(st, a);
    case 64: return launch_flash<64, KV>(st, a);
    case 128: return launch_flash<128, KV>(st, a);
    default: return launch_flash<256, KV>(st, a);
    }
}

static cudaError_t cu_flash_launch(cudaStream_t st, const cu_attn_args *a)
{
    cudaError_t e = a->kv_fmt == CU_KV_F16    ? launch_flash_dim<__half>(st, a)
                    : a->kv_fmt == CU_KV_BF16 ? launch_flash_dim<__nv_bfloat16>(st, a)
                                              : launch_flash_dim<float>(st, a);
    if (e != cudaSuccess || a->splits == 1) return e;
    flash_merge_kernel<<<(unsigned)(a->n * a->n_head), 128, 0, st>>>(a->out, a->ws, a->splits, a->head_dim, a->gate);
    return cudaGetLastError();
}

/*
 * cuda_fgemv.cu — the single-token GEMV of the fast decode path (fgemv) for
 * bf16, Q8_0, Q4_K, Q6_K and Q4_0 rows, and the choice of its launch shape.
 *
 * Decode at batch 1 is a stream over the weights: every row is read as
 * 16-byte units, each lane of a warp keeping all of its units' loads in
 * flight before it uses the first (the loads of the next row group are
 * issued before the current one's products, into a second register set),
 * the grid sized to the SMs.
 * The formats differ only in what a unit holds and how it meets x:
 *
 *   bf16   8 values;
 *   Q8_0   16 int8 values (half a block) and the block's f16 scale;
 *   Q4_K   a sub-block's 32 4-bit values and its superblock's 16-byte
 *          header (d, dmin, the 6-bit scales / mins);
 *   Q6_K   32 values' low 4 bits, beside an 8-byte load of their top 2
 *          bits and a 4-byte one of their two scales and d;
 *   Q4_0   a block's 32 4-bit values and its f16 d.
 *
 * The quantized rows are in the GPU layout cu_repack_rows makes at upload
 * (each row's quants first, then its scales), so a unit is one aligned
 * 16-byte load; the bits are the file's (Q4_K's 6-bit scales and mins
 * reordered within their 12 bytes: q4k_dev_scale_min; Q6_K's regrouped by
 * 32-value units, q6k_dev_unit). Products are fp32
 * on dequantized values: Q8_0 d * sum(q x), Q4_K a * sum(q x) - m * sum(x)
 * per sub-block (the sums of x per sub-block are computed once per launch).
 *
 * x is read from shared memory for every unit, at 2 (bf16) to 8 (Q4_K)
 * bytes of x per weight byte; it is stored transposed by units so those
 * reads are conflict-free, and a warp takes two rows of a quantized matrix
 * so each read serves both (bench/cuda_runs.md run 8: with one row a warp
 * and x in row order, Q8_0 / Q4_K streamed at 1.0-2.8 / 0.5-1.4 TB/s).
 *
 * The formats' units and dot products are in cuda_fgemv_formats.cuh; this
 * file holds x's loads, the kernel and the choice of its launch shape.
 */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_fgemv_formats.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

using namespace spark_dev;

namespace {

constexpr int FG_THREADS = 256, FG_WARPS = FG_THREADS / WARP;

/* Block 0 writes the normalised x to a.xn, (x * inv) * nw as load_norm_x
 * does, for a kernel that kept inv out of its x (x and nw again from L1). */
__device__ __forceinline__ void write_xn(const cu_fgemv_args &a, float inv)
{
    if (blockIdx.x != 0 || !a.xn) return;
    const float4 *x4 = (const float4 *)a.x, *nw4 = (const float4 *)a.nw;
    float4 *xn4 = (float4 *)a.xn;
    for (int i = threadIdx.x; i < a.cols / 4; i += FG_THREADS) {
        const float4 t = x4[i], w = nw4[i];
        xn4[i] = make_float4(t.x * inv * w.x, t.y * inv * w.y, t.z * inv * w.z, t.w * inv * w.w);
    }
}

/* x rounded to int16 per 32 values into xq (VPU uint4s a unit, transposed
 * as above), xd and xs (see above). Every block does this for the whole
 * row, so its cost is paid by every SM: a lane takes 16 consecutive values
 * (two lanes a group, one shuffle for the max and one for the sum; 4 values
 * a lane with 8 lanes a group took ~1 us more per launch on the 10240-value
 * down projection, bench/cuda_runs.md run 10). Needs cols % 256 == 0. Ends
 * with a block barrier.
 *
 * With a.nw (the RMS norm fused) the values rounded are x * nw, before the
 * norm's scale 1 / RMS is known: a 32-group's int16 values do not depend on
 * a common factor (only its d would), and the products are linear in x, so
 * the caller multiplies each row's sum by the returned scale instead. That
 * saves the norm a barrier and a second pass over x: x and nw are read
 * once, together, and the sum of squares ends at the barrier that publishes
 * xq. Block 0 then rereads x and nw (L1) to write a.xn = (x * inv) * nw,
 * exactly as load_norm_x does. Returns 1 without a norm (bit-unchanged). */
/* SUM16 (Q6_K, whose scales are per 16 values): xs holds d * the sum of
 * each 16-value half (cols / 16 of them) instead of each group's. */
template <int VPU, bool SUM16>
__device__ __forceinline__ float load_x16(const cu_fgemv_args &a, uint4 *xq, float *xd, float *xs, float *red)
{
    const int halves = a.cols / 16, nvec = a.cols / (8 * VPU);
    const float4 *x4 = (const float4 *)a.x, *nw4 = (const float4 *)a.nw;
    float ss = 0.0f;
    /* whole warps go round together (the shuffles); halves is even, so both
     * lanes of a group are in range or neither is */
    const int rounds = (halves + FG_THREADS - 1) / FG_THREADS;
    for (int r = 0; r < rounds; r++) {
        const int h = threadIdx.x + r * FG_THREADS;
        const bool in = h < halves;
        if (__all_sync(0xffffffffu, !in)) break;
        float4 v[4], w[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            v[k] = in ? x4[4 * h + k] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            w[k] = in && nw4 ? nw4[4 * h + k] : make_float4(1.0f, 1.0f, 1.0f, 1.0f);
        }
        if (nw4) {
#pragma unroll
            for (int k = 0; k < 4; k++) {
                ss = fmaf(v[k].x, v[k].x, ss);
                ss = fmaf(v[k].y, v[k].y, ss);
                ss = fmaf(v[k].z, v[k].z, ss);
                ss = fmaf(v[k].w, v[k].w, ss);
                v[k].x *= w[k].x;
                v[k].y *= w[k].y;
                v[k].z *= w[k].z;
                v[k].w *= w[k].w;
            }
        }
        float m = 0.0f;
#pragma unroll
        for (int k = 0; k < 4; k++)
            m = fmaxf(m, fmaxf(fmaxf(fabsf(v[k].x), fabsf(v[k].y)), fmaxf(fabsf(v[k].z), fabsf(v[k].w))));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
        const float id = m > 0.0f ? 32767.0f / m : 0.0f;
        uint32_t p[8];
        int sum = 0;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int q0 = __float2int_rn(v[k].x * id), q1 = __float2int_rn(v[k].y * id);
            const int q2 = __float2int_rn(v[k].z * id), q3 = __float2int_rn(v[k].w * id);
            sum += q0 + q1 + q2 + q3;
            p[2 * k] = ((uint32_t)q0 & 0xffffu) | ((uint32_t)q1 << 16);
            p[2 * k + 1] = ((uint32_t)q2 & 0xffffu) | ((uint32_t)q3 << 16);
        }
        const int half_sum = sum; /* this lane's 16 values */
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        if (in) {
            const int j = 2 * h; /* the uint4s of values 8j..8j+15: unit j / VPU, parts j % VPU and the next */
            xq[(j % VPU) * nvec + j / VPU] = make_uint4(p[0], p[1], p[2], p[3]);
            xq[((j + 1) % VPU) * nvec + (j + 1) / VPU] = make_uint4(p[4], p[5], p[6], p[7]);
            if (SUM16) {
                const float d = m / 32767.0f;
                xs[h] = d * (float)half_sum; /* |sum| <= 16 * 32767: exact in float */
                if ((h & 1) == 0) xd[h / 2] = d;
            } else if ((h & 1) == 0) {
                const float d = m / 32767.0f;
                xd[h / 2] = d;
                xs[h / 2] = d * (float)sum; /* |sum| <= 32 * 32767: exact in float */
            }
        }
    }
    if (!nw4) {
        __syncthreads();
        return 1.0f;
    }
    const float inv = block_rms_inv<FG_WARPS>(a, ss, red);
    write_xn(a, inv);
    return inv;
}

/* 4 bytes global -> shared without a register (cp.async), for a value a
 * thread reads only at the end of a row group (its residual row): the read
 * is issued early and its L2 round trip overlaps the products */
__device__ __forceinline__ void cp4_early(float *dst, const float *src)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(smem_u32(dst)), "l"(src) : "memory");
}

/* Work: "groups" of FG_WARPS / KS row sets; warp w of a block takes row set
 * w / KS of the group (RW consecutive rows, or a gate / up row pair when
 * PAIR) and the (w % KS)-th of KS equal unit segments, each lane NV units
 * of each row (all issued before any is used), so every x value a lane
 * reads from shared memory serves all rows of its set. Blocks stride over
 * the groups; the next group's loads are issued as soon as the current
 * one's are consumed, before its reduction, or, with DB (double-buffered
 * registers), before the current one's products: a quantized unit costs
 * tens of instructions, and with one block an SM (their register counts)
 * the products and the next loads' latency would otherwise not overlap. */
/* F::MINB: the launch bounds' minimum blocks an SM (0: none given, as
 * __launch_bounds__(FG_THREADS) alone; 1 would still change the code) */
template <typename F, int NV, int KS, bool PAIR, bool DB>
__global__ void __launch_bounds__(FG_THREADS, F::MINB) fgemv_kernel(cu_fgemv_args a)
{
    constexpr int RW = F::RW_SINGLE > 1 && !PAIR ? F::RW_SINGLE : 1; /* rows a warp, single matrices */
    constexpr int NR = PAIR ? 2 : RW;
    constexpr int RPG = FG_WARPS / KS;
    extern __shared__ float4 xs4[];
    __shared__ float part[2][FG_WARPS][NR];
    __shared__ float red[FG_WARPS];
    __shared__ float early[2][FG_WARPS][NR]; /* a warp's residual rows and steering entries (cp4_early) */
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int seg = warp % KS, rl = warp / KS;
    const int nvec = a.cols / F::VALS;
    const int seglen = (nvec + KS - 1) / KS;
    const int s0 = seg * seglen;
    const int s1 = s0 + seglen < nvec ? s0 + seglen : nvec;
    const int64_t R = PAIR ? a.rows0 : a.rows0 + a.rows1;
    const int64_t groups = (R + RPG * RW - 1) / (RPG * RW);
    const uint8_t *w0 = (const uint8_t *)a.w0, *w1 = (const uint8_t *)a.w1;

    typename F::unit v[NR][NV], vn[DB ? NR : 1][DB ? NV : 1]; /* vn: the next group's, with DB */
    auto row_of = [&](int64_t g, int q) { return PAIR ? g * RPG + rl : (g * RPG + rl) * RW + q; };
    auto load = [&](int64_t g, auto &dst) {
#pragma unroll
        for (int q = 0; q < NR; q++) {
            const int64_t r = row_of(g, PAIR ? 0 : q);
            const uint8_t *p = NULL;
            if (r < R) {
                if (PAIR) p = (q == 0 ? w0 : w1) + r * a.row_bytes;
                else p = r < a.rows0 ? w0 + r * a.row_bytes : w1 + (r - a.rows0) * a.row_bytes;
            }
#pragma unroll
            for (int k = 0; k < NV; k++) {
                const int i = s0 + lane + WARP * k;
                dst[q][k] = p && i < s1 ? F::load(p, i, a.cols) : F::none();
            }
        }
    };

    int64_t g = blockIdx.x;
    tl_mark(a.tl, 0);
    load(g, v); /* weights only: before the wait */
    pdl_wait();
    pdl_release();
    tl_mark(a.tl, 1);
    if (a.stamps && blockIdx.x == 0 && threadIdx.x == 0) { /* the folded phase stamp (cuda_hooks.cu) */
        unsigned long long t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        if (a.stamp_phase >= 0) a.stamps[1 + a.stamp_phase] += t - a.stamps[0];
        a.stamps[0] = t;
    }

    const float *xsum; /* float x: Q4_K's sums of x per unit; int16 x: xd, then xs */
    float xscale = 1.0f; /* the norm's 1 / RMS when load_x16 left it out of x */
    if constexpr (F::X16) {
        float *xd = (float *)((uint4 *)xs4 + a.cols / 8);
        xscale = load_x16<F::VALS / 8, F::DTYPE == CU_Q6_K>(a, (uint4 *)xs4, xd, xd + a.cols / 32, red);
        xsum = xd;
    } else {
        /* x (RMS-normalised when nw), by units. (The norm's scale left
         * for the rows' ends, as load_x16 does, gained the bf16 gate / up
         * pair nothing: bench/cuda_runs.md run 30.) */
        load_norm_x<FG_THREADS, false, F::VALS / 4>(a, xs4, red);
        float *sums = (float *)(xs4 + a.cols / 4);
        if constexpr (F::DTYPE == CU_Q4_K) { /* sums of x per unit, for the mins */
            for (int i = threadIdx.x; i < nvec; i += FG_THREADS) {
                float s = 0.0f;
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    const float4 t = xs4[k * nvec + i];
                    s += t.x + t.y + t.z + t.w;
                }
                sums[i] = s;
            }
            __syncthreads();
        }
        xsum = sums;
    }
    tl_mark(a.tl, 3); /* x ready: the prologue's end */

    /* a group's residual rows (and steering entries), read by the warps
     * that write them: asked for before the group's products (the first
     * group's here, the next one's as each group ends), not after the store
     * to out0, behind which their L2 round trip was exposed at every group's
     * end (bench/cuda_runs.md run 27; fuse() never makes resid alias out0) */
    const bool early_rows = !PAIR && a.resid && lane == 0 && (KS == 1 || seg == 0);
    auto ask_rows = [&](int64_t gg) {
#pragma unroll
        for (int q = 0; q < NR; q++) {
            const int64_t r = row_of(gg, q);
            if (r < a.rows0) {
                cp4_early(&early[0][warp][q], a.resid + r);
                if (a.steer_dir) cp4_early(&early[1][warp][q], a.steer_dir + r);
            }
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
    };
    if (early_rows) ask_rows(g);

    int par = 0;
    for (;;) {
        const int64_t gn = g + gridDim.x;
        if constexpr (DB) {
            if (gn < groups) load(gn, vn); /* in flight during the products below */
        }
        /* bf16: two accumulators a row (even / odd units) halve the dependent
         * FMA chain, and a unit past the segment (zero weights, F::none) is
         * multiplied with unit 0's x instead of branched around (~10
         * instructions a unit; chain 2.050 -> 2.014 ms, bench/cuda_runs.md
         * run 9). Not for quantized units: their dots have two chains of
         * their own, and both changes cost the registers of a second block
         * an SM there (Q8_0 gate/up 15.5 -> 18.7 us) */
        constexpr int NACC = F::DTYPE == CU_BF16 ? 2 : 1;
        constexpr bool BRANCHLESS = F::DTYPE == CU_BF16; /* quantized: the branch keeps two blocks an SM */
        float acc[NR], acc2[NR][NACC];
#pragma unroll
        for (int q = 0; q < NR; q++)
#pragma unroll
            for (int c = 0; c < NACC; c++) acc2[q][c] = 0.0f;
#pragma unroll
        for (int k = 0; k < NV; k++) {
            const int i = s0 + lane + WARP * k;
            const int ix = BRANCHLESS ? (i < s1 ? i : 0) : i;
            if (BRANCHLESS || i < s1) {
#pragma unroll
                for (int q = 0; q < NR; q++) acc2[q][k % NACC] = F::dot(v[q][k], xs4, xsum, ix, nvec, acc2[q][k % NACC]);
            }
        }
#pragma unroll
        for (int q = 0; q < NR; q++) acc[q] = NACC == 2 ? acc2[q][0] + acc2[q][NACC - 1] : acc2[q][0];
        if constexpr (!DB) {
            if (gn < groups) load(gn, v); /* in flight during the reduction below */
        }
#pragma unroll
        for (int q = 0; q < NR; q++) acc[q] = warp_sum(acc[q]);
        bool mine = lane == 0;
        if (KS > 1) {
            if (lane == 0) {
#pragma unroll
                for (int q = 0; q < NR; q++) part[par][warp][q] = acc[q];
            }
            __syncthreads(); /* the other buffer (par ^ 1) is rewritten only after the next one */
            mine = mine && seg == 0;
            if (mine) {
#pragma unroll
                for (int q = 0; q < NR; q++) {
                    float s = 0.0f;
                    for (int j = 0; j < KS; j++) s += part[par][warp + j][q];
                    acc[q] = s;
                }
            }
            par ^= 1;
        }
        if (mine) {
#pragma unroll
            for (int q = 0; q < NR; q++) acc[q] *= xscale; /* 1 unless the norm's scale was left out of x */
            if (PAIR) {
                const int64_t r = row_of(g, 0);
                if (r < R) {
                    const float ga = acc[0], up = acc[NR - 1];
                    a.out0[r] = 0.5f * ga * (1.0f + erff(ga * 0.70710678118654752f)) * up; /* exact erf form */
                    a.out1[r] = up;
                }
            } else {
                if (early_rows) asm volatile("cp.async.wait_group 0;" ::: "memory");
#pragma unroll
                for (int q = 0; q < NR; q++) {
                    const int64_t r = row_of(g, q);
                    if (r >= R) break;
                    if (r < a.rows0) {
                        a.out0[r] = acc[q];
                        if (a.resid) {
                            float h = early[0][warp][q] + acc[q];
                            if (a.steer_dir) h = __fadd_rn(h, __fmul_rn(a.steer_alpha, early[1][warp][q])); /* = steer_kernel */
                            a.resid[r] = h;
                        }
                    } else {
                        a.out1[r - a.rows0] = acc[q];
                    }
                }
                if (early_rows && gn < groups) ask_rows(gn); /* the slots are read: the next group's rows */
            }
        }
        if (gn >= groups) break;
        if constexpr (DB) {
#pragma unroll
            for (int q = 0; q < NR; q++)
#pragma unroll
                for (int k = 0; k < NV; k++) v[q][k] = vn[q][k];
        }
        g = gn;
    }
    tl_mark(a.tl, 2);
}

/* Superblock b of a Q6_K row (blk: the file's 210 bytes) into the device
 * row d (q6k_dev_unit): unit u = 4 h + k holds values 128 h + 32 k + l,
 * whose low 4 bits are ql[64 h + 32 (k & 1) + l] (the high nibble for
 * k >= 2), top 2 bits qh[32 h + l] >> 2 k, scales sc[2 u], sc[2 u + 1]
 * (model/quant.c). */
__device__ void repack_q6_k(uint8_t *d, const uint8_t *blk, int64_t b, int64_t cols)
{
    auto low4 = [&](int u, int l) { /* value l of unit u, its low 4 bits */
        const int h = u / 4, k = u % 4;
        return (blk[64 * h + 32 * (k & 1) + l] >> (k < 2 ? 0 : 4)) & 0x0F;
    };
    auto top2 = [&](int u, int l) { return (blk[128 + 32 * (u / 4) + l] >> (2 * (u % 4))) & 3; };
    for (int u = 0; u < 8; u++) {
        const int64_t i = 8 * b + u; /* the unit's index in the row */
        uint8_t *q = d + 16 * i, *h = d + cols / 2 + 8 * i, *w = d + cols / 2 + cols / 4 + 4 * i;
        for (int t = 0; t < 16; t++) q[t] = (uint8_t)(low4(u, t) | low4(u, 16 + t) << 4);
        for (int half = 0; half < 2; half++)
            for (int bb = 0; bb < 4; bb++) {
                int v = 0;
                for (int sh = 0; sh < 4; sh++) v |= top2(u, 16 * half + 4 * sh + bb) << (2 * sh);
                h[4 * half + bb] = (uint8_t)v;
            }
        w[0] = blk[192 + 2 * u];
        w[1] = blk[192 + 2 * u + 1];
        w[2] = blk[208];
        w[3] = blk[209];
    }
}

/* GPU layout of quantized rows (see the formats above), one thread per block. */
__global__ void repack_rows_kernel(uint8_t *dst, const uint8_t *src, int dtype, int64_t rows, int64_t cols,
                                   int64_t src_row_bytes, int64_t dst_row_bytes)
{
    const int64_t per_row = dtype == CU_Q8_0 || dtype == CU_Q4_0 ? cols / 32 : cols / 256;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < rows * per_row;
         t += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = t / per_row, b = t % per_row;
        const uint8_t *s = src + r * src_row_bytes;
        uint8_t *d = dst + r * dst_row_bytes;
        if (dtype == CU_Q6_K) {
            repack_q6_k(d, s + b * 210, b, cols);
        } else if (dtype == CU_Q4_0) { /* the block's d to the row's end, its 16 bytes of quants as they are */
            const uint8_t *blk = s + b * 18;
            d[cols / 2 + 2 * b] = blk[0];
            d[cols / 2 + 2 * b + 1] = blk[1];
            for (int k = 0; k < 16; k++) d[16 * b + k] = blk[2 + k];
        } else if (dtype == CU_Q8_0) {
            const uint8_t *blk = s + b * 34;
            d[cols + 2 * b] = blk[0];
            d[cols + 2 * b + 1] = blk[1];
            for (int k = 0; k < 32; k++) d[32 * b + k] = blk[2 + k];
        } else { /* sub-block j of the file's superblock: chunk j / 2, nibble j % 2 */
            const uint8_t *blk = s + b * 144;
            uint8_t *hdr = d + cols / 2 + 16 * b; /* q4k_dev_scale_min's layout */
            uint32_t mn_lo = 0;
            for (int k = 0; k < 4; k++) hdr[k] = blk[k];
            for (int j = 0; j < 8; j++) { /* the file's 6-bit pair of sub-block j (model/quant.c) */
                const uint8_t *f = blk + 4;
                const int sc = j < 4 ? f[j] & 63 : (f[j + 4] & 0x0F) | ((f[j - 4] >> 6) << 4);
                const int mn = j < 4 ? f[j + 4] & 63 : (f[j + 4] >> 4) | ((f[j] >> 6) << 4);
                hdr[4 + j] = (uint8_t)(sc | (mn >> 4) << 6);
                mn_lo |= (uint32_t)(mn & 15) << (4 * j);
            }
            for (int k = 0; k < 4; k++) hdr[12 + k] = (uint8_t)(mn_lo >> (8 * k));
            for (int j = 0; j < 8; j++) {
                const uint8_t *qs = blk + 16 + 32 * (j / 2);
                const int sh = 4 * (j & 1);
                for (int t = 0; t < 16; t++)
                    d[128 * b + 16 * j + t] = (uint8_t)(((qs[t] >> sh) & 0x0F) | (((qs[16 + t] >> sh) & 0x0F) << 4));
            }
        }
    }
}

typedef void (*fgemv_fn)(cu_fgemv_args);

/* units a lane of a row segment (NV) per format: bf16 up to 16; a
 * quantized unit is wider in registers (5-8 with its scales), up to 5 */
constexpr int FG_NV_BF16[] = {1, 2, 4, 5, 8, 10, 16};
constexpr int FG_NV_Q[] = {1, 2, 3, 4, 5};
constexpr int FG_NNV_BF16 = sizeof FG_NV_BF16 / sizeof(int), FG_NNV_Q = sizeof FG_NV_Q / sizeof(int);
constexpr int FG_KS[] = {1, 2, 4, 8};
constexpr int FG_NKS = 4;

int fg_nv(int dtype, int nvi) { return dtype == CU_BF16 ? FG_NV_BF16[nvi] : FG_NV_Q[nvi]; }

template <typename F, int KS, bool PAIR, bool DB>
fgemv_fn fg_pick_nv(int nvi)
{
    if constexpr (F::DTYPE == CU_BF16) {
        switch (nvi) {
        case 0: return fgemv_kernel<F, 1, KS, PAIR, DB>;
        case 1: return fgemv_kernel<F, 2, KS, PAIR, DB>;
        case 2: return fgemv_kernel<F, 4, KS, PAIR, DB>;
        case 3: return fgemv_kernel<F, 5, KS, PAIR, DB>;
        case 4: return fgemv_kernel<F, 8, KS, PAIR, DB>;
        case 5: return fgemv_kernel<F, 10, KS, PAIR, DB>;
        case 6: return fgemv_kernel<F, 16, KS, PAIR, DB>;
        }
    } else {
        switch (nvi) {
        case 0: return fgemv_kernel<F, 1, KS, PAIR, DB>;
        case 1: return fgemv_kernel<F, 2, KS, PAIR, DB>;
        case 2: return fgemv_kernel<F, 3, KS, PAIR, DB>;
        case 3: return fgemv_kernel<F, 4, KS, PAIR, DB>;
        case 4: return fgemv_kernel<F, 5, KS, PAIR, DB>;
        }
    }
    return NULL;
}

template <typename F, bool DB>
fgemv_fn fg_pick_f(int ksi, int nvi, bool pair)
{
    switch (ksi) {
    case 0: return pair ? fg_pick_nv<F, 1, true, DB>(nvi) : fg_pick_nv<F, 1, false, DB>(nvi);
    case 1: return pair ? fg_pick_nv<F, 2, true, DB>(nvi) : fg_pick_nv<F, 2, false, DB>(nvi);
    case 2: return pair ? fg_pick_nv<F, 4, true, DB>(nvi) : fg_pick_nv<F, 4, false, DB>(nvi);
    default: return pair ? fg_pick_nv<F, 8, true, DB>(nvi) : fg_pick_nv<F, 8, false, DB>(nvi);
    }
}

/* x16: quantized rows against int16 x (only double-buffered kernels are
 * instantiated for it; single-buffered launches keep float x) */
fgemv_fn fg_pick(int dtype, int ksi, int nvi, bool pair, bool db, bool x16)
{
    switch (dtype) {
    case CU_BF16: return db ? fg_pick_f<fmt_bf16, true>(ksi, nvi, pair) : fg_pick_f<fmt_bf16, false>(ksi, nvi, pair);
    case CU_Q8_0:
        if (db && x16) return fg_pick_f<fmt_q8_0_x16, true>(ksi, nvi, pair);
        return db ? fg_pick_f<fmt_q8_0, true>(ksi, nvi, pair) : fg_pick_f<fmt_q8_0, false>(ksi, nvi, pair);
    case CU_Q4_K:
        if (db && x16) return fg_pick_f<fmt_q4_k_x16, true>(ksi, nvi, pair);
        return db ? fg_pick_f<fmt_q4_k, true>(ksi, nvi, pair) : fg_pick_f<fmt_q4_k, false>(ksi, nvi, pair);
    case CU_Q4_0:
        if (db && x16) return fg_pick_f<fmt_q4_0_x16, true>(ksi, nvi, pair);
        return db ? fg_pick_f<fmt_q4_0, true>(ksi, nvi, pair) : fg_pick_f<fmt_q4_0, false>(ksi, nvi, pair);
    case CU_Q6_K:
        if (db && x16) return fg_pick_f<fmt_q6_k_x16, true>(ksi, nvi, pair);
        return db ? fg_pick_f<fmt_q6_k, true>(ksi, nvi, pair) : fg_pick_f<fmt_q6_k, false>(ksi, nvi, pair);
    default: return NULL;
    }
}

/* Whether fgemv double-buffers its registers (the kernel's DB; default on,
 * SPARK_CUDA_FG_DB=0 off): bench/cuda_runs.md run 9, 4B bf16 GEMV chain
 * 2.240 -> 2.050 ms, Q4_K 1.717 -> 1.597 ms. cu_fgemv_force can override it. */
int fg_force_db = -1, fg_force_ks = 0, fg_force_b = 0;

bool fg_db()
{
    static int mode = -1;
    if (mode < 0) {
        const char *e = getenv("SPARK_CUDA_FG_DB");
        mode = e && *e ? atoi(e) != 0 : 1;
    }
    return fg_force_db >= 0 ? fg_force_db != 0 : mode != 0;
}

/* Whether quantized rows meet x in int16 (default on, SPARK_CUDA_QX16=0:
 * float x); single-buffered launches always take float x. */
bool fg_x16(int dtype)
{
    static int mode = -1;
    if (mode < 0) {
        const char *e = getenv("SPARK_CUDA_QX16");
        mode = e && *e ? atoi(e) != 0 : 1;
    }
    return mode != 0 && fg_db() && cu_repack_kind(dtype); /* every block format */
}

/* values per unit, bytes read per unit, NV choices, rows a warp of a single matrix */
void fg_format(int dtype, int *vals, double *bytes, int *nnv, int *rw)
{
    switch (dtype) {
    case CU_BF16: *rw = fmt_bf16::RW_SINGLE, *vals = fmt_bf16::VALS, *bytes = fmt_bf16::BYTES; break;
    case CU_Q8_0: *rw = fmt_q8_0::RW_SINGLE, *vals = fmt_q8_0::VALS, *bytes = fmt_q8_0::BYTES; break;
    case CU_Q4_K: *rw = fmt_q4_k::RW_SINGLE, *vals = fmt_q4_k::VALS, *bytes = fmt_q4_k::BYTES; break;
    case CU_Q4_0: *rw = fmt_q4_0::RW_SINGLE, *vals = fmt_q4_0::VALS, *bytes = fmt_q4_0::BYTES; break;
    default: *rw = fmt_q6_k::RW_SINGLE, *vals = fmt_q6_k::VALS, *bytes = fmt_q6_k::BYTES; break;
    }
    *nnv = dtype == CU_BF16 ? FG_NNV_BF16 : FG_NNV_Q;
}

/* float x (+ Q4_K's unit sums), or int16 x + its groups' d and sums (Q6_K:
 * its halves' sums) */
size_t fg_smem(int dtype, int64_t cols)
{
    if (fg_x16(dtype))
        return (size_t)cols * 2 + (size_t)cols / 32 * sizeof(float) +
               (size_t)cols / (dtype == CU_Q6_K ? 16 : 32) * sizeof(float);
    return (size_t)cols * sizeof(float) + (dtype == CU_Q4_K ? (size_t)cols / 4 : 0);
}

/* Resident blocks per SM of a kernel at a dynamic shared-memory size (cached). */
int fg_occupancy(fgemv_fn fn, size_t smem)
{
    static struct {
        fgemv_fn fn;
        size_t smem;
        int blocks;
    } cache[512];
    static int used;
    for (int i = 0; i < used; i++)
        if (cache[i].fn == fn && cache[i].smem == smem) return cache[i].blocks;
    int b = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, fn, FG_THREADS, smem) != cudaSuccess) {
        cudaGetLastError();
        b = 0;
    }
    if (used < 512) cache[used++] = {fn, smem, b};
    return b;
}

double fg_fly = 96e3; /* bench/cuda_runs.md run 7: 48 KB left the out-projection at 41 KB per SM */

} // namespace

int cu_fgemv_ok(int dtype, int64_t cols, int64_t row_bytes, const void *w, int64_t rows)
{
    /* whole 16-byte units per row (rows and the Q8_0 scale area 16-byte
     * aligned), x in shared memory (<= 46 KB), every segment within the
     * largest instantiated NV at KS = 8 */
    int vals, nnv, rw;
    double bytes;
    if (dtype != CU_BF16 && !cu_repack_kind(dtype)) return 0;
    fg_format(dtype, &vals, &bytes, &nnv, &rw);
    const int64_t file_rb = dtype == CU_BF16   ? cols * 2
                            : dtype == CU_Q8_0 ? cols / 32 * 34
                            : dtype == CU_Q4_K ? cols / 256 * 144
                            : dtype == CU_Q4_0 ? cols / 32 * 18
                                               : cols / 256 * 210;
    const int64_t want_rb = cu_dev_row_bytes(dtype, cols, file_rb);
    const int64_t unit = dtype == CU_BF16 ? 8 : 256; /* Q8_0 / Q4_0: 8 blocks keep rows aligned */
    return cols > 0 && cols % unit == 0 && row_bytes == want_rb && row_bytes % 16 == 0 && ((uintptr_t)w % 16) == 0 &&
           fg_smem(dtype, cols) <= 46 * 1024 && cols / vals <= 8 * WARP * fg_nv(dtype, nnv - 1) && rows > 0 &&
           rows < ((int64_t)1 << 31);
}

void cu_fgemv_tune(int fly_kb) { fg_fly = fly_kb > 0 ? fly_kb * 1e3 : 96e3; }

void cu_fgemv_force(int ks, int b, int db)
{
    fg_force_ks = ks;
    fg_force_b = b;
    fg_force_db = db;
}

/* Every block rounds the whole x to int16 (load_x16): its cost, counted as
 * bytes of weights streamed meanwhile per value of x (SPARK_CUDA_FG_X16COST;
 * run 10's sweep: the 10240-value down projections ran 0.5-1 us faster at
 * one block an SM than at the two the model without it picked). */
double fg_x16_cost()
{
    static double c = -1;
    if (c < 0) {
        const char *e = getenv("SPARK_CUDA_FG_X16COST");
        c = e && *e ? atof(e) : 2.0;
        if (c < 0) c = 0;
    }
    return c;
}

/* The split (KS, NV) and blocks per SM with the least time: per-SM bytes
 * (padding and the last round's idle slots included) over a bandwidth share
 * that drops when under ~48 KB per SM are in flight, plus each resident
 * block's x preparation when that is the int16 rounding. */
cudaError_t cu_fgemv(cudaStream_t st, const cu_fgemv_args *a, int sms, int pdl)
{
    if (!cu_fgemv_ok(a->dtype, a->cols, a->row_bytes, a->w0, a->rows0 + a->rows1)) return cudaErrorInvalidValue;
    const bool pair = a->pair != 0;
    const int64_t R = pair ? a->rows0 : a->rows0 + a->rows1;
    int vals, nnv, rw;
    double unit_bytes;
    fg_format(a->dtype, &vals, &unit_bytes, &nnv, &rw);
    if (pair) rw = 1; /* a pair's two rows are its set */
    const int nvec = a->cols / vals;
    const size_t smem = fg_smem(a->dtype, a->cols);
    const double prologue = fg_x16(a->dtype) ? fg_x16_cost() * a->cols : 0.0; /* a block's, as bytes */
    fgemv_fn best = NULL;
    unsigned best_grid = 0;
    double best_t = 0, best_fly = 0;
    int best_ks = 0, best_nv = 0;
    for (int ksi = 0; ksi < FG_NKS; ksi++) {
        const int ks = FG_KS[ksi];
        if (fg_force_ks && ks != fg_force_ks) continue;
        const int need = ((nvec + ks - 1) / ks + WARP - 1) / WARP;
        int nvi = 0;
        while (nvi < nnv && fg_nv(a->dtype, nvi) < need) nvi++;
        if (nvi == nnv) continue;
        const int nv = fg_nv(a->dtype, nvi);
        fgemv_fn fn = fg_pick(a->dtype, ksi, nvi, pair, fg_db(), fg_x16(a->dtype));
        int bmax = fg_occupancy(fn, smem);
        if (bmax > 8) bmax = 8;
        const int64_t set_rows = (int64_t)(FG_WARPS / ks) * rw;
        const int64_t groups = (R + set_rows - 1) / set_rows;
        for (int b = 1; b <= bmax; b++) {
            if (fg_force_b && b != fg_force_b) continue;
            int64_t grid = (int64_t)sms * b;
            if (grid > groups) grid = groups;
            const int64_t rounds = (groups + grid - 1) / grid;
            const int64_t per_sm_blocks = (grid + sms - 1) / sms;
            const double group_bytes = (double)FG_THREADS * nv * unit_bytes * (pair ? 2 : rw);
            const double fly = (double)per_sm_blocks * group_bytes;
            const double share = fly >= fg_fly ? 1.0 : fly / fg_fly;
            const double t = (double)rounds * per_sm_blocks * group_bytes / share + per_sm_blocks * prologue;
            if (!best || t < best_t * 0.99 || (t <= best_t * 1.01 && fly > best_fly)) {
                best_ks = ks;
                best_nv = nv;
                best = fn;
                best_grid = (unsigned)grid;
                best_t = t;
                best_fly = fly;
            }
            if (grid == groups) break;
        }
    }
    if (!best) return cudaErrorInvalidValue;
    static const int show = getenv("SPARK_CUDA_FG_SHOW") != NULL;
    if (show)
        fprintf(stderr, "fgemv %lld x %d%s (dtype %d): KS %d NV %d%s%s, %u blocks (%.0f KB in flight per SM)\n",
                (long long)R, a->cols, pair ? " pair" : "", a->dtype, best_ks, best_nv,
                fg_x16(a->dtype) ? " X16" : "", fg_db() ? " DB" : "", best_grid, best_fly / 1e3);
    cudaError_t e = launch_ex(pdl != 0, dim3(best_grid), dim3(FG_THREADS), smem, st, best, *a);
    if (e != cudaSuccess) return e;
    return cudaGetLastError();
}

void cu_fgemv_prepare(int64_t cols)
{
    const int dtypes[] = {CU_BF16, CU_Q8_0, CU_Q4_K, CU_Q6_K, CU_Q4_0};
    for (int dtype : dtypes) {
        int vals, nnv, rw;
        double bytes;
        fg_format(dtype, &vals, &bytes, &nnv, &rw);
        if (cols <= 0 || fg_smem(dtype, cols) > 46 * 1024) continue;
        for (int ksi = 0; ksi < FG_NKS; ksi++)
            for (int nvi = 0; nvi < nnv; nvi++)
                for (int pair = 0; pair < 2; pair++)
                    fg_occupancy(fg_pick(dtype, ksi, nvi, pair != 0, fg_db(), fg_x16(dtype)), fg_smem(dtype, cols));
    }
}

int cu_repack_kind(int dtype) { return dtype == CU_Q8_0 || dtype == CU_Q4_K || dtype == CU_Q6_K || dtype == CU_Q4_0; }

int64_t cu_dev_row_bytes(int dtype, int64_t cols, int64_t file_row_bytes)
{
    return dtype == CU_Q6_K && cols % 256 == 0 ? cols / 256 * 224 : file_row_bytes;
}

cudaError_t cu_repack_rows(cudaStream_t st, void *dst, const void *src, int dtype, int64_t rows, int64_t cols,
                           int64_t file_row_bytes)
{
    const int64_t block = dtype == CU_Q8_0 || dtype == CU_Q4_0 ? 32 : 256;
    if (!cu_repack_kind(dtype) || cols % block != 0) return cudaErrorInvalidValue;
    const int64_t work = rows * (cols / block);
    int64_t blocks = (work + 255) / 256;
    if (blocks > 65535LL * 16) blocks = 65535LL * 16;
    repack_rows_kernel<<<(unsigned)(blocks > 0 ? blocks : 1), 256, 0, st>>>(
        (uint8_t *)dst, (const uint8_t *)src, dtype, rows, cols, file_row_bytes,
        cu_dev_row_bytes(dtype, cols, file_row_bytes));
    return cudaGetLastError();
}

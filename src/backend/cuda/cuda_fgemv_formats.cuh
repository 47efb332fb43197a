/*
 * cuda_fgemv_formats.cuh — the formats of the decode GEMV (cuda_fgemv.cu):
 * what a 16-byte unit of a row holds in each format, and its dot product
 * with x, in float (x as floats in shared memory) and, for the quantized
 * formats, in int16 (x rounded per 32 values, integer dp2a). The kernel in
 * cuda_fgemv.cu is written once against these; a format is a struct with
 * its unit's load and its dot. Included by cuda_fgemv.cu alone.
 */
#pragma once

#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_device.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

using namespace spark_dev;

namespace {

/* byte k of w (0..255), minus `bias`, as a float, exactly: 2^23 + b as bits
 * (one byte permute), minus 2^23 + bias (no integer-to-float conversion) */
template <int BIAS>
__device__ __forceinline__ float byte_f(uint32_t w, int k)
{
    return __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7440u | (unsigned)k)) - (8388608.0f + (float)BIAS);
}

/* byte k of w, a nibble n (0..15), as the float 0.5 + n / 256 in one byte
 * permute: bits 0x3F00_0000 | n << 16. A dot product of such values with x
 * gives sum(n x) = 256 S - 128 sum(x); the offset costs ~4 of fp32's 24
 * bits (relative error ~1e-6 of the sum), and halves the instructions a
 * Q4_K value needs (bench/cuda_runs.md run 8). */
__device__ __forceinline__ float nib_f(uint32_t w, int k)
{
    return __uint_as_float(__byte_perm(w, 0x3F000000u, 0x7044u | ((unsigned)k << 8)));
}

/* ---- the formats: a unit of a row, and its dot product with x ---------------- */
/* x is in shared memory by units, transposed (load_norm_x's VPU = VALS / 4):
 * float4 k of unit i at xs4[k * nvec + i], nvec = units a row. */

struct fmt_bf16 {
    static constexpr int DTYPE = CU_BF16, VALS = 8, RW_SINGLE = 1, X16 = 0, MINB = 0;
    static constexpr double BYTES = 16.0;
    struct unit {
        uint4 q;
    };
    __device__ static unit load(const uint8_t *row, int i, int) { return {__ldcs((const uint4 *)row + i)}; }
    __device__ static unit none() { return {make_uint4(0, 0, 0, 0)}; }
    __device__ static float dot(const unit &u, const float4 *xs4, const float *, int i, int nvec, float acc)
    {
        return dot_bf16x8(u.q, xs4[i], xs4[nvec + i], acc);
    }
};

/* GPU row: cols int8 quants, then cols / 32 f16 scales */
struct fmt_q8_0 {
    static constexpr int DTYPE = CU_Q8_0, VALS = 16, RW_SINGLE = 2, X16 = 0, MINB = 0; /* 2 rows share each x read */
    static constexpr double BYTES = 17.0;
    struct unit {
        uint4 q;
        uint32_t d;
    };
    __device__ static unit load(const uint8_t *row, int i, int cols)
    {
        return {__ldcs((const uint4 *)row + i), (uint32_t)__ldcs((const unsigned short *)(row + cols) + i / 2)};
    }
    __device__ static unit none() { return {make_uint4(0, 0, 0, 0), 0}; }
    __device__ static float dot(const unit &u, const float4 *xs4, const float *, int i, int nvec, float acc)
    {
        const uint32_t w[4] = {u.q.x ^ 0x80808080u, u.q.y ^ 0x80808080u, u.q.z ^ 0x80808080u,
                               u.q.w ^ 0x80808080u}; /* signed -> biased by 128 */
        float s0 = 0.0f, s1 = 0.0f; /* two chains */
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const float4 x = xs4[k * nvec + i];
            s0 = fmaf(byte_f<128>(w[k], 0), x.x, s0);
            s1 = fmaf(byte_f<128>(w[k], 1), x.y, s1);
            s0 = fmaf(byte_f<128>(w[k], 2), x.z, s0);
            s1 = fmaf(byte_f<128>(w[k], 3), x.w, s1);
        }
        return fmaf(h2f((uint16_t)u.d), s0 + s1, acc);
    }
};

/* GPU row: cols / 2 bytes of quants, 16 per sub-block of 32 values (byte t:
 * value t in the low nibble, value 16 + t in the high one), then a 16-byte
 * header per superblock of 8 sub-blocks (d, dmin, 12 bytes of scales), as
 * in the file. Unit i is sub-block i; y = d * sc * q - dmin * mn, so
 * y . x = d sc (q . x) - dmin mn sum(x) with the sums of x per unit made
 * once per launch. */
struct fmt_q4_k {
    static constexpr int DTYPE = CU_Q4_K, VALS = 32, RW_SINGLE = 2, X16 = 0, MINB = 0;
    static constexpr double BYTES = 18.0;
    struct unit {
        uint4 q, h;
    };
    __device__ static unit load(const uint8_t *row, int i, int cols)
    {
        return {__ldcs((const uint4 *)row + i), __ldcs((const uint4 *)(row + cols / 2) + i / 8)};
    }
    __device__ static unit none() { return {make_uint4(0, 0, 0, 0), make_uint4(0, 0, 0, 0)}; }
    /* (a lane's units all have the same j = i % 8: the compiler finds that;
     * selecting by a per-lane table instead cost 32 registers, a second block
     * an SM, bench/cuda_runs.md run 9) */
    /* sub-block i % 8's d * scale (*a) and dmin * min (*m) from the header */
    __device__ static void scale_min(const unit &u, int i, float *a, float *m) { q4k_dev_sub_scale(u.h, i % 8, a, m); }
    __device__ static float dot(const unit &u, const float4 *xs4, const float *xsum, int i, int nvec, float acc)
    {
        float a, dm;
        scale_min(u, i, &a, &dm);
        const uint32_t w[4] = {u.q.x, u.q.y, u.q.z, u.q.w};
        float s0 = 0.0f, s1 = 0.0f; /* two chains: low and high nibbles */
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const uint32_t lo = w[k] & 0x0f0f0f0fu, hi = (w[k] >> 4) & 0x0f0f0f0fu;
            const float4 xl = xs4[k * nvec + i], xh = xs4[(4 + k) * nvec + i];
            s0 = fmaf(nib_f(lo, 0), xl.x, s0);
            s1 = fmaf(nib_f(hi, 0), xh.x, s1);
            s0 = fmaf(nib_f(lo, 1), xl.y, s0);
            s1 = fmaf(nib_f(hi, 1), xh.y, s1);
            s0 = fmaf(nib_f(lo, 2), xl.z, s0);
            s1 = fmaf(nib_f(hi, 2), xh.z, s1);
            s0 = fmaf(nib_f(lo, 3), xl.w, s0);
            s1 = fmaf(nib_f(hi, 3), xh.w, s1);
        }
        /* a sum(n x) - m sum(x) with sum(n x) = 256 S - 128 sum(x) (nib_f) */
        const float X = xsum[i];
        acc = fmaf(256.0f * a, s0 + s1, acc);
        return fmaf(-(128.0f * a + dm), X, acc);
    }
};

/* A 32-value unit held a value a byte (lo[k]: values 4k..4k+3, hi[k]:
 * 16 + 4k..), each byte minus BIAS, against float x: *s0 over values
 * 0..15, *s1 over 16..31 (two chains). */
template <int BIAS>
__device__ __forceinline__ void bytes_dot(const uint32_t (&lo)[4], const uint32_t (&hi)[4], const float4 *xs4, int i,
                                          int nvec, float *s0, float *s1)
{
    float a = 0.0f, b = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const float4 xl = xs4[k * nvec + i], xh = xs4[(4 + k) * nvec + i];
        a = fmaf(byte_f<BIAS>(lo[k], 0), xl.x, a);
        b = fmaf(byte_f<BIAS>(hi[k], 0), xh.x, b);
        a = fmaf(byte_f<BIAS>(lo[k], 1), xl.y, a);
        b = fmaf(byte_f<BIAS>(hi[k], 1), xh.y, b);
        a = fmaf(byte_f<BIAS>(lo[k], 2), xl.z, a);
        b = fmaf(byte_f<BIAS>(hi[k], 2), xh.z, b);
        a = fmaf(byte_f<BIAS>(lo[k], 3), xl.w, a);
        b = fmaf(byte_f<BIAS>(hi[k], 3), xh.w, b);
    }
    *s0 = a;
    *s1 = b;
}

/* GPU row: cols / 2 bytes of quants, 16 per 32-value block (byte t: value t
 * in the low nibble, 16 + t in the high one, as in the file), then the
 * blocks' f16 d. y = d * (n - 8); byte_f<8> gives n - 8 exactly. */
struct fmt_q4_0 {
    static constexpr int DTYPE = CU_Q4_0, VALS = 32, RW_SINGLE = 2, X16 = 0, MINB = 0;
    static constexpr double BYTES = 18.0;
    struct unit {
        uint4 q;
        uint32_t d;
    };
    __device__ static unit load(const uint8_t *row, int i, int cols)
    {
        return {__ldcs((const uint4 *)row + i), (uint32_t)__ldcs((const unsigned short *)(row + cols / 2) + i)};
    }
    __device__ static unit none() { return {make_uint4(0, 0, 0, 0), 0}; }
    __device__ static float dot(const unit &u, const float4 *xs4, const float *, int i, int nvec, float acc)
    {
        const uint32_t w[4] = {u.q.x, u.q.y, u.q.z, u.q.w};
        uint32_t lo[4], hi[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            lo[k] = w[k] & 0x0f0f0f0fu;
            hi[k] = (w[k] >> 4) & 0x0f0f0f0fu;
        }
        float s0, s1;
        bytes_dot<8>(lo, hi, xs4, i, nvec, &s0, &s1);
        return fmaf(h2f((uint16_t)u.d), s0 + s1, acc);
    }
};

/* GPU row: cols / 2 bytes of low 4 bits (16 per 32-value unit, byte t =
 * values t and 16 + t), cols / 4 of top 2 bits (8 per unit), then a word per
 * unit (its two 16-value halves' int8 scales, the superblock's f16 d): see
 * q6k_dev_unit. y = d * scale * (q - 32), so y . x = a0 (q - 32) . x over
 * values 0..15 + a1 (q - 32) . x over 16..31; byte_f<32> gives q - 32
 * exactly from the byte. */
struct fmt_q6_k {
    static constexpr int DTYPE = CU_Q6_K, VALS = 32, RW_SINGLE = 2, X16 = 0, MINB = 0;
    static constexpr double BYTES = 28.0;
    struct unit {
        uint4 q;
        uint2 h;
        uint32_t s;
    };
    __device__ static unit load(const uint8_t *row, int i, int cols)
    {
        return {__ldcs((const uint4 *)row + i), __ldcs((const uint2 *)(row + cols / 2) + i),
                __ldcs((const unsigned int *)(row + cols / 2 + cols / 4) + i)};
    }
    __device__ static unit none() { return {make_uint4(0, 0, 0, 0), make_uint2(0, 0), 0}; }
    __device__ static float dot(const unit &u, const float4 *xs4, const float *, int i, int nvec, float acc)
    {
        uint32_t lo[4], hi[4];
        q6k_dev_unit(u.q, u.h, lo, hi);
        float a0, a1, s0, s1; /* values 0..15 and 16..31: their own scales */
        q6k_dev_scales(u.s, &a0, &a1);
        bytes_dot<32>(lo, hi, xs4, i, nvec, &s0, &s1);
        return fmaf(a1, s1, fmaf(a0, s0, acc));
    }
};

/* ---- quantized rows against x in int16 (the default for Q8_0 / Q4_K) --------- */
/*
 * x rounded to int16 per 32 values, as the CPU's single-token kernels do
 * (backend/cpu/kernels_x8.inc, x8_quant_x16): d = max|x| / 32767, q =
 * round-to-nearest-even(x / d). Each element is within max|x| / 65534 of
 * its group, more precise than the reference's own bf16 activations (SPEC
 * §2; bench/RESULTS.md, "Q8_0 decode with int16 activations"). Then every
 * pair of weights meets a pair of x in one integer dp2a (an int16 pair times
 * two bytes, accumulated in int32, exact), so a 16-value Q8_0 unit costs 8
 * dp2a, a conversion and an FMA where the float form needs 16 byte permutes,
 * 16 subtractions and 16 FMAs, and x in shared memory is half the bytes.
 * Shared memory: xq (cols int16, by units, transposed: uint4 k of unit i at
 * xq[k * nvec + i]), then xd[cols / 32] (the groups' d), then xs[cols / 32]
 * (d * the sum of the group's q, for Q4_K's mins). SPARK_CUDA_QX16=0 keeps
 * the float x path above.
 */
__device__ __forceinline__ int dp2a_lo(uint32_t x2, uint32_t w4, int c)
{
    int d;
    asm("dp2a.lo.s32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(x2), "r"(w4), "r"(c));
    return d;
}

__device__ __forceinline__ int dp2a_hi(uint32_t x2, uint32_t w4, int c)
{
    int d;
    asm("dp2a.hi.s32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(x2), "r"(w4), "r"(c));
    return d;
}

/* 8 x values (one uint4 of int16 pairs) against 8 int8 weights (w0, w1) */
__device__ __forceinline__ int dot8_x16(const uint4 &x, uint32_t w0, uint32_t w1, int s)
{
    s = dp2a_lo(x.x, w0, s);
    s = dp2a_hi(x.y, w0, s);
    s = dp2a_lo(x.z, w1, s);
    return dp2a_hi(x.w, w1, s);
}

struct fmt_q8_0_x16 : fmt_q8_0 {
    /* MINB 2: <= 128 registers, two blocks an SM where the NV 5 kernels took
     * 127-140 and one (no spills; down projection 12.4 -> 11.2 us, run 10) */
    static constexpr int X16 = 1, MINB = 2;
    /* xs4: the xq area; aux: xd then xs (by 32-value groups) */
    __device__ static float dot(const unit &u, const float4 *xs4, const float *aux, int i, int nvec, float acc)
    {
        const uint4 *xq = (const uint4 *)xs4;
        const int lo = dot8_x16(xq[i], u.q.x, u.q.y, 0), hi = dot8_x16(xq[nvec + i], u.q.z, u.q.w, 0);
        return fmaf(h2f((uint16_t)u.d) * aux[i / 2], (float)(lo + hi), acc); /* |sum| <= 16 * 128 * 32767 */
    }
};

/* The sum of a unit's 32 nibbles (byte t: value t low, 16 + t high) times
 * its int16 x: masked to bytes 0..15 they are the int8 dp2a operand (no
 * sign to fix). |sum| <= 32 * 15 * 32767. */
__device__ __forceinline__ int nibbles_x16(const uint4 &q, const uint4 *xq, int i, int nvec)
{
    const uint32_t w[4] = {q.x, q.y, q.z, q.w};
    int sl = 0, sh = 0; /* values 0..15 and 16..31 */
#pragma unroll
    for (int k = 0; k < 4; k += 2) {
        const uint4 xl = xq[(k / 2) * nvec + i], xh = xq[(2 + k / 2) * nvec + i];
        sl = dot8_x16(xl, w[k] & 0x0f0f0f0fu, w[k + 1] & 0x0f0f0f0fu, sl);
        sh = dot8_x16(xh, (w[k] >> 4) & 0x0f0f0f0fu, (w[k + 1] >> 4) & 0x0f0f0f0fu, sh);
    }
    return sl + sh;
}

/* A Q4_K unit against int16 x: a (d_x S) - m X per sub-block */
struct fmt_q4_k_x16 : fmt_q4_k {
    static constexpr int X16 = 1; /* (MINB 0: capped at 128 registers its NV 4-5 kernels spill) */
    __device__ static float dot(const unit &u, const float4 *xs4, const float *aux, int i, int nvec, float acc)
    {
        float a, m;
        scale_min(u, i, &a, &m);
        const int S = nibbles_x16(u.q, (const uint4 *)xs4, i, nvec);
        acc = fmaf(a * aux[i], (float)S, acc); /* one 32-value group a unit: nvec groups */
        return fmaf(-m, aux[nvec + i], acc); /* - dmin * mn * (d * sum q) */
    }
};

/* Q4_0 against int16 x: the nibbles (0..15) in dp2a as Q4_K's, the -8
 * through the group's sum of x (aux[nvec + i] = d_x * its sum of int16
 * values): y . x = d (d_x S - 8 X). */
struct fmt_q4_0_x16 : fmt_q4_0 {
    static constexpr int X16 = 1;
    __device__ static float dot(const unit &u, const float4 *xs4, const float *aux, int i, int nvec, float acc)
    {
        const int S = nibbles_x16(u.q, (const uint4 *)xs4, i, nvec);
        return fmaf(h2f((uint16_t)u.d), fmaf(aux[i], (float)S, -8.0f * aux[nvec + i]), acc);
    }
};

/* Q6_K against int16 x: the unit's bytes q (0..63, q6k_dev_unit) meet x in
 * dp2a, and the -32 is applied through the halves' sums of x (load_x16's
 * SUM16: aux[nvec + 2i], aux[nvec + 2i + 1], each d_x * the half's sum of
 * int16 values): y . x = a_h (d_x S_h - 32 X_h) per 16-value half h. */
struct fmt_q6_k_x16 : fmt_q6_k {
    static constexpr int X16 = 1;
    __device__ static float dot(const unit &u, const float4 *xs4, const float *aux, int i, int nvec, float acc)
    {
        const uint4 *xq = (const uint4 *)xs4;
        uint32_t lo[4], hi[4];
        q6k_dev_unit(u.q, u.h, lo, hi);
        float a0, a1;
        q6k_dev_scales(u.s, &a0, &a1);
        /* |S| <= 16 * 63 * 32767 < 2^25: its float is within 2^-24 relative */
        const int S0 = dot8_x16(xq[nvec + i], lo[2], lo[3], dot8_x16(xq[i], lo[0], lo[1], 0));
        const int S1 = dot8_x16(xq[3 * nvec + i], hi[2], hi[3], dot8_x16(xq[2 * nvec + i], hi[0], hi[1], 0));
        const float dx = aux[i];
        acc = fmaf(a0, fmaf(dx, (float)S0, -32.0f * aux[nvec + 2 * i]), acc);
        return fmaf(a1, fmaf(dx, (float)S1, -32.0f * aux[nvec + 2 * i + 1]), acc);
    }
};

} // namespace

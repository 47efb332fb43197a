/*
 * cuda_fmt.cuh — the weight formats of the single-token GEMVs: what a
 * 16-byte "unit" of a row holds and its dot product with x, shared by the
 * fgemv kernels (cuda_fgemv.cu, rows read from global memory) and the
 * persistent step (cuda_step.cu, rows landed in shared memory by the bulk
 * copy engine). x is in shared memory by units, transposed: float4 k of
 * unit i at xs4[k * nvec + i], nvec = units a row (load_norm_x's VPU =
 * VALS / 4), so lanes reading consecutive units hit consecutive banks.
 * Included by .cu files only.
 */
#ifndef SPARK_BACKEND_CUDA_FMT_CUH
#define SPARK_BACKEND_CUDA_FMT_CUH

#include "backend/cuda/cuda_device.cuh"

namespace spark_dev {

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
    __device__ static unit load_shared(const uint8_t *row, int i, int) { return {((const uint4 *)row)[i]}; }
    __device__ static unit none() { return {make_uint4(0, 0, 0, 0)}; }
    __device__ static float dot(const unit &u, const float4 *xs4, const float *, int i, int nvec, float acc)
    {
        const uint4 w = u.q;
        const float4 x0 = xs4[i], x1 = xs4[nvec + i];
        acc = fmaf(__uint_as_float(w.x << 16), x0.x, acc);
        acc = fmaf(__uint_as_float(w.x & 0xffff0000u), x0.y, acc);
        acc = fmaf(__uint_as_float(w.y << 16), x0.z, acc);
        acc = fmaf(__uint_as_float(w.y & 0xffff0000u), x0.w, acc);
        acc = fmaf(__uint_as_float(w.z << 16), x1.x, acc);
        acc = fmaf(__uint_as_float(w.z & 0xffff0000u), x1.y, acc);
        acc = fmaf(__uint_as_float(w.w << 16), x1.z, acc);
        acc = fmaf(__uint_as_float(w.w & 0xffff0000u), x1.w, acc);
        return acc;
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
    __device__ static unit load_shared(const uint8_t *row, int i, int cols)
    {
        return {((const uint4 *)row)[i], (uint32_t)((const unsigned short *)(row + cols))[i / 2]};
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
    __device__ static unit load_shared(const uint8_t *row, int i, int cols)
    {
        return {((const uint4 *)row)[i], ((const uint4 *)(row + cols / 2))[i / 8]};
    }
    __device__ static unit none() { return {make_uint4(0, 0, 0, 0), make_uint4(0, 0, 0, 0)}; }
    /* (a lane's units all have the same j = i % 8: the compiler finds that;
     * selecting by a per-lane table instead cost 32 registers, a second block
     * an SM, bench/cuda_runs.md run 9) */
    /* sub-block i % 8's d * scale (*a) and dmin * min (*m) from the header */
    __device__ static void scale_min(const unit &u, int i, float *a, float *m)
    {
        /* sub-block j's 6-bit scale and min (model/quant.c's packing): for j < 4
         * bytes j, j + 4; else the low / high nibbles of byte j + 4 with the
         * top bits of bytes j - 4 / j. A = bytes 2c, 2c + 1 (c = j / 2), B =
         * bytes 2c + 4, +5, Cw = bytes 2c - 4, -3 of the 12 scale bytes. */
        const int j = i % 8, c = j / 2, sh = (c & 1) * 16, hb = (j & 1) * 8;
        const uint32_t A = ((c < 2 ? u.h.y : u.h.z) >> sh) & 0xffffu;
        const uint32_t B = ((c < 2 ? u.h.z : u.h.w) >> sh) & 0xffffu;
        const uint32_t Cw = (u.h.y >> sh) & 0xffffu;
        const uint32_t sc2 = c < 2 ? A & 0x3f3fu : (B & 0x0f0fu) | ((Cw >> 2) & 0x3030u);
        const uint32_t mn2 = c < 2 ? B & 0x3f3fu : ((B >> 4) & 0x0f0fu) | ((A >> 2) & 0x3030u);
        const float sc = (float)((sc2 >> hb) & 0xffu), mn = (float)((mn2 >> hb) & 0xffu);
        *a = h2f((uint16_t)u.h.x) * sc;
        *m = h2f((uint16_t)(u.h.x >> 16)) * mn;
    }
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

} // namespace spark_dev

#endif

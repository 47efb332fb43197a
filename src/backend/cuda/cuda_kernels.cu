/*
 * cuda_kernels.cu — the device kernels of the CUDA backend and their launch
 * shapes: weight decoding for every stored format, the decode GEMVs, the
 * element-wise ops of SPARK §2 and split-KV (flash-decoding) attention.
 *
 * Decode at batch 1 is a stream over the weights, so the GEMVs are built
 * for bytes in flight: one warp per output row, 16-byte loads, several
 * loads issued before the first is used. Everything else is small and only
 * has to be right and not wasteful. The fast decode path (fgemv, rope_kv,
 * the gate inside attention) is at the end: fused launches for one token. Numbers follow the CPU backend: fp32
 * activations and accumulation, rope angles in double, exact erf GELU.
 */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_device.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <type_traits>

using namespace spark_dev;

namespace {

__device__ __forceinline__ float b2f(uint16_t b) { return __uint_as_float((uint32_t)b << 16); }
__device__ __forceinline__ uint16_t ld16(const uint8_t *p) { return *(const uint16_t *)p; }

/* ---- weight decoding: 32 consecutive values of a row ---------------------- */

/* y[0..31] = values [32g, 32g + 32) of a row (zeros past `cols` for the plain
 * formats; block formats always hold whole groups). Layouts: model/quant.c,
 * except the block formats, which are in the device layout of
 * cu_repack_rows (quants first, then the row's scales / superblock
 * headers). */
__device__ void dq32(int dtype, const uint8_t *row, int64_t g, int64_t cols, float *y)
{
    int64_t c0 = g * 32;
    switch (dtype) {
    case CU_F32:
    case CU_F16:
    case CU_BF16:
        for (int i = 0; i < 32; i++) {
            int64_t c = c0 + i;
            float v = 0.0f;
            if (c < cols) {
                if (dtype == CU_F32) v = ((const float *)row)[c];
                else if (dtype == CU_F16) v = h2f(((const uint16_t *)row)[c]);
                else v = b2f(((const uint16_t *)row)[c]);
            }
            y[i] = v;
        }
        return;
    case CU_Q8_0: {
        float d = h2f(ld16(row + cols + 2 * g));
        const int8_t *q = (const int8_t *)(row + 32 * g);
        for (int i = 0; i < 32; i++) y[i] = d * (float)q[i];
        return;
    }
    case CU_Q4_0: {
        const uint8_t *q = row + 16 * g; /* byte t holds values t (low nibble) and 16 + t */
        float d = h2f(ld16(row + cols / 2 + 2 * g));
        for (int i = 0; i < 16; i++) {
            y[i] = d * (float)((q[i] & 0x0F) - 8);
            y[i + 16] = d * (float)((q[i] >> 4) - 8);
        }
        return;
    }
    case CU_Q4_K: {
        const uint4 *hdr = (const uint4 *)(row + cols / 2) + g / 8; /* the superblock's header */
        float a, m;
        q4k_dev_sub_scale(*hdr, (int)(g % 8), &a, &m);
        const uint8_t *q = row + 16 * g; /* sub-block g: byte t holds values t (low nibble) and 16 + t */
        for (int l = 0; l < 32; l++) y[l] = a * (float)((q[l & 15] >> (l < 16 ? 0 : 4)) & 0x0F) - m;
        return;
    }
    case CU_Q6_K: { /* unit g (q6k_dev_unit) */
        uint32_t lo[4], hi[4];
        q6k_dev_unit(*((const uint4 *)row + g), *((const uint2 *)(row + cols / 2) + g), lo, hi);
        float a0, a1;
        q6k_dev_scales(*((const uint32_t *)(row + cols / 2 + cols / 4) + g), &a0, &a1);
        for (int l = 0; l < 16; l++) {
            y[l] = a0 * (float)((int)((lo[l / 4] >> (8 * (l % 4))) & 0xFF) - 32);
            y[16 + l] = a1 * (float)((int)((hi[l / 4] >> (8 * (l % 4))) & 0xFF) - 32);
        }
        return;
    }
    default:
        for (int i = 0; i < 32; i++) y[i] = __int_as_float(0x7fc00000); /* unknown: NaN, loudly */
    }
}

/* ---- GEMV ----------------------------------------------------------------- */

/* One warp sweeps a row's 16-byte units front to back, U in flight a lane
 * (decode is a pure weight stream: ~U * 512 bytes a warp in flight), and
 * fold(i, unit, acc) adds unit i's products to the NT tokens' sums, which
 * lane 0 stores. */
template <int NT, int U, typename Fold>
__device__ __forceinline__ void sweep_row(float *__restrict__ out, const uint4 *__restrict__ units, int64_t nunits,
                                          int64_t row, int64_t rows, Fold fold)
{
    const int lane = threadIdx.x % WARP;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    for (int64_t base = lane; base < nunits; base += (int64_t)WARP * U) {
        uint4 v[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            int64_t i = base + (int64_t)u * WARP;
            if (i < nunits) v[u] = __ldcs(units + i); /* streamed once: don't keep in L2 */
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            int64_t i = base + (int64_t)u * WARP;
            if (i >= nunits) break;
            fold(i, v[u], acc);
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        float s = warp_sum(acc[t]);
        if (lane == 0) out[t * rows + row] = s;
    }
}

/* Warps a block of the few-token GEMVs below (a warp a row): their launch
 * bounds and the launches share it. */
constexpr int ROW_WARPS = 8;

/* Plain formats, 16-byte weight loads, a warp a row (so each row is one
 * contiguous stream). */
template <typename T, int NT, int U>
__global__ void __launch_bounds__(ROW_WARPS * WARP)
gemv_vec_kernel(float *__restrict__ out, const float *__restrict__ x, const uint8_t *__restrict__ w, int64_t rows,
                int64_t cols, int64_t row_bytes)
{
    constexpr int PER = 16 / sizeof(T); /* values per 16-byte load */
    const int64_t row = (int64_t)blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    if (row >= rows) return;
    auto fold = [&](int64_t i, uint4 v, float(&acc)[NT]) {
        float wf[PER];
        if constexpr (sizeof(T) == 4) {
            wf[0] = __uint_as_float(v.x);
            wf[1] = __uint_as_float(v.y);
            wf[2] = __uint_as_float(v.z);
            wf[3] = __uint_as_float(v.w);
        } else {
            uint32_t p[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int k = 0; k < 4; k++) {
                if constexpr (std::is_same<T, __nv_bfloat16>::value) {
                    wf[2 * k] = __uint_as_float(p[k] << 16);
                    wf[2 * k + 1] = __uint_as_float(p[k] & 0xffff0000u);
                } else {
                    wf[2 * k] = h2f((uint16_t)(p[k] & 0xffff));
                    wf[2 * k + 1] = h2f((uint16_t)(p[k] >> 16));
                }
            }
        }
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float4 *xv = (const float4 *)(x + t * cols + i * PER);
            float s = acc[t];
#pragma unroll
            for (int k = 0; k < PER / 4; k++) {
                float4 a = __ldg(xv + k);
                s = fmaf(wf[4 * k], a.x, s);
                s = fmaf(wf[4 * k + 1], a.y, s);
                s = fmaf(wf[4 * k + 2], a.z, s);
                s = fmaf(wf[4 * k + 3], a.w, s);
            }
            acc[t] = s;
        }
    };
    sweep_row<NT, U>(out, (const uint4 *)(w + row * row_bytes), cols / PER, row, rows, fold);
}

/* Q8_0, Q4_K, Q6_K and Q4_0 in the device layout (cu_repack_rows), a few
 * tokens: a warp a row, as gemv_vec_kernel. A Q8_0 unit is 16 values of one
 * block (its f16 scale follows the row's quants); a Q4_K unit is one
 * 32-value sub-block, byte t holding values t and 16 + t, a Q4_0 unit a
 * block so, and a Q6_K unit the low 4 bits of 32 values so (its top bits
 * and scales read beside), so all decode in column order against
 * contiguous x. Each unit's products are summed
 * before its scale (and Q4_K's min) is applied. */
template <int FMT, int NT, int U>
__global__ void __launch_bounds__(ROW_WARPS * WARP)
gemv_quant_kernel(float *__restrict__ out, const float *__restrict__ x, const uint8_t *__restrict__ w, int64_t rows,
                  int64_t cols, int64_t row_bytes)
{
    constexpr int VALS = FMT == CU_Q8_0 ? 16 : 32; /* values a 16-byte unit holds */
    const int64_t row = (int64_t)blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    if (row >= rows) return;
    const uint8_t *wr = w + row * row_bytes;
    auto fold = [&](int64_t i, uint4 v, float(&acc)[NT]) {
        uint32_t p[4] = {v.x, v.y, v.z, v.w}, p6[4]; /* Q6_K: values 0..15, 16..31 (q + 32) */
        float scale, shift = 0.0f, scale1 = 0.0f;
        if constexpr (FMT == CU_Q8_0) {
            scale = h2f(__ldg((const unsigned short *)(wr + cols) + i / 2));
        } else if constexpr (FMT == CU_Q4_0) {
            scale = h2f(__ldg((const unsigned short *)(wr + cols / 2) + i));
        } else if constexpr (FMT == CU_Q4_K) {
            q4k_dev_sub_scale(*((const uint4 *)(wr + cols / 2) + i / 8), (int)(i % 8), &scale, &shift);
        } else {
            q6k_dev_unit(v, __ldg((const uint2 *)(wr + cols / 2) + i), p, p6);
            q6k_dev_scales(__ldg((const unsigned int *)(wr + cols / 2 + cols / 4) + i), &scale, &scale1);
        }
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float4 *xv = (const float4 *)(x + t * cols + i * VALS);
            float dot = 0.0f, dot1 = 0.0f, xsum = 0.0f; /* dot1: Q6_K's values 16..31 */
#pragma unroll
            for (int k = 0; k < VALS / 4; k++) {
                float4 a = __ldg(xv + k);
                float q[4];
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int c = 4 * k + e; /* the value's column within the unit */
                    const uint32_t nib = (p[(c % 16) / 4] >> (8 * (c % 4) + (c < 16 ? 0 : 4))) & 0x0F; /* Q4_K, Q4_0 */
                    if constexpr (FMT == CU_Q8_0)
                        q[e] = (float)(int8_t)(p[c / 4] >> (8 * (c % 4)));
                    else if constexpr (FMT == CU_Q4_K)
                        q[e] = (float)nib;
                    else if constexpr (FMT == CU_Q4_0)
                        q[e] = (float)((int)nib - 8);
                    else
                        q[e] = (float)((int)(((c < 16 ? p : p6)[(c % 16) / 4] >> (8 * (c % 4))) & 0xFF) - 32);
                }
                if (FMT == CU_Q6_K && k >= 4)
                    dot1 = fmaf(q[0], a.x, fmaf(q[1], a.y, fmaf(q[2], a.z, fmaf(q[3], a.w, dot1))));
                else
                    dot = fmaf(q[0], a.x, fmaf(q[1], a.y, fmaf(q[2], a.z, fmaf(q[3], a.w, dot))));
                if constexpr (FMT == CU_Q4_K) xsum += (a.x + a.y) + (a.z + a.w);
            }
            acc[t] = fmaf(scale, dot, acc[t]);
            if constexpr (FMT == CU_Q4_K) acc[t] = fmaf(-shift, xsum, acc[t]);
            if constexpr (FMT == CU_Q6_K) acc[t] = fmaf(scale1, dot1, acc[t]);
        }
    };
    sweep_row<NT, U>(out, (const uint4 *)wr, cols / VALS, row, rows, fold);
}

/* Block formats (and odd-sized plain rows): one warp per row, each lane
 * decodes whole 32-value groups; neighbouring lanes read neighbouring
 * blocks, so a warp still sweeps the row front to back. */
template <int NT>
__global__ void __launch_bounds__(ROW_WARPS * WARP)
gemv_groups_kernel(float *__restrict__ out, const float *__restrict__ x, const uint8_t *__restrict__ w, int dtype,
                   int64_t rows, int64_t cols, int64_t row_bytes)
{
    int64_t row = (int64_t)blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    int lane = threadIdx.x % WARP;
    if (row >= rows) return;
    const uint8_t *wr = w + row * row_bytes;
    int64_t groups = (cols + 31) / 32;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    for (int64_t g = lane; g < groups; g += WARP) {
        float y[32];
        dq32(dtype, wr, g, cols, y);
        int lim = cols - g * 32 < 32 ? (int)(cols - g * 32) : 32;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float *xt = x + t * cols + g * 32;
            float s = acc[t];
            for (int i = 0; i < lim; i++) s = fmaf(y[i], __ldg(xt + i), s);
            acc[t] = s;
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        float s = warp_sum(acc[t]);
        if (lane == 0) out[t * rows + row] = s;
    }
}

/* A value as a bf16 pair: hi = v rounded, lo = the rest rounded, so hi + lo
 * holds 16 of v's 24 significant bits (exact for bf16 and f16 values). */
__device__ __forceinline__ void split_bf16(float v, __nv_bfloat16 *hi, __nv_bfloat16 *lo)
{
    const __nv_bfloat16 h = __float2bfloat16_rn(v);
    *hi = h;
    *lo = __float2bfloat16_rn(v - __bfloat162float(h));
}

/* Where decoded weights go: a float32 panel (SGEMM) or a bf16 hi + lo pair
 * of panels (tensor-core GEMMs). */
struct panel_f32 {
    float *p;
    __device__ void put(int64_t i, float v) const { p[i] = v; }
};
struct panel_bf16x2 {
    __nv_bfloat16 *hi, *lo;
    __device__ void put(int64_t i, float v) const { split_bf16(v, hi + i, lo + i); }
};

/* Grid-stride decode of rows into a panel for cuBLAS: one thread per
 * 32-value group (row-major panel, contiguous per row). */
template <typename P>
__global__ void dequant_rows_kernel(P panel, const uint8_t *w, int dtype, int64_t r0, int64_t prow, int64_t cols,
                                    int64_t row_bytes)
{
    int64_t groups = (cols + 31) / 32;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < prow * groups;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / groups, g = i % groups;
        float y[32];
        dq32(dtype, w + (r0 + r) * row_bytes, g, cols, y);
        int lim = cols - g * 32 < 32 ? (int)(cols - g * 32) : 32;
        for (int k = 0; k < lim; k++) panel.put(r * cols + g * 32 + k, y[k]);
    }
}

/* The same for rows of whole groups (cols % 32 == 0), where a block's 256
 * groups are one run of the panel: each thread decodes its group into
 * shared memory, then the block stores the run, consecutive threads
 * consecutive values. (A thread storing its own group stored 32 values
 * 64-128 bytes apart from its neighbours' in each instruction: the 4B's
 * Q8_0 prefill of 512 tokens took 146 ms with that, 60 ms with this, on an
 * H100: bench/cuda_runs.md run 25.) */
template <typename P>
__global__ void __launch_bounds__(256) dequant_run_kernel(P panel, const uint8_t *w, int dtype, int64_t r0,
                                                          int64_t prow, int64_t cols, int64_t row_bytes)
{
    __shared__ float run[256 * 33]; /* a group a row, padded: no bank conflicts either way */
    const int64_t groups = cols / 32, total = prow * groups;
    for (int64_t b0 = (int64_t)blockIdx.x * 256; b0 < total; b0 += (int64_t)gridDim.x * 256) {
        const int64_t i = b0 + threadIdx.x;
        if (i < total) {
            float y[32];
            dq32(dtype, w + (r0 + i / groups) * row_bytes, i % groups, cols, y);
#pragma unroll
            for (int k = 0; k < 32; k++) run[threadIdx.x * 33 + k] = y[k];
        }
        __syncthreads();
        const int n = (int)(total - b0 < 256 ? total - b0 : 256) * 32;
        for (int j = threadIdx.x; j < n; j += 256) panel.put(b0 * 32 + j, run[(j >> 5) * 33 + (j & 31)]);
        __syncthreads();
    }
}

/* Element i of x as the bf16 pair its GEMM multiplies, when `pair` asks for
 * one (hi NULL: no pair; lo NULL: hi alone, x rounded once as with
 * SPARK_CUDA_PREFILL_X=bf16). */
__device__ __forceinline__ void put_pair(cu_pair pair, int64_t i, float v)
{
    __nv_bfloat16 *hi = (__nv_bfloat16 *)pair.hi, *lo = (__nv_bfloat16 *)pair.lo;
    if (!hi) return;
    if (lo) split_bf16(v, hi + i, lo + i);
    else hi[i] = __float2bfloat16_rn(v);
}

/* Element-wise, grid-stride: the hi/lo bf16 pair cuBLAS multiplies. */
__global__ void split_bf16_kernel(cu_pair pair, const float *x, int64_t count)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x)
        put_pair(pair, i, x[i]);
}

/* ---- small ops ------------------------------------------------------------ */

/* One block per token row, one thread per 32-value group: rows are short. */
__global__ void embed_kernel(float *out, const uint8_t *table, int dtype, int64_t cols, int64_t row_bytes,
                             const int32_t *ids)
{
    int t = blockIdx.x;
    const uint8_t *row = table + (int64_t)ids[t] * row_bytes;
    int64_t groups = (cols + 31) / 32;
    for (int64_t g = threadIdx.x; g < groups; g += blockDim.x) {
        float y[32];
        dq32(dtype, row, g, cols, y);
        int lim = cols - g * 32 < 32 ? (int)(cols - g * 32) : 32;
        for (int k = 0; k < lim; k++) out[(int64_t)t * cols + g * 32 + k] = y[k];
    }
}

/* One block per row: a block-wide sum of squares, then one scaled pass
 * (which also writes the rows' bf16 pair for the GEMM that reads them). */
__global__ void __launch_bounds__(256) rmsnorm_kernel(float *out, const float *x, const float *w, int dim, float eps,
                                                      cu_pair pair)
{
    __shared__ float part[256 / WARP];
    const float *xr = x + (int64_t)blockIdx.x * dim;
    float *yr = out + (int64_t)blockIdx.x * dim;
    float s = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) s = fmaf(xr[i], xr[i], s);
    s = warp_sum(s);
    if (threadIdx.x % WARP == 0) part[threadIdx.x / WARP] = s;
    __syncthreads();
    if (threadIdx.x < WARP) {
        float v = threadIdx.x < blockDim.x / WARP ? part[threadIdx.x] : 0.0f;
        v = warp_sum(v);
        if (threadIdx.x == 0) part[0] = v;
    }
    __syncthreads();
    float inv = 1.0f / sqrtf(part[0] / (float)dim + eps);
    const int64_t row0 = (int64_t)blockIdx.x * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        const float v = xr[i] * inv * w[i];
        yr[i] = v;
        put_pair(pair, row0 + i, v);
    }
}

/* One thread per (token, rotated pair): the angle is computed once, in
 * double as on the CPU, and applied to every head of the row. */
__global__ void rope_kernel(float *x, int n, int64_t stride, int n_heads, int head_dim, const int64_t *pos, int half,
                            double theta)
{
    const int64_t pos0 = *pos;
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)n * half) return;
    int t = (int)(i / half), j = (int)(i % half);
    float c, s;
    rope_cos_sin(pos0 + t, j, half, theta, &c, &s);
    float *row = x + (int64_t)t * stride;
    for (int h = 0; h < n_heads; h++) {
        float *v = row + (int64_t)h * head_dim;
        float a = v[j], b = v[j + half];
        v[j] = a * c - b * s;
        v[j + half] = b * c + a * s;
    }
}

__global__ void gate_heads_kernel(float *o, const float *g, int64_t count, int head_dim, cu_pair pair)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x) {
        const float v = o[i] * (1.0f / (1.0f + expf(-g[i / head_dim])));
        o[i] = v;
        put_pair(pair, i, v);
    }
}

__global__ void gelu_mul_kernel(float *a, const float *b, int64_t count, cu_pair pair)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x) {
        const float u = a[i];
        const float v = 0.5f * u * (1.0f + erff(u * 0.70710678118654752f)) * b[i]; /* exact erf form */
        a[i] = v;
        put_pair(pair, i, v);
    }
}

__global__ void add_kernel(float *y, const float *x, int64_t count)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x)
        y[i] += x[i];
}

/* out[r, t] = the sum of a stacked product's parts: `wide` holds, column-
 * major with leading dimension parts_r * rows, the products of parts_r row
 * blocks of rows each against 2n columns (x hi, then x lo). */
__global__ void fold_products_kernel(float *out, int64_t ldo, const float *wide, int64_t rows, int n, int parts_r)
{
    const int64_t count = rows * n, ldw = parts_r * rows;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i % rows, t = i / rows;
        float s = 0.0f;
        for (int a = 0; a < parts_r; a++) s += wide[a * rows + r + t * ldw] + wide[a * rows + r + (t + n) * ldw];
        out[r + t * ldo] = s;
    }
}

/* A ring keeps only the newest `slots` rows of the chunk. */
__global__ void kv_store_kernel(float *kc, float *vc, int64_t slots, const float *qkv, const int64_t *pos, int first,
                                int n, int64_t q_dim, int64_t kv_dim, int64_t qkv_stride)
{
    const int64_t pos0 = *pos;
    int64_t count = (int64_t)(n - first) * kv_dim;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x) {
        int t = first + (int)(i / kv_dim);
        int64_t e = i % kv_dim;
        int64_t slot = (pos0 + t) % slots;
        const float *row = qkv + (int64_t)t * qkv_stride + q_dim;
        kc[slot * kv_dim + e] = row[e];
        vc[slot * kv_dim + e] = row[kv_dim + e];
    }
}

/* ---- attention -------------------------------------------------------------- */

/* Warps per attention block: 8 where the warps' merge buffer fits in 40 KB
 * of shared memory, else 4 (SPARK_CUDA_ATT_WARPS=4 forces 4). */
constexpr int att_warps(int E, int GMAX) { return 8 * GMAX * E * 32 * 4 <= 40960 ? 8 : 4; }
constexpr int ATT_KT = 4; /* keys a warp scores together */

/* One block per (query token, KV head, key split); the G query heads of the
 * KV head share every key/value row fetched. A warp owns every ATT_WARPS-th
 * key of the split and keeps an online softmax per head; lanes hold E
 * interleaved dims (d = lane + 32 e) so a key row is read coalesced. Splits
 * over the key range keep the whole GPU busy at batch 1 on long contexts
 * (flash-decoding); their partial (max, sum, out) are merged afterwards. */
template <int E, int GMAX, int ATT_WARPS>
__global__ void __launch_bounds__(ATT_WARPS * 32) attention_kernel(cu_attn_args a)
{
    if (a.pdl_early) pdl_release(); /* the next kernels may become resident now (see cu_attn_args) */
    pdl_wait();
    pdl_release();
    const int D = a.head_dim, G = a.n_head / a.n_head_kv;
    const int t = blockIdx.x / a.n_head_kv, kh = blockIdx.x % a.n_head_kv, split = blockIdx.y;
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int64_t q_dim = (int64_t)a.n_head * D, kv_dim = (int64_t)a.n_head_kv * D;
    const int64_t pos0 = *a.pos, p = pos0 + t;
    int64_t lo = a.window ? p - a.window + 1 : 0; /* sliding: 0 <= p - j < window */
    if (lo < 0) lo = 0;
    /* the most keys any query of the chunk sees, cut into equal splits */
    const int64_t keys = a.window && a.window < pos0 + a.n ? a.window : pos0 + a.n;
    int64_t per_split = (keys + a.splits - 1) / a.splits;
    if (per_split < a.min_split_keys) per_split = a.min_split_keys; /* short contexts: fewer, fuller splits */
    const int64_t j_begin = lo + (int64_t)split * per_split;
    int64_t j_end = j_begin + per_split;
    if (j_end > p + 1) j_end = p + 1;
    if (a.splits > 1 && j_begin >= j_end && keys > 0) { /* no keys: an empty partial is all the merge reads */
        if (threadIdx.x < G) a.ws[(((int64_t)t * a.n_head + kh * G + threadIdx.x) * a.splits + split) * (D + 2)] = -INFINITY;
        return;
    }

    float q[GMAX][E], acc[GMAX][E], m[GMAX], l[GMAX];
    const float *qrow = a.qkv + (int64_t)t * a.qkv_stride;
#pragma unroll
    for (int g = 0; g < GMAX; g++) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
#pragma unroll
        for (int e = 0; e < E; e++) {
            int d = lane + 32 * e;
            int h = kh * G + g;
            q[g][e] = (g < G && d < D) ? qrow[(int64_t)h * D + d] * a.scale : 0.0f;
            acc[g][e] = 0.0f;
        }
    }

    /* a warp takes ATT_KT keys at a time: their scores reduce side by side
     * (independent shuffle chains) and the running softmax is rescaled once
     * per tile, not once per key */
    auto load = [&](int64_t j0, float (&k)[ATT_KT][E], float (&v)[ATT_KT][E]) {
#pragma unroll
        for (int u = 0; u < ATT_KT; u++) {
            const int64_t j = j0 + u;
            const float *kr = NULL, *vr = NULL;
            if (j < j_end) {
                if (j >= pos0) { /* this chunk's own rows, still in qkv */
                    kr = a.qkv + (j - pos0) * a.qkv_stride + q_dim + (int64_t)kh * D;
                    vr = kr + kv_dim;
                } else {           /* earlier positions: the cache (ring slot j % slots) */
                    const int64_t off = (j % a.slots) * kv_dim + (int64_t)kh * D;
                    kr = a.kc + off;
                    vr = a.vc + off;
                }
            }
#pragma unroll
            for (int e = 0; e < E; e++) {
                const int d = lane + 32 * e;
                k[u][e] = kr && d < D ? kr[d] : 0.0f;
                v[u][e] = vr && d < D ? vr[d] : 0.0f;
            }
        }
    };
    /* the next tile's loads are issued before the current one is scored,
     * so a warp always has a tile in flight: at ctx 32k (2.5 GB of f32 keys
     * and values a token) the kernel streamed at ~55 % of the copy
     * bandwidth with one tile at a time and ~85 % with two (run 23). Not
     * for 8 query heads of 256 dims, where the second tile would spill. */
    constexpr bool AHEAD = E * GMAX <= 32;
    constexpr int64_t STRIDE = (int64_t)ATT_WARPS * ATT_KT;
    float k[ATT_KT][E], v[ATT_KT][E];
    int64_t j0 = j_begin + (int64_t)warp * ATT_KT;
    if (AHEAD && j0 < j_end) load(j0, k, v);
    for (; j0 < j_end; j0 += STRIDE) {
        float k2[ATT_KT][E], v2[ATT_KT][E];
        if (!AHEAD) load(j0, k, v);
        else if (j0 + STRIDE < j_end) load(j0 + STRIDE, k2, v2);
        att_tile<ATT_KT, E, GMAX>(q, k, v, G, j_end - j0, acc, m, l);
        if (AHEAD) att_next_tile(k, v, k2, v2);
    }

    /* merge the warps' states through shared memory */
    __shared__ float sm_m[ATT_WARPS][GMAX], sm_l[ATT_WARPS][GMAX];
    __shared__ float sm_acc[ATT_WARPS][GMAX][E * 32];
    att_store_warp<ATT_WARPS, E, GMAX>(sm_m, sm_l, sm_acc, warp, lane, m, l, acc);
    __syncthreads();
    for (int i = threadIdx.x; i < G * D; i += blockDim.x) {
        int g = i / D, d = i % D;
        float M, L, A;
        att_merge_warps<ATT_WARPS, E, GMAX>(sm_m, sm_l, sm_acc, g, d, &M, &L, &A);
        int h = kh * G + g;
        if (a.splits == 1) {
            float o = A / L;
            if (a.gate) o *= 1.0f / (1.0f + expf(-a.gate[(int64_t)t * a.n_head + h]));
            a.out[((int64_t)t * a.n_head + h) * D + d] = o;
        } else {
            float *ws = a.ws + (((int64_t)t * a.n_head + h) * a.splits + split) * (D + 2);
            if (d == 0) {
                ws[0] = M;
                ws[1] = L;
            }
            ws[2 + d] = A;
        }
    }
}

/* One block per (token, head): merge the splits' partial softmax states.
 * The splits' maxima and weights are found once, in parallel, into shared
 * memory; each dim then sums the non-empty splits in ascending order (the
 * same float operations, in the same order, as a serial merge). */
constexpr int MERGE_MAX_SPLITS = 1024;
__global__ void attention_merge_kernel(float *out, const float *ws, int splits, int head_dim, const float *gate,
                                       int early)
{
    if (early) pdl_release();
    pdl_wait();
    pdl_release();
    __shared__ float f[MERGE_MAX_SPLITS], red[32];
    const int64_t row = head_dim + 2;
    const float *base = ws + (int64_t)blockIdx.x * splits * row;
    float m = -INFINITY;
    for (int s = threadIdx.x; s < splits; s += blockDim.x) m = fmaxf(m, base[(int64_t)s * row]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (threadIdx.x % WARP == 0) red[threadIdx.x / WARP] = m;
    __syncthreads();
    float M = -INFINITY;
    for (int w = 0; w < (int)(blockDim.x + WARP - 1) / WARP; w++) M = fmaxf(M, red[w]);
    for (int s = threadIdx.x; s < splits; s += blockDim.x) {
        const float ms = base[(int64_t)s * row];
        f[s] = ms == -INFINITY ? 0.0f : expf(ms - M); /* 0: skipped below */
    }
    __syncthreads();
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float L = 0.0f, A = 0.0f;
        for (int s0 = 0; s0 < splits; s0 += 4) {
            float l4[4], a4[4];
#pragma unroll
            for (int u = 0; u < 4; u++) { /* four independent loads in flight */
                const int s = s0 + u;
                const bool on = s < splits && f[s] != 0.0f;
                l4[u] = on ? base[(int64_t)s * row + 1] : 0.0f;
                a4[u] = on ? base[(int64_t)s * row + 2 + d] : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const int s = s0 + u;
                if (s < splits && f[s] != 0.0f) {
                    L += l4[u] * f[s];
                    A += a4[u] * f[s];
                }
            }
        }
        float o = A / L;
        if (gate) o *= 1.0f / (1.0f + expf(-gate[blockIdx.x])); /* block = token * n_head + head */
        out[(int64_t)blockIdx.x * head_dim + d] = o;
    }
}

__global__ void set_i64_kernel(int64_t *dst, int64_t v) { *dst = v; }
/* ---- rope of a decode step ------------------------------------------------------ */

/* One block per head (q heads, then k heads, then v heads), one thread per
 * dim: rotate q and k pairs (angles in double, as rope_kernel), store k and
 * v into the cache slot of the position. */
/* tab[t], tab[half + t] = cos, sin of the angle of pair t at *pos (double,
 * as rope_kernel): once a step per rope class, for rope_kv to read. */
__global__ void rope_table_kernel(float *tab, const int64_t *pos, int half, double theta)
{
    pdl_wait();
    pdl_release();
    for (int t = threadIdx.x; t < half; t += blockDim.x) rope_cos_sin(*pos, t, half, theta, &tab[t], &tab[half + t]);
}

__global__ void rope_kv_kernel(float *qkv, int n_q, int n_kv, int D, const int64_t *pos, int half, double theta,
                               float *kc, float *vc, int64_t slots, const float *tab)
{
    pdl_wait();
    pdl_release();
    const int h = blockIdx.x, t = threadIdx.x;
    const int64_t pos0 = *pos;
    const int64_t kv_dim = (int64_t)n_kv * D;
    const int64_t slot = pos0 % slots;
    if (h < n_q + n_kv) {
        float *v = qkv + (int64_t)h * D;
        const bool isk = h >= n_q;
        float *kr = isk ? kc + slot * kv_dim + (int64_t)(h - n_q) * D : NULL;
        if (t < half) {
            float c, s;
            if (tab) {
                c = tab[t];
                s = tab[half + t];
            } else {
                rope_cos_sin(pos0, t, half, theta, &c, &s);
            }
            float x0 = v[t], x1 = v[t + half];
            float y0 = x0 * c - x1 * s, y1 = x1 * c + x0 * s;
            v[t] = y0;
            v[t + half] = y1;
            if (isk) {
                kr[t] = y0;
                kr[t + half] = y1;
            }
        } else if (t >= 2 * half && isk) {
            kr[t] = v[t];
        }
    } else {
        const int kh = h - n_q - n_kv;
        const float *vr = qkv + (int64_t)(n_q + n_kv) * D + (int64_t)kh * D;
        vc[slot * kv_dim + (int64_t)kh * D + t] = vr[t];
    }
}

unsigned grid_for(int64_t count, int threads)
{
    int64_t b = (count + threads - 1) / threads;
    if (b > 65535LL * 16) b = 65535LL * 16; /* grid-stride loops cover the rest */
    return (unsigned)(b > 0 ? b : 1);
}

/* A one-warp-a-row GEMV instance, and the one for n tokens (1..4; more
 * take 4 a launch, the caller's loop) of a family Of<NT>::k. */
using rows_kernel = void (*)(float *, const float *, const uint8_t *, int64_t, int64_t, int64_t);

template <template <int> class Of>
rows_kernel for_tokens(int n)
{
    return n == 1 ? Of<1>::k : n == 2 ? Of<2>::k : n == 3 ? Of<3>::k : Of<4>::k;
}

template <typename T>
struct vec_of {
    template <int NT>
    struct at {
        static constexpr rows_kernel k = gemv_vec_kernel<T, NT, 8>;
    };
};

template <int FMT>
struct quant_of {
    template <int NT>
    struct at {
        static constexpr rows_kernel k = gemv_quant_kernel<FMT, NT, 4>;
    };
};

void launch_rows(cudaStream_t st, rows_kernel k, float *out, const float *x, const uint8_t *w, int64_t rows,
                 int64_t cols, int64_t row_bytes)
{
    k<<<(unsigned)((rows + ROW_WARPS - 1) / ROW_WARPS), ROW_WARPS * WARP, 0, st>>>(out, x, w, rows, cols, row_bytes);
}

int gemv_quant_units = 1; /* SPARK_CUDA_QGEMV=groups: Q8_0 / Q4_K / Q6_K / Q4_0 through gemv_groups_kernel (cu_gemv_units) */

int att_warps_env = -1;

template <int E, int GMAX>
void launch_attention(cudaStream_t st, const cu_attn_args *a)
{
    dim3 grid((unsigned)(a->n * a->n_head_kv), (unsigned)a->splits);
    if (att_warps_env < 0) {
        const char *w = getenv("SPARK_CUDA_ATT_WARPS");
        att_warps_env = w && atoi(w) == 4 ? 4 : 8;
    }
    constexpr int W = att_warps(E, GMAX);
    /* an error here is also the runtime's last error, which the caller reads */
    if (W == 8 && att_warps_env == 8)
        (void)launch_ex(a->pdl != 0, grid, dim3(W * 32), 0, st, attention_kernel<E, GMAX, W>, *a);
    else
        (void)launch_ex(a->pdl != 0, grid, dim3(4 * 32), 0, st, attention_kernel<E, GMAX, 4>, *a);
}

template <int E>
void launch_attention_g(cudaStream_t st, const cu_attn_args *a)
{
    int G = a->n_head / a->n_head_kv;
    if (G <= 1) launch_attention<E, 1>(st, a);
    else if (G <= 4) launch_attention<E, 4>(st, a);
    else launch_attention<E, 8>(st, a);
}

} // namespace

void cu_gemv_units(int on) { gemv_quant_units = on; }

cudaError_t cu_gemv(cudaStream_t st, float *out, const float *x, const void *w, int dtype, int64_t rows,
                    int64_t cols, int64_t row_bytes, int n)
{
    const uint8_t *wb = (const uint8_t *)w;
    int plain = dtype == CU_F32 || dtype == CU_F16 || dtype == CU_BF16;
    /* 16-byte loads need every row start and x row 16-byte aligned */
    int vec_ok = plain && row_bytes % 16 == 0 && cols % 4 == 0 && ((uintptr_t)w % 16) == 0 &&
                 ((uintptr_t)x % 16) == 0 && (dtype == CU_F32 || cols % 8 == 0);
    if (vec_ok) {
        rows_kernel k = dtype == CU_F32   ? for_tokens<vec_of<float>::at>(n)
                        : dtype == CU_F16 ? for_tokens<vec_of<__half>::at>(n)
                                          : for_tokens<vec_of<__nv_bfloat16>::at>(n);
        launch_rows(st, k, out, x, wb, rows, cols, row_bytes);
        return cudaGetLastError();
    }
    /* the unit kernel needs every row's quants in whole 16-byte units, aligned */
    const int units_ok = gemv_quant_units && cu_repack_kind(dtype) && row_bytes % 16 == 0 && ((uintptr_t)w % 16) == 0 && ((uintptr_t)x % 16) == 0 &&
                         cols % (dtype == CU_Q8_0 || dtype == CU_Q4_0 ? 32 : 256) == 0;
    if (units_ok) {
        rows_kernel k = dtype == CU_Q8_0   ? for_tokens<quant_of<CU_Q8_0>::at>(n)
                        : dtype == CU_Q4_K ? for_tokens<quant_of<CU_Q4_K>::at>(n)
                        : dtype == CU_Q4_0 ? for_tokens<quant_of<CU_Q4_0>::at>(n)
                                           : for_tokens<quant_of<CU_Q6_K>::at>(n);
        launch_rows(st, k, out, x, wb, rows, cols, row_bytes);
        return cudaGetLastError();
    }
    const unsigned blocks = (unsigned)((rows + ROW_WARPS - 1) / ROW_WARPS);
    switch (n) {
    case 1: gemv_groups_kernel<1><<<blocks, ROW_WARPS * WARP, 0, st>>>(out, x, wb, dtype, rows, cols, row_bytes); break;
    case 2: gemv_groups_kernel<2><<<blocks, ROW_WARPS * WARP, 0, st>>>(out, x, wb, dtype, rows, cols, row_bytes); break;
    case 3: gemv_groups_kernel<3><<<blocks, ROW_WARPS * WARP, 0, st>>>(out, x, wb, dtype, rows, cols, row_bytes); break;
    default: gemv_groups_kernel<4><<<blocks, ROW_WARPS * WARP, 0, st>>>(out, x, wb, dtype, rows, cols, row_bytes); break;
    }
    return cudaGetLastError();
}

template <typename P>
static cudaError_t launch_dequant(cudaStream_t st, P panel, const void *w, int dtype, int64_t r0, int64_t prow,
                                  int64_t cols, int64_t row_bytes)
{
    int64_t work = prow * ((cols + 31) / 32);
    if (cols % 32 == 0)
        dequant_run_kernel<<<grid_for(work, 256), 256, 0, st>>>(panel, (const uint8_t *)w, dtype, r0, prow, cols,
                                                               row_bytes);
    else
        dequant_rows_kernel<<<grid_for(work, 256), 256, 0, st>>>(panel, (const uint8_t *)w, dtype, r0, prow, cols,
                                                                row_bytes);
    return cudaGetLastError();
}

cudaError_t cu_dequant_rows(cudaStream_t st, float *panel, const void *w, int dtype, int64_t r0, int64_t prow,
                            int64_t cols, int64_t row_bytes)
{
    return launch_dequant(st, panel_f32{panel}, w, dtype, r0, prow, cols, row_bytes);
}

cudaError_t cu_dequant_rows_bf16x2(cudaStream_t st, void *hi, void *lo, const void *w, int dtype, int64_t r0,
                                   int64_t prow, int64_t cols, int64_t row_bytes)
{
    const panel_bf16x2 pair = {(__nv_bfloat16 *)hi, (__nv_bfloat16 *)lo};
    return launch_dequant(st, pair, w, dtype, r0, prow, cols, row_bytes);
}

cudaError_t cu_split_bf16(cudaStream_t st, cu_pair pair, const float *x, int64_t count)
{
    split_bf16_kernel<<<grid_for(count, 256), 256, 0, st>>>(pair, x, count);
    return cudaGetLastError();
}

cudaError_t cu_set_i64(cudaStream_t st, int64_t *dst, int64_t v)
{
    set_i64_kernel<<<1, 1, 0, st>>>(dst, v);
    return cudaGetLastError();
}

cudaError_t cu_embed(cudaStream_t st, float *out, const void *table, int dtype, int64_t cols, int64_t row_bytes,
                     const int32_t *ids_dev, int n)
{
    embed_kernel<<<n, 128, 0, st>>>(out, (const uint8_t *)table, dtype, cols, row_bytes, ids_dev);
    return cudaGetLastError();
}

cudaError_t cu_rmsnorm(cudaStream_t st, float *out, const float *x, const float *w, int n, int dim, float eps,
                       cu_pair pair)
{
    rmsnorm_kernel<<<n, 256, 0, st>>>(out, x, w, dim, eps, pair);
    return cudaGetLastError();
}

cudaError_t cu_rope(cudaStream_t st, float *x, int n, int64_t stride, int n_heads, int head_dim, const int64_t *pos,
                    int rot_dims, double theta)
{
    int half = rot_dims / 2;
    if (half <= 0) return cudaSuccess;
    int64_t count = (int64_t)n * half;
    rope_kernel<<<(unsigned)((count + 127) / 128), 128, 0, st>>>(x, n, stride, n_heads, head_dim, pos, half, theta);
    return cudaGetLastError();
}

cudaError_t cu_gate_heads(cudaStream_t st, float *o, const float *g, int n, int n_head, int head_dim, cu_pair pair)
{
    int64_t count = (int64_t)n * n_head * head_dim;
    gate_heads_kernel<<<grid_for(count, 256), 256, 0, st>>>(o, g, count, head_dim, pair);
    return cudaGetLastError();
}

cudaError_t cu_gelu_mul(cudaStream_t st, float *a, const float *b, int64_t count, cu_pair pair)
{
    gelu_mul_kernel<<<grid_for(count, 256), 256, 0, st>>>(a, b, count, pair);
    return cudaGetLastError();
}

cudaError_t cu_fold_products(cudaStream_t st, float *out, int64_t ldo, const float *wide, int64_t rows, int n,
                             int parts_r)
{
    fold_products_kernel<<<grid_for(rows * n, 256), 256, 0, st>>>(out, ldo, wide, rows, n, parts_r);
    return cudaGetLastError();
}

cudaError_t cu_add(cudaStream_t st, float *y, const float *x, int64_t count)
{
    add_kernel<<<grid_for(count, 256), 256, 0, st>>>(y, x, count);
    return cudaGetLastError();
}

cudaError_t cu_kv_store(cudaStream_t st, float *kc, float *vc, int64_t slots, const float *qkv, const int64_t *pos, int n,
                        int n_head, int n_head_kv, int head_dim, int64_t qkv_stride)
{
    int first = n > slots ? n - (int)slots : 0;
    int64_t kv_dim = (int64_t)n_head_kv * head_dim;
    int64_t count = (int64_t)(n - first) * kv_dim;
    kv_store_kernel<<<grid_for(count, 256), 256, 0, st>>>(kc, vc, slots, qkv, pos, first, n,
                                                         (int64_t)n_head * head_dim, kv_dim, qkv_stride);
    return cudaGetLastError();
}

cudaError_t cu_attention(cudaStream_t st, const cu_attn_args *a)
{
    int D = a->head_dim;
    if (D <= 32) launch_attention_g<1>(st, a);
    else if (D <= 64) launch_attention_g<2>(st, a);
    else if (D <= 128) launch_attention_g<4>(st, a);
    else launch_attention_g<8>(st, a);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess || a->splits == 1) return err;
    err = launch_ex(a->pdl != 0, dim3((unsigned)(a->n * a->n_head)), dim3(128), 0, st, attention_merge_kernel, a->out,
                    (const float *)a->ws, a->splits, D, a->gate, a->pdl_early);
    if (err != cudaSuccess) return err;
    return cudaGetLastError();
}

cudaError_t cu_rope_kv(cudaStream_t st, float *qkv, int n_head, int n_head_kv, int head_dim, const int64_t *pos,
                       int rot_dims, double theta, float *kc, float *vc, int64_t slots, int pdl,
                       const float *tab)
{
    cudaError_t e = launch_ex(pdl != 0, dim3((unsigned)(n_head + 2 * n_head_kv)), dim3((unsigned)head_dim), 0, st,
                              rope_kv_kernel, qkv, n_head, n_head_kv, head_dim, pos, rot_dims / 2, theta, kc, vc,
                              slots, tab);
    if (e != cudaSuccess) return e;
    return cudaGetLastError();
}

cudaError_t cu_rope_table(cudaStream_t st, float *tab, const int64_t *pos, int rot_dims, double theta, int pdl)
{
    cudaError_t e = launch_ex(pdl != 0, dim3(1), dim3(128), 0, st, rope_table_kernel, tab, pos, rot_dims / 2, theta);
    if (e != cudaSuccess) return e;
    return cudaGetLastError();
}

namespace {
__global__ void pdl_probe_kernel(int *p, int v)
{
    pdl_wait();
    pdl_release();
    if (threadIdx.x == 0) *p = *p * 2 + v;
}
} // namespace

bool cu_pdl_probe(cudaStream_t st)
{
    int *d = NULL, h = 0;
    cudaGraph_t g = NULL;
    cudaGraphExec_t ex = NULL;
    bool ok = cudaMalloc((void **)&d, sizeof(int)) == cudaSuccess && cudaMemsetAsync(d, 0, sizeof(int), st) == cudaSuccess &&
              cudaStreamSynchronize(st) == cudaSuccess;
    if (ok && cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) == cudaSuccess) {
        bool launched = true;
        for (int i = 1; i <= 3; i++)
            launched = launched && launch_ex(i > 1, dim3(1), dim3(32), 0, st, pdl_probe_kernel, d, i) == cudaSuccess;
        cudaError_t e = cudaStreamEndCapture(st, &g);
        ok = launched && e == cudaSuccess && g && cudaGraphInstantiate(&ex, g, 0) == cudaSuccess &&
             cudaGraphLaunch(ex, st) == cudaSuccess && cudaStreamSynchronize(st) == cudaSuccess &&
             cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess && h == ((1 * 2) + 2) * 2 + 3;
    } else {
        ok = false;
    }
    if (ex) cudaGraphExecDestroy(ex);
    if (g) cudaGraphDestroy(g);
    if (d) cudaFree(d);
    cudaGetLastError(); /* a refusal is an answer, not an error */
    return ok;
}

/*
 * cuda_kv.cu — KV caches that are not float32 on the GPU (issue 7): f16,
 * bf16 and TurboQuant rows in exactly the CPU's byte format
 * (engine/kv_format.h), written by an encoder kernel and read directly by
 * the attention kernel.
 *
 * Encoding (cu_kv_encode): one block per row (one kv head's key or value of
 * one token), one thread per coordinate. TurboQuant does what kv_encode_row
 * does, in the same float operations: signs, the Walsh-Hadamard butterflies
 * stage by stage (h = 1, 2, 4, ...), the 1/sqrt(D) factor, the
 * standardisation by sqrt(D)/|x| (norm in double), the nearest centroid by
 * counting boundaries, the unbiased scale from a double sum. The two double
 * sums run in another order than on the CPU, so a code can differ from the
 * CPU's only where a coordinate sits within rounding of a boundary.
 *
 * Attention (cu_kv_attention) has the contract of backend.h: keys before
 * *pos are read from the cache, the chunk's own keys as the format stores
 * them. The chunk's rows are first encoded into a stage buffer ([n][n_kv]
 * rows) by the same encoder, and the attention kernel reads row j from the
 * cache (slot j % slots) when j < *pos, else from the stage: prefill,
 * chunked prefill and decode see the same bytes, as on the CPU (kv_store
 * encodes the same rows into the cache afterwards).
 *
 * The attention kernel: one block per (query token, kv head, key split),
 * four warps; a warp takes KC keys at a time, all their key and value loads
 * issued before the first is used; lane l holds dims [8l, 8l + 8) of every
 * row (one 16-byte load of an f16 row, `bits` bytes of a TurboQuant row).
 * TurboQuant: the query heads are rotated once in shared memory (with the
 * softmax scale folded in, as the CPU does), keys and values are decoded to
 * centroids (codebook in shared memory), the key scale multiplies the score
 * and the value scale the softmax weight, values are summed in the rotated
 * basis; the merge kernel normalises the split states, de-rotates once and
 * applies the head gate when fused. Splits: the launcher's choice (from the
 * cache capacity, so a captured decode step replays at any position), the
 * key range cut on the device from the position (flash-decoding).
 */
extern "C" {
#include "engine/kv_format.h"
}
#include "backend/cuda/cuda_kv.h"
#include "backend/cuda/cuda_device.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

using namespace spark_dev;

namespace {

constexpr int KA_WARPS = 4;   /* warps per attention block */
constexpr int KC = 8;         /* keys a warp holds in flight */
constexpr int MAXD = 256;     /* CUDA_MAX_HEAD_DIM */

/* element kinds of a row: TurboQuant bits, or these */
constexpr int K_F16 = 16, K_BF16 = 17;

/* the rotation's signs and the codebooks (centroids, boundaries) per bit
 * width: kv_format.c's tables, uploaded once per device */
__device__ float d_signs[MAXD];
__device__ float d_cent[5][16];
__device__ float d_bound[5][16];

__host__ __device__ inline int kind_bits(int fmt, int is_value)
{
    switch (fmt) {
    case CU_KV_TQ2: return 2;
    case CU_KV_TQ3: return 3;
    case CU_KV_TQ3_5: return is_value ? 4 : 3;
    case CU_KV_TQ4: return 4;
    default: return 0;
    }
}

__host__ __device__ inline int64_t row_bytes(int fmt, int is_value, int D)
{
    int b = kind_bits(fmt, is_value);
    if (b) return 4 + (int64_t)D * b / 8;
    return (int64_t)D * (fmt == CU_KV_F32 ? 4 : 2);
}

__device__ double block_sum_d(double v, double *red)
{
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, nw = (blockDim.x + WARP - 1) / WARP;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads(); /* red may still be read from a previous call */
    if (lane == 0) red[warp] = v;
    __syncthreads();
    double s = 0;
    for (int w = 0; w < nw; w++) s += red[w];
    return s;
}

/* In-place unnormalised Walsh-Hadamard transform of y[D] in shared memory,
 * the CPU's butterflies in the CPU's order (every thread of the block calls). */
__device__ void fwht_smem(float *y, int D)
{
    for (int h = 1; h < D; h *= 2) {
        __syncthreads();
        for (int i = threadIdx.x; i < D / 2; i += blockDim.x) {
            int j = (i / h) * 2 * h + i % h;
            float a = y[j], b = y[j + h];
            y[j] = a + b;
            y[j + h] = a - b;
        }
    }
    __syncthreads();
}

/* Encode one row whose coordinate d is thread d's xd (blockDim.x >= D, every
 * thread of the block calls) into dst, as kv_encode_row does. */
__device__ void encode_row(int fmt, int is_value, int D, float xd, uint8_t *dst)
{
    __shared__ float y[MAXD];
    __shared__ uint8_t code[MAXD];
    __shared__ double red[32];
    const int d = threadIdx.x;
    const int bits = kind_bits(fmt, is_value);
    if (!bits) {
        if (d < D) {
            if (fmt == CU_KV_F32) ((float *)dst)[d] = xd;
            else if (fmt == CU_KV_F16) ((__half *)dst)[d] = __float2half_rn(xd);
            else ((__nv_bfloat16 *)dst)[d] = __float2bfloat16_rn(xd);
        }
        return;
    }
    double n2 = block_sum_d(d < D ? (double)xd * (double)xd : 0.0, red);
    if (d < D) y[d] = xd * d_signs[d];
    fwht_smem(y, D);
    const int levels = 1 << bits;
    float z = 0;
    int k = 0;
    if (d < D && n2 > 0) {
        float nrm = 1.0f / sqrtf((float)D);
        double norm = sqrt(n2);
        float to_std = (float)(sqrt((double)D) / norm);
        z = (y[d] * nrm) * to_std;
        while (k + 1 < levels && d_bound[bits][k] < z) k++;
    }
    double zc = block_sum_d(d < D && n2 > 0 ? (double)z * (double)d_cent[bits][k] : 0.0, red);
    if (d < D) code[d] = (uint8_t)k;
    __syncthreads();
    const int nbytes = D * bits / 8;
    for (int B = d; B < nbytes; B += blockDim.x) {
        uint32_t v = 0;
        for (int i = (8 * B) / bits; i * bits < 8 * B + 8 && i < D; i++) {
            int sh = i * bits - 8 * B;
            uint32_t c = code[i];
            v |= sh >= 0 ? c << sh : c >> -sh;
        }
        dst[4 + B] = (uint8_t)v;
    }
    if (d == 0) {
        float scale = n2 > 0 ? (float)(sqrt(n2) * sqrt((double)D) / zc) : 0.0f;
        uint32_t u = __float_as_uint(scale);
        for (int i = 0; i < 4; i++) dst[i] = (uint8_t)(u >> (8 * i));
    }
    __syncthreads(); /* y / code are reused by the caller's next row */
}

/* Rows of tokens first..n-1 of qkv: to the cache (slots > 0: slot (*pos + t)
 * % slots) or to a stage (slots == 0: row t). Block = one row. */
__global__ void kv_encode_kernel(uint8_t *kdst, uint8_t *vdst, int64_t slots, const float *qkv, const int64_t *pos,
                                 int first, int n_kv, int D, int64_t q_dim, int64_t qkv_stride, int fmt)
{
    const int64_t r = blockIdx.x;
    const int is_value = (int)(r % 2);
    const int kh = (int)((r / 2) % n_kv);
    const int t = first + (int)(r / 2 / n_kv);
    const int64_t kv_dim = (int64_t)n_kv * D;
    const float *src = qkv + (int64_t)t * qkv_stride + q_dim + (is_value ? kv_dim : 0) + (int64_t)kh * D;
    const int64_t slot = slots > 0 ? (*pos + t) % slots : t;
    uint8_t *dst = (is_value ? vdst : kdst) + (slot * n_kv + kh) * row_bytes(fmt, is_value, D);
    float xd = threadIdx.x < D ? src[threadIdx.x] : 0.0f;
    encode_row(fmt, is_value, D, xd, dst);
}

/* splitmix64 */
__device__ __forceinline__ uint64_t mix64(uint64_t x)
{
    uint64_t z = x + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Benchmark fill: rows [0, rows) of a cache (k and v: 2 * rows * n_kv rows)
 * get seeded pseudo-random contents: float formats coordinates ~ N(0, 1)
 * (a sum of four uniforms); TurboQuant rows uniformly random codes with
 * scale 1 (a row of N(0, 1) coordinates has a scale near 1). Attention's
 * cost does not depend on the values; a grid-stride loop over elements
 * (float formats) or bytes (TurboQuant) writes it at memory speed. */
__global__ void kv_fill_kernel(uint8_t *cache, int64_t rows, int64_t rb, int D, int bits, int fmt, uint64_t seed)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    if (bits) {
        const int64_t total = rows * rb;
        for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
            const int64_t off = i % rb;
            uint8_t v;
            if (off < 4) v = (uint8_t)(__float_as_uint(1.0f) >> (8 * off));
            else v = (uint8_t)mix64(seed ^ (uint64_t)i);
            cache[i] = v;
        }
        return;
    }
    const int64_t total = rows * D;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        uint64_t h = mix64(seed ^ (uint64_t)i);
        float x = ((float)(h & 0xffff) + (float)((h >> 16) & 0xffff) + (float)((h >> 32) & 0xffff) +
                   (float)((h >> 48) & 0xffff)) / 65536.0f - 2.0f;
        x *= 1.7320508f;
        if (fmt == CU_KV_F32) ((float *)cache)[i] = x;
        else if (fmt == CU_KV_F16) ((__half *)cache)[i] = __float2half_rn(x);
        else ((__nv_bfloat16 *)cache)[i] = __float2bfloat16_rn(x);
    }
}

/* ---- attention ---------------------------------------------------------------- */

/* The raw bytes of a row's 8 coordinates [d0, d0 + 8) (d0 < D; zeros past D). */
template <int KIND>
__device__ __forceinline__ uint4 load_chunk(const uint8_t *row, int d0, int D)
{
    uint4 raw = make_uint4(0, 0, 0, 0);
    if (KIND == K_F16 || KIND == K_BF16) {
        if ((D & 7) == 0) {
            raw = *(const uint4 *)(row + d0 * 2);
        } else {
            uint16_t h[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            for (int e = 0; e < 8 && d0 + e < D; e++) h[e] = ((const uint16_t *)row)[d0 + e];
            raw.x = h[0] | (uint32_t)h[1] << 16;
            raw.y = h[2] | (uint32_t)h[3] << 16;
            raw.z = h[4] | (uint32_t)h[5] << 16;
            raw.w = h[6] | (uint32_t)h[7] << 16;
        }
    } else {
        const uint8_t *p = row + 4 + (d0 / 8) * KIND;
        if (KIND == 4 && ((uintptr_t)p & 3) == 0) {
            raw.x = *(const uint32_t *)p;
        } else if (KIND == 2 && ((uintptr_t)p & 1) == 0) {
            raw.x = *(const uint16_t *)p;
        } else {
            uint32_t w = 0;
#pragma unroll
            for (int i = 0; i < KIND; i++) w |= (uint32_t)p[i] << (8 * i);
            raw.x = w;
        }
    }
    return raw;
}

/* A row's scale (its first 4 bytes in the coded formats, 1 for f16 / bf16). */
template <int KIND>
__device__ __forceinline__ float row_scale(const uint8_t *row)
{
    if (KIND == K_F16 || KIND == K_BF16) return 1.0f;
    if (((uintptr_t)row & 3) == 0) return *(const float *)row;
    return __uint_as_float(row[0] | (uint32_t)row[1] << 8 | (uint32_t)row[2] << 16 | (uint32_t)row[3] << 24);
}

/* The raw bytes of lane's 8 coordinates of a row (zeros past D), and the row's scale. */
template <int KIND>
__device__ __forceinline__ void load_row(const uint8_t *row, int lane, int D, uint4 &raw, float &scale)
{
    scale = row_scale<KIND>(row);
    raw = lane * 8 < D ? load_chunk<KIND>(row, lane * 8, D) : make_uint4(0, 0, 0, 0);
}

template <int KIND>
__device__ __forceinline__ void decode8(uint4 raw, const float *cb, float *o)
{
    if (KIND == K_F16) {
        const __half2 *h = (const __half2 *)&raw;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float2 f = __half22float2(h[i]);
            o[2 * i] = f.x;
            o[2 * i + 1] = f.y;
        }
    } else if (KIND == K_BF16) {
        const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            o[2 * i] = __uint_as_float(w[i] << 16);
            o[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
        }
    } else {
#pragma unroll
        for (int e = 0; e < 8; e++) o[e] = cb[(raw.x >> (e * KIND)) & ((1u << KIND) - 1)];
    }
}

/* The keys split `split` of token t scores: [j_begin, j_end), within the
 * window of its position p = pos0 + t (sliding: 0 <= p - j < window). Splits are cut
 * from the keys the whole chunk sees, so every token of a chunk uses the
 * same split boundaries; a split may be empty. */
struct key_range {
    int64_t pos0, j_begin, j_end;
};

__device__ __forceinline__ key_range split_keys(const cu_kv_attn_args &a, int t, int split)
{
    const int64_t pos0 = *a.pos, p = pos0 + t;
    int64_t lo = a.window ? p - a.window + 1 : 0;
    if (lo < 0) lo = 0;
    const int64_t keys = a.window && a.window < pos0 + a.n ? a.window : pos0 + a.n;
    const int64_t per_split = (keys + a.splits - 1) / a.splits;
    const int64_t j_begin = lo + (int64_t)split * per_split;
    const int64_t j_end = j_begin + per_split < p + 1 ? j_begin + per_split : p + 1;
    return {pos0, j_begin, j_end};
}

/* The block's query heads (kh's group of G) into shared memory, scaled and
 * zero-padded to MAXD; for TurboQuant formats rotated as the keys were
 * (signs, Walsh-Hadamard, 1/sqrt(D)), and the formats' codebooks beside them. */
template <int KK, int VK, int GMAX>
__device__ __forceinline__ void load_queries(const cu_kv_attn_args &a, int t, int kh, float (&qs)[GMAX][MAXD],
                                             float (&cbk)[16], float (&cbv)[16])
{
    constexpr bool TQ = KK < 16;
    const int D = a.head_dim, G = a.n_head / a.n_head_kv;
    const float *qrow = a.qkv + (int64_t)t * a.qkv_stride;
    for (int i = threadIdx.x; i < GMAX * MAXD; i += blockDim.x) {
        int g = i / MAXD, d = i % MAXD;
        qs[g][d] = g < G && d < D ? qrow[(int64_t)(kh * G + g) * D + d] * a.scale : 0.0f;
    }
    if (threadIdx.x < 16) {
        cbk[threadIdx.x] = TQ ? d_cent[KK][threadIdx.x & ((1 << KK) - 1)] : 0.0f;
        cbv[threadIdx.x] = TQ ? d_cent[VK][threadIdx.x & ((1 << VK) - 1)] : 0.0f;
    }
    if (TQ) {
        __syncthreads();
        for (int i = threadIdx.x; i < GMAX * D; i += blockDim.x) qs[i / D][i % D] *= d_signs[i % D];
        for (int g = 0; g < GMAX; g++) fwht_smem(qs[g], D);
        const float nrm = 1.0f / sqrtf((float)D);
        for (int i = threadIdx.x; i < GMAX * D; i += blockDim.x) qs[i / D][i % D] *= nrm;
    }
    __syncthreads();
}

/* The end of both attention kernels: merge the block's warps' running
 * states (max, sum, lane l's dims [8l, 8l + 8) of each head's output) and
 * write this split's (max, sum, output) for kv_merge_kernel. */
template <int GMAX>
__device__ __forceinline__ void write_split(const cu_kv_attn_args &a, int t, int kh, int split, const float (&m)[GMAX],
                                            const float (&l)[GMAX], const float (&acc)[GMAX][8])
{
    static_assert(MAXD == 8 * WARP, "a lane holds 8 dims of a head");
    const int D = a.head_dim, G = a.n_head / a.n_head_kv;
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    __shared__ float sm_m[KA_WARPS][GMAX], sm_l[KA_WARPS][GMAX];
    __shared__ float sm_acc[KA_WARPS][GMAX][MAXD];
    att_store_warp<KA_WARPS, MAXD / WARP, GMAX, true>(sm_m, sm_l, sm_acc, warp, lane, m, l, acc);
    __syncthreads();
    for (int i = threadIdx.x; i < G * D; i += blockDim.x) {
        int g = i / D, d = i % D;
        float M, L, A; /* (an empty warp's exp(-inf) weight adds its zeros) */
        att_merge_warps<KA_WARPS, MAXD / WARP, GMAX>(sm_m, sm_l, sm_acc, g, d, &M, &L, &A);
        int h = kh * G + g;
        float *ws = a.ws + (((int64_t)t * a.n_head + h) * a.splits + split) * (D + 2);
        if (d == 0) {
            ws[0] = M;
            ws[1] = L;
        }
        ws[2 + d] = A;
    }
}

template <int KK, int VK, int GMAX>
__global__ void __launch_bounds__(KA_WARPS * WARP) kv_attn_kernel(cu_kv_attn_args a)
{
    const int D = a.head_dim;
    const int t = blockIdx.x / a.n_head_kv, kh = blockIdx.x % a.n_head_kv, split = blockIdx.y;
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const key_range kr = split_keys(a, t, split);
    const int64_t pos0 = kr.pos0, j_begin = kr.j_begin, j_end = kr.j_end;

    __shared__ __align__(16) float qs[GMAX][MAXD];
    __shared__ float cbk[16], cbv[16];
    load_queries<KK, VK, GMAX>(a, t, kh, qs, cbk, cbv);

    float q[GMAX][8], acc[GMAX][8], m[GMAX], l[GMAX];
#pragma unroll
    for (int g = 0; g < GMAX; g++) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; e++) {
            int d = lane * 8 + e;
            q[g][e] = d < D ? qs[g][d] : 0.0f;
            acc[g][e] = 0.0f;
        }
    }

    const int64_t rbk = row_bytes(a.fmt, 0, D), rbv = row_bytes(a.fmt, 1, D);
    for (int64_t j0 = j_begin + (int64_t)warp * KC; j0 < j_end; j0 += (int64_t)KA_WARPS * KC) {
        uint4 kr[KC], vr[KC];
        float ksc[KC], vsc[KC];
#pragma unroll
        for (int c = 0; c < KC; c++) {
            const int64_t j = j0 + c;
            if (j < j_end) {
                const uint8_t *kp, *vp;
                if (j < pos0) {
                    int64_t row = (j % a.slots) * a.n_head_kv + kh;
                    kp = a.kc + row * rbk;
                    vp = a.vc + row * rbv;
                } else {
                    int64_t row = (j - pos0) * a.n_head_kv + kh;
                    kp = a.ks + row * rbk;
                    vp = a.vs + row * rbv;
                }
                load_row<KK>(kp, lane, D, kr[c], ksc[c]);
                load_row<VK>(vp, lane, D, vr[c], vsc[c]);
            } else {
                kr[c] = vr[c] = make_uint4(0, 0, 0, 0);
                ksc[c] = vsc[c] = 0.0f;
            }
        }
        float s[KC][GMAX];
#pragma unroll
        for (int c = 0; c < KC; c++) {
            float kf[8];
            decode8<KK>(kr[c], cbk, kf);
#pragma unroll
            for (int g = 0; g < GMAX; g++) {
                float dot = 0.0f;
#pragma unroll
                for (int e = 0; e < 8; e++) dot = fmaf(q[g][e], kf[e], dot);
                s[c][g] = j0 + c < j_end ? warp_sum(dot) * ksc[c] : -INFINITY;
            }
        }
#pragma unroll
        for (int g = 0; g < GMAX; g++) {
            float mx = m[g];
#pragma unroll
            for (int c = 0; c < KC; c++) mx = fmaxf(mx, s[c][g]);
            const float corr = expf(m[g] - mx); /* m = -inf the first time: 0, and acc, l are 0 */
            l[g] *= corr;
#pragma unroll
            for (int e = 0; e < 8; e++) acc[g][e] *= corr;
            m[g] = mx;
#pragma unroll
            for (int c = 0; c < KC; c++) {
                float pe = expf(s[c][g] - mx);
                l[g] += pe;
                s[c][g] = pe * vsc[c];
            }
        }
#pragma unroll
        for (int c = 0; c < KC; c++) {
            float vf[8];
            decode8<VK>(vr[c], cbv, vf);
#pragma unroll
            for (int g = 0; g < GMAX; g++)
#pragma unroll
                for (int e = 0; e < 8; e++) acc[g][e] = fmaf(s[c][g], vf[e], acc[g][e]);
        }
    }

    write_split<GMAX>(a, t, kh, split, m, l, acc);
}

/* The same attention, keys over lanes (the default; SPARK_CUDA_KV_ATTN=0
 * selects kv_attn_kernel above). A warp takes 32 keys at a time, lane l key
 * j0 + l: it reads its whole key row (8 coordinates a step, the query heads'
 * matching coordinates from shared memory as broadcasts) and ends with the
 * key's G scores — no reduction across lanes. The softmax weights go to
 * shared memory; then lanes switch to dims (lane l: dims [8l, 8l + 8)) and
 * walk the 32 value rows, 8 loads in flight. Per key this is ~3x fewer
 * instructions than a warp-wide dot product per (key, head). */
template <int KK, int VK, int GMAX>
__global__ void __launch_bounds__(KA_WARPS * WARP) kv_attn2_kernel(cu_kv_attn_args a)
{
    const int D = a.head_dim;
    const int t = blockIdx.x / a.n_head_kv, kh = blockIdx.x % a.n_head_kv, split = blockIdx.y;
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const key_range kr = split_keys(a, t, split);
    const int64_t pos0 = kr.pos0, j_begin = kr.j_begin, j_end = kr.j_end;
    /* cache slot of key j: j on full layers (slots >= the context); rings:
     * (j_begin % slots) + (j - j_begin), wrapped once (a split spans fewer
     * than `slots` keys) */
    const int64_t slot0 = a.window ? j_begin % a.slots : j_begin;

    __shared__ __align__(16) float qs[GMAX][MAXD];
    __shared__ float cbk[16], cbv[16];
    __shared__ __align__(16) float ps[KA_WARPS][WARP][GMAX];
    load_queries<KK, VK, GMAX>(a, t, kh, qs, cbk, cbv);

    const int64_t rbk = row_bytes(a.fmt, 0, D), rbv = row_bytes(a.fmt, 1, D);
    float acc[GMAX][8], m[GMAX], l[GMAX];
#pragma unroll
    for (int g = 0; g < GMAX; g++) {
        m[g] = -INFINITY;
        l[g] = 0.0f; /* this lane's keys' share of the sum */
#pragma unroll
        for (int e = 0; e < 8; e++) acc[g][e] = 0.0f;
    }

    for (int64_t j0 = j_begin + (int64_t)warp * WARP; j0 < j_end; j0 += (int64_t)KA_WARPS * WARP) {
        const int64_t j = j0 + lane;
        const bool valid = j < j_end;
        const uint8_t *kp = NULL, *vp = NULL;
        if (valid) {
            int64_t row;
            if (j < pos0) {
                int64_t sl = slot0 + (j - j_begin);
                if (sl >= a.slots) sl -= a.slots;
                row = sl * a.n_head_kv + kh;
                kp = a.kc + row * rbk;
                vp = a.vc + row * rbv;
            } else {
                row = (j - pos0) * a.n_head_kv + kh;
                kp = a.ks + row * rbk;
                vp = a.vs + row * rbv;
            }
        }
        /* scores of this lane's key */
        float s[GMAX];
#pragma unroll
        for (int g = 0; g < GMAX; g++) s[g] = 0.0f;
        float vsc = 0.0f;
        if (valid) {
            const float ksc = row_scale<KK>(kp);
            vsc = row_scale<VK>(vp);
#pragma unroll 4
            for (int d0 = 0; d0 < D; d0 += 8) {
                float kf[8];
                decode8<KK>(load_chunk<KK>(kp, d0, D), cbk, kf);
#pragma unroll
                for (int g = 0; g < GMAX; g++) {
                    const float4 q0 = *(const float4 *)&qs[g][d0], q1 = *(const float4 *)&qs[g][d0 + 4];
                    float dot = s[g];
                    dot = fmaf(q0.x, kf[0], dot);
                    dot = fmaf(q0.y, kf[1], dot);
                    dot = fmaf(q0.z, kf[2], dot);
                    dot = fmaf(q0.w, kf[3], dot);
                    dot = fmaf(q1.x, kf[4], dot);
                    dot = fmaf(q1.y, kf[5], dot);
                    dot = fmaf(q1.z, kf[6], dot);
                    dot = fmaf(q1.w, kf[7], dot);
                    s[g] = dot;
                }
            }
#pragma unroll
            for (int g = 0; g < GMAX; g++) s[g] *= ksc;
        }
        /* online softmax: the block of 32 keys' max per head, then weights */
#pragma unroll
        for (int g = 0; g < GMAX; g++) {
            float mx = valid ? s[g] : -INFINITY;
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            const float mn = fmaxf(m[g], mx); /* finite: key j0 is valid */
            const float corr = expf(m[g] - mn);
            const float pe = valid ? expf(s[g] - mn) : 0.0f;
            l[g] = l[g] * corr + pe;
#pragma unroll
            for (int e = 0; e < 8; e++) acc[g][e] *= corr;
            m[g] = mn;
            ps[warp][lane][g] = pe * vsc;
        }
        __syncwarp();
        /* P.V: lanes over dims, 8 value rows in flight */
        const int nk = j_end - j0 < WARP ? (int)(j_end - j0) : WARP;
        const uintptr_t vpi = (uintptr_t)vp;
        for (int c0 = 0; c0 < nk; c0 += 8) {
            uint4 raw[8];
#pragma unroll
            for (int c = 0; c < 8; c++) {
                const uint8_t *row = (const uint8_t *)__shfl_sync(0xffffffffu, (unsigned long long)vpi, c0 + c);
                raw[c] = c0 + c < nk && lane * 8 < D ? load_chunk<VK>(row, lane * 8, D) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int c = 0; c < 8; c++) {
                if (c0 + c >= nk) break;
                float vf[8];
                decode8<VK>(raw[c], cbv, vf);
#pragma unroll
                for (int g = 0; g < GMAX; g++) {
                    const float pw = ps[warp][c0 + c][g];
#pragma unroll
                    for (int e = 0; e < 8; e++) acc[g][e] = fmaf(pw, vf[e], acc[g][e]);
                }
            }
        }
        __syncwarp();
    }
#pragma unroll
    for (int g = 0; g < GMAX; g++) l[g] = warp_sum(l[g]);

    write_split<GMAX>(a, t, kh, split, m, l, acc);
}

/* One block per (token, head): combine the splits, normalise, de-rotate
 * (TurboQuant), gate. */
__global__ void kv_merge_kernel(float *out, const float *ws, int splits, int D, int tq, const float *gate)
{
    __shared__ float o[MAXD];
    const float *base = ws + (int64_t)blockIdx.x * splits * (D + 2);
    float M = -INFINITY;
    for (int s = 0; s < splits; s++) M = fmaxf(M, base[(int64_t)s * (D + 2)]);
    float L = 0.0f;
    for (int s = 0; s < splits; s++) {
        const float *p = base + (int64_t)s * (D + 2);
        if (p[0] != -INFINITY) L += p[1] * expf(p[0] - M);
    }
    const float inv = L > 0 ? 1.0f / L : 0.0f;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float A = 0.0f;
        for (int s = 0; s < splits; s++) {
            const float *p = base + (int64_t)s * (D + 2);
            if (p[0] != -INFINITY) A += p[2 + d] * expf(p[0] - M);
        }
        o[d] = A * inv;
    }
    if (tq) {
        fwht_smem(o, D);
        const float nrm = 1.0f / sqrtf((float)D);
        for (int d = threadIdx.x; d < D; d += blockDim.x) o[d] *= nrm * d_signs[d];
    }
    __syncthreads();
    const float gm = gate ? 1.0f / (1.0f + expf(-gate[blockIdx.x])) : 1.0f;
    for (int d = threadIdx.x; d < D; d += blockDim.x) out[(int64_t)blockIdx.x * D + d] = gate ? o[d] * gm : o[d];
}

int attn_variant(void)
{
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("SPARK_CUDA_KV_ATTN");
        v = e && !strcmp(e, "0") ? 0 : 1;
    }
    return v;
}

template <int KK, int VK>
cudaError_t launch_g(cudaStream_t st, const cu_kv_attn_args *a)
{
    dim3 grid((unsigned)(a->n * a->n_head_kv), (unsigned)a->splits), block(KA_WARPS * WARP);
    int G = a->n_head / a->n_head_kv;
    if (attn_variant() == 0) {
        if (G <= 1) kv_attn_kernel<KK, VK, 1><<<grid, block, 0, st>>>(*a);
        else if (G <= 2) kv_attn_kernel<KK, VK, 2><<<grid, block, 0, st>>>(*a);
        else if (G <= 4) kv_attn_kernel<KK, VK, 4><<<grid, block, 0, st>>>(*a);
        else kv_attn_kernel<KK, VK, 8><<<grid, block, 0, st>>>(*a);
    } else {
        if (G <= 1) kv_attn2_kernel<KK, VK, 1><<<grid, block, 0, st>>>(*a);
        else if (G <= 2) kv_attn2_kernel<KK, VK, 2><<<grid, block, 0, st>>>(*a);
        else if (G <= 4) kv_attn2_kernel<KK, VK, 4><<<grid, block, 0, st>>>(*a);
        else kv_attn2_kernel<KK, VK, 8><<<grid, block, 0, st>>>(*a);
    }
    return cudaGetLastError();
}

template <int KK, int VK>
const void *attn_fn(int G)
{
    if (attn_variant() == 0) {
        if (G <= 1) return (const void *)kv_attn_kernel<KK, VK, 1>;
        if (G <= 2) return (const void *)kv_attn_kernel<KK, VK, 2>;
        if (G <= 4) return (const void *)kv_attn_kernel<KK, VK, 4>;
        return (const void *)kv_attn_kernel<KK, VK, 8>;
    }
    if (G <= 1) return (const void *)kv_attn2_kernel<KK, VK, 1>;
    if (G <= 2) return (const void *)kv_attn2_kernel<KK, VK, 2>;
    if (G <= 4) return (const void *)kv_attn2_kernel<KK, VK, 4>;
    return (const void *)kv_attn2_kernel<KK, VK, 8>;
}

unsigned threads_for(int D) { return (unsigned)((D + WARP - 1) / WARP * WARP); }

} // namespace

int cu_kv_supported(int fmt, int head_dim)
{
    if (fmt == CU_KV_F32) return 1;
    if (head_dim < 1 || head_dim > MAXD) return 0;
    if (kind_bits(fmt, 0) && (head_dim < 16 || (head_dim & (head_dim - 1)))) return 0;
    return fmt >= CU_KV_F16 && fmt <= CU_KV_TQ4;
}

int64_t cu_kv_row_bytes(int fmt, int is_value, int head_dim) { return row_bytes(fmt, is_value, head_dim); }

cudaError_t cu_kv_init(void)
{
    float signs[MAXD], cent[5][16], bound[5][16];
    memset(cent, 0, sizeof cent);
    memset(bound, 0, sizeof bound);
    for (int i = 0; i < MAXD; i++) signs[i] = kv_tq_sign(i);
    for (int b = 1; b <= 4; b++) {
        const kv_codebook *cb = kv_codebook_get(b);
        for (int i = 0; i < cb->levels; i++) cent[b][i] = cb->centroid[i];
        for (int i = 0; i + 1 < cb->levels; i++) bound[b][i] = cb->boundary[i];
    }
    cudaError_t e = cudaMemcpyToSymbol(d_signs, signs, sizeof signs);
    if (e == cudaSuccess) e = cudaMemcpyToSymbol(d_cent, cent, sizeof cent);
    if (e == cudaSuccess) e = cudaMemcpyToSymbol(d_bound, bound, sizeof bound);
    return e;
}

cudaError_t cu_kv_encode(cudaStream_t st, void *kdst, void *vdst, int64_t slots, const float *qkv, const int64_t *pos,
                         int n, int n_head, int n_head_kv, int head_dim, int64_t qkv_stride, int fmt)
{
    int first = slots > 0 && n > slots ? n - (int)slots : 0; /* a ring keeps only the newest */
    int64_t rows = (int64_t)(n - first) * n_head_kv * 2;
    if (rows <= 0) return cudaSuccess;
    kv_encode_kernel<<<(unsigned)rows, threads_for(head_dim), 0, st>>>(
        (uint8_t *)kdst, (uint8_t *)vdst, slots, qkv, pos, first, n_head_kv, head_dim, (int64_t)n_head * head_dim,
        qkv_stride, fmt);
    return cudaGetLastError();
}

cudaError_t cu_kv_attention(cudaStream_t st, const cu_kv_attn_args *a)
{
    /* the chunk's own rows, encoded as the cache will hold them */
    cudaError_t e = cu_kv_encode(st, (void *)a->ks, (void *)a->vs, 0, a->qkv, a->pos, a->n, a->n_head, a->n_head_kv,
                                 a->head_dim, a->qkv_stride, a->fmt);
    if (e != cudaSuccess) return e;
    switch (a->fmt) {
    case CU_KV_F16: e = launch_g<K_F16, K_F16>(st, a); break;
    case CU_KV_BF16: e = launch_g<K_BF16, K_BF16>(st, a); break;
    case CU_KV_TQ2: e = launch_g<2, 2>(st, a); break;
    case CU_KV_TQ3: e = launch_g<3, 3>(st, a); break;
    case CU_KV_TQ3_5: e = launch_g<3, 4>(st, a); break;
    case CU_KV_TQ4: e = launch_g<4, 4>(st, a); break;
    default: return cudaErrorInvalidValue;
    }
    if (e != cudaSuccess) return e;
    kv_merge_kernel<<<(unsigned)(a->n * a->n_head), threads_for(a->head_dim), 0, st>>>(
        a->out, a->ws, a->splits, a->head_dim, kind_bits(a->fmt, 0) > 0, a->gate);
    return cudaGetLastError();
}

cudaError_t cu_kv_fill(cudaStream_t st, void *kc, void *vc, int64_t rows, int n_head_kv, int head_dim, int fmt,
                       uint64_t seed)
{
    if (rows <= 0) return cudaSuccess;
    for (int is_value = 0; is_value < 2; is_value++) {
        kv_fill_kernel<<<132 * 16, 256, 0, st>>>((uint8_t *)(is_value ? vc : kc), rows * n_head_kv,
                                                 row_bytes(fmt, is_value, head_dim), head_dim, kind_bits(fmt, is_value),
                                                 fmt, seed + (uint64_t)is_value * 0x51ED27u);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

int cu_kv_attn_blocks_per_sm(int fmt, int n_head, int n_head_kv)
{
    static int cache[7][9][2];
    const int G = n_head / n_head_kv, gi = G <= 1 ? 1 : G <= 2 ? 2 : G <= 4 ? 4 : 8, v = attn_variant();
    if (fmt < CU_KV_F16 || fmt > CU_KV_TQ4) return 0;
    if (cache[fmt][gi][v]) return cache[fmt][gi][v];
    const void *fn;
    switch (fmt) {
    case CU_KV_F16: fn = attn_fn<K_F16, K_F16>(gi); break;
    case CU_KV_BF16: fn = attn_fn<K_BF16, K_BF16>(gi); break;
    case CU_KV_TQ2: fn = attn_fn<2, 2>(gi); break;
    case CU_KV_TQ3: fn = attn_fn<3, 3>(gi); break;
    case CU_KV_TQ3_5: fn = attn_fn<3, 4>(gi); break;
    default: fn = attn_fn<4, 4>(gi); break;
    }
    int b = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, fn, KA_WARPS * WARP, 0) != cudaSuccess) {
        cudaGetLastError();
        b = 0;
    }
    cache[fmt][gi][v] = b;
    return b;
}

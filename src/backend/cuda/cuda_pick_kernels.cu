/*
 * cuda_pick_kernels.cu — the kernels behind greedy picks and sampling
 * candidates (the host side: cuda_pick.cu).
 *
 *   pick        CU_PICK_BLOCKS blocks each leave the largest key of their
 *               range of the logits; a key orders like (value, -index), so
 *               the largest of them is the host sampler's greedy pick;
 *   set_step    the next step's position and token id, the id taken from
 *               the last pick's keys on the device (greedy generation
 *               without a round trip to the host);
 *   candidates  three launches: each block counts its range's candidates
 *               by bucket below the largest logit and sums their weights in
 *               a fixed order; one block plans which buckets fit in cap;
 *               each block writes its candidates in id order.
 */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_device.cuh"
#include "engine/backend.h" /* CAND_BUCKET */

#include <math.h>

using namespace spark_dev;

namespace {

/* The id of the largest of a pick's block keys (see pick_kernel); no
 * candidate at all (every logit NaN or -inf): row 0, a valid row to read
 * for a step the host will not keep (it reads the pick as -1 and stops). */
__device__ int32_t id_of_pick(const unsigned long long *keys, int nkeys)
{
    unsigned long long k = 0;
    for (int i = threadIdx.x; i < nkeys; i += WARP) k = keys[i] > k ? keys[i] : k;
    for (int o = WARP / 2; o > 0; o /= 2) {
        const unsigned long long other = __shfl_xor_sync(0xffffffffu, k, o);
        k = other > k ? other : k;
    }
    return k ? (int32_t)(0xffffffffu - (unsigned)k) : 0;
}

/* One warp: *pos = p (when pos), and *id = t, or with t < 0 the id of the
 * last pick (keys). */
__global__ void set_step_kernel(int64_t *pos, int64_t p, int32_t *id, int32_t t, const unsigned long long *keys,
                                int nkeys)
{
    const int32_t v = t >= 0 ? t : id_of_pick(keys, nkeys);
    if (threadIdx.x) return;
    if (pos) *pos = p;
    *id = v;
}

/* A greedy pick with the host sampler's rule (greedy_pick: the first index
 * of the largest value > -inf) as keys that order like (value, -index):
 * the value's bits made unsigned-monotonic in the high word (-0 as +0: the
 * host's > does not tell them apart), ~index in the low word, 0 for no
 * candidate. Block b leaves the largest key of its range in keys[b]; the
 * reader takes the largest of those. */
__global__ void pick_kernel(const float *x, int count, unsigned long long *keys)
{
    pdl_wait();
    pdl_release();
    const int per = (count + (int)gridDim.x - 1) / (int)gridDim.x;
    const int lo = (int)blockIdx.x * per, hi = lo + per < count ? lo + per : count;
    unsigned long long best = 0;
    for (int i = lo + (int)threadIdx.x; i < hi; i += (int)blockDim.x) {
        float v = x[i];
        if (!(v > -INFINITY)) continue; /* -inf and NaN never win */
        if (v == 0.0f) v = 0.0f;
        const unsigned u = __float_as_uint(v);
        const unsigned ord = u & 0x80000000u ? ~u : u | 0x80000000u;
        const unsigned long long k = (unsigned long long)ord << 32 | (0xffffffffu - (unsigned)i);
        best = k > best ? k : best;
    }
    for (int o = WARP / 2; o > 0; o /= 2) {
        const unsigned long long other = __shfl_xor_sync(0xffffffffu, best, o);
        best = other > best ? other : best;
    }
    __shared__ unsigned long long warp_best[32];
    if (threadIdx.x % WARP == 0) warp_best[threadIdx.x / WARP] = best;
    __syncthreads();
    if (threadIdx.x >= WARP) return;
    best = threadIdx.x < blockDim.x / WARP ? warp_best[threadIdx.x] : 0;
    for (int o = WARP / 2; o > 0; o /= 2) {
        const unsigned long long other = __shfl_xor_sync(0xffffffffu, best, o);
        best = other > best ? other : best;
    }
    if (threadIdx.x == 0) keys[blockIdx.x] = best;
}

/* The largest logit times inv_t, from a pick's block keys (the key's high
 * word is the value's bits made monotonic; see pick_kernel). */
__device__ float cand_x_max(const unsigned long long *keys, int nkeys, float inv_t)
{
    unsigned long long k = 0;
    for (int i = 0; i < nkeys; i++) k = keys[i] > k ? keys[i] : k;
    if (!k) return -INFINITY;
    const unsigned ord = (unsigned)(k >> 32);
    return __uint_as_float(ord & 0x80000000u ? ord & 0x7fffffffu : ~ord) * inv_t;
}

/* Block b over its range: how many candidates fall in each bucket, and the
 * sum of their weights exp(x - max) in a fixed order (each thread its
 * strided elements in turn, then a fixed tree), so the total is the same on
 * every run. */
__global__ void cand_count_kernel(const float *w, int count, float inv_t, float log_min_p,
                                  const unsigned long long *keys, int nkeys, int *hist, double *tot, float *x_max_out)
{
    __shared__ int h[CAND_BUCKETS];
    __shared__ double part[32];
    for (int i = threadIdx.x; i < CAND_BUCKETS; i += blockDim.x) h[i] = 0;
    const float x_max = cand_x_max(keys, nkeys, inv_t);
    const float floor = x_max + log_min_p;
    __syncthreads();
    const int per = (count + (int)gridDim.x - 1) / (int)gridDim.x;
    const int lo = (int)blockIdx.x * per, hi = lo + per < count ? lo + per : count;
    double sum = 0;
    if (x_max > -INFINITY)
        for (int i = lo + (int)threadIdx.x; i < hi; i += (int)blockDim.x) {
            const float x = w[i] * inv_t;
            if (!(x > -INFINITY && x >= floor)) continue;
            atomicAdd(&h[CAND_BUCKET(x_max, x)], 1);
            sum += exp((double)x - (double)x_max);
        }
    for (int o = WARP / 2; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (threadIdx.x % WARP == 0) part[threadIdx.x / WARP] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0;
        for (int k = 0; k < (int)blockDim.x / WARP; k++) t += part[k];
        tot[blockIdx.x] = t;
        if (blockIdx.x == 0) *x_max_out = x_max;
    }
    for (int i = threadIdx.x; i < CAND_BUCKETS; i += blockDim.x) hist[blockIdx.x * CAND_BUCKETS + i] = h[i];
}

/* One block of CAND_BUCKETS threads: the buckets that fit in cap
 * (meta[0] = their count, meta[1] = complete, meta[2] = the last bucket
 * taken or -1) and each block's first output slot (off). The counts come
 * into shared memory first, in coalesced loads: one thread walking them
 * in global memory cost ~1 ms (bench/cuda_runs.md run 11). */
__global__ void cand_plan_kernel(const int *hist, int blocks, int cap, int *meta, int *off)
{
    __shared__ int h[CU_PICK_BLOCKS * CAND_BUCKETS];
    __shared__ long long in[CAND_BUCKETS];
    __shared__ int mine[CU_PICK_BLOCKS];
    __shared__ int last;
    for (int i = threadIdx.x; i < blocks * CAND_BUCKETS; i += blockDim.x) h[i] = hist[i];
    __syncthreads();
    const int b = threadIdx.x;
    long long c = 0;
    for (int k = 0; k < blocks; k++) c += h[k * CAND_BUCKETS + b];
    in[b] = c;
    __syncthreads();
    if (b == 0) {
        long long held = 0;
        int l = -1;
        for (int k = 0; k < CAND_BUCKETS && held + in[k] <= cap; k++) {
            held += in[k];
            l = k;
        }
        last = l;
        meta[0] = l < 0 ? 0 : (int)held;
        meta[1] = l == CAND_BUCKETS - 1;
        meta[2] = l;
    }
    __syncthreads();
    if (b < blocks) {
        int n = 0;
        for (int j = 0; j <= last; j++) n += h[b * CAND_BUCKETS + j];
        mine[b] = n;
    }
    __syncthreads();
    if (b == 0)
        for (int k = 0, at = 0; k < blocks; k++) {
            off[k] = at;
            at += mine[k];
        }
}

/* Block b writes the candidates of its range in the taken buckets in id
 * order from off[b]: each thread a contiguous piece, placed by a scan. */
__global__ void cand_write_kernel(const float *w, int count, float inv_t, float log_min_p, const float *x_max_in,
                                  const int *meta, const int *off, float *x_out, int32_t *id_out)
{
    __shared__ int at[1024];
    const int last = meta[2];
    if (last < 0) return;
    const float x_max = *x_max_in, floor = x_max + log_min_p;
    const int per = (count + (int)gridDim.x - 1) / (int)gridDim.x;
    const int lo = (int)blockIdx.x * per, hi = lo + per < count ? lo + per : count;
    const int piece = (hi - lo + (int)blockDim.x - 1) / (int)blockDim.x;
    const int a = lo + (int)threadIdx.x * piece, e = a + piece < hi ? a + piece : hi;
    auto member = [&](int i, float *x) {
        *x = w[i] * inv_t;
        return *x > -INFINITY && *x >= floor && CAND_BUCKET(x_max, *x) <= last;
    };
    int mine = 0;
    float x;
    for (int i = a; i < e; i++) mine += member(i, &x);
    at[threadIdx.x] = mine;
    __syncthreads();
    if (threadIdx.x == 0) { /* exclusive scan, in order */
        int sum = off[blockIdx.x];
        for (int t = 0; t < (int)blockDim.x; t++) {
            const int k = at[t];
            at[t] = sum;
            sum += k;
        }
    }
    __syncthreads();
    int slot = at[threadIdx.x];
    for (int i = a; i < e; i++)
        if (member(i, &x)) {
            x_out[slot] = x;
            id_out[slot++] = i;
        }
}

} // namespace

cudaError_t cu_candidates(cudaStream_t st, const float *w, int count, float inv_t, float log_min_p, int cap,
                          const unsigned long long *pick_keys, cu_cand_buf *b)
{
    cand_count_kernel<<<CU_PICK_BLOCKS, 256, 0, st>>>(w, count, inv_t, log_min_p, pick_keys, CU_PICK_BLOCKS, b->hist,
                                                    b->tot, b->x_max);
    cand_plan_kernel<<<1, CAND_BUCKETS, 0, st>>>(b->hist, CU_PICK_BLOCKS, cap, b->meta, b->off);
    cand_write_kernel<<<CU_PICK_BLOCKS, 256, 0, st>>>(w, count, inv_t, log_min_p, b->x_max, b->meta, b->off, b->x,
                                                    b->id);
    return cudaGetLastError();
}

cudaError_t cu_set_step(cudaStream_t st, int64_t *pos, int64_t p, int32_t *id, int32_t t,
                        const unsigned long long *pick_keys)
{
    set_step_kernel<<<1, WARP, 0, st>>>(pos, p, id, t, pick_keys, CU_PICK_BLOCKS);
    return cudaGetLastError();
}

cudaError_t cu_pick(cudaStream_t st, const float *x, int count, unsigned long long *keys, bool pdl)
{
    const cudaError_t e = launch_ex(pdl, dim3(CU_PICK_BLOCKS), dim3(256), 0, st, pick_kernel, x, count, keys);
    return e != cudaSuccess ? e : cudaGetLastError();
}

uint32_t cu_pick_id(const unsigned long long *keys)
{
    unsigned long long k = 0;
    for (int i = 0; i < CU_PICK_BLOCKS; i++) k = keys[i] > k ? keys[i] : k;
    return k ? 0xffffffffu - (uint32_t)k : 0xffffffffu;
}

/*
 * cuda_fgemv_stage.cu — the single-token GEMV with its rows staged in
 * shared memory before the dependency wait (SPARK_CUDA_STAGE).
 *
 * Why: the one-launch attention holds 64 of the H200's 132 SMs for ~10 us
 * of dependent latency, during which memory is idle. Under programmatic
 * dependent launch the out projection's blocks become resident on the 68
 * free SMs ~9.5 us before the attention ends, but fgemv_kernel can only
 * hold its first row group (~16 KB) in registers while it waits; the rest
 * of the 21 MB is streamed after the wait at 2.5-2.8 TB/s (~8 us). Here a
 * block's whole share of rows (up to ~220 KB) is copied into its shared
 * memory by the bulk-copy engine before the wait: the early blocks' rows
 * are on chip when the attention ends, and the late blocks (on the
 * attention's SMs) stream a smaller share, computing on each 4-row chunk
 * as it lands.
 *
 * The split: blocks [0, early) take `big` rows each (the early blocks are
 * the low indices: the block scheduler places them first), the others share
 * the remaining rows evenly; early = 0 splits evenly. bf16 single matrices
 * only (no fused norm, no second matrix), x held in registers: thread t
 * takes the 16-byte units t, t + 256, ... of every row. Timeline marks
 * (SPARK_CUDA_TIMELINE): 3 x loaded, 4 the first chunk landed, 5 the last.
 */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_fgemv.cuh"

#include <stdio.h>
#include <stdlib.h>

using namespace spark_dev;

namespace {

constexpr int ST_THREADS = 256, ST_WARPS = ST_THREADS / WARP;
constexpr int ST_CHUNK = 4;    /* rows per bulk copy, mbarrier and compute group */
constexpr int ST_MAX_ROWS = 32; /* a block's rows at most (the static reduction area) */
constexpr int ST_MAX_NU = 5;    /* units a thread a row: cols <= 5 * 256 * 8 = 10240 */

struct st_split {
    int early, big; /* blocks [0, early) take big rows each; the rest share what is left */
};

/* block b's rows [*r0, *r1) of R */
__device__ __forceinline__ void st_rows_of(st_split sp, int64_t R, int b, int G, int64_t *r0, int64_t *r1)
{
    int64_t lo, hi;
    if (b < sp.early) {
        lo = (int64_t)b * sp.big;
        hi = lo + sp.big;
    } else {
        const int64_t base = (int64_t)sp.early * sp.big, rest = R > base ? R - base : 0;
        const int k = b - sp.early, late = G - sp.early;
        lo = base + rest * k / late;
        hi = base + rest * (k + 1) / late;
    }
    *r0 = lo < R ? lo : R;
    *r1 = hi < R ? hi : R;
}

/* one step of reduce_scatter32: of the current 2W rows v[0..2W), lanes with
 * bit W keep rows [W, 2W), the others [0, W), each adding its partner's */
template <int W>
__device__ __forceinline__ void rs_step(float (&v)[WARP], int lane)
{
    const bool upper = lane & W;
#pragma unroll
    for (int i = 0; i < W; i++) {
        const float send = upper ? v[i] : v[i + W], keep = upper ? v[i + W] : v[i];
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, W);
    }
}

/* v[j] of every lane (j < 32, a partial sum of row j) -> the warp's sum of
 * row `lane` in v[0]: a reduce-scatter of 31 shuffles, where one warp_sum a
 * row would take 160 */
__device__ __forceinline__ float reduce_scatter32(float (&v)[WARP], int lane)
{
    rs_step<16>(v, lane);
    rs_step<8>(v, lane);
    rs_step<4>(v, lane);
    rs_step<2>(v, lane);
    rs_step<1>(v, lane);
    return v[0];
}

template <int NU>
__global__ void __launch_bounds__(ST_THREADS, 1) fgemv_stage_kernel(cu_fgemv_args a, st_split sp)
{
    static_assert(ST_MAX_ROWS == WARP, "a lane holds one row's sum after reduce_scatter32");
    constexpr int MAXC = ST_MAX_ROWS / ST_CHUNK;
    extern __shared__ __align__(128) uint8_t st_w[]; /* the block's rows, as stored */
    __shared__ uint64_t bar[MAXC];
    __shared__ float red[ST_WARPS][ST_MAX_ROWS];
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    int64_t r0, r1;
    st_rows_of(sp, a.rows0, blockIdx.x, gridDim.x, &r0, &r1);
    const int n = (int)(r1 - r0), chunks = (n + ST_CHUNK - 1) / ST_CHUNK;
    const int64_t rb = a.row_bytes;

    tl_mark(a.tl, 0);
    if (threadIdx.x < chunks) { /* weights only, before the wait: lane c issues chunk c */
        const int c = threadIdx.x;
        const int rows = n - c * ST_CHUNK < ST_CHUNK ? n - c * ST_CHUNK : ST_CHUNK;
        const uint32_t bytes = (uint32_t)(rows * rb);
        mbar_init(&bar[c], 1);
        mbar_fence_init();
        mbar_expect(&bar[c], bytes);
        bulk_load(st_w + c * ST_CHUNK * rb, (const uint8_t *)a.w0 + (r0 + c * ST_CHUNK) * rb, bytes, &bar[c]);
    }
    __syncthreads(); /* the barriers are initialised before anyone waits on them */
    pdl_wait();
    pdl_release();
    tl_mark(a.tl, 1);
    fg_stamp(a);

    const int units = a.cols / 8;
    float4 x[NU][2];
#pragma unroll
    for (int u = 0; u < NU; u++) {
        const int i = threadIdx.x + u * ST_THREADS;
        const float4 z = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        x[u][0] = i < units ? ((const float4 *)a.x)[2 * i] : z;
        x[u][1] = i < units ? ((const float4 *)a.x)[2 * i + 1] : z;
    }
    /* the residual row this thread will write, loaded now rather than after the products */
    const bool writer = threadIdx.x < n;
    const float h_old = writer && a.resid ? a.resid[r0 + threadIdx.x] : 0.0f;
    if (a.tl) asm volatile("" ::"f"(x[0][0].x)); /* mark 3 waits for x (the asm needs its value) */
    tl_mark(a.tl, 3);
    float acc[ST_MAX_ROWS];
#pragma unroll
    for (int j = 0; j < ST_MAX_ROWS; j++) acc[j] = 0.0f;
#pragma unroll
    for (int c = 0; c < MAXC; c++) { /* unrolled: acc is indexed by constants only (registers) */
        if (c < chunks) {
            mbar_wait(&bar[c], 0);
            if (c == 0) tl_mark(a.tl, 4);
            if (c == chunks - 1) tl_mark(a.tl, 5);
#pragma unroll
            for (int q = 0; q < ST_CHUNK; q++) {
                const int j = c * ST_CHUNK + q;
                if (j < n) {
                    const uint4 *row = (const uint4 *)(st_w + j * rb);
#pragma unroll
                    for (int u = 0; u < NU; u++) {
                        const int i = threadIdx.x + u * ST_THREADS;
                        if (i < units) acc[j] = bf16x8_fma(row[i], x[u][0], x[u][1], acc[j]);
                    }
                }
            }
        }
    }
    red[warp][lane] = reduce_scatter32(acc, lane);
    __syncthreads();
    if (writer) {
        float s = 0.0f;
#pragma unroll
        for (int w = 0; w < ST_WARPS; w++) s += red[w][threadIdx.x];
        const int64_t r = r0 + threadIdx.x;
        a.out0[r] = s;
        if (a.resid) a.resid[r] = fg_steer(a, r, h_old + s);
    }
    tl_mark(a.tl, 2);
}

typedef void (*stage_fn)(cu_fgemv_args, st_split);

stage_fn st_pick(int nu)
{
    switch (nu) {
    case 1: return fgemv_stage_kernel<1>;
    case 2: return fgemv_stage_kernel<2>;
    case 3: return fgemv_stage_kernel<3>;
    case 4: return fgemv_stage_kernel<4>;
    case 5: return fgemv_stage_kernel<5>;
    }
    return NULL;
}

/* a non-negative integer setting, read from the environment once (0 when unset) */
int st_env(const char *name, int *cache)
{
    if (*cache < 0) {
        const char *e = getenv(name);
        const int v = e && *e ? atoi(e) : 0;
        *cache = v > 0 ? v : 0;
    }
    return *cache;
}

/* SPARK_CUDA_STAGE: 0 off (the default until measured), 1 the GEMV right
 * after an attention (fuse() marks it), 2 every GEMV that qualifies (tests) */
int st_mode()
{
    static int mode = -1;
    return st_env("SPARK_CUDA_STAGE", &mode);
}

/* SPARK_CUDA_STAGE_EARLY: blocks given the largest share (0: an even split) */
int st_early_env()
{
    static int early = -1;
    return st_env("SPARK_CUDA_STAGE_EARLY", &early);
}

/* the most dynamic shared memory a block may have, less the kernel's static area */
size_t st_smem_cap()
{
    static size_t cap = 0;
    if (!cap) {
        int dev = 0, optin = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) {
            cudaGetLastError();
            optin = 48 * 1024;
        }
        const size_t fixed = sizeof(uint64_t) * (ST_MAX_ROWS / ST_CHUNK) + sizeof(float) * ST_WARPS * ST_MAX_ROWS;
        cap = (size_t)optin > fixed + 1024 ? (size_t)optin - fixed - 1024 : 1;
        for (int nu = 1; nu <= ST_MAX_NU; nu++)
            if (cudaFuncSetAttribute(st_pick(nu), cudaFuncAttributeMaxDynamicSharedMemorySize, (int)cap) !=
                cudaSuccess) {
                cudaGetLastError();
                cap = 1; /* nothing stages */
            }
    }
    return cap;
}

} // namespace

void cu_fgemv_stage_prepare() { (void)st_smem_cap(); }

int cu_fgemv_stage(cudaStream_t st, const cu_fgemv_args *a, int sms, int pdl, cudaError_t *err)
{
    const int mode = st_mode();
    if (mode == 0 || (mode == 1 && !a->stage)) return 0;
    if (a->dtype != CU_BF16 || a->pair || a->rows1 || a->nw || a->cols % 8 || sms < 2) return 0;
    const int units = a->cols / 8, nu = (units + ST_THREADS - 1) / ST_THREADS;
    if (nu > ST_MAX_NU || a->row_bytes != (int64_t)a->cols * 2) return 0;
    int cap = (int)(st_smem_cap() / (size_t)a->row_bytes);
    if (cap > ST_MAX_ROWS) cap = ST_MAX_ROWS;
    const int64_t R = a->rows0;
    if (cap < 1 || R > (int64_t)cap * sms) return 0;
    st_split sp = {0, 0};
    int grid = sms, rows_max;
    int early = st_early_env();
    if (early >= sms) early = sms - 1;
    if (early > 0 && (int64_t)early * cap >= R) { /* the early blocks alone hold it */
        grid = (int)((R + cap - 1) / cap);
        sp = {grid, cap};
        rows_max = cap;
    } else if (early > 0) { /* the late blocks' share is <= cap, as R <= cap * sms */
        sp = {early, cap};
        rows_max = cap;
    } else {
        if (R < grid) grid = (int)R;
        rows_max = (int)((R + grid - 1) / grid);
    }
    const size_t smem = (size_t)rows_max * (size_t)a->row_bytes;
    static const int show = getenv("SPARK_CUDA_FG_SHOW") != NULL;
    if (show)
        fprintf(stderr, "fgemv %lld x %d (dtype %d): staged, %d blocks (%d early x %d rows), %zu KB shared\n",
                (long long)R, a->cols, a->dtype, grid, sp.early, sp.big, smem / 1024);
    cudaError_t e = launch_ex(pdl != 0, dim3(grid), dim3(ST_THREADS), smem, st, st_pick(nu), *a, sp);
    *err = e != cudaSuccess ? e : cudaGetLastError();
    return 1;
}

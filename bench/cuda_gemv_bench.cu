/*
 * cuda_gemv_bench.cu — the decode step's GEMVs alone, on the 4B shape
 * (SPEC §1: hidden 2560, ff 10240, 16 x 256 query dims, 4 x 256 KV dims),
 * as CUDA graphs replayed back to back: how much of a token's time is the
 * weight stream itself, per matrix kind, next to cuBLAS doing the same
 * products (one cublasGemmEx per matrix, n = 1).
 *
 *   cuda_gemv_bench [--layers 36] [--reps 20] [--dtype bf16|q8_0|q4_k]
 *
 * --dtype: the matrices in that format (quantized: hashed bytes in the
 * device layout, cu_repack_rows; the cuBLAS chain is bf16 only).
 * Each layer has its own weights (no L2 reuse across layers, as in a real
 * step); values are hashed bf16 numbers of size ~0.02 (never zeros).
 * The attention path of a layer (rope_kv, split-KV attention with the head
 * gate, the merge) runs on f32 caches as the 4B's at context 4096: sliding
 * layers a 512-slot ring, every fourth layer full (4096 slots), position
 * --pos (640): alone, and between the GEMVs as in a decode step.
 * Prints ms per step and TB/s of weight bytes for each chain.
 */
#include "backend/cuda/cuda_internal.h"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <algorithm>
#include <vector>

#define CK(x)                                                                                   \
    do {                                                                                        \
        cudaError_t e_ = (x);                                                                   \
        if (e_ != cudaSuccess) {                                                                \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                            \
        }                                                                                       \
    } while (0)

static __global__ void fill_bf16(__nv_bfloat16 *w, size_t n, unsigned seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed;
        h ^= h >> 13;
        h *= 0x5bd1e995u;
        h ^= h >> 15;
        w[i] = __float2bfloat16(((float)(h & 0xffff) / 65536.0f - 0.5f) * 0.04f);
    }
}

static __global__ void fill_f32(float *x, size_t n, float v)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = v * (float)((i % 7) + 1);
}

static __global__ void fill_bytes(uint8_t *w, size_t n, unsigned seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed;
        h ^= h >> 13;
        h *= 0x5bd1e995u;
        w[i] = (uint8_t)(h >> 17 & 0x3b); /* keeps f16 scales finite and small */
    }
}

struct layer {
    const void *qkv, *g, *o, *gate, *up, *down;
};

static int dtype = CU_BF16;

static int64_t row_bytes(int64_t cols)
{
    return dtype == CU_Q8_0 ? cols / 32 * 34 : dtype == CU_Q4_K ? cols / 256 * 144 : cols * 2;
}

enum { H = 2560, FF = 10240, QD = 4096, QKV = 6144, G = 16 };

static const void *alloc_w(size_t rows, size_t cols, unsigned seed)
{
    void *w;
    CK(cudaMalloc(&w, rows * row_bytes(cols)));
    if (dtype == CU_BF16) fill_bf16<<<1024, 256>>>((__nv_bfloat16 *)w, rows * cols, seed);
    else fill_bytes<<<1024, 256>>>((uint8_t *)w, rows * row_bytes(cols), seed);
    CK(cudaGetLastError());
    return w;
}

int main(int argc, char **argv)
{
    int L = 36, reps = 20;
    long pos = 640;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--layers") && i + 1 < argc) L = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--pos") && i + 1 < argc) pos = atol(argv[++i]);
        else if (!strcmp(argv[i], "--dtype") && i + 1 < argc) {
            const char *d = argv[++i];
            dtype = !strcmp(d, "q8_0") ? CU_Q8_0 : !strcmp(d, "q4_k") ? CU_Q4_K : CU_BF16;
        }
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    const int sms = prop.multiProcessorCount;
    std::vector<layer> ly(L);
    for (int l = 0; l < L; l++) {
        ly[l].qkv = alloc_w(QKV, H, 11 * l + 1);
        ly[l].g = alloc_w(G, H, 11 * l + 2);
        ly[l].o = alloc_w(H, QD, 11 * l + 3);
        ly[l].gate = alloc_w(FF, H, 11 * l + 4);
        ly[l].up = alloc_w(FF, H, 11 * l + 5);
        ly[l].down = alloc_w(H, FF, 11 * l + 6);
    }
    float *x, *xn, *nw, *qkv, *gb, *att, *proj, *fa, *fb;
    CK(cudaMalloc((void **)&x, H * 4));
    CK(cudaMalloc((void **)&xn, H * 4));
    CK(cudaMalloc((void **)&nw, H * 4));
    CK(cudaMalloc((void **)&qkv, (QKV + G) * 4));
    CK(cudaMalloc((void **)&gb, G * 4));
    CK(cudaMalloc((void **)&att, QD * 4));
    CK(cudaMalloc((void **)&proj, FF * 4));
    CK(cudaMalloc((void **)&fa, FF * 4));
    CK(cudaMalloc((void **)&fb, FF * 4));
    fill_f32<<<64, 256>>>(x, H, 0.1f);
    fill_f32<<<64, 256>>>(nw, H, 0.3f);
    fill_f32<<<64, 256>>>(att, QD, 0.05f);
    fill_f32<<<64, 256>>>(fa, FF, 0.01f);
    CK(cudaDeviceSynchronize());
    cu_fgemv_prepare(H);
    cu_fgemv_prepare(FF);
    cu_fgemv_prepare(QD);
    const char *fl = getenv("SPARK_CUDA_FG_FLY");
    cu_fgemv_tune(fl ? atoi(fl) : 0);
    const char *only = getenv("CHAINS"); /* "fgemv": the GEMV chains only; "attn1": those with the one-launch attention */

    /* KV caches and the attention's buffers */
    const int KVD = 1024, NH = 16, NKV = 4, D = 256;
    std::vector<float *> kc(L), vc(L);
    for (int l = 0; l < L; l++) {
        const size_t slots = l % 4 == 3 ? 4096 : 512;
        CK(cudaMalloc((void **)&kc[l], slots * KVD * 4));
        CK(cudaMalloc((void **)&vc[l], slots * KVD * 4));
        fill_f32<<<256, 256>>>(kc[l], slots * KVD, 0.02f);
        fill_f32<<<256, 256>>>(vc[l], slots * KVD, 0.03f);
    }
    float *ws;
    int64_t *d_pos;
    CK(cudaMalloc((void **)&ws, (size_t)NH * 2 * sms * (D + 2) * 4));
    CK(cudaMalloc((void **)&d_pos, 8));
    CK(cudaMemcpy(d_pos, &pos, 8, cudaMemcpyHostToDevice));
    fill_f32<<<64, 256>>>(qkv, QKV + G, 0.01f);
    CK(cudaDeviceSynchronize());
    int min_keys = 64;

    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cublasHandle_t blas;
    if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) return 1;
    cublasSetStream(blas, st);

    const double lb_qkv = (double)(QKV + G) * row_bytes(H), lb_o = (double)H * row_bytes(QD),
                 lb_ff = 2.0 * FF * row_bytes(H), lb_down = (double)H * row_bytes(FF);

    auto fg_qkv = [&](int l, int pdl) {
        cu_fgemv_args a;
        memset(&a, 0, sizeof a);
        a.dtype = dtype;
        a.x = x, a.nw = nw, a.eps = 1e-6f, a.xn = xn;
        a.w0 = ly[l].qkv, a.rows0 = QKV, a.w1 = ly[l].g, a.rows1 = G, a.out0 = qkv, a.out1 = gb;
        a.row_bytes = row_bytes(H), a.cols = H;
        return cu_fgemv(st, &a, sms, pdl);
    };
    auto fg_o = [&](int l, int pdl) {
        cu_fgemv_args a;
        memset(&a, 0, sizeof a);
        a.dtype = dtype;
        a.x = att, a.w0 = ly[l].o, a.rows0 = H, a.out0 = proj, a.resid = x, a.row_bytes = row_bytes(QD), a.cols = QD;
        return cu_fgemv(st, &a, sms, pdl);
    };
    auto fg_ff = [&](int l, int pdl) {
        cu_fgemv_args a;
        memset(&a, 0, sizeof a);
        a.dtype = dtype;
        a.x = x, a.nw = nw, a.eps = 1e-6f, a.xn = xn, a.pair = 1;
        a.w0 = ly[l].gate, a.w1 = ly[l].up, a.rows0 = FF, a.out0 = fa, a.out1 = fb, a.row_bytes = row_bytes(H), a.cols = H;
        return cu_fgemv(st, &a, sms, pdl);
    };
    auto fg_down = [&](int l, int pdl) {
        cu_fgemv_args a;
        memset(&a, 0, sizeof a);
        a.dtype = dtype;
        a.x = fa, a.w0 = ly[l].down, a.rows0 = H, a.out0 = proj, a.resid = x, a.row_bytes = row_bytes(FF), a.cols = FF;
        return cu_fgemv(st, &a, sms, pdl);
    };
    float *tab;
    CK(cudaMalloc((void **)&tab, 512 * 4));
    int what = 3; /* 1 rope_kv, 2 attention, 4 rope_kv from a table, 8 all in one launch */
    const char *skv = getenv("SPARK_CUDA_SPLIT_KEYS");
    const int split_keys = skv && atoi(skv) > 0 ? atoi(skv) : 32;
    const int cluster = cu_attn_step_cluster(0, 16);
    auto attn_path = [&](int l, int pdl) {
        const bool full = l % 4 == 3;
        const int64_t slots = full ? 4096 : 512;
        if (what & 8) { /* the one-launch form (cuda_attn_step.cu), angles from the tables */
            cu_attn_args a;
            memset(&a, 0, sizeof a);
            a.out = att, a.qkv = qkv, a.kc = kc[l], a.vc = vc[l], a.pos = d_pos, a.slots = slots;
            a.qkv_stride = QKV + G, a.n = 1, a.n_head = NH, a.n_head_kv = NKV, a.head_dim = D;
            a.window = full ? 0 : 512;
            a.rot_dims = full ? 64 : 256, a.theta = full ? 5e6 : 1e4, a.rope_tab = tab + (full ? 0 : 256);
            a.pdl_early = !(getenv("SPARK_CUDA_PDL_EARLY") && atoi(getenv("SPARK_CUDA_PDL_EARLY")) == 0);
            a.scale = 1.0f / 16.0f, a.gate = gb, a.pdl = pdl, a.step = 1;
            CK(cu_attn_step(st, &a, cluster));
            return;
        }
        if (what & 1)
            CK(cu_rope_kv(st, qkv, NH, NKV, D, d_pos, full ? 64 : 256, full ? 5e6 : 1e4, kc[l], vc[l], slots, pdl,
                          (what & 4) ? tab + (full ? 0 : 256) : NULL));
        if (!(what & 2)) return;
        cu_attn_args a;
        memset(&a, 0, sizeof a);
        a.out = att, a.qkv = qkv, a.kc = kc[l], a.vc = vc[l], a.ws = ws, a.pos = d_pos, a.slots = slots;
        a.qkv_stride = QKV + G, a.n = 1, a.n_head = NH, a.n_head_kv = NKV, a.head_dim = D;
        a.window = full ? 0 : 512;
        int64_t splits = (2 * sms + NKV - 1) / NKV, most = (slots + split_keys - 1) / split_keys; /* key_splits */
        a.splits = (int)(splits < most ? splits : most);
        a.min_split_keys = min_keys;
        a.pdl_early = getenv("SPARK_CUDA_PDL_EARLY") && atoi(getenv("SPARK_CUDA_PDL_EARLY")) == 1;
        a.scale = 1.0f / 16.0f, a.gate = gb, a.pdl = pdl;
        CK(cu_attention(st, &a));
    };
    const float one = 1.0f, zero = 0.0f;
    auto blas_mv = [&](const void *w, int rows, int cols, const float *in, float *out) {
        /* cuBLAS on bf16 x needs x in bf16: use the f32-in / bf16-weight path of GemmEx with x as f32? not allowed
         * for mixed types, so convert once per step outside the timing: x is fed as bf16 scratch */
        static __nv_bfloat16 *xb = NULL;
        if (!xb) xb = (__nv_bfloat16 *)ws; /* any bf16 values will do; no allocation inside a capture */
        (void)in;
        cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, rows, 1, cols, &one, w, CUDA_R_16BF, cols, xb, CUDA_R_16BF, cols,
                     &zero, out, CUDA_R_32F, rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    };

    /* ms per replay of a graph of what build() launches on st (3 warm-up replays, then reps timed) */
    auto graph_ms = [&](auto build) {
        cudaGraph_t g;
        cudaGraphExec_t ex;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        build();
        CK(cudaStreamEndCapture(st, &g));
        CK(cudaGraphInstantiate(&ex, g, 0));
        for (int i = 0; i < 3; i++) CK(cudaGraphLaunch(ex, st));
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        CK(cudaEventRecord(e0, st));
        for (int i = 0; i < reps; i++) CK(cudaGraphLaunch(ex, st));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        cudaGraphExecDestroy(ex);
        cudaGraphDestroy(g);
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
        return (double)ms / reps;
    };

    /* SWEEP_FG=1: every launch shape of each matrix kind (split KS, blocks an
     * SM, double-buffered or not) as a chain of L layers of that kind alone;
     * prints the default's time and the six fastest. */
    if (getenv("SWEEP_FG")) {
        struct res {
            double us;
            int db, ks, b;
        };
        const char *kname[] = {"qkv+gate", "out", "gate/up pair", "down"};
        const double kbytes[] = {lb_qkv, lb_o, lb_ff, lb_down};
        auto launch = [&](int k, int l) {
            return k == 0 ? fg_qkv(l, 1) : k == 1 ? fg_o(l, 1) : k == 2 ? fg_ff(l, 1) : fg_down(l, 1);
        };
        auto time_kind = [&](int k) { /* us a layer */
            return 1e3 / L * graph_ms([&] {
                for (int l = 0; l < L; l++) CK(launch(k, l));
            });
        };
        for (int k = 0; k < 4; k++) {
            cu_fgemv_force(0, 0, -1);
            const double def = time_kind(k);
            std::vector<res> all;
            for (int db = 0; db < 2; db++)
                for (int ks = 1; ks <= 8; ks *= 2)
                    for (int b = 1; b <= 8; b++) {
                        cu_fgemv_force(ks, b, db);
                        if (launch(k, 0) != cudaSuccess) { /* no such shape for this kind */
                            cudaGetLastError();
                            continue;
                        }
                        all.push_back({time_kind(k), db, ks, b});
                    }
            cu_fgemv_force(0, 0, -1);
            std::sort(all.begin(), all.end(), [](const res &x, const res &y) { return x.us < y.us; });
            printf("sweep %-12s default: %6.2f us/layer, %.2f TB/s\n", kname[k], def, kbytes[k] / (def * 1e-6) / 1e12);
            for (size_t i = 0; i < all.size() && i < 6; i++)
                printf("sweep %-12s db %d ks %d b %d: %6.2f us/layer, %.2f TB/s\n", kname[k], all[i].db, all[i].ks,
                       all[i].b, all[i].us, kbytes[k] / (all[i].us * 1e-6) / 1e12);
        }
        if (only && !strcmp(only, "sweep")) return 0;
    }

    struct chain {
        const char *name;
        double bytes;
        int kind; /* bitmask: 1 qkv, 2 o, 4 ff, 8 down; 16 = cuBLAS */
    } chains[] = {
        {"all four (fgemv, PDL)", lb_qkv + lb_o + lb_ff + lb_down, 15},
        {"all four (fgemv, no PDL)", lb_qkv + lb_o + lb_ff + lb_down, 15 | 32},
        {"qkv+gate only", lb_qkv, 1},
        {"out only", lb_o, 2},
        {"gate/up pair only", lb_ff, 4},
        {"down only", lb_down, 8},
        {"cuBLAS: qkv, g, o, gate, up, down", lb_qkv + lb_o + lb_ff + lb_down, 16},
        {"attention path only", 0, 64},
        {"attention path only, no split minimum", 0, 64 | 128},
        {"attention path, rope from table", 0, 64 | 512},
        {"rope_kv only", 0, 64 | 1024},
        {"rope_kv only, from table", 0, 64 | 1024 | 512},
        {"attention only", 0, 64 | 2048},
        {"attention in one launch (cluster merge)", 0, 64 | 512 | 4096},
        {"step: 4 fgemv + attention path", lb_qkv + lb_o + lb_ff + lb_down, 15 | 64},
        {"step: 4 fgemv + attention in one launch", lb_qkv + lb_o + lb_ff + lb_down, 15 | 64 | 512 | 4096},
        {"step, no split minimum", lb_qkv + lb_o + lb_ff + lb_down, 15 | 64 | 128},
    };
    for (const chain &c : chains) {
        if (only && !strcmp(only, "fgemv") && (c.kind & (16 | 32 | 64))) continue;
        if (only && !strcmp(only, "attn1") && !(c.kind & 4096)) continue; /* the one-launch attention's chains */
        if ((c.kind & 4096) && !cluster) continue; /* no clusters on this device */
        if ((c.kind & 16) && dtype != CU_BF16) continue; /* cuBLAS: bf16 matrices only */
        const int pdl = (c.kind & 32) ? 0 : 1;
        min_keys = (c.kind & 128) ? 0 : split_keys;
        what = (c.kind & 1024) ? 1 : (c.kind & 2048) ? 2 : 3;
        if (c.kind & 512) what |= 4;
        if (c.kind & 4096) what |= 8;
        const double ms = graph_ms([&] {
            if (c.kind & 512) { /* the tables, once (the position does not change here) */
                CK(cu_rope_table(st, tab, d_pos, 64, 5e6, 0));
                CK(cu_rope_table(st, tab + 256, d_pos, 256, 1e4, 0));
            }
            for (int l = 0; l < L; l++) {
                if (c.kind & 16) {
                    blas_mv(ly[l].qkv, QKV, H, xn, qkv);
                    blas_mv(ly[l].g, G, H, xn, gb);
                    blas_mv(ly[l].o, H, QD, att, proj);
                    blas_mv(ly[l].gate, FF, H, xn, fa);
                    blas_mv(ly[l].up, FF, H, xn, fb);
                    blas_mv(ly[l].down, H, FF, fa, proj);
                    continue;
                }
                if (c.kind & 1) CK(fg_qkv(l, pdl));
                if (c.kind & 64) attn_path(l, pdl);
                if (c.kind & 2) CK(fg_o(l, pdl));
                if (c.kind & 4) CK(fg_ff(l, pdl));
                if (c.kind & 8) CK(fg_down(l, pdl));
            }
        });
        const double bytes = c.bytes * L;
        printf("chain %-40s %2d layers: %7.3f ms/step, %6.1f us/layer, %.2f TB/s\n", c.name, L, ms,
               1e3 * ms / L, bytes / (ms * 1e-3) / 1e12);
    }
    return 0;
}

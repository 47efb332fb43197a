/*
 * cpu_internal.h — the CPU backend's private state, shared by its files:
 * cpu_backend.c (the backend_ops table, elementwise ops, rope), matmul.c
 * (GEMV / GEMM drivers) and attention.c.
 */
#ifndef SPARK_BACKEND_CPU_INTERNAL_H
#define SPARK_BACKEND_CPU_INTERNAL_H

#include "backend/cpu/kernels.h"
#include "backend/cpu/threadpool.h"
#include "engine/backend.h"

/* cos/sin of one rope class for a run of positions: [n][half] each. */
typedef struct rope_table {
    int64_t pos0;
    int n, rot_dims;
    double theta;
    float *cs, *sn;
    int cap; /* rows allocated */
} rope_table;

typedef struct cpu_backend {
    backend base; /* first: the engine holds a backend* */
    thread_pool *pool;
    cpu_kernels k;
    /* GEMM scratch, grown on demand */
    float *packed;       /* packed token groups */
    size_t packed_cap;   /* floats */
    float **panel;       /* per thread: dequantized weight rows */
    size_t panel_cap;    /* floats per thread */
    q8x_block *xq;       /* the activation row in int8 (single-token K-quant GEMV, SPARK_KQUANT_X8=1) */
    size_t xq_cap;       /* blocks */
    int16_t *x16q;       /* the activation row in int16 (single-token Q8_0 / Q4_K / Q6_K GEMV) */
    float *x16d;         /* its scales, one per 32 values */
    float *x16s;         /* the sums of its rounded values, one per 32 (Q4_K's mins) */
    size_t x16_cap;      /* values */
    uint16_t *amx_x;     /* the activations' bf16 parts for the AMX prefill (amx.c) */
    size_t amx_x_cap;    /* values */
    rope_table rope[2];
    int32_t picks[2];    /* queued greedy picks, oldest first (backend.h's pick) */
    int n_picks;
    int32_t last_pick;   /* the id embed(ids = NULL) reads */
} cpu_backend;

static inline cpu_backend *cpu_of(backend *be) { return (cpu_backend *)be; }

/* out[t, r] = sum_c x[t, c] * W[r, c] for t < n (x: [n, cols], out: [n, rows]). */
void cpu_matmul(backend *be, float *out, const float *x, const weight_ref *w, int n);

/* Prefill with bf16 weights on AMX tiles (amx.c), for n >= AMX_MIN_TOKENS:
 * returns 0 without writing when it does not apply (other dtype, no AMX,
 * SPARK_AMX=0, no memory), and the caller uses the float path. */
enum { AMX_MIN_TOKENS = 16 };
int cpu_amx_matmul(cpu_backend *cb, int nth, float *out, const float *x, const weight_ref *w, int n);
int cpu_amx_available(void); /* the CPU has AMX-BF16, the kernel grants it and SPARK_AMX is not 0 */
/* `iters` rounds of four tile products on this thread (the probe's loop);
 * the FLOPs done, 0 without AMX. */
double cpu_amx_tile_flops(long iters);

/* The backend's attention op (see backend.h). */
void cpu_attention(backend *be, float *out, const float *qkv, const kv_layer *cache, int64_t pos0, int n,
                   const attn_shape *sh);

/* Prefill attention over blocks of query tokens (attention_tiled.c); returns
 * 0 without doing anything when the shape is outside what it handles. */
int cpu_attention_tiled(backend *be, float *out, const float *qkv, const kv_layer *cache, int64_t pos0, int n,
                        const attn_shape *sh);

/* Split [0, total) into nth nearly equal ranges whose starts are multiples
 * of `align`; range ith is [*lo, *hi). */
void cpu_split(int64_t total, int64_t align, int ith, int nth, int64_t *lo, int64_t *hi);

#endif

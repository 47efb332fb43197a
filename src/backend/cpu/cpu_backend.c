/*
 * cpu_backend.c — the CPU implementation of the backend interface.
 *
 * The heavy ops live in matmul.c (GEMV / GEMM over every weight format) and
 * attention.c (online-softmax GQA attention); this file holds the op table,
 * memory, the element-wise ops and rope. Kernels come from the table of the
 * best instruction-set level this CPU runs (cpu_features.c; SPARK_CPU caps
 * it), work is split over a private thread pool (threadpool.c).
 *
 * Element-wise ops over one token's row run on the calling thread: a pool
 * hand-off costs about a microsecond, more than adding 2560 floats.
 */
#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/kv_turbo.h"

#include "base/error.h"
#include "base/mem.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

enum {
    BUF_HEADER = 64,            /* keeps the returned pointer 64-byte aligned */
    PARALLEL_ELEMS = 1 << 16,   /* element-wise ops smaller than this stay on one thread */
};

/* ---- memory: anonymous mappings, committed lazily by the kernel ----------- */

static spark_status cpu_alloc(backend *be, size_t bytes, float **out)
{
    size_t total = bytes + BUF_HEADER;
    void *p = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        *out = NULL;
        return spark_fail(SPARK_ERR_NOMEM, "cannot reserve %zu bytes of memory", bytes);
    }
    *(size_t *)p = total;
    *out = (float *)((char *)p + BUF_HEADER);
    return SPARK_OK;
}

static void cpu_release(backend *be, float *buf)
{
    if (!buf) return;
    char *base = (char *)buf - BUF_HEADER;
    munmap(base, *(size_t *)base);
}

static void cpu_download(backend *be, float *dst, const float *buf, size_t count)
{
    memcpy(dst, buf, count * sizeof(float));
}

static void cpu_destroy(backend *be)
{
    cpu_backend *cb = cpu_of(be);
    int nth = pool_size(cb->pool);
    pool_free(cb->pool);
    free(cb->packed);
    free(cb->xq);
    free(cb->x16q);
    free(cb->x16d);
    free(cb->x16s);
    free(cb->amx_x);
    if (cb->panel)
        for (int i = 0; i < nth; i++) free(cb->panel[i]);
    free(cb->panel);
    for (int i = 0; i < 2; i++) {
        free(cb->rope[i].cs);
        free(cb->rope[i].sn);
    }
    free(cb);
}

/* ---- parallel-for over a range of rows / elements --------------------------- */

typedef void (*range_fn)(const void *ctx, int64_t lo, int64_t hi);

typedef struct range_job {
    range_fn fn;
    const void *ctx;
    int64_t total, align;
} range_job;

static void range_task(void *arg, int ith, int nth)
{
    const range_job *r = arg;
    int64_t lo, hi;
    cpu_split(r->total, r->align, ith, nth, &lo, &hi);
    if (lo < hi) r->fn(r->ctx, lo, hi);
}

/* fn over [0, total), split over the pool when work (elements touched) is large. */
static void parallel_range(cpu_backend *cb, range_fn fn, const void *ctx, int64_t total, int64_t align, int64_t work)
{
    if (work < PARALLEL_ELEMS || pool_size(cb->pool) == 1) {
        fn(ctx, 0, total);
        return;
    }
    range_job r = {.fn = fn, .ctx = ctx, .total = total, .align = align};
    pool_run(cb->pool, range_task, &r, pool_size(cb->pool));
}

/* ---- element-wise and row ops ----------------------------------------------- */

static void cpu_embed(backend *be, float *out, const weight_ref *table, const int32_t *ids, int n)
{
    if (!ids) ids = &cpu_of(be)->last_pick;
    size_t rb = (size_t)dtype_row_bytes(table->dtype, (uint64_t)table->cols);
    for (int t = 0; t < n; t++) {
        const uint8_t *row = (const uint8_t *)table->data + (size_t)ids[t] * rb;
        cpu_of(be)->k.dequant[table->dtype](row, rb, 1, table->cols, out + (int64_t)t * table->cols);
    }
}

typedef struct norm_ctx {
    const cpu_kernels *k;
    float *out;
    const float *x, *w;
    int dim;
    float eps;
} norm_ctx;

static void norm_rows(const void *arg, int64_t lo, int64_t hi)
{
    const norm_ctx *c = arg;
    for (int64_t t = lo; t < hi; t++) c->k->rmsnorm(c->out + t * c->dim, c->x + t * c->dim, c->w, c->dim, c->eps);
}

static void cpu_rmsnorm(backend *be, float *out, const float *x, const float *w, int n, int dim, float eps)
{
    norm_ctx c = {&cpu_of(be)->k, out, x, w, dim, eps};
    parallel_range(cpu_of(be), norm_rows, &c, n, 1, (int64_t)n * dim);
}

static void cpu_gate_heads(backend *be, float *o, const float *g, int n, int n_head, int head_dim)
{
    const cpu_kernels *k = &cpu_of(be)->k;
    for (int64_t i = 0; i < (int64_t)n * n_head; i++)
        k->scale(o + i * head_dim, 1.0f / (1.0f + expf(-g[i])), head_dim);
}

typedef struct pair_ctx {
    const cpu_kernels *k;
    float *a;
    const float *b;
} pair_ctx;

static void gelu_range(const void *arg, int64_t lo, int64_t hi)
{
    const pair_ctx *c = arg;
    c->k->gelu_mul(c->a + lo, c->b + lo, hi - lo);
}

static void add_range(const void *arg, int64_t lo, int64_t hi)
{
    const pair_ctx *c = arg;
    c->k->add(c->a + lo, c->b + lo, hi - lo);
}

static void cpu_gelu_mul(backend *be, float *a, const float *b, int64_t count)
{
    pair_ctx c = {&cpu_of(be)->k, a, b};
    parallel_range(cpu_of(be), gelu_range, &c, count, 64, count * 8); /* erf costs ~8 adds */
}

static void cpu_add(backend *be, float *y, const float *x, int64_t count)
{
    pair_ctx c = {&cpu_of(be)->k, y, x};
    parallel_range(cpu_of(be), add_range, &c, count, 64, count);
}

/* ---- rope: cos/sin per (position, pair), computed once per chunk and class ---- */

/* The table for positions pos0..pos0+n-1 of class rc, reusing the last one
 * computed when it matches (every layer of a class in a chunk does). */
static const rope_table *rope_table_for(cpu_backend *cb, int64_t pos0, int n, const rope_class *rc)
{
    rope_table *tb = NULL;
    for (int i = 0; i < 2 && !tb; i++) {
        rope_table *c = &cb->rope[i];
        if (c->rot_dims != rc->rot_dims || c->theta != rc->theta) continue;
        if (c->pos0 == pos0 && c->n == n) return c;
        tb = c; /* this class's slot: refill it */
    }
    if (!tb) tb = !cb->rope[0].rot_dims ? &cb->rope[0] : !cb->rope[1].rot_dims ? &cb->rope[1] : &cb->rope[pos0 & 1];
    int half = rc->rot_dims / 2;
    if (n > tb->cap) {
        free(tb->cs);
        free(tb->sn);
        tb->cs = malloc((size_t)n * (size_t)half * sizeof(float));
        tb->sn = malloc((size_t)n * (size_t)half * sizeof(float));
        tb->cap = tb->cs && tb->sn ? n : 0;
        if (!tb->cap) {
            tb->n = 0;
            return NULL;
        }
    }
    for (int j = 0; j < half; j++) {
        /* angle = pos * theta^(-2j/R): the divisor is the ROTARY width R */
        double inv_freq = pow(rc->theta, -2.0 * j / rc->rot_dims);
        for (int t = 0; t < n; t++) {
            double angle = (double)(pos0 + t) * inv_freq;
            tb->cs[(int64_t)t * half + j] = (float)cos(angle);
            tb->sn[(int64_t)t * half + j] = (float)sin(angle);
        }
    }
    tb->pos0 = pos0;
    tb->n = n;
    tb->rot_dims = rc->rot_dims;
    tb->theta = rc->theta;
    return tb;
}

typedef struct rope_ctx {
    const cpu_kernels *k;
    const rope_table *tb;
    float *x;
    int64_t stride;
    int n_heads, head_dim, half;
} rope_ctx;

static void rope_rows(const void *arg, int64_t lo, int64_t hi)
{
    const rope_ctx *c = arg;
    for (int64_t t = lo; t < hi; t++) {
        const float *cs = c->tb->cs + t * c->half, *sn = c->tb->sn + t * c->half;
        for (int h = 0; h < c->n_heads; h++)
            c->k->rope_head(c->x + t * c->stride + (int64_t)h * c->head_dim, cs, sn, c->half);
    }
}

/* Rotation without a table (allocation failed): the same formula, slower. */
static void rope_direct(float *x, int n, int64_t stride, int n_heads, int head_dim, int64_t pos0,
                        const rope_class *rc)
{
    int half = rc->rot_dims / 2;
    for (int t = 0; t < n; t++)
        for (int j = 0; j < half; j++) {
            double angle = (double)(pos0 + t) * pow(rc->theta, -2.0 * j / rc->rot_dims);
            float c = (float)cos(angle), s = (float)sin(angle);
            for (int h = 0; h < n_heads; h++) {
                float *v = x + (int64_t)t * stride + (int64_t)h * head_dim;
                float a = v[j], b = v[j + half];
                v[j] = a * c - b * s;
                v[j + half] = b * c + a * s;
            }
        }
}

static void cpu_rope(backend *be, float *x, int n, int64_t stride, int n_heads, int head_dim, int64_t pos0,
                     const rope_class *rc)
{
    cpu_backend *cb = cpu_of(be);
    const rope_table *tb = rope_table_for(cb, pos0, n, rc);
    if (!tb) {
        rope_direct(x, n, stride, n_heads, head_dim, pos0, rc);
        return;
    }
    rope_ctx c = {&cb->k, tb, x, stride, n_heads, head_dim, rc->rot_dims / 2};
    parallel_range(cb, rope_rows, &c, n, 1, (int64_t)n * n_heads * rc->rot_dims);
}

/* ---- KV cache --------------------------------------------------------------- */

static void cpu_kv_store(backend *be, kv_layer *cache, const float *qkv, int64_t pos0, int n, const attn_shape *sh)
{
    if (cache->type != SPARK_KV_F32) { /* encoded rows: kv_turbo.c */
        cpu_kv_coded_store(be, cache, qkv, pos0, n, sh);
        return;
    }
    int64_t kv_dim = (int64_t)sh->n_head_kv * sh->head_dim;
    int64_t q_dim = (int64_t)sh->n_head * sh->head_dim;
    int first = n > cache->slots ? n - (int)cache->slots : 0; /* a ring keeps only the newest */
    for (int t = first; t < n; t++) {
        int64_t slot = (pos0 + t) % cache->slots;
        const float *row = qkv + (int64_t)t * sh->qkv_stride + q_dim;
        memcpy(cache->k + slot * kv_dim, row, (size_t)kv_dim * sizeof(float));
        memcpy(cache->v + slot * kv_dim, row + kv_dim, (size_t)kv_dim * sizeof(float));
    }
}

/* ---- greedy picks (backend.h): on the host buffer, as the sampler would ---- */

static void cpu_pick(backend *be, const float *logits, int count)
{
    cpu_backend *cb = cpu_of(be);
    ASSERT(cb->n_picks < 2);
    cb->last_pick = greedy_pick(logits, count);
    cb->picks[cb->n_picks++] = cb->last_pick;
}

static int32_t cpu_pick_read(backend *be)
{
    cpu_backend *cb = cpu_of(be);
    ASSERT(cb->n_picks > 0);
    int32_t id = cb->picks[0];
    cb->picks[0] = cb->picks[1];
    cb->n_picks--;
    return id;
}

static void cpu_pick_drop(backend *be) { cpu_of(be)->n_picks = 0; }

/* The same selection the device backends make (backend.h), on the host
 * buffer: the total is summed in id order, as the sampler's own. */
static int32_t cpu_candidates(backend *be, const float *logits, int count, float inv_t, float log_min_p, int32_t cap,
                              float *x_out, int32_t *id_out, int *complete, double *total)
{
    *complete = 0;
    *total = 0;
    const int32_t best = greedy_pick(logits, count);
    if (best < 0) return 0;
    const float x_max = logits[best] * inv_t; /* the largest x: inv_t > 0 keeps the order */
    const float floor = x_max + log_min_p;
    int64_t in[CAND_BUCKETS] = {0};
    double sum = 0;
    for (int i = 0; i < count; i++) {
        float x = logits[i] * inv_t;
        if (!(x > -INFINITY && x >= floor)) continue;
        in[CAND_BUCKET(x_max, x)]++;
        sum += exp((double)x - x_max);
    }
    *total = sum;
    int last = -1;
    for (int64_t b = 0, held = 0; b < CAND_BUCKETS && held + in[b] <= cap; b++) {
        held += in[b];
        last = (int)b;
    }
    if (last < 0) return 0;
    *complete = last == CAND_BUCKETS - 1;
    int32_t n = 0;
    for (int i = 0; i < count; i++) {
        float x = logits[i] * inv_t;
        if (x > -INFINITY && x >= floor && CAND_BUCKET(x_max, x) <= last) {
            x_out[n] = x;
            id_out[n++] = i;
        }
    }
    return n;
}

static const backend_ops cpu_ops = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .release = cpu_release,
    .download = cpu_download,
    .destroy = cpu_destroy,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .matmul = cpu_matmul,
    .rope = cpu_rope,
    .attention = cpu_attention,
    .kv_store = cpu_kv_store,
    .gate_heads = cpu_gate_heads,
    .gelu_mul = cpu_gelu_mul,
    .add = cpu_add,
    .pick = cpu_pick,
    .pick_read = cpu_pick_read,
    .pick_drop = cpu_pick_drop,
    .pick_ahead = 0, /* every op has finished when it returns: nothing to overlap */
    .candidates = cpu_candidates,
};

/* An environment switch: `on` or `off` picks that; unset or anything else, the default. */
static int env_switch(const char *name, const char *on, const char *off, int dflt)
{
    const char *v = getenv(name);
    return v && !strcmp(v, on) ? 1 : v && !strcmp(v, off) ? 0 : dflt;
}

spark_status backend_cpu_create(int n_threads, backend **out)
{
    *out = NULL;
    cpu_backend *cb = spark_calloc(1, sizeof *cb, "CPU backend");
    if (!cb) return SPARK_ERR_NOMEM;
    cb->base.ops = &cpu_ops;
    cb->base.n_threads = n_threads > 0 ? n_threads : cpu_physical_cores();
    if (!cpu_kernels_resolve(cpu_isa_active(), &cb->k)) cpu_kernels_resolve(CPU_ISA_SCALAR, &cb->k);
    /* Single-token Q8_0 / Q4_K / Q6_K GEMVs: by default x is rounded to
     * int16 per 32 values (kernels_x8.inc), more precise than the bf16
     * activations the reference multiplies (SPEC section 2).
     * SPARK_KQUANT_X8=1: Q4_K / Q6_K round x to int8 per 32 values instead
     * (faster in cache, but BELOW SPEC section 2's precision: an opt-in
     * for experiments only). SPARK_INT8_DOT=0: all three on the exact
     * float path (wins over SPARK_KQUANT_X8). */
    const char *kx8 = getenv("SPARK_KQUANT_X8");
    if (kx8 && !strcmp(kx8, "1")) {
        cb->k.x8.gemv_x16[SPARK_DTYPE_Q4_K] = NULL;
        cb->k.x8.gemv_x16[SPARK_DTYPE_Q6_K] = NULL;
    } else {
        memset(cb->k.x8.gemv, 0, sizeof cb->k.x8.gemv);
    }
    const char *i8 = getenv("SPARK_INT8_DOT");
    if (i8 && !strcmp(i8, "0")) memset(&cb->k.x8, 0, sizeof cb->k.x8);
    /* Lane layout of the single-token GEMVs that have more than one (the
     * int16 Q8_0 one, the float f32 / f16 / bf16 ones). On AMD 2 long lanes
     * a tile prefetched 4 KB ahead: the 4B decode's products streamed
     * 1.1-1.7x faster so on the Zen 5 VM than in 8 lanes at 1 KB. Elsewhere
     * Q8_0 keeps 8 lanes at 1 KB (measured ahead of 2 on the Intel VM) and
     * the float formats take 3 lanes prefetched 3 KB ahead into L1: on the
     * Intel VM bf16 decode ran 4.1 % faster so than in 8 lanes, tokens
     * alternating in one process (bench/RESULTS.md, 2026-11-30, 2026-12-01
     * and 2026-12-02). SPARK_GEMV_LANES=2|3|8 forces one (3: the float
     * formats; Q8_0 then stays at 8). The results are the same bits in every
     * layout. The 2-lane far prefetches' hint (cpu_far_prefetch_nta,
     * SPARK_GEMV_FAR_NTA=0|1) is process-wide: the backend created last
     * sets it. */
    const char *lanes_env = getenv("SPARK_GEMV_LANES");
    const int lanes = lanes_env && (!strcmp(lanes_env, "2") || !strcmp(lanes_env, "3") || !strcmp(lanes_env, "8"))
                          ? atoi(lanes_env)
                          : cpu_is_amd() ? 2 : 3;
    cpu_far_prefetch_nta = env_switch("SPARK_GEMV_FAR_NTA", "1", "0", cpu_is_amd());
    for (int d = 0; d < SPARK_DTYPE_COUNT; d++) {
        if (lanes == 2 && cb->k.x8.gemv_x16[d] && cb->k.x8.gemv_x16_2l[d]) cb->k.x8.gemv_x16[d] = cb->k.x8.gemv_x16_2l[d];
        gemv_fn alt = lanes == 2 ? cb->k.gemv_2l[d] : lanes == 3 ? cb->k.gemv_3l[d] : NULL;
        if (alt) cb->k.gemv[d] = alt;
    }
    spark_status st = pool_create(cb->base.n_threads, &cb->pool);
    if (st == SPARK_OK) {
        cb->panel = spark_calloc((size_t)cb->base.n_threads, sizeof *cb->panel, "GEMM panels");
        if (!cb->panel) st = SPARK_ERR_NOMEM;
    }
    if (st != SPARK_OK) {
        cpu_destroy(&cb->base);
        return st;
    }
    *out = &cb->base;
    return SPARK_OK;
}

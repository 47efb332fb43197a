/*
 * attention.c — causal / sliding-window GQA attention with an online
 * softmax: no n x n score matrix, memory O(head_dim) per query head.
 *
 * One task = one query token x one KV head; the task handles the query
 * heads that share that KV head together, so each key and value row is
 * fetched once for the whole group. Keys are visited in blocks of KEY_BLOCK:
 * scores for the block, one max update and one rescale of the running output
 * per block (not per key), exponentials in a vector, then the block's values
 * are added with axpy_rows (the output stays in registers across the block).
 */
#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/kv_turbo.h"

#include <math.h>

enum {
    KEY_BLOCK = 64,
    MAX_GROUP = 64,            /* query heads per KV head handled in one task */
    PARALLEL_WORK = 1 << 15,   /* (keys x query heads x dims) below this: one thread */
    TILED_MIN_TOKENS = 4,      /* from this many query tokens, attention_tiled.c shares key loads */
};

typedef struct attn_job {
    cpu_backend *cb;
    float *out;
    const float *qkv;
    const kv_layer *cache;
    int64_t pos0;
    int n;
    const attn_shape *sh;
} attn_job;

/* Key (or value) row of kv head kh at absolute position j: this chunk's rows
 * are still in the qkv buffer, earlier ones in the cache (ring slot j % slots). */
static const float *kv_row(const attn_job *a, int64_t j, int kh, int is_value)
{
    const attn_shape *sh = a->sh;
    int64_t kv_dim = (int64_t)sh->n_head_kv * sh->head_dim;
    int64_t head_off = (int64_t)kh * sh->head_dim;
    if (j >= a->pos0) {
        int64_t q_dim = (int64_t)sh->n_head * sh->head_dim;
        return a->qkv + (j - a->pos0) * sh->qkv_stride + q_dim + (is_value ? kv_dim : 0) + head_off;
    }
    const float *base = is_value ? a->cache->v : a->cache->k;
    return base + (j % a->cache->slots) * kv_dim + head_off;
}

typedef struct head_state {
    float max, sum;
    float *out;
    const float *q;
} head_state;

/* One block of keys [j0, j0 + nk) for every head of the group. */
static void attend_block(const attn_job *a, int kh, head_state *hs, int group, int64_t j0, int nk)
{
    const cpu_kernels *k = &a->cb->k;
    int D = a->sh->head_dim;
    const float *keys[KEY_BLOCK], *vals[KEY_BLOCK];
    float s[KEY_BLOCK];
    for (int i = 0; i < nk; i++) {
        keys[i] = kv_row(a, j0 + i, kh, 0);
        vals[i] = kv_row(a, j0 + i, kh, 1);
    }
    for (int g = 0; g < group; g++) {
        head_state *h = &hs[g];
        float bmax = -INFINITY;
        for (int i = 0; i < nk; i++) {
            s[i] = k->dot(h->q, keys[i], D) * a->sh->scale;
            if (s[i] > bmax) bmax = s[i];
        }
        if (bmax > h->max) { /* a new maximum: rescale what was accumulated */
            float rescale = expf(h->max - bmax);
            h->sum *= rescale;
            k->scale(h->out, rescale, D);
            h->max = bmax;
        }
        h->sum += k->exp_sum(s, h->max, nk);
        k->axpy_rows(h->out, s, vals, nk, D);
    }
}

/* Query heads [g0, g0 + group) of kv head kh's group, for query token t. */
static void attend_heads(const attn_job *a, int t, int kh, int g0, int group)
{
    const attn_shape *sh = a->sh;
    int D = sh->head_dim, per_kv = sh->n_head / sh->n_head_kv;
    int64_t p = a->pos0 + t;
    /* sliding: keys j with 0 <= p - j < window; full: every j <= p */
    int64_t lo = a->cache->window ? p - a->cache->window + 1 : 0;
    if (lo < 0) lo = 0;
    head_state hs[MAX_GROUP];
    for (int g = 0; g < group; g++) {
        int h = kh * per_kv + g0 + g;
        hs[g] = (head_state){.max = -INFINITY, .sum = 0,
                             .out = a->out + ((int64_t)t * sh->n_head + h) * D,
                             .q = a->qkv + (int64_t)t * sh->qkv_stride + (int64_t)h * D};
        for (int d = 0; d < D; d++) hs[g].out[d] = 0;
    }
    for (int64_t j0 = lo; j0 <= p; j0 += KEY_BLOCK) {
        int nk = p + 1 - j0 < KEY_BLOCK ? (int)(p + 1 - j0) : KEY_BLOCK;
        attend_block(a, kh, hs, group, j0, nk);
    }
    for (int g = 0; g < group; g++) a->cb->k.scale(hs[g].out, 1.0f / hs[g].sum, D);
}

static void attend_task(const attn_job *a, int t, int kh)
{
    int per_kv = a->sh->n_head / a->sh->n_head_kv;
    for (int g0 = 0; g0 < per_kv; g0 += MAX_GROUP)
        attend_heads(a, t, kh, g0, per_kv - g0 < MAX_GROUP ? per_kv - g0 : MAX_GROUP);
}

static void attention_task(void *arg, int ith, int nth)
{
    const attn_job *a = arg;
    /* interleaved: causal rows grow with t, so contiguous slices would be uneven */
    int64_t tasks = (int64_t)a->n * a->sh->n_head_kv;
    for (int64_t i = ith; i < tasks; i += nth) attend_task(a, (int)(i / a->sh->n_head_kv), (int)(i % a->sh->n_head_kv));
}

void cpu_attention(backend *be, float *out, const float *qkv, const kv_layer *cache, int64_t pos0, int n,
                   const attn_shape *sh)
{
    if (cache->type != SPARK_KV_F32) { /* f16 / bf16 / TurboQuant rows: kv_turbo.c */
        cpu_kv_coded_attention(be, out, qkv, cache, pos0, n, sh);
        return;
    }
    if (n >= TILED_MIN_TOKENS && cpu_attention_tiled(be, out, qkv, cache, pos0, n, sh)) return;
    cpu_backend *cb = cpu_of(be);
    attn_job a = {.cb = cb, .out = out, .qkv = qkv, .cache = cache, .pos0 = pos0, .n = n, .sh = sh};
    int64_t keys = cache->window && cache->window < pos0 + n ? cache->window : pos0 + n;
    int64_t work = keys * n * sh->n_head * sh->head_dim;
    int nth = work < PARALLEL_WORK ? 1 : pool_size(cb->pool);
    if (nth > n * sh->n_head_kv) nth = n * sh->n_head_kv;
    pool_run(cb->pool, attention_task, &a, nth);
}

/*
 * attention_tiled.c — prefill attention for many query tokens at once: a
 * flash-attention-style loop over key blocks with an online softmax, so a
 * 512-token prompt never builds a 512 x 512 score matrix.
 *
 * One task = one KV head x a block of query tokens: its rows are every
 * (token, query head of that KV head) pair, up to TASK_ROWS of them. Each
 * block of KEY_BLOCK keys is loaded once for all those rows: scores with
 * qk_block (register-tiled dot products), then per row the visible range's
 * exponentials against the running maximum, then P.V with pv_block, which
 * keeps output vectors in registers while the value rows stream by. Work
 * per row and key is the same as attention.c's; only the reuse differs.
 */
#include "backend/cpu/cpu_internal.h"

#include <math.h>
#include <stdatomic.h>

enum {
    KEY_BLOCK = 32,
    TASK_ROWS = 32, /* query rows per task: (tokens x heads of one KV group) */
};

typedef struct tiled_job {
    cpu_backend *cb;
    float *out;
    const float *qkv;
    const kv_layer *cache;
    int64_t pos0;
    int n, tokens_per_task, tasks_per_head;
    const attn_shape *sh;
    _Atomic int64_t next; /* tasks are claimed in order: later token blocks (more keys) come last */
} tiled_job;

/* Key (or value) row of kv head kh at absolute position j (see attention.c). */
static const float *kv_row(const tiled_job *a, int64_t j, int kh, int is_value)
{
    const attn_shape *sh = a->sh;
    int64_t kv_dim = (int64_t)sh->n_head_kv * sh->head_dim, head_off = (int64_t)kh * sh->head_dim;
    if (j >= a->pos0) {
        int64_t q_dim = (int64_t)sh->n_head * sh->head_dim;
        return a->qkv + (j - a->pos0) * sh->qkv_stride + q_dim + (is_value ? kv_dim : 0) + head_off;
    }
    const float *base = is_value ? a->cache->v : a->cache->k;
    return base + (j % a->cache->slots) * kv_dim + head_off;
}

/* First key position the query at position p sees. */
static int64_t first_key(const tiled_job *a, int64_t p)
{
    int64_t lo = a->cache->window ? p - a->cache->window + 1 : 0;
    return lo > 0 ? lo : 0;
}

typedef struct row_state {
    const float *q;
    float *o;
    int64_t pos;
    float max, sum;
} row_state;

/* Softmax bookkeeping of one row for the block [j0, j0 + nk): only keys in
 * [first_key(pos), pos] count; others get weight 0. */
static void softmax_row(const tiled_job *a, row_state *r, float *s, int64_t j0, int nk)
{
    const cpu_kernels *k = &a->cb->k;
    int64_t lo = first_key(a, r->pos) - j0, hi = r->pos - j0; /* visible: [lo, hi] within the block */
    int ja = lo > 0 ? (int)lo : 0, jb = hi < nk - 1 ? (int)hi : nk - 1;
    if (ja > jb) {
        for (int j = 0; j < nk; j++) s[j] = 0;
        return;
    }
    float bmax = -INFINITY;
    for (int j = ja; j <= jb; j++) bmax = s[j] > bmax ? s[j] : bmax;
    if (bmax > r->max) {
        float rescale = expf(r->max - bmax);
        r->sum *= rescale;
        k->scale(r->o, rescale, a->sh->head_dim);
        r->max = bmax;
    }
    r->sum += k->exp_sum(s + ja, r->max, jb - ja + 1);
    for (int j = 0; j < ja; j++) s[j] = 0;
    for (int j = jb + 1; j < nk; j++) s[j] = 0;
}

static void tiled_task(const tiled_job *a, int kh, int tb)
{
    const attn_shape *sh = a->sh;
    const cpu_kernels *k = &a->cb->k;
    int D = sh->head_dim, G = sh->n_head / sh->n_head_kv;
    int t0 = tb * a->tokens_per_task, t1 = t0 + a->tokens_per_task < a->n ? t0 + a->tokens_per_task : a->n;
    int rows = (t1 - t0) * G;
    row_state st[TASK_ROWS];
    const float *q[TASK_ROWS];
    float *o[TASK_ROWS];
    for (int r = 0; r < rows; r++) {
        int t = t0 + r / G, h = kh * G + r % G;
        st[r] = (row_state){.q = a->qkv + (int64_t)t * sh->qkv_stride + (int64_t)h * D,
                            .o = a->out + ((int64_t)t * sh->n_head + h) * D,
                            .pos = a->pos0 + t, .max = -INFINITY, .sum = 0};
        q[r] = st[r].q;
        o[r] = st[r].o;
        for (int d = 0; d < D; d++) o[r][d] = 0;
    }
    float s[TASK_ROWS * KEY_BLOCK];
    const float *keys[KEY_BLOCK], *vals[KEY_BLOCK];
    int64_t lo = first_key(a, a->pos0 + t0), hi = a->pos0 + t1 - 1;
    for (int64_t j0 = lo; j0 <= hi; j0 += KEY_BLOCK) {
        int nk = hi + 1 - j0 < KEY_BLOCK ? (int)(hi + 1 - j0) : KEY_BLOCK;
        for (int j = 0; j < nk; j++) {
            keys[j] = kv_row(a, j0 + j, kh, 0);
            vals[j] = kv_row(a, j0 + j, kh, 1);
        }
        k->qk_block(s, KEY_BLOCK, q, rows, keys, nk, D, sh->scale);
        for (int r = 0; r < rows; r++) softmax_row(a, &st[r], s + r * KEY_BLOCK, j0, nk);
        k->pv_block(o, s, KEY_BLOCK, rows, vals, nk, D);
    }
    for (int r = 0; r < rows; r++) k->scale(o[r], 1.0f / st[r].sum, D);
}

static void tiled_pool_task(void *arg, int ith, int nth)
{
    tiled_job *a = arg;
    int64_t tasks = (int64_t)a->tasks_per_head * a->sh->n_head_kv;
    for (int64_t i; (i = atomic_fetch_add_explicit(&a->next, 1, memory_order_relaxed)) < tasks;)
        tiled_task(a, (int)(i % a->sh->n_head_kv), (int)(i / a->sh->n_head_kv));
}

int cpu_attention_tiled(backend *be, float *out, const float *qkv, const kv_layer *cache, int64_t pos0, int n,
                        const attn_shape *sh)
{
    int G = sh->n_head / sh->n_head_kv;
    if (G > TASK_ROWS) return 0; /* huge query groups: the per-token path handles them */
    cpu_backend *cb = cpu_of(be);
    tiled_job a = {.cb = cb, .out = out, .qkv = qkv, .cache = cache, .pos0 = pos0, .n = n, .sh = sh};
    a.tokens_per_task = TASK_ROWS / G;
    a.tasks_per_head = (n + a.tokens_per_task - 1) / a.tokens_per_task;
    pool_run(cb->pool, tiled_pool_task, &a, pool_size(cb->pool));
    return 1;
}

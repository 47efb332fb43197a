/*
 * kv_turbo.c — attention over KV caches stored as f16, bf16 or TurboQuant
 * rows, reading the stored rows directly (engine/kv_format.h), and the
 * writes into such caches.
 *
 * Work item = one kv head x a block of query tokens x the query heads of
 * that kv head (at most QUERY_ROWS (token, head) rows), optionally x one
 * slice of the keys. An item walks its keys in blocks of KEY_BLOCK: the
 * block's key and value rows are decoded once into float rows (centroids in
 * the rotated basis for TurboQuant, no per-key rotation) and reused by every
 * query row of the item, so prefill costs one decode per key per query
 * block instead of per query; scores and P.V then run on the register-tiled
 * qk_block / pv_block kernels the float32 path uses (attention_tiled.c). Queries are rotated once (q' = R q, so
 * <q', decoded k> = <q, k>); values are summed in the rotated basis and the
 * output de-rotated once. Softmax is online (running max and sum): memory
 * is O(QUERY_ROWS x head_dim) per thread whatever the context.
 *
 * The chunk's own keys (positions >= pos0) are still float32 in qkv. They
 * are encoded first, exactly as kv_store will store them, so a query sees
 * the same numbers whether a key came from this chunk or an earlier one:
 * prefill, chunked prefill and decode agree.
 *
 * Decode has one query token, hence few items: then the keys of each item
 * are split over the threads (flash-decoding) and the partial softmax
 * states (max, sum, output) are merged at the end.
 */
#include "backend/cpu/kv_turbo.h"

#include "backend/cpu/cpu_internal.h"
#include "base/error.h"
#include "engine/kv_format.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    KEY_BLOCK = 32,          /* keys decoded together: 2 x 32 rows of <= 512 floats stay in L2 */
    QUERY_ROWS = 32,         /* (token, head) query rows one item holds */
    SPLIT_MIN_KEYS = 512,    /* a key slice of a split item has at least this many keys */
    PARALLEL_WORK = 1 << 15, /* (keys x query heads x dims) below this: one thread */
    MAX_ROW_BYTES = 2 * KV_MAX_CODED_HEAD_DIM, /* f16 / bf16: the widest coded row */
};

typedef struct coded_attn {
    cpu_backend *cb;
    float *out;
    const float *qkv;
    const kv_layer *cache;
    const attn_shape *sh;
    int64_t pos0;
    int n;
    int tq;               /* TurboQuant: queries rotated, outputs de-rotated */
    int64_t rb[2];        /* bytes of a key / value row */
    kv_decode_fn decode[2];
    uint8_t *stage;       /* the chunk's rows encoded: [n][2][n_head_kv] rows; NULL: encode per block */
    int group;            /* query heads per kv head */
    int heads, tokens;    /* per item: query heads, query tokens */
    int n_hsub, n_tblocks, splits;
    int64_t n_items;
    atomic_llong next;    /* the next item to take */
    float *partial;       /* splits > 1: [item][QUERY_ROWS][2 + head_dim] max, sum, output */
} coded_attn;

/* ---- encoding rows: the cache, and the chunk's stage ------------------------------- */

static const float *qkv_kv_row(const float *qkv, const attn_shape *sh, int t, int kh, int is_value)
{
    int64_t q_dim = (int64_t)sh->n_head * sh->head_dim, kv_dim = (int64_t)sh->n_head_kv * sh->head_dim;
    return qkv + (int64_t)t * sh->qkv_stride + q_dim + (is_value ? kv_dim : 0) + (int64_t)kh * sh->head_dim;
}

static uint8_t *stage_row(const coded_attn *a, int t, int kh, int is_value)
{
    int64_t slot = (int64_t)t * 2 * a->sh->n_head_kv + (int64_t)is_value * a->sh->n_head_kv + kh;
    return a->stage + slot * MAX_ROW_BYTES;
}

typedef struct encode_job {
    const coded_attn *a;   /* staging: rows go to stage_row */
    kv_layer *cache;       /* storing: rows go to cache slots */
    const float *qkv;
    const attn_shape *sh;
    int64_t pos0;
    int first, n;
} encode_job;

static void encode_task(void *arg, int ith, int nth)
{
    const encode_job *j = arg;
    const attn_shape *sh = j->sh;
    spark_kv_type type = j->a ? j->a->cache->type : j->cache->type;
    int64_t lo, hi;
    cpu_split(j->n - j->first, 1, ith, nth, &lo, &hi);
    for (int t = j->first + (int)lo; t < j->first + (int)hi; t++)
        for (int kh = 0; kh < sh->n_head_kv; kh++)
            for (int is_value = 0; is_value < 2; is_value++) {
                const float *x = qkv_kv_row(j->qkv, sh, t, kh, is_value);
                uint8_t *dst;
                if (j->a) {
                    dst = stage_row(j->a, t, kh, is_value);
                } else {
                    int64_t rb = kv_row_bytes(type, is_value, sh->head_dim);
                    int64_t slot = (j->pos0 + t) % j->cache->slots;
                    dst = (uint8_t *)(is_value ? j->cache->v : j->cache->k) + (slot * sh->n_head_kv + kh) * rb;
                }
                kv_encode_row(type, is_value, x, sh->head_dim, dst);
            }
}

static void run_encode(cpu_backend *cb, const encode_job *j)
{
    int rows = (j->n - j->first) * j->sh->n_head_kv;
    int nth = rows >= 16 ? pool_size(cb->pool) : 1; /* an encode costs ~ a microsecond */
    pool_run(cb->pool, encode_task, (void *)j, nth);
}

void cpu_kv_coded_store(backend *be, kv_layer *cache, const float *qkv, int64_t pos0, int n, const attn_shape *sh)
{
    encode_job j = {.cache = cache, .qkv = qkv, .sh = sh, .pos0 = pos0,
                    .first = n > cache->slots ? n - (int)cache->slots : 0, /* a ring keeps only the newest */
                    .n = n};
    run_encode(cpu_of(be), &j);
}

/* ---- one work item ------------------------------------------------------------------- */

typedef struct item {
    int kh, g0, ng, t0, nt, split;
    int64_t klo, khi; /* keys [klo, khi) of this item's slice */
} item;

/* One thread's working rows, carved from the call's workspace (head_dim D). */
typedef struct thread_rows {
    float *q;        /* [QUERY_ROWS][D] prepared queries: scaled, rotated for TQ */
    float *o;        /* [QUERY_ROWS][D] running outputs (rotated basis for TQ) */
    float *k, *v;    /* [KEY_BLOCK][D] the decoded key / value block */
    uint8_t *tmp;    /* [2][KEY_BLOCK][MAX_ROW_BYTES] chunk rows encoded on the fly (no stage) */
    float max[QUERY_ROWS], sum[QUERY_ROWS];
    float ks[KEY_BLOCK], vs[KEY_BLOCK]; /* the block's row scales */
} thread_rows;

static size_t thread_bytes(int D)
{
    return (size_t)(2 * QUERY_ROWS + 2 * KEY_BLOCK) * (size_t)D * sizeof(float) + 2 * KEY_BLOCK * MAX_ROW_BYTES;
}

static void carve_thread(thread_rows *w, void *mem, int D)
{
    float *f = mem;
    w->q = f;
    w->o = f + QUERY_ROWS * D;
    w->k = f + 2 * QUERY_ROWS * D;
    w->v = f + (2 * QUERY_ROWS + KEY_BLOCK) * D;
    w->tmp = (uint8_t *)(f + (2 * QUERY_ROWS + 2 * KEY_BLOCK) * D);
}

static item item_of(const coded_attn *a, int64_t i)
{
    item it;
    it.split = (int)(i % a->splits);
    i /= a->splits;
    int tb = (int)(i % a->n_tblocks);
    i /= a->n_tblocks;
    int hs = (int)(i % a->n_hsub);
    it.kh = (int)(i / a->n_hsub);
    it.g0 = hs * a->heads;
    it.ng = a->group - it.g0 < a->heads ? a->group - it.g0 : a->heads;
    it.t0 = tb * a->tokens;
    it.nt = a->n - it.t0 < a->tokens ? a->n - it.t0 : a->tokens;
    /* keys any of the item's queries sees, then this split's share (whole blocks) */
    int64_t first = a->pos0 + it.t0, last = a->pos0 + it.t0 + it.nt - 1;
    int64_t lo = a->cache->window && first - a->cache->window + 1 > 0 ? first - a->cache->window + 1 : 0;
    int64_t per = (last + 1 - lo + a->splits - 1) / a->splits;
    per = (per + KEY_BLOCK - 1) / KEY_BLOCK * KEY_BLOCK;
    it.klo = lo + it.split * per < last + 1 ? lo + it.split * per : last + 1;
    it.khi = it.klo + per < last + 1 ? it.klo + per : last + 1;
    return it;
}

static void prepare_rows(const coded_attn *a, const item *it, thread_rows *w)
{
    const attn_shape *sh = a->sh;
    int D = sh->head_dim;
    for (int t = 0; t < it->nt; t++)
        for (int g = 0; g < it->ng; g++) {
            int r = t * it->ng + g, h = it->kh * a->group + it->g0 + g;
            const float *q = a->qkv + (int64_t)(it->t0 + t) * sh->qkv_stride + (int64_t)h * D;
            float *qr = w->q + (int64_t)r * D;
            for (int d = 0; d < D; d++) qr[d] = q[d] * sh->scale; /* the softmax scale folded into the query */
            if (a->tq) kv_rotate(qr, D);
            memset(w->o + (int64_t)r * D, 0, (size_t)D * sizeof(float));
            w->max[r] = -INFINITY;
            w->sum[r] = 0;
        }
}

/* The stored bytes of key/value row j of kv head kh (i: its index in the block). */
static const uint8_t *coded_row(const coded_attn *a, thread_rows *w, int64_t j, int i, int kh, int is_value)
{
    if (j < a->pos0) {
        const uint8_t *base = (const uint8_t *)(is_value ? a->cache->v : a->cache->k);
        return base + ((j % a->cache->slots) * a->sh->n_head_kv + kh) * a->rb[is_value];
    }
    int t = (int)(j - a->pos0);
    if (a->stage) return stage_row(a, t, kh, is_value);
    uint8_t *dst = w->tmp + ((int64_t)is_value * KEY_BLOCK + i) * MAX_ROW_BYTES;
    kv_encode_row(a->cache->type, is_value, qkv_kv_row(a->qkv, a->sh, t, kh, is_value), a->sh->head_dim, dst);
    return dst;
}

static void decode_block(const coded_attn *a, thread_rows *w, int kh, int64_t j0, int nk)
{
    const uint8_t *rows[2][KEY_BLOCK];
    for (int i = 0; i < nk; i++) {
        rows[0][i] = coded_row(a, w, j0 + i, i, kh, 0);
        rows[1][i] = coded_row(a, w, j0 + i, i, kh, 1);
    }
    int D = a->sh->head_dim;
    a->decode[0](rows[0], nk, D, w->k, D, w->ks);
    a->decode[1](rows[1], nk, D, w->v, D, w->vs);
}

/* Softmax bookkeeping of query row r (position p) for the decoded block
 * [j0, j0 + nk) whose raw scores s[] came from qk_block: apply the key rows'
 * scales, update the running max / sum, leave in s[] the weights P.V needs
 * (value scales folded in, invisible keys 0). */
static void softmax_row(const coded_attn *a, thread_rows *w, int r, float *s, int64_t p, int64_t j0, int nk)
{
    const cpu_kernels *k = &a->cb->k;
    int32_t window = a->cache->window;
    /* query p sees keys j <= p, and p - j < window on sliding layers */
    int64_t lo = (window && p - window + 1 > 0 ? p - window + 1 : 0) - j0, hi = p - j0;
    int ja = lo > 0 ? (int)lo : 0, jb = hi < nk - 1 ? (int)hi : nk - 1;
    if (ja > jb) {
        memset(s, 0, sizeof(float) * (size_t)nk);
        return;
    }
    float bmax = -INFINITY;
    for (int j = ja; j <= jb; j++) {
        s[j] *= w->ks[j];
        bmax = s[j] > bmax ? s[j] : bmax;
    }
    if (bmax > w->max[r]) { /* a new maximum: rescale what was accumulated */
        float rescale = expf(w->max[r] - bmax);
        w->sum[r] *= rescale;
        k->scale(w->o + (int64_t)r * a->sh->head_dim, rescale, a->sh->head_dim);
        w->max[r] = bmax;
    }
    w->sum[r] += k->exp_sum(s + ja, w->max[r], jb - ja + 1);
    for (int j = 0; j < nk; j++) s[j] = j < ja || j > jb ? 0.0f : s[j] * w->vs[j]; /* value scale on the weight */
}

/* Every key block of the item's slice against all its query rows: scores
 * with the register-tiled qk_block, P.V with pv_block (kernels.h). */
static void attend_keys(const coded_attn *a, const item *it, thread_rows *w)
{
    const cpu_kernels *k = &a->cb->k;
    int D = a->sh->head_dim, rows = it->nt * it->ng;
    const float *q[QUERY_ROWS], *keys[KEY_BLOCK], *vals[KEY_BLOCK];
    float *o[QUERY_ROWS], s[QUERY_ROWS * KEY_BLOCK];
    for (int r = 0; r < rows; r++) {
        q[r] = w->q + (int64_t)r * D;
        o[r] = w->o + (int64_t)r * D;
    }
    for (int j = 0; j < KEY_BLOCK; j++) {
        keys[j] = w->k + (int64_t)j * D;
        vals[j] = w->v + (int64_t)j * D;
    }
    for (int64_t j0 = it->klo; j0 < it->khi; j0 += KEY_BLOCK) {
        int nk = it->khi - j0 < KEY_BLOCK ? (int)(it->khi - j0) : KEY_BLOCK;
        decode_block(a, w, it->kh, j0, nk);
        k->qk_block(s, KEY_BLOCK, q, rows, keys, nk, D, 1.0f); /* the softmax scale is in q already */
        for (int r = 0; r < rows; r++)
            softmax_row(a, w, r, s + r * KEY_BLOCK, a->pos0 + it->t0 + r / it->ng, j0, nk);
        k->pv_block(o, s, KEY_BLOCK, rows, vals, nk, D);
    }
}

/* Normalise, de-rotate and store query row r's output o (overwritten). */
static void finish_row(const coded_attn *a, const item *it, int r, float *o, float sum)
{
    int D = a->sh->head_dim;
    a->cb->k.scale(o, sum > 0 ? 1.0f / sum : 0.0f, D);
    if (a->tq) kv_unrotate(o, D);
    int t = it->t0 + r / it->ng, h = it->kh * a->group + it->g0 + r % it->ng;
    memcpy(a->out + ((int64_t)t * a->sh->n_head + h) * D, o, (size_t)D * sizeof(float));
}

static float *partial_row(const coded_attn *a, int64_t index, int r)
{
    return a->partial + (index * QUERY_ROWS + r) * (2 + (int64_t)a->sh->head_dim);
}

static void run_item(coded_attn *a, int64_t index, thread_rows *w)
{
    item it = item_of(a, index);
    prepare_rows(a, &it, w);
    attend_keys(a, &it, w);
    int D = a->sh->head_dim;
    for (int r = 0; r < it.nt * it.ng; r++) {
        float *o = w->o + (int64_t)r * D;
        if (a->splits == 1) {
            finish_row(a, &it, r, o, w->sum[r]);
            continue;
        }
        float *p = partial_row(a, index, r);
        p[0] = w->max[r];
        p[1] = w->sum[r];
        memcpy(p + 2, o, (size_t)D * sizeof(float));
    }
}

typedef struct attn_run {
    coded_attn *a;
    uint8_t *workspace; /* thread_bytes(D) per thread */
} attn_run;

static void attention_task(void *arg, int ith, int nth)
{
    attn_run *run = arg;
    coded_attn *a = run->a;
    thread_rows w;
    carve_thread(&w, run->workspace + (size_t)ith * thread_bytes(a->sh->head_dim), a->sh->head_dim);
    /* items are taken dynamically, latest query blocks (the most keys) first */
    for (int64_t i; (i = atomic_fetch_add(&a->next, 1)) < a->n_items;) run_item(a, a->n_items - 1 - i, &w);
}

/* Combine the key slices' partial softmax states of every query row. */
static void merge_splits(coded_attn *a)
{
    int D = a->sh->head_dim;
    float o[KV_MAX_CODED_HEAD_DIM];
    for (int64_t base = 0; base < a->n_items; base += a->splits) {
        item it = item_of(a, base);
        for (int r = 0; r < it.nt * it.ng; r++) {
            float m = -INFINITY, sum = 0;
            for (int sp = 0; sp < a->splits; sp++) m = fmaxf(m, partial_row(a, base + sp, r)[0]);
            memset(o, 0, sizeof(float) * (size_t)D);
            for (int sp = 0; sp < a->splits; sp++) {
                const float *p = partial_row(a, base + sp, r);
                if (p[1] == 0) continue; /* a slice with no visible key */
                float f = expf(p[0] - m);
                sum += f * p[1];
                a->cb->k.axpy(o, f, p + 2, D);
            }
            finish_row(a, &it, r, o, sum);
        }
    }
}

/* ---- the entry point ----------------------------------------------------------------- */

/* Items (and key slices when there are fewer items than threads). */
static void plan_items(coded_attn *a, int nth)
{
    const attn_shape *sh = a->sh;
    a->group = sh->n_head / sh->n_head_kv;
    a->heads = a->group < QUERY_ROWS ? a->group : QUERY_ROWS;
    a->tokens = QUERY_ROWS / a->heads;
    a->n_hsub = (a->group + a->heads - 1) / a->heads;
    a->n_tblocks = (a->n + a->tokens - 1) / a->tokens;
    int64_t base = (int64_t)sh->n_head_kv * a->n_hsub * a->n_tblocks;
    int64_t keys = a->cache->window && a->cache->window < a->pos0 + a->n ? a->cache->window : a->pos0 + a->n;
    int64_t splits = base < nth ? (nth + base - 1) / base : 1;
    if (splits > keys / SPLIT_MIN_KEYS) splits = keys / SPLIT_MIN_KEYS;
    a->splits = splits > 1 ? (int)splits : 1;
    a->n_items = base * a->splits;
}

/* One allocation for the call: per-thread rows, then the chunk's stage, then
 * split partials. Without memory for all of it: one thread, no stage, no
 * splits (the same results, slower); without even that, nothing can run. */
static uint8_t *alloc_workspace(coded_attn *a, int *nth)
{
    size_t per_thread = thread_bytes(a->sh->head_dim);
    size_t stage = (size_t)a->n * 2 * (size_t)a->sh->n_head_kv * MAX_ROW_BYTES;
    size_t partial = a->splits > 1 ? (size_t)a->n_items * QUERY_ROWS * (2 + (size_t)a->sh->head_dim) * sizeof(float) : 0;
    uint8_t *ws = malloc((size_t)*nth * per_thread + stage + partial);
    if (ws) {
        a->stage = ws + (size_t)*nth * per_thread;
        a->partial = partial ? (float *)(ws + (size_t)*nth * per_thread + stage) : NULL;
        return ws;
    }
    *nth = 1;
    a->stage = NULL;
    a->partial = NULL;
    a->n_items /= a->splits;
    a->splits = 1;
    ws = malloc(per_thread);
    if (!ws) {
        fprintf(stderr, "spark: out of memory for %zu bytes of attention scratch\n", per_thread);
        abort();
    }
    return ws;
}

void cpu_kv_coded_attention(backend *be, float *out, const float *qkv, const kv_layer *cache, int64_t pos0, int n,
                            const attn_shape *sh)
{
    cpu_backend *cb = cpu_of(be);
    ASSERT(sh->head_dim <= KV_MAX_CODED_HEAD_DIM && sh->n_head % sh->n_head_kv == 0);
    coded_attn a = {.cb = cb, .out = out, .qkv = qkv, .cache = cache, .sh = sh, .pos0 = pos0, .n = n,
                    .tq = kv_tq_bits(cache->type, 0) > 0};
    for (int is_value = 0; is_value < 2; is_value++) {
        a.rb[is_value] = kv_row_bytes(cache->type, is_value, sh->head_dim);
        a.decode[is_value] = kv_decoder(cache->type, is_value, cb->k.isa);
    }
    int64_t keys = cache->window && cache->window < pos0 + n ? cache->window : pos0 + n;
    int nth = keys * n * sh->n_head * sh->head_dim < PARALLEL_WORK ? 1 : pool_size(cb->pool);
    plan_items(&a, nth);
    if (nth > a.n_items) nth = (int)a.n_items;
    atomic_init(&a.next, 0);
    attn_run run = {.a = &a, .workspace = alloc_workspace(&a, &nth)};
    if (a.stage) {
        encode_job j = {.a = &a, .qkv = qkv, .sh = sh, .pos0 = pos0, .first = 0, .n = n};
        run_encode(cb, &j);
    }
    pool_run(cb->pool, attention_task, &run, nth);
    if (a.splits > 1) merge_splits(&a);
    free(run.workspace);
}

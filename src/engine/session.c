/*
 * session.c — sessions: KV cache and scratch allocation, and
 * spark_session_eval(), which validates a request and feeds it to the
 * forward pass in chunks of at most n_batch tokens.
 *
 * Sliding layers get a ring of exactly `sliding_window` slots (or n_ctx if
 * smaller); full layers one slot per context position, each class in the
 * format its options name (engine/kv_format.h). Memory is reserved by the
 * backend; on the CPU large buffers are committed lazily, so a long context
 * costs only what is used (spark_session_memory_estimate says what a full
 * one will cost, so a caller can refuse up front).
 */
#include "engine/session.h"

#include "backend/cuda/cuda_backend.h"
#include "base/error.h"
#include "base/mem.h"
#include "engine/kv_format.h"
#include "engine/mutants.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { DEFAULT_BATCH = 512 };

spark_session_options spark_session_default_options(void)
{
    return (spark_session_options){.n_ctx = 0, .n_batch = DEFAULT_BATCH, .n_threads = 0};
}

static spark_status alloc_floats(spark_session *s, int64_t count, float **out)
{
    return s->be->ops->alloc(s->be, (size_t)count * sizeof(float), out);
}

/* Each layer's cache in its class's format (rows of kv_row_bytes each). */
static spark_status alloc_kv(spark_session *s, const spark_session_options *o)
{
    const spark_model_config *c = &s->model->cfg;
    s->kv = spark_calloc((size_t)c->n_layer, sizeof *s->kv, "KV cache table");
    if (!s->kv) return SPARK_ERR_NOMEM;
    for (int i = 0; i < c->n_layer; i++) {
        kv_layer *L = &s->kv[i];
        int sliding = c->layer_kind[i] == SPARK_LAYER_SLIDING;
        int32_t window = c->sliding_window + MUTANT_WINDOW_EXTRA;
        L->window = sliding ? window : 0;
        int64_t ring = (int64_t)window + s->n_rewind; /* slack beyond the window: cheap rewinds */
        L->slots = sliding && ring < s->n_ctx ? ring : s->n_ctx;
        L->type = sliding ? o->kv_sliding : o->kv_full;
        int64_t slot_k = c->n_head_kv * kv_row_bytes(L->type, 0, c->head_dim);
        int64_t slot_v = c->n_head_kv * kv_row_bytes(L->type, 1, c->head_dim);
        TRY(s->be->ops->alloc(s->be, (size_t)(L->slots * slot_k), &L->k));
        TRY(s->be->ops->alloc(s->be, (size_t)(L->slots * slot_v), &L->v));
    }
    return SPARK_OK;
}

static spark_status alloc_scratch(spark_session *s)
{
    const spark_model_config *c = &s->model->cfg;
    int64_t b = s->n_batch;
    scratch *a = &s->s;
    TRY(alloc_floats(s, b * c->n_embd, &a->x));
    TRY(alloc_floats(s, b * c->n_embd, &a->xn));
    TRY(alloc_floats(s, b * config_qkv_dim(c), &a->qkv));
    TRY(alloc_floats(s, b * c->n_head, &a->gate));
    TRY(alloc_floats(s, b * config_q_dim(c), &a->attn));
    TRY(alloc_floats(s, b * c->n_embd, &a->proj));
    TRY(alloc_floats(s, b * c->n_ff, &a->ff_a));
    TRY(alloc_floats(s, b * c->n_ff, &a->ff_b));
    TRY(alloc_floats(s, (int64_t)HEAD_ROWS * c->n_vocab, &a->logits));
    return SPARK_OK;
}

/* Token ids and a logits row for generation: host memory, committed lazily. */
static spark_status alloc_history(spark_session *s)
{
    s->tokens = spark_calloc((size_t)s->n_ctx, sizeof(int32_t), "session token history");
    s->logits = spark_calloc((size_t)s->model->cfg.n_vocab, sizeof(float), "session logits");
    return s->tokens && s->logits ? SPARK_OK : SPARK_ERR_NOMEM;
}

static void describe_model(spark_session *s)
{
    const spark_model_config *c = &s->model->cfg;
    s->rope[SPARK_LAYER_FULL] = (rope_class){.rot_dims = c->rope_dim_full, .theta = c->rope_theta_full};
    s->rope[SPARK_LAYER_SLIDING] = (rope_class){.rot_dims = c->rope_dim_sliding, .theta = c->rope_theta_sliding};
    s->shape = (attn_shape){.n_head = c->n_head,
                            .n_head_kv = c->n_head_kv,
                            .head_dim = c->head_dim,
                            .qkv_stride = config_qkv_dim(c),
                            .scale = (float)(1.0 / sqrt((double)c->head_dim))};
}

/* The options' checks shared by create and the memory estimate. */
static spark_status check_options(const spark_model *model, const spark_session_options *o)
{
    const spark_model_config *c = &model->cfg;
    if (o->n_ctx < 0 || o->n_batch < 0 || o->n_rewind < 0)
        return spark_fail(SPARK_ERR_ARG, "context %d, batch %d and rewind slack %d must not be negative", o->n_ctx,
                          o->n_batch, o->n_rewind);
    if (o->n_ctx > c->max_ctx)
        return spark_fail(SPARK_ERR_ARG, "context %d exceeds the model's maximum of %d positions", o->n_ctx,
                          c->max_ctx);
    TRY(kv_type_check(o->kv_full, c->head_dim));
    return kv_type_check(o->kv_sliding, c->head_dim);
}

spark_status spark_session_memory_estimate(const spark_model *model, const spark_session_options *options,
                                           spark_session_memory *out)
{
    memset(out, 0, sizeof *out);
    spark_clear_error();
    if (!model) return spark_fail(SPARK_ERR_ARG, "spark_session_memory_estimate: no model");
    spark_session_options o = options ? *options : spark_session_default_options();
    TRY(check_options(model, &o));
    const spark_model_config *c = &model->cfg;
    int64_t n_ctx = o.n_ctx ? o.n_ctx : c->max_ctx;
    int64_t b = o.n_batch ? o.n_batch : DEFAULT_BATCH;
    if (b > n_ctx) b = n_ctx;
    spark_model_config with_slack = *c; /* rings hold the window plus the rewind slack */
    with_slack.sliding_window += o.n_rewind;
    kv_cost k = kv_cost_of(&with_slack, n_ctx, o.kv_full, o.kv_sliding);
    /* the buffers of alloc_scratch and alloc_history, in floats */
    int64_t floats = b * (3 * (int64_t)c->n_embd + config_qkv_dim(c) + c->n_head + config_q_dim(c) + 2 * (int64_t)c->n_ff) +
                     ((int64_t)HEAD_ROWS + 1) * c->n_vocab + n_ctx;
    *out = (spark_session_memory){.n_ctx = (int32_t)n_ctx,
                                  .kv_per_token = k.per_token,
                                  .kv_sliding = k.sliding,
                                  .kv_bytes = k.per_token * (uint64_t)n_ctx + k.sliding,
                                  .scratch_bytes = (uint64_t)floats * sizeof(float)};
    return SPARK_OK;
}

/* What a CUDA session takes beyond weights, KV cache and activations: the
 * backend's scratch (decoded weight panels, the bf16 activation pair,
 * attention partials, cuBLAS), and a margin kept free. */
static uint64_t device_extra(const spark_model_config *c, int64_t n_batch)
{
    int64_t cols = c->n_ff > c->n_embd ? c->n_ff : c->n_embd;
    if (config_q_dim(c) > cols) cols = config_q_dim(c);
    uint64_t panel = 128ull << 20, pair = (uint64_t)n_batch * (uint64_t)cols * 4;
    uint64_t partials = (uint64_t)n_batch * (uint64_t)c->n_head * (uint64_t)(c->head_dim + 2) * 4;
    return panel + pair + 2 * partials + (64ull << 20);
}

spark_status session_device_fit(const spark_model *model, const spark_session_options *o, uint64_t free_bytes,
                                uint64_t total_bytes, uint64_t *need, uint64_t *margin, int64_t *fit)
{
    spark_session_memory mem;
    TRY(spark_session_memory_estimate(model, o, &mem));
    int64_t b = o->n_batch ? o->n_batch : DEFAULT_BATCH;
    uint64_t fixed = spark_model_weight_bytes(model) + mem.kv_sliding + mem.scratch_bytes + device_extra(&model->cfg, b);
    *need = fixed + mem.kv_per_token * (uint64_t)mem.n_ctx;
    *margin = (256ull << 20) + total_bytes / 100;
    uint64_t budget = free_bytes > *margin ? free_bytes - *margin : 0;
    *fit = budget > fixed ? (int64_t)((budget - fixed) / (mem.kv_per_token ? mem.kv_per_token : 1)) : 0;
    return SPARK_OK;
}

/* A CUDA session allocates its whole cache up front: refuse a context whose
 * weights + KV cache + scratch do not fit in the device's free memory, with
 * the numbers (as the CLI does for host memory), instead of a cudaMalloc
 * failure. No readable device: backend_cuda_create will say why. */
static spark_status check_device_memory(const spark_model *model, const spark_session_options *o)
{
    uint64_t free_b = 0, total_b = 0, need = 0, margin = 0;
    char name[128] = "";
    if (backend_cuda_memory(o->device, &free_b, &total_b, name, sizeof name) != SPARK_OK) {
        spark_clear_error();
        return SPARK_OK;
    }
    int64_t fit = 0;
    TRY(session_device_fit(model, o, free_b, total_b, &need, &margin, &fit));
    if (need + margin <= free_b) return SPARK_OK;
    spark_session_memory mem, tq4;
    TRY(spark_session_memory_estimate(model, o, &mem));
    spark_session_options alt = *o;
    alt.kv_full = SPARK_KV_TQ4;
    int have_tq4 = o->kv_full != SPARK_KV_TQ4 && spark_session_memory_estimate(model, &alt, &tq4) == SPARK_OK;
    spark_clear_error();
    char hint[128] = "";
    if (have_tq4) snprintf(hint, sizeof hint, "--kv-bits 4 (KV cache %.2f GB at this context) or ", tq4.kv_bytes / 1e9);
    if (fit > mem.n_ctx) fit = mem.n_ctx;
    return spark_fail(SPARK_ERR_NOMEM,
                      "CUDA device %d (%s): a context of %d positions needs %.2f GB of device memory: KV cache %.2f GB "
                      "(%s full layers: %llu bytes per position; %s sliding rings: %.3f GB) + weights %.2f GB + "
                      "scratch %.2f GB; %.2f GB is free (less a %.2f GB margin). Use %s--ctx %lld or less (the most "
                      "that fits with this format)",
                      o->device, name, mem.n_ctx, need / 1e9, mem.kv_bytes / 1e9, spark_kv_type_name(o->kv_full),
                      (unsigned long long)mem.kv_per_token, spark_kv_type_name(o->kv_sliding), mem.kv_sliding / 1e9,
                      spark_model_weight_bytes(model) / 1e9, (need - mem.kv_bytes - spark_model_weight_bytes(model)) / 1e9,
                      free_b / 1e9, margin / 1e9, hint, (long long)fit);
}

spark_status session_bench_fill(spark_session *s, int32_t depth, uint64_t seed)
{
    spark_clear_error();
    if (depth < 0 || depth > s->n_ctx)
        return spark_fail(SPARK_ERR_ARG, "bench fill: depth %d outside the context of %d", depth, s->n_ctx);
    if (!s->be->device_memory)
        return spark_fail(SPARK_ERR_UNSUPPORTED, "bench fill: only on the CUDA backend");
    const spark_model_config *c = &s->model->cfg;
    for (int i = 0; i < c->n_layer; i++)
        TRY(backend_cuda_fill_kv(s->be, &s->kv[i], depth, c->n_head_kv, c->head_dim, seed + (uint64_t)i * 0x9E37u));
    for (int32_t i = 0; i < depth; i++) s->tokens[i] = 3;
    s->pos = depth;
    return SPARK_OK;
}

spark_status spark_session_create(spark_model *model, const spark_session_options *options, spark_session **out)
{
    *out = NULL;
    spark_clear_error();
    if (!model) return spark_fail(SPARK_ERR_ARG, "spark_session_create: no model");
    spark_session_options o = options ? *options : spark_session_default_options();
    const spark_model_config *c = &model->cfg;
    TRY(check_options(model, &o));
    spark_session *s = spark_calloc(1, sizeof *s, "session");
    if (!s) return SPARK_ERR_NOMEM;
    s->model = model;
    s->n_ctx = o.n_ctx ? o.n_ctx : c->max_ctx;
    s->n_batch = o.n_batch ? o.n_batch : DEFAULT_BATCH;
    s->n_rewind = o.n_rewind;
    if (s->n_batch > s->n_ctx) s->n_batch = s->n_ctx;
    describe_model(s);
    spark_status st = SPARK_OK;
    if (o.backend == SPARK_BACKEND_CUDA) st = check_device_memory(model, &o); /* before any upload */
    if (st != SPARK_OK) {
        spark_session_free(s);
        return st;
    }
    if (o.backend == SPARK_BACKEND_CUDA) st = backend_cuda_create(model, o.device, &s->be); /* issue 6 */
    else if (o.backend == SPARK_BACKEND_CPU) st = backend_cpu_create(o.n_threads, &s->be);
    else st = spark_fail(SPARK_ERR_ARG, "unknown backend %d (0 = CPU, 1 = CUDA)", o.backend);
    if (st == SPARK_OK) st = alloc_kv(s, &o);
    if (st == SPARK_OK) st = alloc_scratch(s);
    if (st == SPARK_OK) st = alloc_history(s);
    if (st != SPARK_OK) {
        spark_session_free(s);
        return st;
    }
    *out = s;
    return SPARK_OK;
}

void spark_session_free(spark_session *s)
{
    if (!s) return;
    if (s->be) {
        hooks_release(s); /* the instruments' device buffers, while the backend lives */
        float **bufs = (float **)&s->s;
        for (size_t i = 0; i < sizeof s->s / sizeof(float *); i++) s->be->ops->release(s->be, bufs[i]);
        if (s->kv) {
            for (int i = 0; i < s->model->cfg.n_layer; i++) {
                s->be->ops->release(s->be, s->kv[i].k);
                s->be->ops->release(s->be, s->kv[i].v);
            }
        }
        s->be->ops->destroy(s->be);
    }
    hooks_free(&s->hooks);
    free(s->kv);
    free(s->tokens);
    free(s->logits);
    free(s);
}

int32_t spark_session_pos(const spark_session *s) { return (int32_t)s->pos; }
int32_t spark_session_n_ctx(const spark_session *s) { return s->n_ctx; }
void spark_session_reset(spark_session *s) { s->pos = 0; }

/* ids through the model in n_batch chunks; the last chunk ends in logits
 * (into `logits`, unless NULL) or as `end` says when that is END_KEEP or
 * END_PICK. */
static spark_status eval_chunks(spark_session *s, const int32_t *ids, int32_t n, float *logits, int all_positions,
                                chunk_end end)
{
    spark_clear_error();
    const spark_model_config *c = &s->model->cfg;
    if (n <= 0 || !ids) return spark_fail(SPARK_ERR_ARG, "spark_session_eval: no tokens given");
    if (s->pos + n > s->n_ctx)
        return spark_fail(SPARK_ERR_CONTEXT, "%d tokens at position %lld do not fit in the context of %d", n,
                          (long long)s->pos, s->n_ctx);
    for (int32_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= c->n_vocab)
            return spark_fail(SPARK_ERR_ARG, "token id %d (at index %d) is outside the vocabulary [0, %d)", ids[i], i,
                              c->n_vocab);
    for (int32_t done = 0; done < n;) {
        int chunk = n - done < s->n_batch ? n - done : s->n_batch;
        int last = done + chunk == n;
        float *out = NULL;
        if (logits && all_positions) out = logits + (size_t)done * (size_t)c->n_vocab;
        if (logits && !all_positions && last) out = logits;
        memcpy(s->tokens + s->pos, ids + done, (size_t)chunk * sizeof(int32_t));
        if (last && (end == END_KEEP || end == END_PICK)) TRY(forward_chunk_end(s, ids + done, chunk, end));
        else TRY(forward_chunk(s, ids + done, chunk, out, all_positions));
        done += chunk;
        if (s->progress && n > s->n_batch) s->progress(s->progress_user, done, n);
    }
    return SPARK_OK;
}

spark_status spark_session_eval(spark_session *s, const int32_t *ids, int32_t n, float *logits, int all_positions)
{
    return eval_chunks(s, ids, n, logits, all_positions, END_LOGITS);
}

spark_status session_eval_end(spark_session *s, const int32_t *ids, int32_t n, chunk_end end)
{
    if (end == END_PICK && !s->be->ops->pick)
        return spark_fail(SPARK_ERR_UNSUPPORTED, "the %s backend has no device pick", s->be->ops->name);
    return eval_chunks(s, ids, n, NULL, 0, end);
}

spark_status session_step_picked(spark_session *s, int32_t id)
{
    spark_clear_error();
    if (!s->be->ops->pick) return spark_fail(SPARK_ERR_UNSUPPORTED, "the %s backend has no device pick", s->be->ops->name);
    if (s->pos + 1 > s->n_ctx)
        return spark_fail(SPARK_ERR_CONTEXT, "1 token at position %lld does not fit in the context of %d",
                          (long long)s->pos, s->n_ctx);
    s->tokens[s->pos] = id; /* -1: the caller stores it once it has read the pick */
    return forward_chunk_end(s, NULL, 1, END_PICK);
}

void spark_session_set_progress(spark_session *s, spark_progress_callback cb, void *user)
{
    s->progress = cb;
    s->progress_user = user;
}

const int32_t *spark_session_tokens(const spark_session *s) { return s->tokens; }

spark_status spark_session_rewind(spark_session *s, int32_t pos)
{
    spark_clear_error();
    if (pos < 0 || pos > s->pos)
        return spark_fail(SPARK_ERR_ARG, "cannot rewind to position %d: the session holds %lld tokens", pos,
                          (long long)s->pos);
    if (pos == s->pos) return SPARK_OK;
    /* Full layers still hold every position < pos. A ring still holds the
     * window before pos when no more than its slack was written since. */
    int has_sliding = 0;
    for (int i = 0; i < s->model->cfg.n_layer; i++) has_sliding |= s->kv[i].window > 0;
    int64_t back = s->pos - pos;
    if (!has_sliding || back <= s->n_rewind) {
        s->pos = pos;
        return SPARK_OK;
    }
    s->pos = 0; /* overwritten ring slots can only be recomputed from the start */
    return spark_session_eval(s, s->tokens, pos, NULL, 0);
}

/*
 * session.h — a spark_session: one sequence's KV cache plus the scratch
 * activations the forward pass needs for a chunk of up to n_batch tokens.
 */
#ifndef SPARK_ENGINE_SESSION_H
#define SPARK_ENGINE_SESSION_H

#include "engine/backend.h"
#include "engine/hooks.h"

enum { HEAD_ROWS = 32 }; /* logits are computed this many rows at a time */

/* Every field is a backend buffer (session_free releases them as an array). */
typedef struct scratch {
    float *x;     /* (n_batch, n_embd) residual stream, fp32 */
    float *xn;    /* (n_batch, n_embd) normalised input of a matrix product */
    float *qkv;   /* (n_batch, qkv_dim) */
    float *gate;  /* (n_batch, n_head) gate logits */
    float *attn;  /* (n_batch, n_head * head_dim) */
    float *proj;  /* (n_batch, n_embd) output of out_proj / down_proj */
    float *ff_a;  /* (n_batch, n_ff) gate_proj, then gelu(gate)*up */
    float *ff_b;  /* (n_batch, n_ff) up_proj */
    float *logits;/* (HEAD_ROWS, n_vocab) */
} scratch;

struct spark_session {
    spark_model *model;
    backend *be;
    int32_t n_ctx, n_batch;
    int32_t n_rewind;     /* extra ring slots for cheap rewinds (spark_session_options) */
    int64_t pos;          /* tokens in the cache */
    int32_t *tokens;      /* (n_ctx) the ids at positions 0..pos-1, for rewind */
    float *logits;        /* (n_vocab) scratch for spark_generate */
    hooks hooks;          /* instruments, all off by default */
    spark_progress_callback progress;
    void *progress_user;
    kv_layer *kv;         /* (n_layer) */
    scratch s;
    rope_class rope[SPARK_LAYER_KIND_COUNT];
    attn_shape shape;
};

/* The rope (rotated dims, theta) of layer `layer`: its class's own. */
const rope_class *rope_for_layer(const spark_session *s, int layer);

/* Run n (<= n_batch) tokens at the session's position through the model.
 * logits: NULL (no head), or [n_vocab] for the last token, or [n, n_vocab]
 * with all_positions. Advances pos. */
spark_status forward_chunk(spark_session *s, const int32_t *ids, int n, float *logits, int all_positions);

/* How a chunk ends for engine/generate.c: no head, the last row's logits
 * into host memory, left in the backend (s->s.logits: for its candidates
 * op), or left there with their greedy pick queued (backends with pick). */
typedef enum { END_NONE, END_LOGITS, END_KEEP, END_PICK } chunk_end;

/* The same, ending as `end` says (END_KEEP / END_PICK: the last row).
 * ids == NULL (n == 1): the token is the backend's last pick, the id of
 * which the caller stores in tokens[] once it has read it. */
spark_status forward_chunk_end(spark_session *s, const int32_t *ids, int n, chunk_end end);

/* spark_session_eval's checks and chunks, the last chunk ending as `end`
 * says (END_KEEP or END_PICK: engine/generate.c). */
spark_status session_eval_end(spark_session *s, const int32_t *ids, int32_t n, chunk_end end);

/* One token whose id is the backend's last pick, ending in a pick of its
 * own; id: that pick's id when the caller has read it, else -1. */
spark_status session_step_picked(spark_session *s, int32_t id);

/* The sampler only takes the largest logit (temperature 0, no bias, no
 * penalties): a pick decides exactly what it would (engine/sampler.c). */
int spark_sampler_plain_greedy(const spark_sampler *s);

/* Sampling from a backend's candidates (backend.h's candidates op): whether
 * the sampler takes them (temperature > 0, no bias, no penalties), and the
 * inv_t and log(min_p) (-inf: off) the op needs. */
int sampler_prefilter(const spark_sampler *s, float *inv_t, float *log_min_p);

/* The token from candidates x / ids[0..n) (id order; every candidate when
 * complete, else those above a threshold, total_all then the weight of
 * all): the token spark_sampler_sample would draw from the full logits, or
 * SAMPLER_MORE when these do not decide it (nothing drawn: sample from the
 * full logits instead). */
enum { SAMPLER_MORE = -2 };
int32_t sampler_sample_candidates(spark_sampler *s, const float *x, const int32_t *ids, int32_t n, int complete,
                                  double total_all);

/* The device-memory accounting of a CUDA session with options o on a device
 * with free_bytes / total_bytes: bytes it needs with its context full
 * (weights, KV cache, scratch, backend scratch), the margin kept free, and
 * the largest context that fits (not capped at the model's maximum). */
spark_status session_device_fit(const spark_model *model, const spark_session_options *o, uint64_t free_bytes,
                                uint64_t total_bytes, uint64_t *need, uint64_t *margin, int64_t *fit);

/* Benchmarks only (bench/cuda_bench.c; not in spark.h): place the session at
 * position `depth` with every layer's cache rows [0, depth) filled with
 * seeded pseudo-random rows in the cache's format (CUDA backend only), so a
 * decode step can be timed at a depth without prefilling it. */
spark_status session_bench_fill(spark_session *s, int32_t depth, uint64_t seed);

#endif

/*
 * backend.h — the small set of operations the forward pass needs from a
 * compute backend (CPU now, CUDA later).
 *
 * Activation buffers are opaque float pointers owned by the backend (host
 * memory on the CPU, device memory on a GPU): engine/ never dereferences
 * them, it only passes them between ops and copies results out with
 * `download`. Every op works on `n` tokens at once (row-major [n, width]),
 * so batched prefill and single-token decode are the same calls.
 */
#ifndef SPARK_ENGINE_BACKEND_H
#define SPARK_ENGINE_BACKEND_H

#include "model/model.h"

#include <stddef.h>
#include <stdint.h>

/* One layer's KV cache. Full layers: slot = position. Sliding layers: a ring
 * of `slots` = window entries, slot = position % slots. Keys are stored
 * after rope. With type SPARK_KV_F32 a slot is [n_head_kv * head_dim]
 * float32; with any other type k and v are byte buffers whose slots hold
 * n_head_kv rows of kv_row_bytes(type, is_value, head_dim) bytes each
 * (engine/kv_format.h), and attention must read keys before pos0 in that
 * format and the chunk's own keys as that format would store them. */
typedef struct kv_layer {
    float *k;        /* (slots, n_head_kv * head_dim) float32, or encoded rows */
    float *v;        /* (slots, n_head_kv * head_dim) float32, or encoded rows */
    int64_t slots;
    int32_t window;  /* 0: full causal attention; else the sliding window */
    spark_kv_type type;
} kv_layer;

typedef struct attn_shape {
    int32_t n_head, n_head_kv, head_dim;
    int64_t qkv_stride; /* floats between consecutive tokens' rows in the qkv buffer */
    float scale;        /* head_dim^-0.5 */
} attn_shape;

typedef struct rope_class {
    int32_t rot_dims;   /* rotated leading dims of each head */
    double theta;
} rope_class;

/* Device-side FFN statistics of one layer (backend buffers, see ffn_observe). */
typedef struct ffn_observe_bufs {
    double *mass;         /* [n_ff] summed |a| per neuron */
    uint64_t *histogram;  /* [SPARK_FFN_BUCKETS] */
    double *overlap_sum;  /* [1] sum over token pairs of |top(t) & top(t-1)| / top_k */
    uint8_t *prev_top;    /* [n_ff] 1 where a neuron was in the previous token's top_k */
    int32_t *has_prev;    /* [1] a previous token exists */
    uint8_t *scratch;     /* [n][n_ff] each row's top_k set */
} ffn_observe_bufs;

typedef struct backend backend;

typedef struct backend_ops {
    const char *name;
    spark_status (*alloc)(backend *be, size_t bytes, float **out); /* zeroed */
    void (*release)(backend *be, float *buf);
    void (*download)(backend *be, float *host_dst, const float *buf, size_t count);
    void (*destroy)(backend *be);

    /* out[t] = table row ids[t] (as float32); ids == NULL (n == 1, backends
     * with pick): the row of the last pick's id */
    void (*embed)(backend *be, float *out, const weight_ref *table, const int32_t *ids, int n);
    /* out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w */
    void (*rmsnorm)(backend *be, float *out, const float *x, const float *w, int n, int dim, float eps);
    /* out[t, r] = sum_c x[t, c] * W[r, c]   (x: [n, W.cols], out: [n, W.rows]) */
    void (*matmul)(backend *be, float *out, const float *x, const weight_ref *w, int n);
    /* NeoX rope on the first rot_dims of each of n_heads heads of every token
     * row (row t at x + t*stride, position pos0 + t). */
    void (*rope)(backend *be, float *x, int n, int64_t stride, int n_heads, int head_dim, int64_t pos0,
                 const rope_class *rc);
    /* Attention for n query tokens at positions pos0.. whose q|k|v rows are in
     * `qkv`; keys before pos0 come from `cache`, keys at pos0.. from qkv.
     * out: [n, n_head * head_dim]. */
    void (*attention)(backend *be, float *out, const float *qkv, const kv_layer *cache, int64_t pos0, int n,
                      const attn_shape *shape);
    /* Write the k|v rows of the n tokens into the cache (rings keep the last slots). */
    void (*kv_store)(backend *be, kv_layer *cache, const float *qkv, int64_t pos0, int n, const attn_shape *shape);
    /* o[t, h, :] *= sigmoid(g[t, h]) */
    void (*gate_heads)(backend *be, float *o, const float *g, int n, int n_head, int head_dim);
    /* a[i] = gelu_erf(a[i]) * b[i] */
    void (*gelu_mul)(backend *be, float *a, const float *b, int64_t count);
    /* y[i] += x[i] */
    void (*add)(backend *be, float *y, const float *x, int64_t count);

    /* ---- the instruments (engine/hooks.c), on backends whose buffers are
     * device memory. Optional: NULL on the CPU backend, where hooks.c works
     * on the host buffers directly. Every buffer argument is a backend
     * buffer (from alloc); none of these synchronizes. */
    /* buf[0..count) = host[0..count) */
    void (*upload)(backend *be, float *buf, const float *host, size_t count);
    /* dst[0..count) = src[0..count), both backend buffers */
    void (*copy)(backend *be, float *dst, const float *src, size_t count);
    /* One steering vector on each of the n rows of x ([n, dim]); mode is a
     * spark_steer_mode, direction and unit ([dim]) the vector and d/|d|;
     * the arithmetic is hooks.c's steer_row (projections in double). */
    void (*steer)(backend *be, float *x, int n, int dim, int mode, float strength, const float *direction,
                  const float *unit);
    /* FFN statistics of one layer on act ([n, n_ff] = gelu(gate x) * up x),
     * rows in token order, as hooks_ffn_activation computes them. */
    void (*ffn_observe)(backend *be, const float *act, int n, int n_ff, int top_k, const ffn_observe_bufs *b);
    /* Device timestamp at the end of everything issued so far: the device
     * time since the previous stamp is added to sums[phase] (phase < 0: only
     * the stamp is taken). device_times copies the sums (seconds) into
     * out[0..count) and zeroes them; it synchronizes. */
    void (*stamp)(backend *be, int phase);
    void (*device_times)(backend *be, double *out, int count);

    /* ---- greedy decoding with the logits kept where they are (optional:
     * NULL where a backend has none; engine/generate.c then downloads the
     * logits and samples on the host). pick: the first index of the largest
     * of logits[0..count) that is > -inf (NaN never wins; none: -1), the
     * host sampler's greedy rule, becomes the id that the next
     * embed(ids = NULL, n = 1) reads and joins a queue of picks (at most
     * two); pick_read takes the oldest pick's id off the queue (waiting for
     * it); pick_drop empties the queue. pick_ahead: 1 when a step issued
     * before the host reads the pick it consumes overlaps the host's work
     * (asynchronous device backends), 0 when ops run as they are called. */
    void (*pick)(backend *be, const float *logits, int count);
    int32_t (*pick_read)(backend *be);
    void (*pick_drop)(backend *be);
    int pick_ahead;

    /* Sampling candidates (optional; engine/generate.c then copies the
     * logits to the host). Of x[i] = logits[i] * inv_t (i < count; logits a
     * backend buffer) the ones > -inf and >= max x + log_min_p, in id order
     * into x_out / id_out (host memory): all of them when at most `cap`
     * (*complete = 1), else those in the buckets nearest the max that hold
     * at most cap together (*complete = 0; bucket: CAND_BUCKET below).
     * Returns their count, 0 when not even the nearest bucket fits.
     * *total = the sum of exp(x - max x) (double) over every candidate. */
    int32_t (*candidates)(backend *be, const float *logits, int count, float inv_t, float log_min_p, int32_t cap,
                          float *x_out, int32_t *id_out, int *complete, double *total);
} backend_ops;

/* A candidate's bucket for backend_ops.candidates: quarter-nats below the
 * largest x, the last bucket holding everything further. A macro, so the
 * CUDA kernels use these very float operations too. */
enum { CAND_BUCKETS = 128 };
#define CAND_BUCKET(x_max, x)                                                                                         \
    (((x_max) - (x)) * 4.0f < (float)(CAND_BUCKETS - 1) ? (int)(((x_max) - (x)) * 4.0f) : CAND_BUCKETS - 1)


struct backend {
    const backend_ops *ops;
    int n_threads;
    int device_memory; /* buffers are not host memory: the instruments need the ops above */
    int timing;        /* phase timing is on: measure device_wait */
    double device_wait; /* seconds the host blocked on the device (download), while timing */
};

/* The host sampler's greedy rule (engine/sampler.c), which every pick
 * follows: the first index of the largest value > -inf, or -1. */
int32_t greedy_pick(const float *x, int32_t count);

/* The CPU backend (backend/cpu). n_threads <= 0: all cores. */
spark_status backend_cpu_create(int n_threads, backend **out);

#endif

/*
 * spark.h — the public C API of spark.c, an inference runtime for iFlytek's
 * Spark-X2.5 (`spark2_5`) language models.
 *
 * Ownership: every object you get from a `*_load` / `*_create` call is yours
 * and is released with the matching `*_free`. Buffers you pass in stay yours.
 * Pointers the library hands back (strings, config) live as long as the
 * object they came from.
 *
 * Errors: every fallible call returns a `spark_status`. On anything but
 * SPARK_OK, `spark_last_error()` holds one line naming the file, tensor or
 * field and what was expected. The message is per thread.
 *
 * Threads: a `spark_model` is read-only after loading and may be shared by
 * any number of threads. A `spark_session` (KV cache + scratch) must be used
 * by one thread at a time; give each thread its own session.
 */
#ifndef SPARK_H
#define SPARK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum spark_status {
    SPARK_OK = 0,
    SPARK_ERR_IO,          /* a file could not be opened, read or mapped */
    SPARK_ERR_FORMAT,      /* a file is malformed: bad magic, truncated, bad offsets */
    SPARK_ERR_UNSUPPORTED, /* valid input this runtime cannot honour (dtype, config) */
    SPARK_ERR_MISSING,     /* a required tensor or key is absent */
    SPARK_ERR_SHAPE,       /* a tensor has the wrong shape */
    SPARK_ERR_ARG,         /* a caller passed a bad argument (id out of range, ...) */
    SPARK_ERR_CONTEXT,     /* the request does not fit in the session's context */
    SPARK_ERR_NOMEM,       /* an allocation failed */
    SPARK_ERR_INTERNAL,    /* a bug: please report it */
    SPARK_STATUS_COUNT
} spark_status;

/* A short constant name for a status, e.g. "SPARK_ERR_SHAPE". */
const char *spark_status_str(spark_status status);

/* The last error message of the calling thread ("" if none). */
const char *spark_last_error(void);

/* ---- models --------------------------------------------------------- */

typedef struct spark_model spark_model;

/* Load a checkpoint: a Hugging Face directory (config.json + safetensors,
 * sharded or not) or a GGUF file. Weights are memory-mapped, not copied.
 * On failure *out is NULL. */
spark_status spark_model_load(const char *path, spark_model **out);
void spark_model_free(spark_model *model);

typedef enum spark_layer_kind {
    SPARK_LAYER_FULL = 0,    /* causal attention over the whole context */
    SPARK_LAYER_SLIDING = 1, /* attention over the last `sliding_window` positions */
    SPARK_LAYER_KIND_COUNT
} spark_layer_kind;

/* Hyper-parameters as read from the checkpoint. */
typedef struct spark_model_config {
    int32_t n_embd;        /* hidden_size */
    int32_t n_ff;          /* intermediate_size */
    int32_t n_layer;
    int32_t n_head;        /* query heads */
    int32_t n_head_kv;     /* key/value heads (GQA) */
    int32_t head_dim;      /* NOT n_embd / n_head in general */
    int32_t n_vocab;
    int32_t max_ctx;       /* max_position_embeddings */
    int32_t sliding_window;
    float rms_eps;
    float rope_theta_full, rope_theta_sliding;
    int32_t rope_dim_full, rope_dim_sliding; /* rotated dims per head */
    int32_t bos_id, eos_id, pad_id;
    const uint8_t *layer_kind; /* n_layer entries of spark_layer_kind */
} spark_model_config;

const spark_model_config *spark_model_get_config(const spark_model *model);

/* Bytes of weights the forward pass reads per token (all matrices + norms). */
uint64_t spark_model_weight_bytes(const spark_model *model);

/* ---- sessions: a KV cache and the scratch to run the model ----------- */

typedef struct spark_session spark_session;

typedef struct spark_session_options {
    int32_t n_ctx;     /* context length; 0 = the checkpoint's max_ctx */
    int32_t n_batch;   /* max tokens per forward chunk; 0 = 512 */
    int32_t n_threads; /* 0 = all cores */
} spark_session_options;

spark_session_options spark_session_default_options(void);

spark_status spark_session_create(spark_model *model, const spark_session_options *options,
                                  spark_session **out);
void spark_session_free(spark_session *session);

/* Number of positions already in the KV cache. */
int32_t spark_session_pos(const spark_session *session);
int32_t spark_session_n_ctx(const spark_session *session);

/* Forget the whole KV cache (position back to 0). */
void spark_session_reset(spark_session *session);

/* Run `n` tokens starting at the current position, appending them to the KV
 * cache. Logits are raw (pre-softmax) float32:
 *   logits == NULL      : no head is computed (pure prefill);
 *   all_positions == 0  : logits[n_vocab] for the last token;
 *   all_positions != 0  : logits[n * n_vocab], one row per token.
 * Fails with SPARK_ERR_CONTEXT (and changes nothing) when pos + n > n_ctx,
 * and SPARK_ERR_ARG for ids outside the vocabulary. */
spark_status spark_session_eval(spark_session *session, const int32_t *ids, int32_t n,
                                float *logits, int all_positions);

/* ---- tokenizer (src/tokenizer/) ------------------------------------- */

#ifdef __cplusplus
}
#endif
#endif /* SPARK_H */

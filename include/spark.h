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
 * sharded or not) or a GGUF file. The weight files are read into memory or
 * memory-mapped as SPARK_LOAD_AUTO decides (see spark_model_load_ex).
 * On failure *out is NULL. */
spark_status spark_model_load(const char *path, spark_model **out);
void spark_model_free(spark_model *model);

/* How a model's weight files are held in memory. */
typedef enum spark_load_mode {
    SPARK_LOAD_AUTO = 0, /* COPY when the files fit comfortably in the memory available (MemAvailable, a
                            cgroup limit if lower: files + max(2 GB, a quarter of it) must fit), else MMAP */
    SPARK_LOAD_MMAP,     /* memory-map the files: nothing copied, pages shared with the page cache */
    SPARK_LOAD_COPY,     /* read the files into anonymous memory, 2 MiB-aligned, with transparent huge
                            pages asked for (MADV_HUGEPAGE): faster CPU decode (streams ~15% faster
                            here), costs the RAM and the time to read the files */
    SPARK_LOAD_MODE_COUNT
} spark_load_mode;

typedef struct spark_model_load_options {
    spark_load_mode mode;
    /* COPY: called as the files are read (bytes so far, total bytes of all files); may be NULL */
    void (*progress)(uint64_t done, uint64_t total, void *user);
    void *progress_user;
} spark_model_load_options;

spark_model_load_options spark_model_default_load_options(void); /* AUTO, no progress */

/* spark_model_load with options (NULL = defaults). spark_model_load(path) is
 * this with the defaults, so it copies when AUTO says so: a program that only
 * runs the model on a GPU should pass SPARK_LOAD_MMAP. */
spark_status spark_model_load_ex(const char *path, const spark_model_load_options *opts, spark_model **out);

/* What the loader did. */
typedef struct spark_model_load_info {
    spark_load_mode mode;  /* SPARK_LOAD_MMAP or SPARK_LOAD_COPY */
    int huge_pages;        /* COPY: transparent huge pages were asked for and are enabled */
    uint64_t file_bytes;   /* bytes of the weight files */
    double seconds;        /* time spent opening (and, for COPY, reading) them */
    char why[192];         /* one line: why this mode (AUTO's reasoning, or "forced") */
} spark_model_load_info;

const spark_model_load_info *spark_model_get_load_info(const spark_model *model);

/* "auto", "mmap", "copy" ("invalid" otherwise). */
const char *spark_load_mode_name(spark_load_mode mode);

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

/* How a KV cache stores its rows (SPEC §2 sizes, §7 TurboQuant). The float
 * formats round each value; TurboQuant stores per row (one kv head's
 * head_dim values) a scale and one Lloyd-Max codebook index per coordinate
 * of the row after a fixed random-sign Hadamard rotation (head_dim must be
 * a power of two), and attention reads the packed rows directly. */
typedef enum spark_kv_type {
    SPARK_KV_F32 = 0, /* exact (the default) */
    SPARK_KV_F16,     /* IEEE half precision */
    SPARK_KV_BF16,    /* bfloat16 */
    SPARK_KV_TQ2,     /* TurboQuant: 2-bit keys and values */
    SPARK_KV_TQ3,     /* TurboQuant: 3-bit keys and values */
    SPARK_KV_TQ3_5,   /* TurboQuant: 3-bit keys, 4-bit values */
    SPARK_KV_TQ4,     /* TurboQuant: 4-bit keys and values */
    SPARK_KV_TYPE_COUNT
} spark_kv_type;

/* "f32", "f16", "bf16", "tq2", "tq3", "tq3.5", "tq4" ("invalid" otherwise). */
const char *spark_kv_type_name(spark_kv_type type);

/* Stored bits per cached value for heads of head_dim values, the
 * TurboQuant row scale included (tq4 at head_dim 256: 4.125). */
double spark_kv_type_bits(spark_kv_type type, int32_t head_dim);

typedef struct spark_session_options {
    int32_t n_ctx;     /* context length; 0 = the checkpoint's max_ctx */
    int32_t n_batch;   /* max tokens per forward chunk; 0 = 512 */
    int32_t n_threads; /* 0 = all cores */
    int32_t backend;   /* spark_backend_kind: where the model runs */
    int32_t device;    /* SPARK_BACKEND_CUDA: the CUDA device index */
    spark_kv_type kv_full;    /* format of the full layers' caches (default F32) */
    spark_kv_type kv_sliding; /* format of the sliding layers' rings (default F32) */
    int32_t n_rewind;  /* sliding rings keep this many positions beyond the window, so a
                          spark_session_rewind by up to n_rewind tokens is exact and free;
                          0 (default): rings of exactly sliding_window slots */
} spark_session_options;

/* Where a session computes. SPARK_BACKEND_CUDA copies every weight to the
 * GPU once at session creation; it fails with SPARK_ERR_UNSUPPORTED when the
 * build has no CUDA or no device is present (see spark_cuda_available). */
typedef enum spark_backend_kind {
    SPARK_BACKEND_CPU = 0,
    SPARK_BACKEND_CUDA = 1,
    SPARK_BACKEND_COUNT
} spark_backend_kind;

/* 1 when this build has the CUDA backend and a CUDA device is usable. */
int spark_cuda_available(void);

spark_session_options spark_session_default_options(void);

/* What a session with given options will hold in memory. */
typedef struct spark_session_memory {
    int32_t n_ctx;            /* the context the numbers are for */
    uint64_t kv_per_token;    /* KV bytes each position adds (all full layers) */
    uint64_t kv_sliding;      /* KV bytes of the sliding layers' rings (fixed) */
    uint64_t kv_bytes;        /* kv_per_token * n_ctx + kv_sliding */
    uint64_t scratch_bytes;   /* activations, logits and token history */
} spark_session_memory;

/* Fill *out for `options` without creating anything. Fails exactly as
 * spark_session_create would on the options (bad context, a KV format this
 * model cannot use). The KV cache is committed lazily as positions fill, so
 * kv_bytes is what a session needs once its context is full. */
spark_status spark_session_memory_estimate(const spark_model *model, const spark_session_options *options,
                                           spark_session_memory *out);

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

/* Progress of long evaluations: called after each chunk of n_batch tokens
 * with the tokens done so far and the total of the current call (only when
 * the call spans more than one chunk). NULL turns it off. */
typedef void (*spark_progress_callback)(void *user, int32_t done, int32_t total);
void spark_session_set_progress(spark_session *session, spark_progress_callback cb, void *user);

/* Go back to position `pos` (<= the current one), as if only the first pos
 * tokens had been evaluated. A rewind by at most the session's n_rewind
 * tokens (or any rewind of a model without sliding layers) costs nothing.
 * Past that, the sliding rings no longer hold the window before pos (those
 * keys depend on the whole history), so the session re-evaluates its first
 * pos tokens, which it remembers: correct, at the price of a prefill. */
spark_status spark_session_rewind(spark_session *session, int32_t pos);

/* The token ids in the cache, in order (spark_session_pos() of them). */
const int32_t *spark_session_tokens(const spark_session *session);

/* ---- sampling (src/engine/sampler.c) ---------------------------------- */

/* How the next token is chosen from raw logits. The order of operations is
 * Hugging Face's: logit bias, penalties (over the last penalty_last_n
 * accepted tokens), temperature, then top-k, top-p and min-p on the
 * tempered distribution. temperature == 0 is greedy (argmax after bias and
 * penalties). Sampling is reproducible for a seed on every machine: the
 * random generator is our own (xoshiro256**) and probabilities are summed in
 * double in a fixed order. */
typedef struct spark_logit_bias {
    int32_t id;
    float bias; /* added to the logit; -INFINITY bans the token */
} spark_logit_bias;

typedef struct spark_sampler_params {
    float temperature;       /* 0 = greedy; default 1.0 */
    int32_t top_k;           /* 0 = off */
    float top_p;             /* 1 = off */
    float min_p;             /* 0 = off: keep p >= min_p * p_max */
    float repeat_penalty;    /* 1 = off: logit / rp if > 0, logit * rp if < 0 (CTRL / llama.cpp) */
    float presence_penalty;  /* 0 = off: minus this once a token appeared (OpenAI) */
    float frequency_penalty; /* 0 = off: minus this times the count (OpenAI) */
    int32_t penalty_last_n;  /* window of accepted tokens the penalties look at; -1 = all */
    uint64_t seed;
    const spark_logit_bias *logit_bias; /* copied at create */
    int32_t n_logit_bias;
} spark_sampler_params;

typedef struct spark_sampler spark_sampler;

/* temperature 1, top_p 1, everything else off, seed 0, penalty_last_n 64. */
spark_sampler_params spark_sampler_default_params(void);

/* SPARK_ERR_ARG for negative / NaN values, top_p outside (0, 1], min_p
 * outside [0, 1], a penalty <= 0 for repeat_penalty, bias ids < 0. */
spark_status spark_sampler_create(const spark_sampler_params *params, int32_t n_vocab, spark_sampler **out);
void spark_sampler_free(spark_sampler *s);

/* The checkpoint's recommended settings (generation_config.json, or GGUF
 * general.sampling.*) over spark_sampler_default_params(). */
spark_sampler_params spark_model_sampler_defaults(const spark_model *model);

/* Choose a token from logits[n_vocab] (not modified). Returns the id, or -1
 * if every token is banned. Does not record the token: call accept. */
int32_t spark_sampler_sample(spark_sampler *s, const float *logits);

/* Record a token (prompt or generated) in the penalty history. */
void spark_sampler_accept(spark_sampler *s, int32_t id);

/* Forget the history; re-seed. */
void spark_sampler_reset(spark_sampler *s, uint64_t seed);

/* ---- instruments (src/engine/hooks.c) ----------------------------------
 * The seed runtime's four per-layer hooks. Each is off by default and costs
 * nothing then (one pointer test per layer). */

/* Steering: a direction d applied to the residual stream h of one layer,
 * after that layer's FFN residual add, with u = d/|d| and strength a:
 *   ADD     h += a*d
 *   ABLATE  h -= a*(h.u)u
 *   CLAMP   h += (a - h.u)u          (the component along u becomes a)
 *   RENORM  h' = h - (h.u)u; h = h' * |h|/|h'|   (a unused)               */
typedef enum spark_steer_mode {
    SPARK_STEER_ADD = 0,
    SPARK_STEER_ABLATE,
    SPARK_STEER_CLAMP,
    SPARK_STEER_RENORM,
    SPARK_STEER_MODE_COUNT
} spark_steer_mode;

/* Add one steering vector (n_embd floats, copied) at `layer`. Several may
 * be added, also at one layer; they apply in the order added. */
spark_status spark_session_add_steering(spark_session *session, int32_t layer, const float *direction,
                                        spark_steer_mode mode, float strength);
void spark_session_clear_steering(spark_session *session);

/* Read steering directions: a llama.cpp control-vector GGUF (tensors
 * `direction.N`, N = the 0-based layer after which it applies, as llama.cpp
 * reads them) or a .npy float32/float64 array [n_layer, n_embd].
 * *directions (n_layer * n_embd, malloc'd) and *present (n_layer flags,
 * malloc'd) are the caller's to free. */
spark_status spark_steering_load(const char *path, int32_t n_layer, int32_t n_embd, float **directions,
                                 uint8_t **present);

/* Residual capture: after each layer in [first_layer, last_layer] (after
 * steering), the residual at either every position or one absolute
 * position is copied out. Starting again clears what was captured. */
spark_status spark_session_capture_start(spark_session *session, int32_t first_layer, int32_t last_layer,
                                         int all_positions, int32_t position);
void spark_session_capture_stop(spark_session *session);
/* Captured rows: [n_positions][n_layers][n_embd] float32, positions in order. */
int32_t spark_session_capture_count(const spark_session *session);
const float *spark_session_capture_data(const spark_session *session);
const int32_t *spark_session_capture_positions(const spark_session *session);

/* FFN activation statistics over every token evaluated while on: per layer
 * and neuron the summed magnitude |gelu(gate x) * up x|; per layer a
 * 64-bucket histogram of log2 magnitudes (bucket b counts magnitudes in
 * [2^(b-48), 2^(b-47)); b = 0 also takes smaller ones and exact zeros, 63
 * larger ones); and the overlap of each token's top_k neurons (by
 * magnitude) with the previous token's. Outputs are unchanged. */
enum { SPARK_FFN_BUCKETS = 64, SPARK_FFN_BUCKET_MIN_EXP = -48 };
typedef struct spark_ffn_stats {
    int32_t n_layer, n_ff, top_k;
    int64_t n_tokens;             /* tokens accumulated */
    const double *mass;           /* [n_layer][n_ff] */
    const uint64_t *histogram;    /* [n_layer][SPARK_FFN_BUCKETS] */
    const double *overlap_sum;    /* [n_layer]: sum over token pairs of |topk(t) & topk(t-1)| / top_k */
    int64_t n_pairs;              /* consecutive token pairs counted */
} spark_ffn_stats;
spark_status spark_session_ffn_stats_start(spark_session *session, int32_t top_k);
const spark_ffn_stats *spark_session_ffn_stats(const spark_session *session); /* NULL when off */
void spark_session_ffn_stats_stop(spark_session *session);

/* Phase timing: wall time of each part of the forward pass. On a GPU
 * session the host fields are the time the host spends issuing each phase
 * (the work runs asynchronously); device_wait is the time the host blocks
 * waiting for the device (copies back), and the device_* fields are the
 * device's own time per phase, from timestamps taken on the device between
 * the phases (device_embed stays 0: the gather is folded into attention). */
typedef struct spark_phase_times {
    double embed, attention, ffn, head; /* seconds, summed */
    double hooks;                       /* steering / capture / statistics */
    int64_t tokens, calls;
    double sampling;                    /* spark_generate's sampler (per generated token) */
    int device;                         /* the device fields below are filled (GPU session) */
    double device_wait;                 /* host blocked on the device */
    double device_embed, device_attention, device_ffn, device_hooks, device_head;
} spark_phase_times;
void spark_session_timing(spark_session *session, int on); /* on also resets the sums */
spark_phase_times spark_session_phase_times(const spark_session *session);

/* ---- tokenizer (src/tokenizer/) ------------------------------------- */

/* Byte-level BPE (SPEC §5), independent of any model: load it from an HF
 * checkpoint directory (tokenizer.json + optional tokenizer_config.json), a
 * tokenizer.json file, or a .gguf file (tokenizer.ggml.* metadata).
 * A loaded tokenizer is read-only and may be shared by threads: encode is
 * thread-safe (concurrent calls fall back to a private scratch area). */
typedef struct spark_tokenizer spark_tokenizer;

/* A growable id array owned by the caller. Zero-initialise it; calls that
 * produce ids APPEND to it; release with spark_token_buf_free. */
typedef struct spark_token_buf {
    int32_t *ids;
    size_t n, cap;
} spark_token_buf;

void spark_token_buf_free(spark_token_buf *buf);

/* Load a tokenizer. A merge whose parts are not tokens (the published Spark
 * file has one) is skipped, not an error. On failure *out is NULL and the
 * error names the file and the field. */
spark_status spark_tokenizer_load(const char *path, spark_tokenizer **out);
void spark_tokenizer_free(spark_tokenizer *tok);

/* Highest id + 1 (131072 for Spark). */
int32_t spark_tokenizer_n_vocab(const spark_tokenizer *tok);

typedef struct spark_tokenizer_specials {
    int32_t bos_id, eos_id, pad_id, unk_id; /* -1 when the tokenizer has none */
    int add_bos;                            /* the checkpoint asks for a BOS (Spark: no) */
} spark_tokenizer_specials;

spark_tokenizer_specials spark_tokenizer_get_specials(const spark_tokenizer *tok);

/* Number of merges skipped at load because they can never fire. */
int32_t spark_tokenizer_n_dead_merges(const spark_tokenizer *tok);

/* Id of the token whose stored string is exactly s[0..len), or -1. */
int32_t spark_tokenizer_token_id(const spark_tokenizer *tok, const char *s, size_t len);

/* The token's string as stored in the vocabulary (byte-level alphabet for
 * ordinary tokens), NUL-terminated; NULL for ids outside the vocabulary. */
const char *spark_tokenizer_token_text(const spark_tokenizer *tok, int32_t id);

/* The bytes token `id` decodes to (*len set); may be part of a UTF-8
 * character. NULL (and *len = 0) for ids outside the vocabulary. */
const char *spark_tokenizer_token_piece(const spark_tokenizer *tok, int32_t id, size_t *len);

/* Is `id` an added token matched whole in raw text / a "special" one? */
int spark_tokenizer_is_added(const spark_tokenizer *tok, int32_t id);
int spark_tokenizer_is_special(const spark_tokenizer *tok, int32_t id);

enum {
    /* Match added-token text ("<|User|>", "<think>", ...) in the input and
     * emit its id. Without this flag such text is encoded as plain text:
     * the safe choice for untrusted user input. */
    SPARK_ENCODE_PARSE_SPECIAL = 1u << 0,
    /* Prepend the BOS id (only when the tokenizer has one). */
    SPARK_ENCODE_ADD_BOS = 1u << 1,
};

/* Encode text[0..len) (len bytes; NUL bytes are ordinary characters),
 * appending ids to *out. Invalid UTF-8 never fails: each maximal invalid
 * subsequence is replaced by U+FFFD first (the same text Python's
 * bytes.decode("utf-8", "replace") gives), then encoded. */
spark_status spark_tokenizer_encode(const spark_tokenizer *tok, const char *text, size_t len,
                                    uint32_t flags, spark_token_buf *out);

enum {
    SPARK_DECODE_SKIP_SPECIAL = 1u << 0, /* drop tokens marked special */
};

/* Decode ids to text, malloc'ed and NUL-terminated in *text (release with
 * free()), length in *len. Byte sequences that are not valid UTF-8 (a
 * character cut by the end of the ids) become U+FFFD, so the result is always
 * valid UTF-8. Ids outside the vocabulary: SPARK_ERR_ARG. */
spark_status spark_tokenizer_decode(const spark_tokenizer *tok, const int32_t *ids, size_t n,
                                    uint32_t flags, char **text, size_t *len);

/* Streaming detokenizer: push ids one at a time, get back only complete
 * UTF-8 text. Bytes of a character split across tokens are held until it is
 * complete; invalid sequences become U+FFFD exactly as in
 * spark_tokenizer_decode, so the concatenation of all outputs (plus flush)
 * equals the decode of all ids. */
typedef struct spark_detokenizer spark_detokenizer;

spark_status spark_detokenizer_create(const spark_tokenizer *tok, uint32_t decode_flags,
                                      spark_detokenizer **out);
void spark_detokenizer_free(spark_detokenizer *dt);
/* Feed one id; *text and *len receive the newly completed text (possibly empty),
 * valid until the next call on dt. */
spark_status spark_detokenizer_push(spark_detokenizer *dt, int32_t id, const char **text,
                                    size_t *len);
/* End of stream: returns held bytes (as U+FFFD) and resets dt for reuse. */
spark_status spark_detokenizer_flush(spark_detokenizer *dt, const char **text, size_t *len);

/* ---- chat format (SPEC §6) ---- */

typedef enum spark_chat_role {
    SPARK_CHAT_SYSTEM = 0,
    SPARK_CHAT_USER,
    SPARK_CHAT_ASSISTANT,
    SPARK_CHAT_TOOL, /* a tool result */
    SPARK_CHAT_ROLE_COUNT
} spark_chat_role;

typedef struct spark_tool_call {
    const char *name;
    const char *arguments_json; /* a JSON object, e.g. {"city":"Paris","days":3} */
} spark_tool_call;

typedef struct spark_chat_message {
    spark_chat_role role;
    const char *content;    /* may be NULL (= "") */
    const char *reasoning;  /* assistant only; past reasoning is not rendered */
    const spark_tool_call *tool_calls; /* assistant only */
    int32_t n_tool_calls;
} spark_chat_message;

typedef struct spark_chat {
    const spark_chat_message *messages;
    int32_t n_messages;
    const char *tools_json;    /* NULL, or a JSON array of tool definitions */
    int enable_thinking;       /* generation prompt ends in <think> (1) or </think> (0) */
    int add_generation_prompt; /* append the assistant turn opener */
} spark_chat;

/* Defaults: thinking on, generation prompt on, no messages. */
spark_chat spark_chat_default(void);

/* Render a conversation. Either output may be NULL:
 *   text : malloc'ed NUL-terminated prompt (release with free()), *text_len its length;
 *   ids  : appended token ids; the format's markers become their ids and
 *          message content is encoded as plain text (so "<|User|>" typed by a
 *          user stays text). Needs tok (may be NULL when ids is NULL).
 * Errors (SPARK_ERR_ARG) name the message index and what is wrong (e.g.
 * arguments that are not a JSON object). */
spark_status spark_chat_render(const spark_tokenizer *tok, const spark_chat *chat, char **text,
                               size_t *text_len, spark_token_buf *ids);

/* A conversation parsed from OpenAI-style JSON: either an array of messages
 * or an object {"messages": [...], "tools": [...]}. Messages have "role"
 * (system, user, assistant or tool), "content" (string or null), optional
 * "reasoning_content" and "tool_calls" ([{"function": {"name", "arguments"}}],
 * arguments an object or a JSON string). Owns all its strings. */
typedef struct spark_chat_doc spark_chat_doc;

spark_status spark_chat_doc_parse(const char *json, size_t len, spark_chat_doc **out);
void spark_chat_doc_free(spark_chat_doc *doc);
/* The conversation view of doc (valid while doc lives); tools from the
 * document, thinking and generation prompt on. */
spark_chat spark_chat_doc_view(const spark_chat_doc *doc);

/* Incremental parser of model output: feed decoded text in pieces of any
 * size (cut anywhere, even inside a tag), read events back. */
typedef enum spark_chat_event_kind {
    SPARK_CHAT_EVENT_NONE = 0,
    SPARK_CHAT_EVENT_REASONING, /* text before </think> */
    SPARK_CHAT_EVENT_CONTENT,   /* answer text */
    SPARK_CHAT_EVENT_TOOL_CALL, /* one complete tool call */
    SPARK_CHAT_EVENT_KIND_COUNT
} spark_chat_event_kind;

typedef struct spark_chat_event {
    spark_chat_event_kind kind;
    const char *text;           /* REASONING / CONTENT: the text, len bytes */
    size_t len;
    const char *name;           /* TOOL_CALL: function name */
    const char *arguments_json; /* TOOL_CALL: arguments as a compact JSON object */
} spark_chat_event;

typedef struct spark_chat_parser spark_chat_parser;

/* in_reasoning: the prompt ended with <think> (output starts as reasoning).
 * tools_json (may be NULL): tool definitions; a parameter declared
 * "type": "string" keeps its value as a string, other values are parsed as
 * JSON when they are valid JSON (numbers, true/false/null, objects, arrays)
 * and kept as strings otherwise. */
spark_status spark_chat_parser_create(int in_reasoning, const char *tools_json,
                                      spark_chat_parser **out);
void spark_chat_parser_free(spark_chat_parser *p);
spark_status spark_chat_parser_feed(spark_chat_parser *p, const char *text, size_t len);
/* End of output: text held back as a possible tag start is released; an
 * unfinished tool call is returned as CONTENT text, verbatim. */
spark_status spark_chat_parser_finish(spark_chat_parser *p);
/* Next pending event (kind NONE when none); pointers valid until the next
 * call on p. Consecutive text of one kind may arrive as several events. */
spark_chat_event spark_chat_parser_next(spark_chat_parser *p);

/* ---- generation (src/engine/generate.c) -------------------------------- */

typedef enum spark_finish_reason {
    SPARK_FINISH_LENGTH = 0, /* max_tokens reached */
    SPARK_FINISH_EOS,        /* the model emitted its end-of-sequence token */
    SPARK_FINISH_STOP,       /* a stop string matched (it is not emitted) */
    SPARK_FINISH_CONTEXT,    /* the context is full */
    SPARK_FINISH_CANCELLED,  /* the callback (or spark_generate_cancel) asked to stop */
    SPARK_FINISH_REASON_COUNT
} spark_finish_reason;

/* Called with each piece of generated text as soon as it is safe to show:
 * complete UTF-8, and never a part of a stop string. `id` is the token that
 * completed the piece (text may be empty while a character or a possible
 * stop string is held back). Return non-zero to stop generating. */
typedef int (*spark_token_callback)(void *user, int32_t id, const char *text, size_t len);

typedef struct spark_generate_params {
    int32_t max_tokens;          /* <= 0: until EOS, a stop string or the end of the context */
    const char *const *stop;     /* stop strings, matched across token boundaries */
    int32_t n_stop;
    const int32_t *stop_ids;     /* extra stop tokens besides the model's EOS */
    int32_t n_stop_ids;
    int ignore_eos;
    uint32_t decode_flags;       /* SPARK_DECODE_* for the text handed to on_token */
    spark_token_callback on_token;
    void *user;
    volatile int *cancel;        /* optional: generation stops when *cancel != 0 (signal-safe) */
} spark_generate_params;

typedef struct spark_generate_result {
    int32_t n_prompt, n_generated;
    spark_finish_reason finish;
    double prompt_seconds, generate_seconds;
} spark_generate_result;

/* Append prompt[0..n_prompt) (n_prompt >= 1: the first token is sampled
 * from the prompt's last logits) to the session, continuing whatever it
 * holds, and generate with `sampler` until a finish condition. Every
 * generated token except the final EOS / stop token is evaluated into the
 * cache, so a caller continuing a chat appends the EOS itself. Prompt tokens
 * are fed to the sampler's penalty history too. tok may be NULL: no text
 * then (on_token gets each id with empty text; stop strings are refused).
 * A plain greedy sampler (temperature 0, no bias or penalties) lets the
 * backend choose each token where the logits are (on a GPU they are never
 * copied back, and the next step runs while the host handles this one); the
 * tokens are the same as the sampler's. */
spark_status spark_generate(spark_session *session, const spark_tokenizer *tok, spark_sampler *sampler,
                            const int32_t *prompt, int32_t n_prompt, const spark_generate_params *params,
                            spark_generate_result *result);

#ifdef __cplusplus
}
#endif
#endif /* SPARK_H */

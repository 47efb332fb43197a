/*
 * cuda_internal.h — the launchers the host side of the CUDA backend
 * (cuda_backend.cu, cuda_graph.cu, cuda_pick.cu, ...) calls, and their
 * argument records: the kernels and their launch shapes are in
 * cuda_kernels.cu (small ops, few-token GEMVs, split-KV attention),
 * cuda_pick_kernels.cu (picks, candidates) and the files named below. C++
 * and CUDA types stay on this side; the C side of spark.c sees
 * cuda_backend.h alone.
 *
 * Every launcher enqueues on `st` and returns the launch's error code (the
 * caller checks it); none synchronizes.
 */
#ifndef SPARK_BACKEND_CUDA_INTERNAL_H
#define SPARK_BACKEND_CUDA_INTERNAL_H

#include <cuda_runtime.h>
#include <stdint.h>

enum {
    CUDA_GEMV_MAX_TOKENS = 4,  /* tokens one GEMV launch multiplies against a weight row */
    CUDA_MAX_HEAD_DIM = 256,   /* attention keeps head_dim / 32 values per lane in registers */
    CUDA_MAX_GROUP = 8,        /* query heads per KV head the attention kernel handles */
};

/* dtype codes are spark_dtype's values (io/dtype.h); repeated so this header
 * needs no C include. */
enum { CU_F32 = 0, CU_F16, CU_BF16, CU_Q8_0, CU_Q4_0, CU_Q4_K, CU_Q6_K };

/* The block formats (Q8_0, Q4_0, Q4_K, Q6_K) live on the device in a
 * layout of their own, made at upload by cu_repack_rows (cuda_fgemv.cu):
 * each row's quants first, then its scales (Q8_0, Q4_0: the f16 d of every
 * block; Q4_K: every superblock's 16-byte header, its 6-bit scales and mins
 * reordered as q4k_dev_scale_min reads them; Q4_0 and Q4_K quants 16 bytes
 * per 32 values, byte t = values t and 16 + t). Q8_0, Q4_0 and Q4_K keep
 * the file's bits and row size.
 * Q6_K (q6k_dev_unit) is regrouped into 32-value units of 16 + 8 + 4 bytes,
 * 224 bytes a superblock where the file has 210: its rows are then whole
 * 16-byte units (the file's are 2-byte aligned), so cu_dev_row_bytes, not
 * the file's, is the stride of a device row. Every kernel that reads such
 * weights (dq32: cu_gemv, cu_dequant_rows, cu_embed; fgemv) reads that
 * layout. */
int cu_repack_kind(int dtype);
int64_t cu_dev_row_bytes(int dtype, int64_t cols, int64_t file_row_bytes);
/* src rows file_row_bytes apart -> dst rows cu_dev_row_bytes apart */
cudaError_t cu_repack_rows(cudaStream_t st, void *dst, const void *src, int dtype, int64_t rows, int64_t cols,
                           int64_t file_row_bytes);

/* out[t, r] = x[t, :] . W[r, :] for t < n (n <= CUDA_GEMV_MAX_TOKENS).
 * W: rows x cols in `dtype`, row_bytes apart. */
cudaError_t cu_gemv(cudaStream_t st, float *out, const float *x, const void *w, int dtype, int64_t rows,
                    int64_t cols, int64_t row_bytes, int n);
/* Whether cu_gemv reads block-format rows in 16-byte units (1, the
 * default) or a 32-value group a lane (0, SPARK_CUDA_QGEMV=groups). */
void cu_gemv_units(int on);

/* panel[r, c] = W[r0 + r, c] as float32, for r < prow. */
cudaError_t cu_dequant_rows(cudaStream_t st, float *panel, const void *w, int dtype, int64_t r0, int64_t prow,
                            int64_t cols, int64_t row_bytes);

/* The same rows as a bf16 pair, hi = bf16(W), lo = bf16(W - hi) (bf16 panels of prow x cols each). */
cudaError_t cu_dequant_rows_bf16x2(cudaStream_t st, void *hi, void *lo, const void *w, int dtype, int64_t r0,
                                   int64_t prow, int64_t cols, int64_t row_bytes);

/* Activations as the bf16 pair a tensor-core GEMM multiplies: hi = bf16(x),
 * lo = bf16(x - hi), so x == hi + lo to ~2^-16 relative (lo NULL: hi alone;
 * hi NULL: no pair). The producers below (rmsnorm, gate_heads, gelu_mul)
 * write it beside their float output when given one, so that a prompt's
 * GEMM need not split its x in a kernel of its own. */
typedef struct cu_pair {
    void *hi, *lo;
} cu_pair;
cudaError_t cu_split_bf16(cudaStream_t st, cu_pair pair, const float *x, int64_t count);
/* out[r, t] (out rows ldo apart per token) = the sum over a stacked GEMM's
 * parts: `wide` is (parts_r * rows) x 2n column-major, parts_r blocks of rows
 * against x hi (columns t) and x lo (columns n + t). */
cudaError_t cu_fold_products(cudaStream_t st, float *out, int64_t ldo, const float *wide, int64_t rows, int n,
                             int parts_r);

/* *dst = v, as a one-thread kernel: stream-ordered, no host buffer to keep alive. */
cudaError_t cu_set_i64(cudaStream_t st, int64_t *dst, int64_t v);
/* *pos = p (pos may be NULL) and *id = t in one launch (a decode step's
 * position and token); t < 0: *id = the id of the pick in pick_keys. */
cudaError_t cu_set_step(cudaStream_t st, int64_t *pos, int64_t p, int32_t *id, int32_t t,
                        const unsigned long long *pick_keys);

/* Greedy picks (backend.h's pick): keys[0..CU_PICK_BLOCKS) = ordered
 * (value, index) keys of x[0..count)'s ranges; cu_pick_id reads a host copy
 * of them: the host sampler's greedy id, or -1 (as uint32) for none. */
enum { CU_PICK_BLOCKS = 64 };
cudaError_t cu_pick(cudaStream_t st, const float *x, int count, unsigned long long *keys, bool pdl);
uint32_t cu_pick_id(const unsigned long long *keys);

/* Sampling candidates (backend.h's candidates op), after a cu_pick of the
 * same logits into pick_keys: device buffers, one allocation laid out so a
 * single copy of [meta, tot, x, id] brings everything the host needs. */
typedef struct cu_cand_buf {
    int *meta;   /* [4]: count, complete, the last bucket taken (-1: none), - */
    double *tot; /* [CU_PICK_BLOCKS] each block's weight sum */
    float *x;    /* [cap] */
    int32_t *id; /* [cap] */
    int *hist;   /* [CU_PICK_BLOCKS * CAND_BUCKETS] */
    int *off;    /* [CU_PICK_BLOCKS] */
    float *x_max;
} cu_cand_buf;
cudaError_t cu_candidates(cudaStream_t st, const float *w, int count, float inv_t, float log_min_p, int cap,
                          const unsigned long long *pick_keys, cu_cand_buf *b);

cudaError_t cu_embed(cudaStream_t st, float *out, const void *table, int dtype, int64_t cols, int64_t row_bytes,
                     const int32_t *ids_dev, int n);
cudaError_t cu_rmsnorm(cudaStream_t st, float *out, const float *x, const float *w, int n, int dim, float eps,
                       cu_pair pair);
/* Kernels that depend on the position read it from device memory (`pos`,
 * the first token's position), so a captured decode step replays unchanged. */
cudaError_t cu_rope(cudaStream_t st, float *x, int n, int64_t stride, int n_heads, int head_dim, const int64_t *pos,
                    int rot_dims, double theta);
cudaError_t cu_gate_heads(cudaStream_t st, float *o, const float *g, int n, int n_head, int head_dim, cu_pair pair);
cudaError_t cu_gelu_mul(cudaStream_t st, float *a, const float *b, int64_t count, cu_pair pair);
cudaError_t cu_add(cudaStream_t st, float *y, const float *x, int64_t count);
cudaError_t cu_kv_store(cudaStream_t st, float *kc, float *vc, int64_t slots, const float *qkv, const int64_t *pos, int n,
                        int n_head, int n_head_kv, int head_dim, int64_t qkv_stride);

/* Attention for n queries at *pos..; keys < *pos from the cache (ring slot
 * j % slots), keys >= *pos from qkv. The key range of each query is cut into
 * `splits` equal parts (sized on the device from the position); splits > 1
 * needs a workspace of n * n_head * splits * (head_dim + 2) floats. */
typedef struct cu_attn_args {
    float *out;
    const float *qkv, *kc, *vc;
    float *ws;
    const int64_t *pos;
    int64_t slots, qkv_stride;
    int n, n_head, n_head_kv, head_dim, window, splits;
    int min_split_keys; /* a split covers at least this many keys (the rest stay empty: short contexts) */
    float scale;
    const float *gate; /* non-NULL: out[t, h, :] *= sigmoid(gate[t * n_head + h]) (the head gate, fused) */
    int pdl;           /* launch as a programmatic dependent of the previous kernel (sm_90) */
    int pdl_early;     /* let the following kernels launch before this one's dependency wait, so the
                        * out-projection GEMV after it loads its first weights during the attention */
    int flash;         /* run by cu_flash_attention (prefill chunks, f32 cache; set by the backend) */
    /* a decode step's attention in one launch (cu_attn_step, cuda_attn_step.cu): */
    int step_ok;       /* recorded: the context is short enough for it (cuda_attention) */
    int step;          /* fused: run by cu_attn_step, which also ropes q / k and stores k / v first */
    int rot_dims;      /* step: the rope of this layer class */
    double theta;
    const float *rope_tab; /* step: cos / sin at *pos (cu_rope_table); NULL: computed */
    unsigned long long *tl; /* step: SPARK_CUDA_TIMELINE's record of this launch (tl_mark), or NULL */
    int kv_fmt;        /* step and flash: the cache's number format, CU_KV_F32 (0) / F16 / BF16 (cuda_kv.h):
                        * kc and vc then point at rows of that element type; every other kernel takes f32 alone */
} cu_attn_args;
cudaError_t cu_attention(cudaStream_t st, const cu_attn_args *a);

/* ---- a decode step's attention in one launch (cuda_attn_step.cu, sm_90) ----
 * rope q and k, store k / v into slot *pos % slots, attention over the
 * keys cut into `cluster` splits that are the blocks of one thread-block
 * cluster per KV head, merged through distributed shared memory, gated:
 * the work of cu_rope_kv + cu_attention + the merge for one token.
 * cu_attn_step_cluster: the cluster size this device runs (<= want, a power
 * of two; 0: none, e.g. before sm_90). cu_attn_step_ok: the shapes it takes
 * (n == 1, <= 4 query heads per KV head, head_dim <= 256, an f32 / f16 /
 * bf16 cache). */
int cu_attn_step_cluster(int device, int want);
int cu_attn_step_ok(const cu_attn_args *a);
cudaError_t cu_attn_step(cudaStream_t st, const cu_attn_args *a, int cluster);

/* ---- prefill attention on tensor cores (cuda_flash.cu) ----
 * The same computation as cu_attention for chunks of >= CUDA_FLASH_MIN_N
 * queries over a float32 cache, or an f16 / bf16 one (kv_fmt; the chunk's
 * own keys and values rounded to it, as they are stored): key tiles shared by 64 query rows of one KV
 * head (its G heads x tokens), mma.sync bf16 with hi + lo operand splits
 * (fp32-close: three products per tile), online softmax. `splits` (from
 * cu_flash_splits) cuts each row block's key range; splits > 1 needs the
 * same workspace as cu_attention. SPARK_CUDA_FLASH=0 turns it off. */
enum { CUDA_FLASH_MIN_N = 16 };
int cu_flash_enabled(void);
int cu_flash_ok(const cu_attn_args *a); /* shape, alignment, n, the cache's format (kv_fmt) */
int cu_flash_splits(const cu_attn_args *a, int64_t pos0, int sms);
cudaError_t cu_flash_attention(cudaStream_t st, const cu_attn_args *a);

/* ---- the fast decode path (SPARK_CUDA_FAST, single token) ----
 *
 * fgemv (cuda_fgemv.cu): out = W . x for one token, W bf16, Q8_0, Q4_K,
 * Q6_K or Q4_0 (dtype; quantized rows in cu_repack_rows' layout) in one or two row segments
 * (rows0 rows of w0, then rows1 of w1, into out0 / out1), every row split
 * over KS warps and every warp keeping its whole segment's 16-byte loads in
 * flight; the grid is sized to the multiprocessors (cu_fgemv picks the split
 * and the blocks per SM). Fused, on request:
 *   nw != NULL   x is first RMS-normalised with weight nw (eps); block 0
 *                also writes the normalised x to xn (when non-NULL);
 *   resid        resid[r] += out0[r] (the residual add after out/down);
 *   pair         w0 / w1 are the FFN gate / up matrices (rows0 each):
 *                out0[r] = gelu_erf(gate_r . x) * (up_r . x), out1[r] = up_r . x.
 * Weights are read before the dependency wait (they never change), so under
 * programmatic dependent launch (pdl) the loads overlap the previous kernel. */
typedef struct cu_fgemv_args {
    int dtype;        /* CU_BF16 or a block format (its rows in cu_repack_rows' layout) */
    const void *w0, *w1;
    float *out0, *out1, *resid, *xn;
    const float *x, *nw;
    int64_t rows0, rows1, row_bytes;
    int cols, pair;
    float eps;
    /* instruments folded in by fuse() (no launch of their own): */
    unsigned long long *stamps; /* phase timing: a stamp_kernel's work, at the start */
    int stamp_phase;
    float steer_alpha;          /* steering `add` after the residual add: */
    const float *steer_dir;     /* resid[r] += alpha * dir[r] */
    unsigned long long *tl;     /* SPARK_CUDA_TIMELINE's record of this launch (tl_mark), or NULL */
} cu_fgemv_args;

/* SPARK_CUDA_TIMELINE's record of one launch (the tl fields above): block b's
 * %globaltimer ns at mark k is tl[b * CU_TL_MARKS + k]: 0 entry, 1 after its
 * dependency wait, 2 exit, 3.. points inside a kernel (the one-launch
 * attention's: cuda_attn_step.cu); 0 where a kernel has no such mark.
 * Blocks past CU_TL_MAX_BLOCKS are not kept. */
enum { CU_TL_MARKS = 8, CU_TL_MAX_BLOCKS = 1024 };

/* Whether cu_fgemv takes this format and shape (else use cu_gemv). */
int cu_fgemv_ok(int dtype, int64_t cols, int64_t row_bytes, const void *w, int64_t rows);
cudaError_t cu_fgemv(cudaStream_t st, const cu_fgemv_args *a, int sms, int pdl);
/* Launch shape choice: the KB in flight per SM below which cu_fgemv's
 * model assumes less bandwidth (SPARK_CUDA_FG_FLY; 0 = the default, 96). */
void cu_fgemv_tune(int fly_kb);
/* For bench/cuda_gemv_bench.cu's sweep: only the split ks (1/2/4/8) and b
 * blocks an SM (0: any), double-buffered or not (db -1: the default). A
 * launch no such shape fits fails with cudaErrorInvalidValue. */
void cu_fgemv_force(int ks, int b, int db);
/* Look up the kernels' occupancy for rows of `cols` now, outside any graph capture. */
void cu_fgemv_prepare(int64_t cols);

/* Rope on the q and k heads of one token's qkv row (position *pos), and its
 * k (rotated) and v rows stored into cache slot *pos % slots: the two rope
 * ops and the kv store of a decode step in one launch. */
cudaError_t cu_rope_kv(cudaStream_t st, float *qkv, int n_head, int n_head_kv, int head_dim, const int64_t *pos,
                       int rot_dims, double theta, float *kc, float *vc, int64_t slots, int pdl,
                       const float *tab);
/* tab[0, half) = cos, tab[half, 2 half) = sin of rope's angles at *pos
 * (half = rot_dims / 2), for rope_kv's `tab` (NULL: it computes them). */
cudaError_t cu_rope_table(cudaStream_t st, float *tab, const int64_t *pos, int rot_dims, double theta, int pdl);

/* Whether a graph captured from programmatic dependent launches runs here
 * (checked once, at backend creation; synchronizes `st`). */
bool cu_pdl_probe(cudaStream_t st);

/* ---- the instruments (cuda_hooks.cu; engine/hooks.c through backend.h) ----
 * One command kind for all of them, so a recorded decode step carries them
 * into its graph like any other op (no field depends on the position). */
enum { CU_HOOK_STEER = 1, CU_HOOK_COPY, CU_HOOK_FFN, CU_HOOK_STAMP };
typedef struct cu_hook_args {
    int kind;
    int n, dim, mode, top_k, phase; /* rows; row width (n_embd or n_ff); steer mode; top-k; stamp phase */
    float strength;
    float *x;                       /* steer: the rows, in place; copy: destination */
    const float *src;               /* copy: source; ffn: the activations [n][dim] */
    const float *dir, *unit;        /* steer: d and d/|d| */
    double *mass, *overlap;         /* ffn: [dim], [1] */
    unsigned long long *hist;       /* ffn: [64] */
    unsigned char *prev, *scratch;  /* ffn: [dim] previous top set, [n][dim] the rows' top sets */
    int32_t *has_prev;              /* ffn: [1] */
    unsigned long long *stamps;     /* stamp: [0] the last timestamp (ns), [1 + phase] the sums */
    int64_t count;                  /* copy: floats */
} cu_hook_args;
/* pdl: launch the kernels as programmatic dependents (inside a captured step). */
cudaError_t cu_hook(cudaStream_t st, const cu_hook_args *a, int pdl);

/* ---- the persistent decode step (cuda_step.cu, sm_90, SPARK_CUDA_MEGA) ----
 *
 * A fused single-token step as phases of one cooperative kernel (one block
 * per SM, grid barriers between phases, weight rows streamed by the bulk
 * copy engine across phase boundaries). cu_mega_create checks every phase
 * and returns NULL for anything it does not take (the caller keeps its
 * graph path); the position and token id are read from d_pos / d_ids. */
enum { CU_MK_EMBED, CU_MK_GEMV, CU_MK_ATTN };
typedef struct cu_mk_phase {
    int kind, dtype;
    int rpc, rope_class;     /* filled by cu_mega_create */
    int rot_dims;            /* ATTN: rope of q and k, then the k/v store, then attention */
    double theta;
    cu_fgemv_args fg;        /* GEMV (bf16) */
    cu_attn_args at;         /* ATTN (n == 1, f32 cache; splits chosen by cu_mega_create) */
    const void *table;       /* EMBED: out = row *d_ids of table */
    int64_t cols, row_bytes;
    float *out;
} cu_mk_phase;
typedef struct cu_mega cu_mega;
int cu_mega_supported(int device);
cu_mega *cu_mega_create(const cu_mk_phase *phases, int np, int sms, int64_t *d_pos, const int32_t *d_ids);
cudaError_t cu_mega_launch(cu_mega *mk, cudaStream_t st);
void cu_mega_destroy(cu_mega *mk);

#endif

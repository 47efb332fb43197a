/*
 * cuda_state.h — the CUDA backend's state and its command records, shared by
 * cuda_backend.cu (memory, the resident weights, the op table, creation),
 * cuda_graph.cu (single-token steps recorded, fused and replayed as one
 * CUDA graph, or handed to the persistent kernel), cuda_instruments.cu (the
 * hooks' ops) and cuda_pick.cu (greedy picks, sampling candidates). C++
 * only; the C side of spark.c sees cuda_backend.h alone.
 */
#ifndef SPARK_BACKEND_CUDA_STATE_H
#define SPARK_BACKEND_CUDA_STATE_H

extern "C" {
#include "backend/cuda/cuda_backend.h"

#include "base/error.h"
#include "io/dtype.h"
}
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_kv.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

namespace spark_cuda {

constexpr size_t PANEL_BYTES = (size_t)128 << 20; /* decoded weight rows per cuBLAS call */
constexpr int STACK_TOKENS = 256; /* up to here x hi and lo share one bf16 GEMM (gemm_stacked; half for panels) */
constexpr int ROPE_TABLES = 4;                    /* rope classes with a per-step angle table (rope_tables) */
constexpr int SPLIT_MIN_KEYS = 32;                /* a key split below this is not worth a block (bench/cuda_runs.md run 7) */
constexpr int ATT_STEP_CLUSTER = 16;              /* blocks (key splits) per KV head of the one-launch attention */
constexpr int64_t ATT_STEP_KEYS = 2048;           /* the most keys it takes; longer contexts: split + merge kernels */

struct dev_entry {
    const void *host;
    void *dev;
};

struct cmd;

struct cuda_backend {
    backend base;
    int device, sms;
    cudaStream_t st;
    cublasHandle_t blas;
    dev_entry *tab; /* open addressing on the host pointer */
    size_t cap, used;
    uint64_t weight_bytes;
    int32_t *ids;   /* (ids_cap) token ids of the current embed */
    size_t ids_bytes;
    float *ws;      /* attention split partials */
    size_t ws_bytes;
    uint8_t *kvstage; /* a coded cache's chunk rows, encoded (cuda_kv.cu) */
    size_t kvstage_bytes;
    void *bf;       /* activations as a bf16 pair (hi, then lo), for cuBLAS */
    size_t bf_bytes;
    /* what bf holds: the pair of the `pair_count` floats at `pair_of`, written
     * by their producer or by the last split, while nothing but GEMMs has run
     * since (NULL: no known x's; any other command, upload or replay clears it) */
    const float *pair_of;
    size_t pair_count;
    int pair_fuse; /* producers write the pair (SPARK_CUDA_XPAIR=0: every GEMM splits its own x) */
    long pair_splits, pair_written, pair_reused; /* SPARK_CUDA_VERBOSE */
    void *panel;    /* decoded weight rows, for cuBLAS (a bf16 pair, or float32) */
    size_t panel_bytes;
    int qgemm_f32;  /* decoded rows as float32 and SGEMM (SPARK_CUDA_QGEMM=f32), not bf16 pairs */
    int x_bf16;     /* SPARK_CUDA_PREFILL_X=bf16: the GEMMs' x rounded to bf16 once (the
                     * reference's own precision), not a hi + lo pair: half the products */
    float *wide;    /* a stacked GEMM's products before they are summed (gemm_stacked) */
    size_t wide_bytes;
    int stack_tokens; /* products of at most this many tokens as one stacked GEMM (SPARK_CUDA_STACK_TOKENS) */
    int gemv_tokens; /* products of at most this many tokens run as GEMVs, not GEMMs
                      * (SPARK_CUDA_GEMV_TOKENS; 0: each format's default, gemv_limit) */
    long gemv_products, gemm_products, stacked_products; /* products of 2+ tokens run each way, stacked
                                                          * GEMMs among the latter (SPARK_CUDA_VERBOSE) */
    long x_bf16_products; /* GEMMs with x in bf16 alone (x_bf16) */
    int64_t *d_pos;  /* position of the current chunk's first token */
    int64_t pos_host; /* what d_pos holds (when pos_set) */
    int pos_set;
    /* decode-step graphs (see flush) */
    int graphs, recording;
    int64_t step_pos;
    int32_t step_id;
    cmd *q, *gq;     /* the step being recorded; the one `exec` was captured from */
    size_t nq, qcap, ngq;
    cudaGraphExec_t exec;
    long captures, replays;
    /* the fast decode path (SPARK_CUDA_FAST, default on): fgemv for single
     * tokens, and recorded steps rewritten into fused commands (fuse) and
     * captured with programmatic dependent launches (pdl) */
    int fast, fuse_on, pdl_on;
    float *ropetab;  /* ROPE_TABLES x 2 x CUDA_MAX_HEAD_DIM / 2: cos / sin per rope class (rope_tables) */
    int split_keys;  /* attention: a key split covers at least this many keys (SPARK_CUDA_SPLIT_KEYS) */
    int att_blocks_per_sm; /* the split attention's blocks an SM (SPARK_CUDA_ATT_BPS, default 1) */
    int pdl_early;   /* attention releases its dependents before its wait (SPARK_CUDA_PDL_EARLY=0: not) */
    int att_cluster; /* a decode step's attention in one launch, splits = this cluster size (cuda_attn_step.cu;
                      * 0: off, SPARK_CUDA_ATTSTEP=0) */
    int64_t att_step_keys; /* ... while a full layer's context is at most this (SPARK_CUDA_ATTSTEP_KEYS) */
    long graph_att_steps, att_step_runs; /* its launches in the current graph; launches run (SPARK_CUDA_VERBOSE) */
    long flash_runs, flash_16bit_runs; /* prefill chunks' attention on the tensor cores, all / over f16 or bf16 caches */
    int pdl_now;     /* launches now get the PDL attribute (during a capture) */
    cmd *fq;         /* the fused form of q */
    size_t nfq, fqcap;
    long fused;      /* commands the last fusion removed */
    unsigned long long *stamps; /* phase timing: last stamp + per-phase sums, ns (cuda_stamp) */
    /* SPARK_CUDA_TIMELINE=FILE (timeline_assign / timeline_dump): a record
     * for each of up to TL_LAUNCHES fused GEMVs and one-launch attentions of
     * the captured step, their commands, and where the last step's go */
    char *tl_path;
    unsigned long long *tl_dev;
    cmd *tl_cmd;
    int tl_n;
    /* the persistent step kernel (cuda_step.cu, SPARK_CUDA_MEGA=1): a
     * recorded step it takes runs as one launch */
    int mega_on;
    cu_mega *mk;     /* built from mq (NULL: mq was refused, use the graph) */
    cmd *mq;
    size_t nmq;
    int mq_valid;
    long mega_runs;
    /* SPARK_CUDA_VERBOSE: the host's time per decode step, seconds summed over
     * host_steps: recording the ops (step start to flush), flush (compare,
     * graph launch), and the download's copy + wait */
    int verbose;
    double host_t0, host_record, host_flush, host_wait;
    long host_steps;
    /* greedy picks (backend.h's pick): the block keys on the device, a
     * page-locked copy of each queued pick's keys and the event that says
     * it has landed, a ring of two; pick_pending: the recorded step ends in
     * a pick, copied out right after the step is launched (flush) */
    unsigned long long *pick_keys, *pick_host;
    cudaEvent_t pick_ev[2];
    int pick_head, n_picks, pick_pending;
    /* sampling candidates (backend.h's candidates): the device buffers of
     * cu_cand_buf in one allocation, and a page-locked copy of its head */
    void *cand_dev, *cand_host;
    size_t cand_dev_bytes, cand_host_bytes;
};

/* CLOCK_MONOTONIC in seconds (the host-time counters above) */
double host_now();

inline cuda_backend *cuda_of(backend *be) { return (cuda_backend *)be; }

/* A CUDA failure inside an op: a bug or a dying device; names the call, the
 * error and the place, and aborts. */
[[noreturn]] void cuda_fatal(const char *call, const char *err, const char *file, int line);

#define CK(call)                                                                       \
    do {                                                                               \
        cudaError_t e_ = (call);                                                       \
        if (e_ != cudaSuccess) cuda_fatal(#call, cudaGetErrorString(e_), __FILE__, __LINE__); \
    } while (0)

#define CKB(call)                                                                      \
    do {                                                                               \
        cublasStatus_t s_ = (call);                                                    \
        if (s_ != CUBLAS_STATUS_SUCCESS) cuda_fatal(#call, cublasGetStatusString(s_), __FILE__, __LINE__); \
    } while (0)


/* ---- commands: every op, its arguments resolved to device memory ------------- */

enum cmd_op { OP_KVATTN = 100, OP_KVSTORE, /* attention / kv store over a coded (non-f32) cache: cuda_kv.cu */
              OP_EMBED = 0, OP_RMSNORM, OP_MATMUL, OP_ROPE, OP_ATTN, OP_KV, OP_GATE, OP_GELU, OP_ADD,
              OP_FGEMV, /* fused: [rmsnorm] + 1-2 matmuls [+ gelu-mul | + residual add] (fg) */
              OP_ROPEKV, /* fused: rope q, rope k, kv store (before the attention that follows) */
              OP_HOOK, /* an instrument (cuda_hooks.cu): steering, capture copy, FFN statistics, timestamp */
              OP_ROPETAB, /* fused: a rope class's cos / sin at the step's position, for the rope_kv commands */
              OP_PICK /* a greedy pick of x[0..count) into the pick keys */ };

/* Zero-filled before use, so two commands compare equal bytewise exactly
 * when they launch the same work (padding included). No field depends on
 * the position or the token ids: those are read from device memory. */
struct cmd {
    int op, n, dtype, heads, head_dim, rot_dims;
    float eps;
    double theta;
    int64_t rows, cols, row_bytes, stride, count, slots;
    float *out, *k, *v;
    const float *x, *y;
    const void *w;
    const int32_t *ids;
    cu_attn_args attn;
    cu_fgemv_args fg;
    cu_kv_attn_args kva; /* OP_KVATTN, OP_KVSTORE (the cache as kc / vc, slots) */
    cu_hook_args hk;
};

/* cuda_backend.cu: a command's launch (into the stream, or into the graph
 * being captured), a zero-filled command of an op, and the fused GEMV of a
 * plain matmul. */
void run_cmd(cuda_backend *cb, const cmd *c);
cmd new_cmd(int op, int n);
/* cuda_gemm.cu: a product (the fused GEMV, GEMVs or a GEMM, by tokens and
 * format); the pair a prompt's producer writes beside its output of `count`
 * floats (none inside a decode step); a GEMM's output ending a remembered
 * pair it overlaps; and the end of what bf is known to hold, when device
 * memory is written outside run_cmd (an upload, a replayed step) or freed. */
void run_matmul(cuda_backend *cb, const cmd *c);
cu_pair producer_pair(cuda_backend *cb, const cmd *c, const float *out, size_t count);
void pair_check_output(cuda_backend *cb, const cmd *c);
void pair_forget(cuda_backend *cb);
/* A fused GEMV of one single-token matmul's matrix: every other field zero
 * (no norm, no second matrix, no residual). */
cu_fgemv_args fgemv_of_matmul(const cmd *m);

/* cuda_graph.cu: run the recorded step (before anything that synchronizes);
 * an op's command, recorded inside a single-token step or else launched;
 * the position the kernels read from cb->d_pos (the step's, or set now). */
void flush(cuda_backend *cb);
void record(cuda_backend *cb, const cmd *c); /* (the step's first command, from cuda_embed) */
void submit(cuda_backend *cb, const cmd *c);
void set_pos(cuda_backend *cb, int64_t pos0);
/* cuda_pick.cu: the pick keys' copy to the host, queued after what the
 * stream holds now (a pick's kernel, or the launched step ending in one). */
void pick_copy(cuda_backend *cb);
/* cuda_backend.cu: the backend's device made current (multi-GPU hosts), and
 * a scratch buffer of at least `need` bytes (grown, never shrunk). */
void use_device(const cuda_backend *cb);
void *scratch(void **buf, size_t *have, size_t need);

/* cuda_instruments.cu and cuda_pick.cu: their backend.h ops (cuda_ops in
 * cuda_backend.cu lists them). */
void cuda_upload(backend *be, float *buf, const float *host, size_t count);
void cuda_copy(backend *be, float *dst, const float *src, size_t count);
void cuda_steer(backend *be, float *x, int n, int dim, int mode, float strength, const float *direction,
                const float *unit);
void cuda_ffn_observe(backend *be, const float *act, int n, int n_ff, int top_k, const ffn_observe_bufs *b);
void cuda_stamp(backend *be, int phase);
void cuda_device_times(backend *be, double *out, int count);
void cuda_pick(backend *be, const float *logits, int count);
int32_t cuda_pick_read(backend *be);
void cuda_pick_drop(backend *be);
int32_t cuda_candidates(backend *be, const float *logits, int count, float inv_t, float log_min_p, int32_t cap,
                        float *x_out, int32_t *id_out, int *complete, double *total);

/* cuda_graph.cu: SPARK_CUDA_TIMELINE's buffers (at creation) and its file (at
 * the backend's end). */
void timeline_init(cuda_backend *cb);
void timeline_dump(cuda_backend *cb);

} // namespace spark_cuda

#endif

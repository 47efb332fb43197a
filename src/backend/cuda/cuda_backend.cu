/*
 * cuda_backend.cu — the CUDA implementation of the backend interface
 * (engine/backend.h): device memory, the resident weights, the op table,
 * and the choice between the hand-written GEMV (decode) and cuBLAS (prefill).
 *
 * Weights are uploaded once, at creation, in their stored format, into a
 * table keyed by the host pointer the model hands the ops (weight_ref.data,
 * and the float32 norm vectors); an op that meets a pointer not yet in the
 * table uploads it then. Activations and the KV cache are plain fp32 device
 * buffers, exactly the CPU backend's layout, so forward.c runs unchanged.
 *
 * Matrix products:
 *   n == 1, bf16 weights           fgemv (the fast decode path, SPARK_CUDA_FAST=0
 *                                  turns it off); inside a recorded decode step
 *                                  fused with its neighbours (see fuse);
 *   n <= 2 * CUDA_GEMV_MAX_TOKENS  GEMV kernels (cuda_kernels.cu), fp32 x;
 *   bf16 weights, more tokens      cuBLAS bf16 tensor-core GEMM, run twice on
 *                                  x split as bf16 hi + lo, fp32 accumulate:
 *                                  as exact as fp32 x to ~2^-16;
 *   f32 weights                    cuBLAS SGEMM;
 *   f16 and block formats          rows decoded to a float32 panel, SGEMM.
 * All work goes to one stream; `download` is the only synchronization.
 * CUDA failures inside an op are bugs or a dying device: they abort with
 * the call, error and location named.
 */
extern "C" {
#include "backend/cuda/cuda_backend.h"

#include "base/error.h"
#include "io/dtype.h"
}
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_kv.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

namespace {

constexpr size_t PANEL_BYTES = (size_t)128 << 20; /* decoded weight rows per cuBLAS call */
constexpr int SPLIT_MIN_KEYS = 32;                /* a key split below this is not worth a block (bench/cuda_runs.md run 7) */

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
    float *panel;   /* decoded weight rows, for cuBLAS */
    size_t panel_bytes;
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
    int pdl_early;   /* attention releases its dependents before its wait (SPARK_CUDA_PDL_EARLY=0: not) */
    int pdl_now;     /* launches now get the PDL attribute (during a capture) */
    cmd *fq;         /* the fused form of q */
    size_t nfq, fqcap;
    long fused;      /* commands the last fusion removed */
    unsigned long long *stamps; /* phase timing: last stamp + per-phase sums, ns (cuda_stamp) */
    /* the persistent step kernel (cuda_step.cu, SPARK_CUDA_MEGA=1): a
     * recorded step it takes runs as one launch */
    int mega_on;
    cu_mega *mk;     /* built from mq (NULL: mq was refused, use the graph) */
    cmd *mq;
    size_t nmq;
    int mq_valid;
    long mega_runs;
};

cuda_backend *cuda_of(backend *be) { return (cuda_backend *)be; }

void flush(cuda_backend *cb); /* runs a recorded decode step: before anything that synchronizes */

[[noreturn]] void cuda_fatal(const char *call, const char *err, int line)
{
    fprintf(stderr, "spark: CUDA backend: %s failed: %s (%s:%d)\n", call, err, __FILE__, line);
    abort();
}

#define CK(call)                                                                       \
    do {                                                                               \
        cudaError_t e_ = (call);                                                       \
        if (e_ != cudaSuccess) cuda_fatal(#call, cudaGetErrorString(e_), __LINE__);    \
    } while (0)

#define CKB(call)                                                                      \
    do {                                                                               \
        cublasStatus_t s_ = (call);                                                    \
        if (s_ != CUBLAS_STATUS_SUCCESS) cuda_fatal(#call, cublasGetStatusString(s_), __LINE__); \
    } while (0)

void use_device(const cuda_backend *cb)
{
    if (cb->device != 0) CK(cudaSetDevice(cb->device));
}

/* ---- the weight table ------------------------------------------------------- */

size_t hash_ptr(const void *p)
{
    uint64_t x = (uint64_t)(uintptr_t)p;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return (size_t)x;
}

void *tab_find(const cuda_backend *cb, const void *host)
{
    if (!cb->cap) return NULL;
    for (size_t i = hash_ptr(host) & (cb->cap - 1);; i = (i + 1) & (cb->cap - 1)) {
        if (cb->tab[i].host == host) return cb->tab[i].dev;
        if (!cb->tab[i].host) return NULL;
    }
}

spark_status tab_put(cuda_backend *cb, const void *host, void *dev)
{
    if (2 * (cb->used + 1) > cb->cap) { /* keep the load under one half */
        size_t ncap = cb->cap ? 2 * cb->cap : 512;
        dev_entry *nt = (dev_entry *)calloc(ncap, sizeof *nt);
        if (!nt) return spark_fail(SPARK_ERR_NOMEM, "CUDA backend: no memory for the weight table");
        for (size_t i = 0; i < cb->cap; i++) {
            if (!cb->tab[i].host) continue;
            size_t j = hash_ptr(cb->tab[i].host) & (ncap - 1);
            while (nt[j].host) j = (j + 1) & (ncap - 1);
            nt[j] = cb->tab[i];
        }
        free(cb->tab);
        cb->tab = nt;
        cb->cap = ncap;
    }
    size_t i = hash_ptr(host) & (cb->cap - 1);
    while (cb->tab[i].host) i = (i + 1) & (cb->cap - 1);
    cb->tab[i] = {host, dev};
    cb->used++;
    return SPARK_OK;
}

/* The device copy of `bytes` bytes at host address `host`, uploaded on first use. */
spark_status upload(cuda_backend *cb, const void *host, size_t bytes, const char *what, void **dev)
{
    if ((*dev = tab_find(cb, host))) return SPARK_OK;
    void *d = NULL;
    cudaError_t e = cudaMalloc(&d, bytes ? bytes : 16);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return spark_fail(SPARK_ERR_NOMEM, "CUDA backend: cannot allocate %zu bytes of device memory for %s (%s)",
                          bytes, what, cudaGetErrorString(e));
    }
    e = cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) {
        cudaFree(d);
        return spark_fail(SPARK_ERR_INTERNAL, "CUDA backend: uploading %s failed (%s)", what, cudaGetErrorString(e));
    }
    spark_status st = tab_put(cb, host, d);
    if (st != SPARK_OK) {
        cudaFree(d);
        return st;
    }
    cb->weight_bytes += bytes;
    *dev = d;
    return SPARK_OK;
}

size_t weight_bytes(const weight_ref *w) { return (size_t)dtype_row_bytes(w->dtype, (uint64_t)w->cols) * (size_t)w->rows; }

const void *dev_weight(cuda_backend *cb, const weight_ref *w)
{
    void *d;
    if (upload(cb, w->data, weight_bytes(w), w->name, &d) != SPARK_OK) cuda_fatal("upload", spark_last_error(), __LINE__);
    return d;
}

const float *dev_vector(cuda_backend *cb, const float *host, int dim)
{
    void *d;
    if (upload(cb, host, (size_t)dim * sizeof(float), "a norm vector", &d) != SPARK_OK)
        cuda_fatal("upload", spark_last_error(), __LINE__);
    return (const float *)d;
}

/* A scratch buffer of at least `need` bytes (grown, never shrunk). */
void *scratch(void **buf, size_t *have, size_t need)
{
    if (need <= *have) return *buf;
    if (*buf) CK(cudaFree(*buf)); /* synchronizes: nothing in flight still reads it */
    size_t bytes = need + need / 4;
    CK(cudaMalloc(buf, bytes));
    *have = bytes;
    return *buf;
}

/* ---- memory ------------------------------------------------------------------ */

spark_status cuda_alloc(backend *be, size_t bytes, float **out)
{
    cuda_backend *cb = cuda_of(be);
    use_device(cb);
    flush(cb);
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 16);
    if (e != cudaSuccess) {
        cudaGetLastError();
        *out = NULL;
        return spark_fail(SPARK_ERR_NOMEM,
                          "cannot allocate %zu bytes of GPU memory (%s); a shorter context (--ctx) needs less",
                          bytes, cudaGetErrorString(e));
    }
    CK(cudaMemsetAsync(p, 0, bytes, cb->st));
    *out = (float *)p;
    return SPARK_OK;
}

void cuda_release(backend *be, float *buf)
{
    if (!buf) return;
    use_device(cuda_of(be));
    flush(cuda_of(be));
    CK(cudaFree(buf));
}

void cuda_download(backend *be, float *host_dst, const float *buf, size_t count)
{
    cuda_backend *cb = cuda_of(be);
    use_device(cb);
    flush(cb);
    if (!be->timing) {
        CK(cudaMemcpyAsync(host_dst, buf, count * sizeof(float), cudaMemcpyDeviceToHost, cb->st));
        CK(cudaStreamSynchronize(cb->st));
        return;
    }
    /* phase timing: the host's wait for the device (a copy into pageable
     * memory already waits for the stream) */
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    CK(cudaMemcpyAsync(host_dst, buf, count * sizeof(float), cudaMemcpyDeviceToHost, cb->st));
    CK(cudaStreamSynchronize(cb->st));
    clock_gettime(CLOCK_MONOTONIC, &t1);
    be->device_wait += (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
}

void cuda_destroy(backend *be)
{
    cuda_backend *cb = cuda_of(be);
    use_device(cb);
    if (cb->st) cudaStreamSynchronize(cb->st);
    if (getenv("SPARK_CUDA_VERBOSE"))
        fprintf(stderr,
                "spark: CUDA backend: %ld decode-step graph captures, %ld replays; fast path %d (fuse %d, pdl %d), "
                "fusion: %ld commands -> %zu; persistent step kernel %d: %ld launches\n",
                cb->captures, cb->replays, cb->fast, cb->fuse_on, cb->pdl_on, (long)cb->fused + (long)cb->nfq, cb->nfq,
                cb->mega_on, cb->mega_runs);
    if (cb->exec) cudaGraphExecDestroy(cb->exec);
    cu_mega_destroy(cb->mk);
    free(cb->mq);
    free(cb->q);
    free(cb->gq);
    free(cb->fq);
    cudaFree(cb->stamps);
    cudaFree(cb->d_pos);
    for (size_t i = 0; i < cb->cap; i++)
        if (cb->tab[i].host) cudaFree(cb->tab[i].dev);
    free(cb->tab);
    cudaFree(cb->ids);
    cudaFree(cb->ws);
    cudaFree(cb->kvstage);
    cudaFree(cb->ropetab);
    cudaFree(cb->bf);
    cudaFree(cb->panel);
    if (cb->blas) cublasDestroy(cb->blas);
    if (cb->st) cudaStreamDestroy(cb->st);
    free(cb);
}

/* ---- commands: every op, its arguments resolved to device memory ------------- */

enum cmd_op { OP_KVATTN = 100, OP_KVSTORE, /* attention / kv store over a coded (non-f32) cache: cuda_kv.cu */
              OP_EMBED = 0, OP_RMSNORM, OP_MATMUL, OP_ROPE, OP_ATTN, OP_KV, OP_GATE, OP_GELU, OP_ADD,
              OP_FGEMV, /* fused: [rmsnorm] + 1-2 matmuls [+ gelu-mul | + residual add] (fg) */
              OP_ROPEKV, /* fused: rope q, rope k, kv store (before the attention that follows) */
              OP_HOOK, /* an instrument (cuda_hooks.cu): steering, capture copy, FFN statistics, timestamp */
              OP_ROPETAB /* fused: a rope class's cos / sin at the step's position, for the rope_kv commands */ };

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

/* bf16 weights, many tokens: tensor-core GEMM on x = hi + lo (two bf16 halves). */
void gemm_bf16(cuda_backend *cb, float *out, const float *x, const void *W, int64_t rows, int64_t cols, int n)
{
    size_t count = (size_t)n * (size_t)cols;
    char *pair = (char *)scratch(&cb->bf, &cb->bf_bytes, count * 4);
    void *hi = pair, *lo = pair + count * 2;
    CK(cu_split_bf16(cb->st, hi, lo, x, (int64_t)count));
    const float one = 1.0f, zero = 0.0f;
    /* column-major view: out^T (rows x n) = W (cols x rows)^T . x^T (cols x n) */
    CKB(cublasGemmEx(cb->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, n, (int)cols, &one, W, CUDA_R_16BF, (int)cols,
                     hi, CUDA_R_16BF, (int)cols, &zero, out, CUDA_R_32F, (int)rows, CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT));
    CKB(cublasGemmEx(cb->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, n, (int)cols, &one, W, CUDA_R_16BF, (int)cols,
                     lo, CUDA_R_16BF, (int)cols, &one, out, CUDA_R_32F, (int)rows, CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT));
}

/* Any other format, many tokens: SGEMM, on the weights themselves (f32) or
 * on panels of rows decoded to float32. */
void gemm_f32(cuda_backend *cb, const cmd *c)
{
    const float one = 1.0f, zero = 0.0f;
    int64_t rows = c->rows, cols = c->cols;
    if (c->dtype == SPARK_DTYPE_F32) {
        CKB(cublasSgemm(cb->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, c->n, (int)cols, &one, (const float *)c->w,
                        (int)cols, c->x, (int)cols, &zero, c->out, (int)rows));
        return;
    }
    int64_t per = (int64_t)(PANEL_BYTES / ((size_t)cols * sizeof(float)));
    if (per < 1) per = 1;
    if (per > rows) per = rows;
    float *panel = (float *)scratch((void **)&cb->panel, &cb->panel_bytes, (size_t)per * (size_t)cols * sizeof(float));
    for (int64_t r0 = 0; r0 < rows; r0 += per) {
        int64_t pr = rows - r0 < per ? rows - r0 : per;
        CK(cu_dequant_rows(cb->st, panel, c->w, c->dtype, r0, pr, cols, c->row_bytes));
        CKB(cublasSgemm(cb->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)pr, c->n, (int)cols, &one, panel, (int)cols, c->x,
                        (int)cols, &zero, c->out + r0, (int)rows));
    }
}

/* Launch one command's work on the stream (or into the graph being captured:
 * then nothing here may allocate or synchronize, and nothing does for the
 * single-token commands a decode step is made of). */
void run_cmd(cuda_backend *cb, const cmd *c)
{
    cudaStream_t st = cb->st;
    switch (c->op) {
    case OP_EMBED: CK(cu_embed(st, c->out, c->w, c->dtype, c->cols, c->row_bytes, c->ids, c->n)); return;
    case OP_RMSNORM: CK(cu_rmsnorm(st, c->out, c->x, c->y, c->n, (int)c->cols, c->eps)); return;
    case OP_MATMUL:
        if (c->n == 1 && cb->fast && c->dtype == SPARK_DTYPE_BF16 &&
            cu_fgemv_ok(c->cols, c->row_bytes, c->w, c->rows) && ((uintptr_t)c->x % 16) == 0) {
            cu_fgemv_args a;
            memset(&a, 0, sizeof a);
            a.w0 = c->w;
            a.out0 = c->out;
            a.x = c->x;
            a.rows0 = c->rows;
            a.row_bytes = c->row_bytes;
            a.cols = (int)c->cols;
            CK(cu_fgemv(st, &a, cb->sms, cb->pdl_now));
        } else if (c->n <= 2 * CUDA_GEMV_MAX_TOKENS) { /* decode: stream the weights once per 4 tokens */
            for (int t0 = 0; t0 < c->n; t0 += CUDA_GEMV_MAX_TOKENS) {
                int nt = c->n - t0 < CUDA_GEMV_MAX_TOKENS ? c->n - t0 : CUDA_GEMV_MAX_TOKENS;
                CK(cu_gemv(st, c->out + (int64_t)t0 * c->rows, c->x + (int64_t)t0 * c->cols, c->w, c->dtype, c->rows,
                           c->cols, c->row_bytes, nt));
            }
        } else if (c->dtype == SPARK_DTYPE_BF16) {
            gemm_bf16(cb, c->out, c->x, c->w, c->rows, c->cols, c->n);
        } else {
            gemm_f32(cb, c);
        }
        return;
    case OP_ROPE:
        CK(cu_rope(st, c->out, c->n, c->stride, c->heads, c->head_dim, cb->d_pos, c->rot_dims, c->theta));
        return;
    case OP_ATTN: {
        cu_attn_args a = c->attn;
        a.pdl = cb->pdl_now;
        CK(a.flash ? cu_flash_attention(st, &a) : cu_attention(st, &a));
        return;
    }
    case OP_FGEMV: CK(cu_fgemv(st, &c->fg, cb->sms, cb->pdl_now)); return;
    case OP_ROPEKV:
        CK(cu_rope_kv(st, c->out, c->heads, (int)c->rows, c->head_dim, cb->d_pos, c->rot_dims, c->theta, c->k, c->v,
                      c->slots, cb->pdl_now, c->y));
        return;
    case OP_ROPETAB:
        CK(cu_rope_table(st, c->out, cb->d_pos, c->rot_dims, c->theta, cb->pdl_now));
        return;
    case OP_KV:
        CK(cu_kv_store(st, c->k, c->v, c->slots, c->x, cb->d_pos, c->n, c->heads, (int)c->rows, c->head_dim,
                       c->stride));
        return;
    case OP_KVATTN: CK(cu_kv_attention(st, &c->kva)); return;
    case OP_KVSTORE: {
        const cu_kv_attn_args *a = &c->kva;
        CK(cu_kv_encode(st, (void *)a->kc, (void *)a->vc, a->slots, a->qkv, a->pos, a->n, a->n_head, a->n_head_kv,
                        a->head_dim, a->qkv_stride, a->fmt));
        return;
    }
    case OP_GATE: CK(cu_gate_heads(st, c->out, c->x, c->n, c->heads, c->head_dim)); return;
    case OP_GELU: CK(cu_gelu_mul(st, c->out, c->x, c->count)); return;
    case OP_ADD: CK(cu_add(st, c->out, c->x, c->count)); return;
    case OP_HOOK: CK(cu_hook(st, &c->hk, cb->pdl_now)); return;
    }
}

/* ---- decode steps as CUDA graphs ---------------------------------------------- */
/*
 * A single-token step (embed with n == 1 up to the next synchronizing call)
 * is recorded instead of launched: ~14 kernels a layer cost more to launch
 * one by one than the GPU needs to run them. At the step's end the recorded
 * commands are compared with the ones the current graph was captured from;
 * equal (the usual case: same buffers, same shapes, only the position and
 * the token differ, and those live in device memory) -> one graph launch;
 * different -> capture a new graph. SPARK_CUDA_GRAPH=0 turns this off.
 */

void record(cuda_backend *cb, const cmd *c)
{
    if (cb->nq == cb->qcap) {
        size_t ncap = cb->qcap ? 2 * cb->qcap : 1024;
        cmd *nq = (cmd *)realloc(cb->q, ncap * sizeof *nq);
        if (!nq) cuda_fatal("realloc", "out of host memory for the command queue", __LINE__);
        cb->q = nq;
        cb->qcap = ncap;
    }
    memcpy(&cb->q[cb->nq++], c, sizeof *c);
}


/* ---- fusion of a recorded decode step --------------------------------------- */
/*
 * The forward pass issues a layer as ~16 small ops; a recorded single-token
 * step is rewritten here into fewer launches, by patterns that check every
 * buffer they rely on (anything that does not match runs as recorded):
 *
 *   rmsnorm(xn <- x); matmul(a <- xn); [matmul(b <- xn); [gelu_mul(a, b)]]
 *       -> one fgemv: the norm in its x load, block 0 still writing xn;
 *          two matmuls as two row segments of one launch (qkv + gate), or
 *          as a gate/up pair with the GELU-mul in the epilogue (ffn);
 *   matmul(p <- a); add(x += p)      -> one fgemv writing p and x += p;
 *   rope(q); rope(k); attention; kv_store
 *       -> rope_kv (rope both, store k/v), then attention: the store moves
 *          before the attention, safe because the slot of the current
 *          position is never one the attention reads (rings hold >= window
 *          slots, full layers >= n_ctx);
 *   attention; gate_heads(attn, g) -> attention with the gate in its output.
 *
 * Every buffer ends the step as the unfused ops leave it (xn, the matmul
 * outputs, the gated attention, the cache), so nothing downstream can tell.
 */

cmd new_cmd(int op, int n);

bool fg_matmul_ok(const cmd *m)
{
    return m->op == OP_MATMUL && m->n == 1 && m->dtype == SPARK_DTYPE_BF16 &&
           cu_fgemv_ok(m->cols, m->row_bytes, m->w, m->rows);
}

bool al16(const void *p) { return ((uintptr_t)p % 16) == 0; }

void fq_push(cuda_backend *cb, const cmd *c)
{
    if (cb->nfq == cb->fqcap) {
        size_t ncap = cb->fqcap ? 2 * cb->fqcap : 1024;
        cmd *nq = (cmd *)realloc(cb->fq, ncap * sizeof *nq);
        if (!nq) cuda_fatal("realloc", "out of host memory for the fused command queue", __LINE__);
        cb->fq = nq;
        cb->fqcap = ncap;
    }
    cb->fq[cb->nfq++] = *c;
}

/* Instruments that cost a launch each are folded into the fused GEMV next
 * to them, where the GEMV does their work exactly: a phase timestamp just
 * before a GEMV becomes that GEMV's first act (after its dependency wait,
 * the moment the stamp kernel would have run), and a steering `add` right
 * after a GEMV's residual add joins its epilogue (same float operations as
 * steer_kernel). Every other instrument keeps its own kernel. */
void fold_hooks(cuda_backend *cb)
{
    size_t w = 0;
    for (size_t i = 0; i < cb->nfq; i++) {
        cmd *c = &cb->fq[i];
        cmd *next = i + 1 < cb->nfq ? &cb->fq[i + 1] : NULL;
        if (c->op == OP_HOOK && c->hk.kind == CU_HOOK_STAMP && next && next->op == OP_FGEMV && !next->fg.stamps) {
            next->fg.stamps = c->hk.stamps;
            next->fg.stamp_phase = c->hk.phase;
            continue;
        }
        if (c->op == OP_HOOK && c->hk.kind == CU_HOOK_STEER && c->hk.mode == SPARK_STEER_ADD && c->hk.n == 1 && w > 0) {
            cmd *prev = &cb->fq[w - 1];
            if (prev->op == OP_FGEMV && !prev->fg.pair && prev->fg.resid == c->hk.x && !prev->fg.steer_dir &&
                prev->fg.rows1 == 0 && prev->fg.rows0 == c->hk.dim) {
                prev->fg.steer_dir = c->hk.dir;
                prev->fg.steer_alpha = c->hk.strength;
                continue;
            }
        }
        if (w != i) cb->fq[w] = *c;
        w++;
    }
    cb->nfq = w;
}

/* The rope angles of a step depend on the position and the layer's class
 * only, so each class's cos / sin (double, as the kernels computed them)
 * come from one kernel at the step's start; the rope_kv commands read them.
 * Classes past ROPE_TABLES keep computing their own. */
constexpr int ROPE_TABLES = 4;
void rope_tables(cuda_backend *cb)
{
    if (!cb->ropetab) return;
    double theta[ROPE_TABLES];
    int rot[ROPE_TABLES], nt = 0;
    for (size_t i = 0; i < cb->nfq; i++) {
        cmd *c = &cb->fq[i];
        if (c->op != OP_ROPEKV || c->rot_dims < 2) continue;
        int k = 0;
        while (k < nt && !(theta[k] == c->theta && rot[k] == c->rot_dims)) k++;
        if (k == nt) {
            if (nt == ROPE_TABLES) continue;
            theta[nt] = c->theta;
            rot[nt++] = c->rot_dims;
        }
        c->y = cb->ropetab + (size_t)k * CUDA_MAX_HEAD_DIM;
    }
    if (!nt) return;
    for (int k = 0; k < nt; k++) { /* room at the front */
        cmd t = new_cmd(OP_ROPETAB, 1);
        t.out = cb->ropetab + (size_t)k * CUDA_MAX_HEAD_DIM;
        t.rot_dims = rot[k];
        t.theta = theta[k];
        fq_push(cb, &t);
    }
    cmd *tabs = (cmd *)malloc((size_t)nt * sizeof *tabs);
    if (!tabs) cuda_fatal("malloc", "out of host memory for the rope tables", __LINE__);
    memcpy(tabs, cb->fq + cb->nfq - nt, (size_t)nt * sizeof *tabs);
    memmove(cb->fq + nt, cb->fq, (cb->nfq - nt) * sizeof *cb->fq);
    memcpy(cb->fq, tabs, (size_t)nt * sizeof *tabs);
    free(tabs);
}

void fuse(cuda_backend *cb)
{
    const cmd *q = cb->q;
    const size_t n = cb->nq;
    cb->nfq = 0;
    size_t i = 0;
    while (i < n) {
        const cmd *c = &q[i];
        /* rmsnorm + matmul(s) [+ gelu_mul] */
        if (c->op == OP_RMSNORM && c->n == 1 && i + 1 < n && fg_matmul_ok(&q[i + 1]) && q[i + 1].x == c->out &&
            q[i + 1].cols == c->cols && al16(c->x) && al16(c->y) && al16(c->out) && c->cols % 4 == 0 &&
            c->out != c->x && q[i + 1].out != c->x) {
            /* (no output may be the input x: blocks load x at different times) */
            const cmd *m1 = &q[i + 1];
            cmd f = new_cmd(OP_FGEMV, 1);
            cu_fgemv_args *a = &f.fg;
            a->x = c->x;
            a->nw = c->y;
            a->eps = c->eps;
            a->xn = c->out;
            a->w0 = m1->w;
            a->out0 = m1->out;
            a->rows0 = m1->rows;
            a->row_bytes = m1->row_bytes;
            a->cols = (int)m1->cols;
            size_t used = 2;
            const cmd *m2 = i + 2 < n ? &q[i + 2] : NULL;
            if (m2 && fg_matmul_ok(m2) && m2->x == c->out && m2->cols == m1->cols && m2->row_bytes == m1->row_bytes &&
                m2->out != m1->out && m2->out != c->x) {
                const cmd *g = i + 3 < n ? &q[i + 3] : NULL;
                if (g && g->op == OP_GELU && g->out == m1->out && g->x == m2->out && g->count == m1->rows &&
                    m2->rows == m1->rows) {
                    a->pair = 1;
                    a->w1 = m2->w;
                    a->out1 = m2->out;
                    a->rows1 = m2->rows;
                    used = 4;
                } else if (m1->rows + m2->rows < ((int64_t)1 << 31)) {
                    a->w1 = m2->w;
                    a->out1 = m2->out;
                    a->rows1 = m2->rows;
                    used = 3;
                }
            }
            fq_push(cb, &f);
            i += used;
            continue;
        }
        /* matmul + residual add */
        if (fg_matmul_ok(c) && al16(c->x) && i + 1 < n && q[i + 1].op == OP_ADD && q[i + 1].x == c->out &&
            q[i + 1].count == c->rows && q[i + 1].out != c->x && q[i + 1].out != c->out && c->out != c->x) {
            cmd f = new_cmd(OP_FGEMV, 1);
            cu_fgemv_args *a = &f.fg;
            a->x = c->x;
            a->w0 = c->w;
            a->out0 = c->out;
            a->resid = q[i + 1].out;
            a->rows0 = c->rows;
            a->row_bytes = c->row_bytes;
            a->cols = (int)c->cols;
            fq_push(cb, &f);
            i += 2;
            continue;
        }
        /* rope q + rope k + attention + kv store [+ gate] */
        if (c->op == OP_ROPE && c->n == 1 && i + 3 < n && q[i + 1].op == OP_ROPE && q[i + 2].op == OP_ATTN &&
            q[i + 3].op == OP_KV) {
            const cmd *r2 = &q[i + 1], *at = &q[i + 2], *kv = &q[i + 3];
            const cu_attn_args *aa = &at->attn;
            const int64_t q_dim = (int64_t)aa->n_head * aa->head_dim;
            bool ok = aa->n == 1 && r2->n == 1 && kv->n == 1 && c->out == aa->qkv && c->heads == aa->n_head &&
                      c->head_dim == aa->head_dim && c->stride == aa->qkv_stride && r2->out == aa->qkv + q_dim &&
                      r2->heads == aa->n_head_kv && r2->head_dim == aa->head_dim && r2->rot_dims == c->rot_dims &&
                      r2->theta == c->theta && r2->stride == aa->qkv_stride && kv->x == aa->qkv &&
                      kv->k == aa->kc && kv->v == aa->vc && kv->slots == aa->slots && kv->heads == aa->n_head &&
                      kv->rows == aa->n_head_kv && kv->head_dim == aa->head_dim && kv->stride == aa->qkv_stride &&
                      (aa->window == 0 || aa->slots >= aa->window) && c->rot_dims <= aa->head_dim &&
                      aa->head_dim <= 1024;
            if (ok) {
                cmd f = new_cmd(OP_ROPEKV, 1);
                f.out = c->out;
                f.heads = aa->n_head;
                f.rows = aa->n_head_kv;
                f.head_dim = aa->head_dim;
                f.rot_dims = c->rot_dims;
                f.theta = c->theta;
                f.k = kv->k;
                f.v = kv->v;
                f.slots = aa->slots;
                fq_push(cb, &f);
                cmd a2 = *at;
                size_t used = 4;
                const cmd *g = i + 4 < n ? &q[i + 4] : NULL;
                if (g && g->op == OP_GATE && g->n == 1 && g->out == aa->out && g->heads == aa->n_head &&
                    g->head_dim == aa->head_dim) {
                    a2.attn.gate = g->x;
                    used = 5;
                }
                fq_push(cb, &a2);
                i += used;
                continue;
            }
        }
        /* attention + gate */
        if (c->op == OP_ATTN && c->attn.n == 1 && i + 1 < n && q[i + 1].op == OP_GATE && q[i + 1].n == 1 &&
            q[i + 1].out == c->attn.out && q[i + 1].heads == c->attn.n_head && q[i + 1].head_dim == c->attn.head_dim) {
            cmd a2 = *c;
            a2.attn.gate = q[i + 1].x;
            fq_push(cb, &a2);
            i += 2;
            continue;
        }
        fq_push(cb, c);
        i++;
    }
    fold_hooks(cb);
    rope_tables(cb);
    cb->fused = (long)n - (long)cb->nfq;
}

/* Capture the recorded step (fused when the fast path is on) as a graph. */
bool capture(cuda_backend *cb)
{
    cudaGraph_t g = NULL;
    if (cudaStreamBeginCapture(cb->st, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    const cmd *list = cb->q;
    size_t count = cb->nq;
    if (cb->fast && cb->fuse_on) {
        fuse(cb);
        list = cb->fq;
        count = cb->nfq;
    }
    cb->pdl_now = cb->pdl_on;
    for (size_t i = 0; i < count; i++) run_cmd(cb, &list[i]);
    cb->pdl_now = 0;
    cudaError_t e = cudaStreamEndCapture(cb->st, &g);
    if (e == cudaSuccess && g) e = cudaGraphInstantiate(&cb->exec, g, 0);
    if (g) cudaGraphDestroy(g);
    if (e != cudaSuccess || !cb->exec) {
        cudaGetLastError();
        cb->exec = NULL;
        return false;
    }
    cmd *copy = (cmd *)realloc(cb->gq, cb->nq * sizeof *copy);
    if (!copy) cuda_fatal("realloc", "out of host memory for the graph's commands", __LINE__);
    memcpy(copy, cb->q, cb->nq * sizeof *copy);
    cb->gq = copy;
    cb->ngq = cb->nq;
    return true;
}

/* The fused step as the persistent kernel's phases: embed, then per layer
 * GEMV (norm + qkv + gate), ATTN (rope_kv + attention), GEMV (out + add),
 * GEMV (norm + gate/up pair), GEMV (down + add), then the head's GEMV.
 * NULL when any command is of another kind. */
cu_mega *mega_build(cuda_backend *cb)
{
    fuse(cb);
    cu_mk_phase *ph = (cu_mk_phase *)calloc(cb->nfq ? cb->nfq : 1, sizeof *ph);
    if (!ph) return NULL;
    int np = 0;
    bool ok = true;
    for (size_t i = 0; i < cb->nfq && ok; i++) {
        const cmd *c = &cb->fq[i];
        if (c->op == OP_ROPETAB) continue; /* the persistent kernel computes its angles itself */
        cu_mk_phase *p = &ph[np++];
        if (c->op == OP_EMBED && c->n == 1) {
            p->kind = CU_MK_EMBED;
            p->dtype = c->dtype;
            p->table = c->w;
            p->cols = c->cols;
            p->row_bytes = c->row_bytes;
            p->out = c->out;
        } else if (c->op == OP_FGEMV) {
            p->kind = CU_MK_GEMV;
            p->dtype = SPARK_DTYPE_BF16; /* fuse() makes OP_FGEMV of bf16 matrices only */
            p->fg = c->fg;
        } else if (c->op == OP_ROPEKV && i + 1 < cb->nfq && cb->fq[i + 1].op == OP_ATTN &&
                   cb->fq[i + 1].attn.qkv == c->out && cb->fq[i + 1].attn.kc == c->k &&
                   cb->fq[i + 1].attn.vc == c->v && cb->fq[i + 1].attn.slots == c->slots && !cb->fq[i + 1].attn.flash) {
            p->kind = CU_MK_ATTN;
            p->at = cb->fq[i + 1].attn;
            p->rot_dims = c->rot_dims;
            p->theta = c->theta;
            i++;
        } else {
            ok = false;
        }
    }
    cu_mega *mk = ok ? cu_mega_create(ph, np, cb->sms, cb->d_pos, cb->ids) : NULL;
    free(ph);
    return mk;
}

/* The recorded step as one persistent-kernel launch, if it takes it. */
bool mega_run(cuda_backend *cb)
{
    bool same = cb->mq_valid && cb->nmq == cb->nq && !memcmp(cb->mq, cb->q, cb->nq * sizeof *cb->q);
    if (!same) {
        cu_mega_destroy(cb->mk);
        cb->mk = mega_build(cb);
        cmd *copy = (cmd *)realloc(cb->mq, cb->nq * sizeof *copy);
        if (!copy) cuda_fatal("realloc", "out of host memory for the step's commands", __LINE__);
        memcpy(copy, cb->q, cb->nq * sizeof *copy);
        cb->mq = copy;
        cb->nmq = cb->nq;
        cb->mq_valid = 1;
    }
    if (!cb->mk) return false;
    CK(cu_mega_launch(cb->mk, cb->st));
    cb->mega_runs++;
    return true;
}

/* Run the recorded step, if any. */
void flush(cuda_backend *cb)
{
    if (!cb->recording) return;
    cb->recording = 0;
    CK(cu_set_i64(cb->st, cb->d_pos, cb->step_pos));
    cb->pos_set = 1;
    cb->pos_host = cb->step_pos;
    CK(cu_set_i32(cb->st, cb->ids, cb->step_id));
    if (cb->mega_on && mega_run(cb)) return;
    bool same = cb->exec && cb->ngq == cb->nq && !memcmp(cb->gq, cb->q, cb->nq * sizeof *cb->q);
    if (!same) {
        if (cb->exec) cudaGraphExecDestroy(cb->exec);
        cb->exec = NULL;
        cb->captures++;
        bool ok = capture(cb);
        if (!ok && cb->pdl_on) { /* programmatic launches not capturable here: without them */
            cb->pdl_on = 0;
            ok = capture(cb);
        }
        if (!ok) { /* not capturable here: run it as it is, and stop trying */
            cb->graphs = 0;
            for (size_t i = 0; i < cb->nq; i++) run_cmd(cb, &cb->q[i]);
            return;
        }
    }
    CK(cudaGraphLaunch(cb->exec, cb->st));
    cb->replays++;
}

/* A command from an op: recorded inside a single-token step, else launched. */
void submit(cuda_backend *cb, const cmd *c)
{
    if (cb->recording && c->n == 1) {
        record(cb, c);
        return;
    }
    flush(cb);
    run_cmd(cb, c);
}

/* The position kernels read from cb->d_pos: the step's, or set now. */
void set_pos(cuda_backend *cb, int64_t pos0)
{
    if (cb->recording) {
        cb->step_pos = pos0;
        return;
    }
    if (cb->pos_set && cb->pos_host == pos0) return;
    CK(cu_set_i64(cb->st, cb->d_pos, pos0));
    cb->pos_set = 1;
    cb->pos_host = pos0;
}

/* ---- ops ----------------------------------------------------------------------- */

cmd new_cmd(int op, int n)
{
    cmd c;
    memset(&c, 0, sizeof c);
    c.op = op;
    c.n = n;
    return c;
}

void cuda_embed(backend *be, float *out, const weight_ref *table, const int32_t *ids, int n)
{
    cuda_backend *cb = cuda_of(be);
    use_device(cb);
    flush(cb); /* an unfinished step (no logits asked) ends here */
    cmd c = new_cmd(OP_EMBED, n);
    c.out = out;
    c.w = dev_weight(cb, table);
    c.dtype = table->dtype;
    c.cols = table->cols;
    c.row_bytes = (int64_t)dtype_row_bytes(table->dtype, (uint64_t)table->cols);
    if (n == 1 && cb->graphs) {
        cb->recording = 1;
        cb->nq = 0;
        cb->step_id = ids[0];
        c.ids = cb->ids;
        record(cb, &c);
        return;
    }
    size_t bytes = (size_t)n * sizeof(int32_t);
    c.ids = (int32_t *)scratch((void **)&cb->ids, &cb->ids_bytes, bytes);
    /* pageable source: copied out of `ids` before this returns */
    CK(cudaMemcpyAsync((void *)c.ids, ids, bytes, cudaMemcpyHostToDevice, cb->st));
    run_cmd(cb, &c);
}

void cuda_rmsnorm(backend *be, float *out, const float *x, const float *w, int n, int dim, float eps)
{
    cuda_backend *cb = cuda_of(be);
    use_device(cb);
    cmd c = new_cmd(OP_RMSNORM, n);
    c.out = out;
    c.x = x;
    c.y = dev_vector(cb, w, dim);
    c.cols = dim;
    c.eps = eps;
    submit(cb, &c);
}

void cuda_matmul(backend *be, float *out, const float *x, const weight_ref *w, int n)
{
    cuda_backend *cb = cuda_of(be);
    use_device(cb);
    cmd c = new_cmd(OP_MATMUL, n);
    c.out = out;
    c.x = x;
    c.w = dev_weight(cb, w);
    c.dtype = w->dtype;
    c.rows = w->rows;
    c.cols = w->cols;
    c.row_bytes = (int64_t)dtype_row_bytes(w->dtype, (uint64_t)w->cols);
    submit(cb, &c);
}

void cuda_rope(backend *be, float *x, int n, int64_t stride, int n_heads, int head_dim, int64_t pos0,
               const rope_class *rc)
{
    cuda_backend *cb = cuda_of(be);
    use_device(cb);
    set_pos(cb, pos0);
    cmd c = new_cmd(OP_ROPE, n);
    c.out = x;
    c.stride = stride;
    c.heads = n_heads;
    c.head_dim = head_dim;
    c.rot_dims = rc->rot_dims;
    c.theta = rc->theta;
    submit(cb, &c);
}

/* Flash-decoding key splits, sized from the cache's capacity and not the
 * position, so a decode step's launch shape never changes: the key range is
 * cut until `blocks` x splits reaches `target` blocks, each split at least
 * min_keys long at full capacity (shorter while the context is short). */
int64_t key_splits(const kv_layer *cache, int64_t blocks, int64_t target, int64_t min_keys)
{
    if (blocks >= target) return 1;
    const int64_t cap = cache->window && cache->window < cache->slots ? cache->window : cache->slots;
    int64_t splits = (target + blocks - 1) / blocks;
    const int64_t most = (cap + min_keys - 1) / min_keys;
    if (splits > most) splits = most;
    return splits < 1 ? 1 : splits;
}

/* Attention over a coded cache (cuda_kv.cu). Flash-decoding splits from the
 * capacity, as for f32 (launch shape independent of the position): enough
 * blocks to fill every SM once (the kernel's occupancy), each split at least
 * 128 keys at full capacity.
 * Scratch (split partials, the chunk's encoded rows) grows outside a
 * recorded step only. */
void kv_coded_attention(cuda_backend *cb, float *out, const float *qkv, const kv_layer *cache, int n,
                        const attn_shape *sh)
{
    const int64_t KV_SPLIT_MIN_KEYS = 128;
    int per_sm = cu_kv_attn_blocks_per_sm(cache->type, sh->n_head, sh->n_head_kv); /* one whole wave */
    int64_t splits = key_splits(cache, (int64_t)n * sh->n_head_kv, (per_sm > 0 ? per_sm : 4) * (int64_t)cb->sms,
                                KV_SPLIT_MIN_KEYS);
    cmd c = new_cmd(OP_KVATTN, n);
    cu_kv_attn_args *a = &c.kva;
    a->out = out;
    a->qkv = qkv;
    a->kc = (const uint8_t *)cache->k;
    a->vc = (const uint8_t *)cache->v;
    a->pos = cb->d_pos;
    a->slots = cache->slots;
    a->qkv_stride = sh->qkv_stride;
    a->n = n;
    a->n_head = sh->n_head;
    a->n_head_kv = sh->n_head_kv;
    a->head_dim = sh->head_dim;
    a->window = cache->window;
    a->splits = (int)splits;
    a->fmt = cache->type;
    a->scale = sh->scale;
    size_t ws_need = (size_t)n * (size_t)sh->n_head * (size_t)splits * (size_t)(sh->head_dim + 2) * sizeof(float);
    int64_t rk = cu_kv_row_bytes(cache->type, 0, sh->head_dim), rv = cu_kv_row_bytes(cache->type, 1, sh->head_dim);
    size_t st_need = (size_t)n * (size_t)sh->n_head_kv * (size_t)(rk + rv);
    if (ws_need > cb->ws_bytes || st_need > cb->kvstage_bytes) flush(cb); /* a recorded step may name the old ones */
    a->ws = (float *)scratch((void **)&cb->ws, &cb->ws_bytes, ws_need);
    a->ks = (uint8_t *)scratch((void **)&cb->kvstage, &cb->kvstage_bytes, st_need);
    a->vs = a->ks + (size_t)n * (size_t)sh->n_head_kv * (size_t)rk;
    submit(cb, &c);
}

void cuda_attention(backend *be, float *out, const float *qkv, const kv_layer *cache, int64_t pos0, int n,
                    const attn_shape *sh)
{
    cuda_backend *cb = cuda_of(be);
    use_device(cb);
    set_pos(cb, pos0);
    if (cache->type != SPARK_KV_F32) {
        kv_coded_attention(cb, out, qkv, cache, n, sh);
        return;
    }
    int64_t splits = key_splits(cache, (int64_t)n * sh->n_head_kv, 2 * (int64_t)cb->sms, cb->split_keys);
    cmd c = new_cmd(OP_ATTN, n);
    cu_attn_args *a = &c.attn;
    a->out = out;
    a->qkv = qkv;
    a->kc = cache->k;
    a->vc = cache->v;
    a->pos = cb->d_pos;
    a->slots = cache->slots;
    a->qkv_stride = sh->qkv_stride;
    a->n = n;
    a->n_head = sh->n_head;
    a->n_head_kv = sh->n_head_kv;
    a->head_dim = sh->head_dim;
    a->window = cache->window;
    a->splits = (int)splits;
    a->min_split_keys = cb->split_keys;
    a->pdl_early = cb->pdl_early;
    a->scale = sh->scale;
    /* prefill chunks over an f32 cache: the tensor-core kernel (cuda_flash.cu) */
    if (cache->type == SPARK_KV_F32 && cu_flash_enabled() && cu_flash_ok(a)) {
        a->flash = 1;
        a->splits = cu_flash_splits(a, pos0, cb->sms);
        splits = a->splits;
    }
    if (splits > 1) {
        size_t need = (size_t)n * (size_t)sh->n_head * (size_t)splits * (size_t)(sh->head_dim + 2) * sizeof(float);
        if (need > cb->ws_bytes) flush(cb); /* a recorded step may still name the old buffer */
        a->ws = (float *)scratch((void **)&cb->ws, &cb->ws_bytes, need);
    }
    submit(cb, &c);
}

void cuda_kv_store(backend *be, kv_layer *cache, const float *qkv, int64_t pos0, int n, const attn_shape *sh)
{
    cuda_backend *cb = cuda_of(be);
    use_device(cb);
    set_pos(cb, pos0);
    if (cache->type != SPARK_KV_F32) {
        cmd c = new_cmd(OP_KVSTORE, n);
        cu_kv_attn_args *a = &c.kva;
        a->kc = (const uint8_t *)cache->k;
        a->vc = (const uint8_t *)cache->v;
        a->slots = cache->slots;
        a->qkv = qkv;
        a->pos = cb->d_pos;
        a->qkv_stride = sh->qkv_stride;
        a->n = n;
        a->n_head = sh->n_head;
        a->n_head_kv = sh->n_head_kv;
        a->head_dim = sh->head_dim;
        a->fmt = cache->type;
        submit(cb, &c);
        return;
    }
    cmd c = new_cmd(OP_KV, n);
    c.k = cache->k;
    c.v = cache->v;
    c.slots = cache->slots;
    c.x = qkv;
    c.heads = sh->n_head;
    c.rows = sh->n_head_kv;
    c.head_dim = sh->head_dim;
    c.stride = sh->qkv_stride;
    submit(cb, &c);
}

void cuda_gate_heads(backend *be, float *o, const float *g, int n, int n_head, int head_dim)
{
    cuda_backend *cb = cuda_of(be);
    use_device(cb);
    cmd c = new_cmd(OP_GATE, n);
    c.out = o;
    c.x = g;
    c.heads = n_head;
    c.head_dim = head_dim;
    submit(cb, &c);
}

/* Element-wise ops carry no token count: inside a recorded step they are
 * recorded (count covers one token's row), else launched. */
void elementwise(cuda_backend *cb, int op, float *a, const float *b, int64_t count)
{
    cmd c = new_cmd(op, cb->recording ? 1 : 0);
    c.out = a;
    c.x = b;
    c.count = count;
    submit(cb, &c);
}

void cuda_gelu_mul(backend *be, float *a, const float *b, int64_t count)
{
    use_device(cuda_of(be));
    elementwise(cuda_of(be), OP_GELU, a, b, count);
}

void cuda_add(backend *be, float *y, const float *x, int64_t count)
{
    use_device(cuda_of(be));
    elementwise(cuda_of(be), OP_ADD, y, x, count);
}

/* ---- the instruments (engine/hooks.c; kernels in cuda_hooks.cu) ------------------
 * Each is one OP_HOOK command: inside a recorded decode step it is recorded
 * and captured into the step's graph with the rest (the persistent step
 * kernel takes no step that has one: such steps run as graphs). */

void cuda_upload(backend *be, float *buf, const float *host, size_t count)
{
    cuda_backend *cb = cuda_of(be);
    use_device(cb);
    flush(cb);
    CK(cudaMemcpyAsync(buf, host, count * sizeof(float), cudaMemcpyHostToDevice, cb->st));
    CK(cudaStreamSynchronize(cb->st)); /* pageable source */
}

void hook(cuda_backend *cb, cu_hook_args *h)
{
    cmd c = new_cmd(OP_HOOK, cb->recording ? 1 : 0);
    c.hk = *h;
    submit(cb, &c);
}

void cuda_copy(backend *be, float *dst, const float *src, size_t count)
{
    use_device(cuda_of(be));
    cu_hook_args h;
    memset(&h, 0, sizeof h);
    h.kind = CU_HOOK_COPY;
    h.x = dst;
    h.src = src;
    h.count = (int64_t)count;
    hook(cuda_of(be), &h);
}

void cuda_steer(backend *be, float *x, int n, int dim, int mode, float strength, const float *direction,
                const float *unit)
{
    use_device(cuda_of(be));
    cu_hook_args h;
    memset(&h, 0, sizeof h);
    h.kind = CU_HOOK_STEER;
    h.n = n;
    h.dim = dim;
    h.mode = mode;
    h.strength = strength;
    h.x = x;
    h.dir = direction;
    h.unit = unit;
    hook(cuda_of(be), &h);
}

void cuda_ffn_observe(backend *be, const float *act, int n, int n_ff, int top_k, const ffn_observe_bufs *b)
{
    use_device(cuda_of(be));
    cu_hook_args h;
    memset(&h, 0, sizeof h);
    h.kind = CU_HOOK_FFN;
    h.n = n;
    h.dim = n_ff;
    h.top_k = top_k;
    h.src = act;
    h.mass = b->mass;
    h.overlap = b->overlap_sum;
    h.hist = (unsigned long long *)b->histogram;
    h.prev = b->prev_top;
    h.scratch = b->scratch;
    h.has_prev = b->has_prev;
    hook(cuda_of(be), &h);
}

enum { STAMP_SLOTS = 16 }; /* [0] the last stamp, [1 + phase] the sums */

void stamps_ready(cuda_backend *cb)
{
    if (cb->stamps) return;
    flush(cb);
    CK(cudaMalloc((void **)&cb->stamps, STAMP_SLOTS * sizeof *cb->stamps));
    CK(cudaMemsetAsync(cb->stamps, 0, STAMP_SLOTS * sizeof *cb->stamps, cb->st));
}

void cuda_stamp(backend *be, int phase)
{
    cuda_backend *cb = cuda_of(be);
    use_device(cb);
    if (phase >= STAMP_SLOTS - 1) return;
    if (!cb->stamps) { /* first use: allocate outside any recorded step */
        bool rec = cb->recording;
        if (rec) return; /* (spark_session_timing allocates them: not reached) */
        stamps_ready(cb);
    }
    cu_hook_args h;
    memset(&h, 0, sizeof h);
    h.kind = CU_HOOK_STAMP;
    h.phase = phase;
    h.stamps = cb->stamps;
    hook(cb, &h);
}

void cuda_device_times(backend *be, double *out, int count)
{
    cuda_backend *cb = cuda_of(be);
    use_device(cb);
    stamps_ready(cb);
    flush(cb);
    unsigned long long v[STAMP_SLOTS];
    CK(cudaMemcpyAsync(v, cb->stamps, sizeof v, cudaMemcpyDeviceToHost, cb->st));
    CK(cudaMemsetAsync(cb->stamps + 1, 0, (STAMP_SLOTS - 1) * sizeof *cb->stamps, cb->st));
    CK(cudaStreamSynchronize(cb->st));
    for (int i = 0; i < count; i++) out[i] = i + 1 < STAMP_SLOTS ? 1e-9 * (double)v[1 + i] : 0;
}

const backend_ops cuda_ops = {
    "cuda",          cuda_alloc,     cuda_release,  cuda_download,   cuda_destroy,
    cuda_embed,      cuda_rmsnorm,   cuda_matmul,   cuda_rope,       cuda_attention,
    cuda_kv_store,   cuda_gate_heads, cuda_gelu_mul, cuda_add,
    cuda_upload,     cuda_copy,      cuda_steer,    cuda_ffn_observe, cuda_stamp,
    cuda_device_times,
};

/* Every tensor the forward pass reads, uploaded now so the first token does
 * not pay for it. */
spark_status upload_model(cuda_backend *cb, const spark_model *m)
{
    const spark_model_config *c = &m->cfg;
    void *d;
    size_t norm = (size_t)c->n_embd * sizeof(float);
    TRY(upload(cb, m->embedding.data, weight_bytes(&m->embedding), m->embedding.name, &d));
    TRY(upload(cb, m->head.data, weight_bytes(&m->head), m->head.name, &d)); /* tied: found, not copied */
    TRY(upload(cb, m->final_norm, norm, "output_norm", &d));
    for (int i = 0; i < c->n_layer; i++) {
        const layer_weights *L = &m->layers[i];
        TRY(upload(cb, L->attn_norm, norm, "attn_norm", &d));
        TRY(upload(cb, L->ffn_norm, norm, "ffn_norm", &d));
        const weight_ref *mats[] = {&L->qkv, &L->gate, &L->out, &L->ffn_gate, &L->ffn_up, &L->ffn_down};
        for (const weight_ref *w : mats) TRY(upload(cb, w->data, weight_bytes(w), w->name, &d));
    }
    return SPARK_OK;
}

} // namespace

extern "C" int backend_cuda_available(void)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return count > 0;
}

extern "C" int spark_cuda_available(void) { return backend_cuda_available(); }

namespace {

/* Median of n timings (ms) of `work` on `st`, each between two events. */
template <typename F> float median_ms(cudaStream_t st, int n, F work)
{
    cudaEvent_t a, b;
    float t[16], ms = 0;
    if (n > 16) n = 16;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (int i = 0; i < n; i++) {
        CK(cudaEventRecord(a, st));
        work();
        CK(cudaEventRecord(b, st));
        CK(cudaEventSynchronize(b));
        CK(cudaEventElapsedTime(&t[i], a, b));
    }
    for (int i = 1; i < n; i++) /* insertion sort: n is tiny */
        for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
            float x = t[j];
            t[j] = t[j - 1];
            t[j - 1] = x;
        }
    ms = t[n / 2];
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return ms;
}

} // namespace

extern "C" spark_status backend_cuda_probe(int device, size_t bytes, double *copy_gb_s, double *bf16_tflop_s)
{
    *copy_gb_s = *bf16_tflop_s = 0;
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || device < 0 || device >= count) {
        cudaGetLastError();
        return spark_fail(SPARK_ERR_UNSUPPORTED, "no CUDA device: none to probe (device %d)", device);
    }
    CK(cudaSetDevice(device));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    void *x = NULL, *y = NULL;
    if (cudaMalloc(&x, bytes) != cudaSuccess || cudaMalloc(&y, bytes) != cudaSuccess) {
        cudaGetLastError();
        cudaFree(x);
        cudaStreamDestroy(st);
        return spark_fail(SPARK_ERR_NOMEM, "CUDA device %d: no room for the %.1f GB bandwidth probe", device,
                          2.0 * (double)bytes / 1e9);
    }
    CK(cudaMemsetAsync(x, 1, bytes, st));
    for (int i = 0; i < 3; i++) CK(cudaMemcpyAsync(y, x, bytes, cudaMemcpyDeviceToDevice, st));
    float ms = median_ms(st, 10, [&] { CK(cudaMemcpyAsync(y, x, bytes, cudaMemcpyDeviceToDevice, st)); });
    *copy_gb_s = 2.0 * (double)bytes / (ms * 1e-3) / 1e9;
    CK(cudaFree(x));
    CK(cudaFree(y));

    /* the matrix peak: bf16 inputs, fp32 accumulation, as the prefill GEMMs */
    const int N = 8192;
    const size_t mat = (size_t)N * N;
    void *A = NULL, *B = NULL, *C = NULL;
    cublasHandle_t h = NULL;
    bool ok = cudaMalloc(&A, mat * 2) == cudaSuccess && cudaMalloc(&B, mat * 2) == cudaSuccess &&
              cudaMalloc(&C, mat * 4) == cudaSuccess && cublasCreate(&h) == CUBLAS_STATUS_SUCCESS;
    if (ok) {
        CKB(cublasSetStream(h, st));
        CK(cudaMemsetAsync(A, 0x3c, mat * 2, st)); /* bf16 0x3c3c: a normal number */
        CK(cudaMemsetAsync(B, 0x3c, mat * 2, st));
        const float one = 1.0f, zero = 0.0f;
        auto gemm = [&] {
            CKB(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, N, N, &one, A, CUDA_R_16BF, N, B, CUDA_R_16BF, N, &zero, C,
                             CUDA_R_32F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        };
        gemm();
        ms = median_ms(st, 5, gemm);
        *bf16_tflop_s = 2.0 * N * (double)N * N / (ms * 1e-3) / 1e12;
    }
    cudaGetLastError();
    if (h) cublasDestroy(h);
    cudaFree(A);
    cudaFree(B);
    cudaFree(C);
    cudaStreamDestroy(st);
    return SPARK_OK;
}

extern "C" spark_status backend_cuda_memory(int device, uint64_t *free_bytes, uint64_t *total_bytes, char *name,
                                            size_t name_len)
{
    *free_bytes = *total_bytes = 0;
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || device < 0 || device >= count) {
        cudaGetLastError();
        return spark_fail(SPARK_ERR_UNSUPPORTED, "no CUDA device %d", device);
    }
    cudaDeviceProp prop;
    size_t f = 0, t = 0;
    if (cudaGetDeviceProperties(&prop, device) != cudaSuccess || cudaSetDevice(device) != cudaSuccess ||
        cudaMemGetInfo(&f, &t) != cudaSuccess) {
        cudaGetLastError();
        return spark_fail(SPARK_ERR_UNSUPPORTED, "CUDA device %d: cannot read its memory", device);
    }
    if (name && name_len) snprintf(name, name_len, "%s", prop.name);
    *free_bytes = f;
    *total_bytes = t;
    return SPARK_OK;
}

extern "C" spark_status backend_cuda_fill_kv(backend *be, kv_layer *layer, int64_t rows, int32_t n_head_kv,
                                             int32_t head_dim, uint64_t seed)
{
    cuda_backend *cb = cuda_of(be);
    use_device(cb);
    flush(cb);
    if (rows > layer->slots) rows = layer->slots;
    CK(cu_kv_fill(cb->st, layer->k, layer->v, rows, n_head_kv, head_dim, layer->type, seed));
    CK(cudaStreamSynchronize(cb->st));
    return SPARK_OK;
}

extern "C" spark_status backend_cuda_create(const spark_model *model, int device, backend **out)
{
    *out = NULL;
    const spark_model_config *c = &model->cfg;
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        cudaGetLastError();
        return spark_fail(SPARK_ERR_UNSUPPORTED, "no CUDA device: %s",
                          e != cudaSuccess ? cudaGetErrorString(e) : "the driver reports none");
    }
    if (device < 0 || device >= count)
        return spark_fail(SPARK_ERR_ARG, "CUDA device %d does not exist (%d present)", device, count);
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, device));
    if (prop.major < 8)
        return spark_fail(SPARK_ERR_UNSUPPORTED, "CUDA device %d (%s) has compute capability %d.%d; spark needs 8.0+",
                          device, prop.name, prop.major, prop.minor);
    if (c->head_dim > CUDA_MAX_HEAD_DIM || c->n_head % c->n_head_kv || c->n_head / c->n_head_kv > CUDA_MAX_GROUP)
        return spark_fail(SPARK_ERR_UNSUPPORTED,
                          "CUDA backend: head_dim %d with %d query heads per KV head is not supported "
                          "(at most %d and %d)",
                          c->head_dim, c->n_head / c->n_head_kv, CUDA_MAX_HEAD_DIM, CUDA_MAX_GROUP);
    size_t free_b = 0, total_b = 0;
    CK(cudaSetDevice(device));
    CK(cudaMemGetInfo(&free_b, &total_b));
    if (model->weight_bytes + ((uint64_t)256 << 20) > free_b)
        return spark_fail(SPARK_ERR_NOMEM, "CUDA device %d (%s): the weights need %.2f GB, %.2f GB is free", device,
                          prop.name, model->weight_bytes / 1e9, free_b / 1e9);

    cuda_backend *cb = (cuda_backend *)calloc(1, sizeof *cb);
    if (!cb) return spark_fail(SPARK_ERR_NOMEM, "no memory for the CUDA backend");
    cb->base.ops = &cuda_ops;
    cb->base.n_threads = 1;
    cb->base.device_memory = 1;
    cb->device = device;
    cb->sms = prop.multiProcessorCount;
    CK(cudaStreamCreateWithFlags(&cb->st, cudaStreamNonBlocking));
    if (cublasCreate(&cb->blas) != CUBLAS_STATUS_SUCCESS) {
        cb->blas = NULL;
        cuda_destroy(&cb->base);
        return spark_fail(SPARK_ERR_UNSUPPORTED, "CUDA device %d: cuBLAS could not be initialised", device);
    }
    CKB(cublasSetStream(cb->blas, cb->st));
    const char *g = getenv("SPARK_CUDA_GRAPH");
    cb->graphs = !(g && !strcmp(g, "0"));
    /* SPARK_CUDA_FAST=0: the first backend's kernels only (no fgemv, no
     * fusion, no programmatic launches); SPARK_CUDA_FUSE=0 / SPARK_CUDA_PDL=0
     * turn off one part of the fast path */
    const char *f = getenv("SPARK_CUDA_FAST");
    cb->fast = !(f && !strcmp(f, "0"));
    const char *fu = getenv("SPARK_CUDA_FUSE");
    cb->fuse_on = cb->fast && !(fu && !strcmp(fu, "0"));
    const char *pd = getenv("SPARK_CUDA_PDL");
    cb->pdl_on = cb->fast && prop.major >= 9 && !(pd && !strcmp(pd, "0"));
    if (cb->pdl_on && !cu_pdl_probe(cb->st)) cb->pdl_on = 0; /* not capturable here: plain launches */
    /* SPARK_CUDA_MEGA=1: decode steps as one persistent kernel (cuda_step.cu)
     * instead of graphs of fused kernels; off by default: correct, but not
     * yet faster (bench/cuda_runs.md, run 5) */
    const char *mg = getenv("SPARK_CUDA_MEGA");
    cb->mega_on = cb->fuse_on && cb->graphs && mg && !strcmp(mg, "1") && cu_mega_supported(device);
    if (cb->fast) {
        const char *fl = getenv("SPARK_CUDA_FG_FLY");
        cu_fgemv_tune(fl ? atoi(fl) : 0);
        cu_fgemv_prepare(c->n_embd);
        cu_fgemv_prepare(c->n_ff);
        cu_fgemv_prepare((int64_t)c->n_head * c->head_dim);
    }
    CK(cudaMalloc((void **)&cb->d_pos, sizeof(int64_t)));
    /* SPARK_CUDA_ROPETAB=0: rope angles computed by every rope_kv launch */
    const char *rt = getenv("SPARK_CUDA_ROPETAB"), *sk = getenv("SPARK_CUDA_SPLIT_KEYS");
    if (cb->fuse_on && !(rt && !strcmp(rt, "0")))
        CK(cudaMalloc((void **)&cb->ropetab, ROPE_TABLES * CUDA_MAX_HEAD_DIM * sizeof(float)));
    cb->split_keys = sk && atoi(sk) > 0 ? atoi(sk) : SPLIT_MIN_KEYS;
    const char *pe = getenv("SPARK_CUDA_PDL_EARLY"); /* =0: off (on: ~1 % faster decode, run 7) */
    cb->pdl_early = !(pe && !strcmp(pe, "0"));
    CK(cu_kv_init()); /* the TurboQuant tables on this device */
    /* a coded cache's single-token stage: allocated here, never grown inside a step */
    scratch((void **)&cb->kvstage, &cb->kvstage_bytes,
            (size_t)c->n_head_kv * 2 * (size_t)cu_kv_row_bytes(CU_KV_F16, 0, c->head_dim));
    scratch((void **)&cb->ids, &cb->ids_bytes, 4096 * sizeof(int32_t));
    /* the most a single-token attention needs: n_head x splits x (head_dim + 2) */
    scratch((void **)&cb->ws, &cb->ws_bytes,
            (size_t)c->n_head * (size_t)(2 * cb->sms) * (size_t)(c->head_dim + 2) * sizeof(float));
    spark_status st = upload_model(cb, model);
    if (st != SPARK_OK) {
        cuda_destroy(&cb->base);
        return st;
    }
    *out = &cb->base;
    return SPARK_OK;
}

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

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

namespace {

constexpr size_t PANEL_BYTES = (size_t)128 << 20; /* decoded weight rows per cuBLAS call */
constexpr int SPLIT_MIN_KEYS = 64;                /* a key split below this is not worth a block */

struct dev_entry {
    const void *host;
    void *dev;
};

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
    void *bf;       /* activations as a bf16 pair (hi, then lo), for cuBLAS */
    size_t bf_bytes;
    float *panel;   /* decoded weight rows, for cuBLAS */
    size_t panel_bytes;
};

cuda_backend *cuda_of(backend *be) { return (cuda_backend *)be; }

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
    CK(cudaFree(buf));
}

void cuda_download(backend *be, float *host_dst, const float *buf, size_t count)
{
    cuda_backend *cb = cuda_of(be);
    use_device(cb);
    CK(cudaMemcpyAsync(host_dst, buf, count * sizeof(float), cudaMemcpyDeviceToHost, cb->st));
    CK(cudaStreamSynchronize(cb->st));
}

void cuda_destroy(backend *be)
{
    cuda_backend *cb = cuda_of(be);
    use_device(cb);
    if (cb->st) cudaStreamSynchronize(cb->st);
    for (size_t i = 0; i < cb->cap; i++)
        if (cb->tab[i].host) cudaFree(cb->tab[i].dev);
    free(cb->tab);
    cudaFree(cb->ids);
    cudaFree(cb->ws);
    cudaFree(cb->bf);
    cudaFree(cb->panel);
    if (cb->blas) cublasDestroy(cb->blas);
    if (cb->st) cudaStreamDestroy(cb->st);
    free(cb);
}

/* ---- ops ----------------------------------------------------------------------- */

void cuda_embed(backend *be, float *out, const weight_ref *table, const int32_t *ids, int n)
{
    cuda_backend *cb = cuda_of(be);
    use_device(cb);
    const void *t = dev_weight(cb, table);
    size_t bytes = (size_t)n * sizeof(int32_t);
    if (bytes > cb->ids_bytes) CK(cudaStreamSynchronize(cb->st)); /* the old buffer may still be read */
    int32_t *d_ids = (int32_t *)scratch((void **)&cb->ids, &cb->ids_bytes, bytes);
    CK(cudaMemcpyAsync(d_ids, ids, bytes, cudaMemcpyHostToDevice, cb->st));
    CK(cu_embed(cb->st, out, t, table->dtype, table->cols, (int64_t)dtype_row_bytes(table->dtype, table->cols),
                d_ids, n));
}

void cuda_rmsnorm(backend *be, float *out, const float *x, const float *w, int n, int dim, float eps)
{
    cuda_backend *cb = cuda_of(be);
    use_device(cb);
    CK(cu_rmsnorm(cb->st, out, x, dev_vector(cb, w, dim), n, dim, eps));
}

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
void gemm_f32(cuda_backend *cb, float *out, const float *x, const void *W, const weight_ref *w, int n)
{
    const float one = 1.0f, zero = 0.0f;
    int64_t rows = w->rows, cols = w->cols;
    if (w->dtype == SPARK_DTYPE_F32) {
        CKB(cublasSgemm(cb->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, n, (int)cols, &one, (const float *)W,
                        (int)cols, x, (int)cols, &zero, out, (int)rows));
        return;
    }
    int64_t row_bytes = (int64_t)dtype_row_bytes(w->dtype, (uint64_t)cols);
    int64_t per = (int64_t)(PANEL_BYTES / ((size_t)cols * sizeof(float)));
    if (per < 1) per = 1;
    if (per > rows) per = rows;
    float *panel = (float *)scratch((void **)&cb->panel, &cb->panel_bytes, (size_t)per * (size_t)cols * sizeof(float));
    for (int64_t r0 = 0; r0 < rows; r0 += per) {
        int64_t pr = rows - r0 < per ? rows - r0 : per;
        CK(cu_dequant_rows(cb->st, panel, W, w->dtype, r0, pr, cols, row_bytes));
        CKB(cublasSgemm(cb->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)pr, n, (int)cols, &one, panel, (int)cols, x,
                        (int)cols, &zero, out + r0, (int)rows));
    }
}

void cuda_matmul(backend *be, float *out, const float *x, const weight_ref *w, int n)
{
    cuda_backend *cb = cuda_of(be);
    use_device(cb);
    const void *W = dev_weight(cb, w);
    if (n <= 2 * CUDA_GEMV_MAX_TOKENS) { /* decode: stream the weights once per 4 tokens */
        int64_t row_bytes = (int64_t)dtype_row_bytes(w->dtype, (uint64_t)w->cols);
        for (int t0 = 0; t0 < n; t0 += CUDA_GEMV_MAX_TOKENS) {
            int nt = n - t0 < CUDA_GEMV_MAX_TOKENS ? n - t0 : CUDA_GEMV_MAX_TOKENS;
            CK(cu_gemv(cb->st, out + (int64_t)t0 * w->rows, x + (int64_t)t0 * w->cols, W, w->dtype, w->rows, w->cols,
                       row_bytes, nt));
        }
        return;
    }
    if (w->dtype == SPARK_DTYPE_BF16) gemm_bf16(cb, out, x, W, w->rows, w->cols, n);
    else gemm_f32(cb, out, x, W, w, n);
}

void cuda_rope(backend *be, float *x, int n, int64_t stride, int n_heads, int head_dim, int64_t pos0,
               const rope_class *rc)
{
    cuda_backend *cb = cuda_of(be);
    use_device(cb);
    CK(cu_rope(cb->st, x, n, stride, n_heads, head_dim, pos0, rc->rot_dims, rc->theta));
}

void cuda_attention(backend *be, float *out, const float *qkv, const kv_layer *cache, int64_t pos0, int n,
                    const attn_shape *sh)
{
    cuda_backend *cb = cuda_of(be);
    use_device(cb);
    /* the most keys any query of the chunk sees */
    int64_t keys = cache->window && cache->window < pos0 + n ? cache->window : pos0 + n;
    int64_t blocks = (int64_t)n * sh->n_head_kv;
    int64_t target = 2 * (int64_t)cb->sms;
    int64_t splits = 1;
    if (blocks < target) { /* flash-decoding: split the key range until the GPU is full */
        splits = (target + blocks - 1) / blocks;
        int64_t most = (keys + SPLIT_MIN_KEYS - 1) / SPLIT_MIN_KEYS;
        if (splits > most) splits = most;
        if (splits < 1) splits = 1;
    }
    cu_attn_args a;
    memset(&a, 0, sizeof a);
    a.out = out;
    a.qkv = qkv;
    a.kc = cache->k;
    a.vc = cache->v;
    a.pos0 = pos0;
    a.slots = cache->slots;
    a.qkv_stride = sh->qkv_stride;
    a.n = n;
    a.n_head = sh->n_head;
    a.n_head_kv = sh->n_head_kv;
    a.head_dim = sh->head_dim;
    a.window = cache->window;
    a.splits = (int)splits;
    a.keys_per_split = (int)((keys + splits - 1) / splits);
    a.scale = sh->scale;
    if (splits > 1) {
        size_t need = (size_t)n * (size_t)sh->n_head * (size_t)splits * (size_t)(sh->head_dim + 2) * sizeof(float);
        a.ws = (float *)scratch((void **)&cb->ws, &cb->ws_bytes, need);
    }
    CK(cu_attention(cb->st, &a));
}

void cuda_kv_store(backend *be, kv_layer *cache, const float *qkv, int64_t pos0, int n, const attn_shape *sh)
{
    cuda_backend *cb = cuda_of(be);
    use_device(cb);
    CK(cu_kv_store(cb->st, cache->k, cache->v, cache->slots, qkv, pos0, n, sh->n_head, sh->n_head_kv, sh->head_dim,
                   sh->qkv_stride));
}

void cuda_gate_heads(backend *be, float *o, const float *g, int n, int n_head, int head_dim)
{
    cuda_backend *cb = cuda_of(be);
    use_device(cb);
    CK(cu_gate_heads(cb->st, o, g, n, n_head, head_dim));
}

void cuda_gelu_mul(backend *be, float *a, const float *b, int64_t count)
{
    cuda_backend *cb = cuda_of(be);
    use_device(cb);
    CK(cu_gelu_mul(cb->st, a, b, count));
}

void cuda_add(backend *be, float *y, const float *x, int64_t count)
{
    cuda_backend *cb = cuda_of(be);
    use_device(cb);
    CK(cu_add(cb->st, y, x, count));
}

const backend_ops cuda_ops = {
    "cuda",          cuda_alloc,     cuda_release,  cuda_download,   cuda_destroy,
    cuda_embed,      cuda_rmsnorm,   cuda_matmul,   cuda_rope,       cuda_attention,
    cuda_kv_store,   cuda_gate_heads, cuda_gelu_mul, cuda_add,
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
    spark_status st = upload_model(cb, model);
    if (st != SPARK_OK) {
        cuda_destroy(&cb->base);
        return st;
    }
    *out = &cb->base;
    return SPARK_OK;
}

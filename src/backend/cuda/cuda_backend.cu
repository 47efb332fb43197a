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
 *   a few tokens (gemv_limit)      GEMV kernels (cuda_kernels.cu), fp32 x;
 *   bf16 weights, more tokens      cuBLAS bf16 tensor-core GEMM on x split as
 *                                  bf16 hi + lo, fp32 accumulate: as exact as
 *                                  fp32 x to ~2^-16; hi and lo as one stacked
 *                                  GEMM for a few tokens, else two GEMMs
 *                                  (SPARK_CUDA_PREFILL_X=bf16: x rounded to
 *                                  bf16 once, one GEMM, 1.36-1.5x faster
 *                                  prefill: the published reference's own
 *                                  precision, as far from the exact forward
 *                                  as its bf16 rounding is; run 41);
 *   f32 weights                    cuBLAS SGEMM;
 *   f16 and block formats          rows decoded to bf16 hi + lo panels,
 *                                  tensor-core GEMMs (gemm_panels).
 * (These paths and the x pairs: cuda_gemm.cu.)
 * All work goes to one stream; `download` is the only synchronization.
 * CUDA failures inside an op are bugs or a dying device: they abort with
 * the call, error and location named. A single-token step's ops are
 * recorded as commands and replayed as a CUDA graph: cuda_graph.cu; the
 * state the backend's files share: cuda_state.h.
 */
#include "backend/cuda/cuda_state.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

namespace spark_cuda {

[[noreturn]] void cuda_fatal(const char *call, const char *err, const char *file, int line)
{
    fprintf(stderr, "spark: CUDA backend: %s failed: %s (%s:%d)\n", call, err, file, line);
    abort();
}

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

/* The bytes of w's rows in the device layout (cu_dev_row_bytes: Q6_K's
 * differ from the file's), and the stride of one. */
int64_t dev_row_bytes(const weight_ref *w)
{
    return cu_dev_row_bytes(w->dtype, (int64_t)w->cols, (int64_t)dtype_row_bytes(w->dtype, (uint64_t)w->cols));
}

size_t dev_weight_bytes(const weight_ref *w) { return (size_t)dev_row_bytes(w) * (size_t)w->rows; }

/* Copy a block-format matrix (host, `bytes` in the file's layout)
 * into d in the device layout (cu_repack_rows), through a staging buffer. */
cudaError_t upload_repacked(cuda_backend *cb, void *d, const weight_ref *w, size_t bytes)
{
    void *stage = NULL;
    cudaError_t e = cudaMalloc(&stage, bytes);
    /* on the repack's stream: a cudaMemcpy from pageable memory may return
     * before its DMA lands, and cb->st does not wait for the legacy stream */
    if (e == cudaSuccess) e = cudaMemcpyAsync(stage, w->data, bytes, cudaMemcpyHostToDevice, cb->st);
    if (e == cudaSuccess)
        e = cu_repack_rows(cb->st, d, stage, w->dtype, (int64_t)w->rows, (int64_t)w->cols,
                           (int64_t)dtype_row_bytes(w->dtype, (uint64_t)w->cols));
    if (e == cudaSuccess) e = cudaStreamSynchronize(cb->st);
    if (stage) cudaFree(stage);
    return e;
}

/* The device copy of `bytes` bytes at host address `host`, uploaded on first
 * use; a weight matrix `w` (else NULL) in the format's device layout
 * (dev_weight_bytes of it on the device). */
spark_status upload(cuda_backend *cb, const void *host, size_t bytes, const char *what, void **dev,
                    const weight_ref *w = NULL)
{
    if ((*dev = tab_find(cb, host))) return SPARK_OK;
    void *d = NULL;
    const size_t dev_bytes = w ? dev_weight_bytes(w) : bytes;
    cudaError_t e = cudaMalloc(&d, dev_bytes ? dev_bytes : 16);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return spark_fail(SPARK_ERR_NOMEM, "CUDA backend: cannot allocate %zu bytes of device memory for %s (%s)",
                          dev_bytes, what, cudaGetErrorString(e));
    }
    if (w && cu_repack_kind(w->dtype)) {
        e = upload_repacked(cb, d, w, bytes);
    } else { /* on cb->st, waited for (see upload_repacked) */
        e = cudaMemcpyAsync(d, host, bytes, cudaMemcpyHostToDevice, cb->st);
        if (e == cudaSuccess) e = cudaStreamSynchronize(cb->st);
    }
    if (e != cudaSuccess) {
        cudaGetLastError();
        cudaFree(d);
        return spark_fail(SPARK_ERR_INTERNAL, "CUDA backend: uploading %s failed (%s)", what, cudaGetErrorString(e));
    }
    spark_status st = tab_put(cb, host, d);
    if (st != SPARK_OK) {
        cudaFree(d);
        return st;
    }
    cb->weight_bytes += dev_bytes;
    *dev = d;
    return SPARK_OK;
}

size_t weight_bytes(const weight_ref *w) { return (size_t)dtype_row_bytes(w->dtype, (uint64_t)w->cols) * (size_t)w->rows; }

const void *dev_weight(cuda_backend *cb, const weight_ref *w)
{
    void *d;
    if (upload(cb, w->data, weight_bytes(w), w->name, &d, w) != SPARK_OK)
        cuda_fatal("upload", spark_last_error(), __FILE__, __LINE__);
    return d;
}

const float *dev_vector(cuda_backend *cb, const float *host, int dim)
{
    void *d;
    if (upload(cb, host, (size_t)dim * sizeof(float), "a norm vector", &d) != SPARK_OK)
        cuda_fatal("upload", spark_last_error(), __FILE__, __LINE__);
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
    pair_forget(cuda_of(be)); /* a later buffer may take its address */
    CK(cudaFree(buf));
}

double host_now()
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The copy waits for the stream; phase timing counts that wait as the host's
 * wait for the device, SPARK_CUDA_VERBOSE as the step's download. (A
 * page-locked bounce buffer for the logits measured the same: bench/cuda_runs.md
 * run 10.) */
void cuda_download(backend *be, float *host_dst, const float *buf, size_t count)
{
    cuda_backend *cb = cuda_of(be);
    use_device(cb);
    flush(cb);
    const bool timed = be->timing || cb->verbose;
    const double t0 = timed ? host_now() : 0;
    CK(cudaMemcpyAsync(host_dst, buf, count * sizeof(float), cudaMemcpyDeviceToHost, cb->st));
    CK(cudaStreamSynchronize(cb->st));
    if (!timed) return;
    const double dt = host_now() - t0;
    if (be->timing) be->device_wait += dt;
    if (cb->verbose) cb->host_wait += dt;
}

void cuda_destroy(backend *be)
{
    cuda_backend *cb = cuda_of(be);
    use_device(cb);
    if (cb->st) cudaStreamSynchronize(cb->st);
    timeline_dump(cb);
    if (getenv("SPARK_CUDA_VERBOSE"))
        fprintf(stderr,
                "spark: CUDA backend: %ld decode-step graph captures, %ld replays; fast path %d (fuse %d, pdl %d), "
                "fusion: %ld commands -> %zu; persistent step kernel %d: %ld launches; "
                "one-launch attention (cluster %d): %ld launches; tensor-core prefill attention: %ld chunks (%ld over "
                "16-bit caches); products of 2+ tokens: %ld GEMV, %ld GEMM (%ld stacked GEMMs, %ld with x in bf16 alone); "
                "GEMMs' x pairs: %ld split, %ld written by their producer, %ld reused\n",
                cb->captures, cb->replays, cb->fast, cb->fuse_on, cb->pdl_on, (long)cb->fused + (long)cb->nfq, cb->nfq,
                cb->mega_on, cb->mega_runs, cb->att_cluster, cb->att_step_runs, cb->flash_runs, cb->flash_16bit_runs,
                cb->gemv_products, cb->gemm_products, cb->stacked_products, cb->x_bf16_products, cb->pair_splits,
                cb->pair_written, cb->pair_reused);
    if (cb->verbose && cb->host_steps)
        fprintf(stderr,
                "spark: CUDA host time per decode step (%ld steps, %zu commands of %zu bytes): recording "
                "%.1f us, flush (compare + launch) %.1f us, download copy + wait %.1f us\n",
                cb->host_steps, cb->nq, sizeof(cmd), 1e6 * cb->host_record / cb->host_steps, 1e6 * cb->host_flush / cb->host_steps,
                1e6 * cb->host_wait / cb->host_steps);
    if (cb->exec) cudaGraphExecDestroy(cb->exec);
    cu_mega_destroy(cb->mk);
    free(cb->mq);
    free(cb->q);
    free(cb->gq);
    free(cb->fq);
    cudaFree(cb->stamps);
    cudaFree(cb->tl_dev);
    free(cb->tl_cmd);
    free(cb->tl_path);
    cudaFree(cb->d_pos);
    cudaFree(cb->pick_keys);
    cudaFreeHost(cb->pick_host);
    cudaFree(cb->cand_dev);
    if (cb->cand_host) cudaFreeHost(cb->cand_host);
    for (int i = 0; i < 2; i++)
        if (cb->pick_ev[i]) cudaEventDestroy(cb->pick_ev[i]);
    for (size_t i = 0; i < cb->cap; i++)
        if (cb->tab[i].host) cudaFree(cb->tab[i].dev);
    free(cb->tab);
    cudaFree(cb->ids);
    cudaFree(cb->ws);
    cudaFree(cb->kvstage);
    cudaFree(cb->ropetab);
    cudaFree(cb->bf);
    cudaFree(cb->panel);
    cudaFree(cb->wide);
    if (cb->blas) cublasDestroy(cb->blas);
    if (cb->st) cudaStreamDestroy(cb->st);
    free(cb);
}

/* Launch one command's work on the stream (or into the graph being captured:
 * then nothing here may allocate or synchronize, and nothing does for the
 * single-token commands a decode step is made of). */
void run_cmd(cuda_backend *cb, const cmd *c)
{
    cudaStream_t st = cb->st;
    if (c->op != OP_MATMUL) pair_forget(cb); /* it may write the floats whose pair bf holds */
    switch (c->op) {
    case OP_EMBED: CK(cu_embed(st, c->out, c->w, c->dtype, c->cols, c->row_bytes, c->ids, c->n)); return;
    case OP_RMSNORM: {
        const cu_pair pair = producer_pair(cb, c, c->out, (size_t)c->n * (size_t)c->cols);
        CK(cu_rmsnorm(st, c->out, c->x, c->y, c->n, (int)c->cols, c->eps, pair));
        return;
    }
    case OP_MATMUL:
        run_matmul(cb, c);
        pair_check_output(cb, c);
        return;
    case OP_ROPE:
        CK(cu_rope(st, c->out, c->n, c->stride, c->heads, c->head_dim, cb->d_pos, c->rot_dims, c->theta));
        return;
    case OP_ATTN: {
        cu_attn_args a = c->attn;
        a.pdl = cb->pdl_now;
        CK(a.flash ? cu_flash_attention(st, &a) : a.step ? cu_attn_step(st, &a, cb->att_cluster) : cu_attention(st, &a));
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
    case OP_GATE: {
        const cu_pair pair = producer_pair(cb, c, c->out, (size_t)c->n * (size_t)c->heads * (size_t)c->head_dim);
        CK(cu_gate_heads(st, c->out, c->x, c->n, c->heads, c->head_dim, pair));
        return;
    }
    case OP_GELU: {
        const cu_pair pair = producer_pair(cb, c, c->out, (size_t)c->count);
        CK(cu_gelu_mul(st, c->out, c->x, c->count, pair));
        return;
    }
    case OP_ADD: CK(cu_add(st, c->out, c->x, c->count)); return;
    case OP_HOOK: CK(cu_hook(st, &c->hk, cb->pdl_now)); return;
    case OP_PICK: CK(cu_pick(st, c->x, (int)c->count, cb->pick_keys, cb->pdl_now != 0)); return;
    }
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

cu_fgemv_args fgemv_of_matmul(const cmd *m)
{
    cu_fgemv_args a;
    memset(&a, 0, sizeof a);
    a.dtype = m->dtype;
    a.x = m->x;
    a.w0 = m->w;
    a.out0 = m->out;
    a.rows0 = m->rows;
    a.row_bytes = m->row_bytes;
    a.cols = (int)m->cols;
    return a;
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
    c.row_bytes = dev_row_bytes(table);
    if (n == 1 && cb->graphs) {
        if (cb->verbose) cb->host_t0 = host_now();
        cb->recording = 1;
        cb->nq = 0;
        cb->step_id = ids ? ids[0] : -1; /* -1: the last pick's id (cu_set_step) */
        c.ids = cb->ids;
        record(cb, &c);
        return;
    }
    if (!ids) { /* the last pick's id, set on the device */
        c.ids = cb->ids;
        CK(cu_set_step(cb->st, NULL, 0, cb->ids, -1, cb->pick_keys));
        run_cmd(cb, &c);
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
    c.row_bytes = dev_row_bytes(w);
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

/* What the attention and cache-store commands of both cache kinds take
 * alike: the cache (f32 rows for cu_attn_args, coded bytes for
 * cu_kv_attn_args), the chunk's qkv rows, the device position, the shape. */
template <class A>
static void cache_args(A *a, const cuda_backend *cb, const kv_layer *cache, const float *qkv, int n,
                       const attn_shape *sh)
{
    a->kc = (decltype(a->kc))cache->k;
    a->vc = (decltype(a->vc))cache->v;
    a->slots = cache->slots;
    a->qkv = qkv;
    a->pos = cb->d_pos;
    a->qkv_stride = sh->qkv_stride;
    a->n = n;
    a->n_head = sh->n_head;
    a->n_head_kv = sh->n_head_kv;
    a->head_dim = sh->head_dim;
}

/* An attention's arguments (either kind of cache): cache_args', and where it
 * writes, over how many key splits. */
template <class A>
static void attn_args(A *a, const cuda_backend *cb, const kv_layer *cache, const float *qkv, int n,
                      const attn_shape *sh, float *out, int64_t splits)
{
    cache_args(a, cb, cache, qkv, n, sh);
    a->out = out;
    a->window = cache->window;
    a->splits = (int)splits;
    a->scale = sh->scale;
}

/* Bytes of the split partials (each split's output, max and sum a head). */
static size_t split_ws_bytes(int n, const attn_shape *sh, int64_t splits)
{
    return (size_t)n * (size_t)sh->n_head * (size_t)splits * (size_t)(sh->head_dim + 2) * sizeof(float);
}

/* Attention over a coded cache (cuda_kv.cu). Flash-decoding splits from the
 * capacity, as for f32 (launch shape independent of the position): enough
 * blocks to fill every SM once (the kernel's occupancy), each split at least
 * 128 keys at full capacity.
 * Scratch (split partials, the chunk's encoded rows) grows outside a
 * recorded step only. */
static bool step_keys_ok(const cuda_backend *cb, const kv_layer *cache, int64_t pos0, int n)
{
    const int64_t keys = cache->window && cache->window < pos0 + n ? cache->window : pos0 + n;
    return n == 1 && cb->att_cluster > 0 && keys <= cb->att_step_keys;
}

/* a cache's SPARK_KV_* type is its CU_KV_* format (kv_fmt, fmt) */
static_assert((int)SPARK_KV_F32 == CU_KV_F32 && (int)SPARK_KV_F16 == CU_KV_F16 && (int)SPARK_KV_BF16 == CU_KV_BF16 &&
                  (int)SPARK_KV_TQ2 == CU_KV_TQ2 && (int)SPARK_KV_TQ3 == CU_KV_TQ3 &&
                  (int)SPARK_KV_TQ3_5 == CU_KV_TQ3_5 && (int)SPARK_KV_TQ4 == CU_KV_TQ4,
              "spark.h's KV types and cuda_kv.h's formats must share their order");

static void kv_coded_attention(cuda_backend *cb, float *out, const float *qkv, const kv_layer *cache, int64_t pos0, int n,
                        const attn_shape *sh)
{
    const int64_t KV_SPLIT_MIN_KEYS = 128;
    int per_sm = cu_kv_attn_blocks_per_sm(cache->type, sh->n_head, sh->n_head_kv); /* one whole wave */
    int64_t splits = key_splits(cache, (int64_t)n * sh->n_head_kv, (per_sm > 0 ? per_sm : 4) * (int64_t)cb->sms,
                                KV_SPLIT_MIN_KEYS);
    cmd c = new_cmd(OP_KVATTN, n);
    cu_kv_attn_args *a = &c.kva;
    attn_args(a, cb, cache, qkv, n, sh, out, splits);
    a->fmt = cache->type;
    /* the step may become the one-launch attention (fuse), as an f32 cache's, where
     * that kernel takes the format (cu_attn_step_ok: f16 / bf16) */
    a->step_ok = step_keys_ok(cb, cache, pos0, n);
    a->pdl_early = cb->pdl_early;
    size_t ws_need = split_ws_bytes(n, sh, splits);
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
    int64_t splits = key_splits(cache, (int64_t)n * sh->n_head_kv, (int64_t)cb->att_blocks_per_sm * cb->sms, cb->split_keys);
    cmd c = new_cmd(OP_ATTN, n);
    cu_attn_args *a = &c.attn;
    attn_args(a, cb, cache, qkv, n, sh, out, splits);
    a->kv_fmt = (int)cache->type; /* SPARK_KV_* and CU_KV_* share their order (asserted above) */
    /* prefill chunks: the tensor-core kernel (cuda_flash.cu), for the formats cu_flash_ok takes */
    const bool flash = cu_flash_enabled() && cu_flash_ok(a);
    if (cache->type != SPARK_KV_F32 && !flash) {
        kv_coded_attention(cb, out, qkv, cache, pos0, n, sh);
        return;
    }
    a->min_split_keys = cb->split_keys;
    a->pdl_early = cb->pdl_early;
    /* the one-launch form (fuse) while the keys are few; a field of the
     * recorded command, so crossing the limit captures a new graph once */
    a->step_ok = step_keys_ok(cb, cache, pos0, n);
    if (flash) {
        a->flash = 1;
        a->splits = cu_flash_splits(a, pos0, cb->sms);
        splits = a->splits;
        cb->flash_runs += 1;
        cb->flash_16bit_runs += cache->type != SPARK_KV_F32;
    }
    if (splits > 1) {
        size_t need = split_ws_bytes(n, sh, splits);
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
        cache_args(a, cb, cache, qkv, n, sh);
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

const backend_ops cuda_ops = {
    "cuda",          cuda_alloc,     cuda_release,  cuda_download,   cuda_destroy,
    cuda_embed,      cuda_rmsnorm,   cuda_matmul,   cuda_rope,       cuda_attention,
    cuda_kv_store,   cuda_gate_heads, cuda_gelu_mul, cuda_add,
    cuda_upload,     cuda_copy,      cuda_steer,    cuda_ffn_observe, cuda_stamp,
    cuda_device_times,
    cuda_pick,       cuda_pick_read, cuda_pick_drop,
    1, /* pick_ahead: the next step runs while the host reads a pick */
    cuda_candidates,
};

/* Every tensor the forward pass reads, uploaded now so the first token does
 * not pay for it. */
spark_status upload_model(cuda_backend *cb, const spark_model *m)
{
    const spark_model_config *c = &m->cfg;
    void *d;
    size_t norm = (size_t)c->n_embd * sizeof(float);
    TRY(upload(cb, m->embedding.data, weight_bytes(&m->embedding), m->embedding.name, &d, &m->embedding));
    TRY(upload(cb, m->head.data, weight_bytes(&m->head), m->head.name, &d, &m->head)); /* tied: found, not copied */
    TRY(upload(cb, m->final_norm, norm, "output_norm", &d));
    for (int i = 0; i < c->n_layer; i++) {
        const layer_weights *L = &m->layers[i];
        TRY(upload(cb, L->attn_norm, norm, "attn_norm", &d));
        TRY(upload(cb, L->ffn_norm, norm, "ffn_norm", &d));
        const weight_ref *mats[] = {&L->qkv, &L->gate, &L->out, &L->ffn_gate, &L->ffn_up, &L->ffn_down};
        for (const weight_ref *w : mats) TRY(upload(cb, w->data, weight_bytes(w), w->name, &d, w));
    }
    return SPARK_OK;
}

} // namespace spark_cuda

using namespace spark_cuda;

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
    CK(cudaMalloc((void **)&cb->pick_keys, CU_PICK_BLOCKS * sizeof *cb->pick_keys));
    CK(cudaMallocHost((void **)&cb->pick_host, 2 * CU_PICK_BLOCKS * sizeof *cb->pick_host));
    for (int i = 0; i < 2; i++) CK(cudaEventCreateWithFlags(&cb->pick_ev[i], cudaEventDisableTiming));
    /* SPARK_CUDA_ROPETAB=0: rope angles computed by every rope_kv launch */
    const char *rt = getenv("SPARK_CUDA_ROPETAB"), *sk = getenv("SPARK_CUDA_SPLIT_KEYS");
    if (cb->fuse_on && !(rt && !strcmp(rt, "0")))
        CK(cudaMalloc((void **)&cb->ropetab, ROPE_TABLES * CUDA_MAX_HEAD_DIM * sizeof(float)));
    cb->split_keys = sk && atoi(sk) > 0 ? atoi(sk) : SPLIT_MIN_KEYS;
    cb->verbose = getenv("SPARK_CUDA_VERBOSE") != NULL;
    const char *qg = getenv("SPARK_CUDA_QGEMM");
    cb->qgemm_f32 = qg && !strcmp(qg, "f32");
    const char *px = getenv("SPARK_CUDA_PREFILL_X"); /* =bf16: x rounded once, half the products */
    cb->x_bf16 = px && !strcmp(px, "bf16");
    const char *xp = getenv("SPARK_CUDA_XPAIR"); /* =0: no producer writes a GEMM's pair, every GEMM splits */
    cb->pair_fuse = !(xp && !strcmp(xp, "0"));
    /* =groups: the few-token block-format products a 32-value group a lane (gemv_groups_kernel) */
    const char *qv = getenv("SPARK_CUDA_QGEMV");
    cu_gemv_units(!(qv && !strcmp(qv, "groups")));
    const char *sk2 = getenv("SPARK_CUDA_STACK_TOKENS"); /* =0: separate products at every size */
    cb->stack_tokens = sk2 ? atoi(sk2) : -1; /* -1: each format's default, stack_limit */
    const char *gt = getenv("SPARK_CUDA_GEMV_TOKENS");
    cb->gemv_tokens = gt && atoi(gt) > 0 ? atoi(gt) : 0;
    const char *pe = getenv("SPARK_CUDA_PDL_EARLY"); /* =0: off (on: ~1 % faster decode, run 7) */
    cb->pdl_early = !(pe && !strcmp(pe, "0"));
    /* one wave of split blocks: the kernel's registers leave one block an
     * SM, and a second wave cost 5 % at ctx 32k (bench/cuda_runs.md run 23) */
    const char *bps = getenv("SPARK_CUDA_ATT_BPS");
    cb->att_blocks_per_sm = bps && atoi(bps) > 0 ? atoi(bps) : 1;
    /* SPARK_CUDA_ATTSTEP=0: a decode step's attention as rope_kv + attention
     * + merge kernels; =N: clusters of N blocks (a power of two, <= 16) */
    const char *as = getenv("SPARK_CUDA_ATTSTEP"), *ak = getenv("SPARK_CUDA_ATTSTEP_KEYS");
    const int want = as ? atoi(as) : ATT_STEP_CLUSTER;
    cb->att_cluster = cb->fuse_on && want > 1 ? cu_attn_step_cluster(device, want) : 0;
    cb->att_step_keys = ak && atoll(ak) > 0 ? atoll(ak) : ATT_STEP_KEYS;
    timeline_init(cb);
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

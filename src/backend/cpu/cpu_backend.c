/*
 * cpu_backend.c — the CPU implementation of the backend interface: plain C
 * loops, parallelised over output rows / heads with OpenMP.
 *
 * This is the straightforward reference path the faster kernels will be
 * checked against; it favours clarity and exactness (fp32 everywhere, sums
 * of squares and rope angles in double) over speed.
 */
#include "engine/backend.h"

#include "base/error.h"
#include "base/mem.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* ---- memory: anonymous mappings, committed lazily by the kernel ----------- */

enum { BUF_HEADER = 64 }; /* keeps the returned pointer 64-byte aligned */

static spark_status cpu_alloc(backend *be, size_t bytes, float **out)
{
    size_t total = bytes + BUF_HEADER;
    void *p = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        *out = NULL;
        return spark_fail(SPARK_ERR_NOMEM, "cannot reserve %zu bytes of memory", bytes);
    }
    *(size_t *)p = total;
    *out = (float *)((char *)p + BUF_HEADER);
    return SPARK_OK;
}

static void cpu_release(backend *be, float *buf)
{
    if (!buf) return;
    char *base = (char *)buf - BUF_HEADER;
    munmap(base, *(size_t *)base);
}

static void cpu_download(backend *be, float *dst, const float *buf, size_t count)
{
    memcpy(dst, buf, count * sizeof(float));
}

static void cpu_destroy(backend *be) { free(be); }

/* ---- elementwise and row ops --------------------------------------------- */

static void cpu_embed(backend *be, float *out, const weight_ref *table, const int32_t *ids, int n)
{
    for (int t = 0; t < n; t++) weight_row_to_f32(table, ids[t], out + (int64_t)t * table->cols);
}

static void cpu_rmsnorm(backend *be, float *out, const float *x, const float *w, int n, int dim, float eps)
{
    for (int t = 0; t < n; t++) {
        const float *xt = x + (int64_t)t * dim;
        float *ot = out + (int64_t)t * dim;
        double ss = 0;
        for (int i = 0; i < dim; i++) ss += (double)xt[i] * xt[i];
        float inv = (float)(1.0 / sqrt(ss / dim + eps));
        for (int i = 0; i < dim; i++) ot[i] = xt[i] * inv * w[i];
    }
}

static void cpu_gate_heads(backend *be, float *o, const float *g, int n, int n_head, int head_dim)
{
    for (int t = 0; t < n; t++)
        for (int h = 0; h < n_head; h++) {
            float gate = 1.0f / (1.0f + expf(-g[(int64_t)t * n_head + h]));
            float *oh = o + ((int64_t)t * n_head + h) * head_dim;
            for (int d = 0; d < head_dim; d++) oh[d] *= gate;
        }
}

static void cpu_gelu_mul(backend *be, float *a, const float *b, int64_t count)
{
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < count; i++) {
        float x = a[i];
        a[i] = 0.5f * x * (1.0f + erff(x * (float)M_SQRT1_2)) * b[i];
    }
}

static void cpu_add(backend *be, float *y, const float *x, int64_t count)
{
    for (int64_t i = 0; i < count; i++) y[i] += x[i];
}

/* ---- matrix product ------------------------------------------------------- */

static float dot_f32(const float *a, const float *b, int64_t n)
{
    /* eight partial sums: vectorisable without -ffast-math, and more exact */
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) acc[k] += a[i + k] * b[i + k];
    float sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < n; i++) sum += a[i] * b[i];
    return sum;
}

static void cpu_matmul(backend *be, float *out, const float *x, const weight_ref *w, int n)
{
    int64_t rows = w->rows, cols = w->cols;
#pragma omp parallel
    {
        float *row = w->dtype == SPARK_DTYPE_F32 ? NULL : malloc((size_t)cols * sizeof(float));
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            const float *wr = (const float *)w->data + r * cols;
            if (row) {
                weight_row_to_f32(w, r, row);
                wr = row;
            }
            for (int t = 0; t < n; t++) out[(int64_t)t * rows + r] = dot_f32(wr, x + (int64_t)t * cols, cols);
        }
        free(row);
    }
}

/* ---- rope ----------------------------------------------------------------- */

static void cpu_rope(backend *be, float *x, int n, int64_t stride, int n_heads, int head_dim, int64_t pos0,
                     const rope_class *rc)
{
    int half = rc->rot_dims / 2;
    for (int t = 0; t < n; t++) {
        double pos = (double)(pos0 + t);
        for (int j = 0; j < half; j++) {
            /* angle = pos * theta^(-2j/R): the divisor is the ROTARY width R */
            double angle = pos * pow(rc->theta, -2.0 * j / rc->rot_dims);
            float c = (float)cos(angle), s = (float)sin(angle);
            for (int h = 0; h < n_heads; h++) {
                float *v = x + (int64_t)t * stride + (int64_t)h * head_dim;
                float a = v[j], b = v[j + half];
                v[j] = a * c - b * s;
                v[j + half] = b * c + a * s;
            }
        }
    }
}

/* ---- attention ------------------------------------------------------------ */

/* Key (or value, with is_value) row of kv head `kh` at absolute position j. */
static const float *kv_row(const float *qkv, const kv_layer *cache, int64_t pos0, int64_t j, int kh, int is_value,
                           const attn_shape *sh)
{
    int64_t kv_dim = (int64_t)sh->n_head_kv * sh->head_dim;
    int64_t head_off = (int64_t)kh * sh->head_dim;
    if (j >= pos0) { /* this chunk's own tokens: still in the qkv buffer */
        int64_t q_dim = (int64_t)sh->n_head * sh->head_dim;
        return qkv + (j - pos0) * sh->qkv_stride + q_dim + (is_value ? kv_dim : 0) + head_off;
    }
    const float *base = is_value ? cache->v : cache->k;
    return base + (j % cache->slots) * kv_dim + head_off;
}

static void attend_one(float *out, const float *q, const float *qkv, const kv_layer *cache, int64_t pos0, int64_t p,
                       int kh, const attn_shape *sh)
{
    int D = sh->head_dim;
    /* sliding: keys j with 0 <= p - j < window; full: every j <= p */
    int64_t lo = cache->window ? p - cache->window + 1 : 0;
    if (lo < 0) lo = 0;
    float max = -INFINITY, sum = 0;
    for (int d = 0; d < D; d++) out[d] = 0;
    for (int64_t j = lo; j <= p; j++) { /* online softmax: one pass over the keys */
        float score = dot_f32(q, kv_row(qkv, cache, pos0, j, kh, 0, sh), D) * sh->scale;
        if (score > max) {
            float rescale = expf(max - score);
            sum *= rescale;
            for (int d = 0; d < D; d++) out[d] *= rescale;
            max = score;
        }
        float w = expf(score - max);
        const float *v = kv_row(qkv, cache, pos0, j, kh, 1, sh);
        sum += w;
        for (int d = 0; d < D; d++) out[d] += w * v[d];
    }
    for (int d = 0; d < D; d++) out[d] /= sum;
}

static void cpu_attention(backend *be, float *out, const float *qkv, const kv_layer *cache, int64_t pos0, int n,
                          const attn_shape *sh)
{
    int group = sh->n_head / sh->n_head_kv; /* query heads per kv head */
    int64_t tasks = (int64_t)n * sh->n_head;
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; task++) {
        int t = (int)(task / sh->n_head), h = (int)(task % sh->n_head);
        const float *q = qkv + (int64_t)t * sh->qkv_stride + (int64_t)h * sh->head_dim;
        float *o = out + ((int64_t)t * sh->n_head + h) * sh->head_dim;
        attend_one(o, q, qkv, cache, pos0, pos0 + t, h / group, sh);
    }
}

static void cpu_kv_store(backend *be, kv_layer *cache, const float *qkv, int64_t pos0, int n, const attn_shape *sh)
{
    int64_t kv_dim = (int64_t)sh->n_head_kv * sh->head_dim;
    int64_t q_dim = (int64_t)sh->n_head * sh->head_dim;
    int first = n > cache->slots ? n - (int)cache->slots : 0; /* a ring keeps only the newest */
    for (int t = first; t < n; t++) {
        int64_t slot = (pos0 + t) % cache->slots;
        const float *row = qkv + (int64_t)t * sh->qkv_stride + q_dim;
        memcpy(cache->k + slot * kv_dim, row, (size_t)kv_dim * sizeof(float));
        memcpy(cache->v + slot * kv_dim, row + kv_dim, (size_t)kv_dim * sizeof(float));
    }
}

static const backend_ops cpu_ops = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .release = cpu_release,
    .download = cpu_download,
    .destroy = cpu_destroy,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .matmul = cpu_matmul,
    .rope = cpu_rope,
    .attention = cpu_attention,
    .kv_store = cpu_kv_store,
    .gate_heads = cpu_gate_heads,
    .gelu_mul = cpu_gelu_mul,
    .add = cpu_add,
};

spark_status backend_cpu_create(int n_threads, backend **out)
{
    backend *be = spark_calloc(1, sizeof *be, "CPU backend");
    if (!be) return SPARK_ERR_NOMEM;
    be->ops = &cpu_ops;
    be->n_threads = n_threads > 0 ? n_threads : omp_get_num_procs();
    omp_set_num_threads(be->n_threads);
    *out = be;
    return SPARK_OK;
}

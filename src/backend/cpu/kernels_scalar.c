/*
 * kernels_scalar.c — the portable C kernels: the reference every SIMD level
 * is tested against, and the path for CPUs without AVX2 or NEON.
 *
 * Weights are decoded with weight_row_to_f32 (model/quant.c), 256 values at
 * a time (a multiple of every block size), so this file holds no format
 * knowledge of its own. Sums use eight partial float sums per row, the
 * shape a compiler can vectorise without -ffast-math.
 */
#include "backend/cpu/kernels.h"

#include "base/error.h"
#include "model/model.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

enum { CHUNK = 256, PARTIALS = 8 };

/* Values [c0, c0 + CHUNK) of a row (c0 a multiple of CHUNK, the row holding
 * at least that many) through the reference decoder. */
static void decode_chunk(spark_dtype dt, const uint8_t *row, int64_t c0, float *out)
{
    uint64_t offset = dtype_row_bytes(dt, (uint64_t)c0);
    weight_ref piece = {.name = "chunk", .dtype = dt, .rows = 1, .cols = CHUNK, .data = row + offset};
    weight_row_to_f32(&piece, 0, out);
}

/* The row tail after the last whole chunk (plain formats only: block
 * formats' rows are multiples of CHUNK, except Q8_0/Q4_0 rows of 32k). */
static void decode_tail(spark_dtype dt, const uint8_t *row, int64_t c0, int64_t n, float *out)
{
    uint64_t offset = dtype_row_bytes(dt, (uint64_t)c0);
    weight_ref piece = {.name = "tail", .dtype = dt, .rows = 1, .cols = n, .data = row + offset};
    weight_row_to_f32(&piece, 0, out);
}

static void gemv_any(spark_dtype dt, const void *w, size_t row_bytes, int64_t rows, int64_t cols, const float *x,
                     int64_t xs, int nt, float *y, int64_t ys)
{
    float buf[CHUNK];
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *row = (const uint8_t *)w + (size_t)r * row_bytes;
        float acc[GEMV_MAX_TOKENS][PARTIALS] = {{0}};
        for (int64_t c0 = 0; c0 < cols; c0 += CHUNK) {
            int64_t len = cols - c0 < CHUNK ? cols - c0 : CHUNK;
            if (len == CHUNK) decode_chunk(dt, row, c0, buf);
            else decode_tail(dt, row, c0, len, buf);
            for (int t = 0; t < nt; t++) {
                const float *xt = x + t * xs + c0;
                for (int64_t i = 0; i < len; i++) acc[t][i % PARTIALS] += buf[i] * xt[i];
            }
        }
        for (int t = 0; t < nt; t++) {
            const float *a = acc[t];
            y[t * ys + r] = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
        }
    }
}

#define SCALAR_GEMV(NAME, DT)                                                                                   \
    static void NAME(const void *w, size_t rb, int64_t rows, int64_t cols, const float *x, int64_t xs, int nt, \
                     float *y, int64_t ys)                                                                      \
    {                                                                                                           \
        gemv_any(DT, w, rb, rows, cols, x, xs, nt, y, ys);                                                      \
    }
SCALAR_GEMV(gemv_f32, SPARK_DTYPE_F32)
SCALAR_GEMV(gemv_f16, SPARK_DTYPE_F16)
SCALAR_GEMV(gemv_bf16, SPARK_DTYPE_BF16)
SCALAR_GEMV(gemv_q8_0, SPARK_DTYPE_Q8_0)
SCALAR_GEMV(gemv_q4_0, SPARK_DTYPE_Q4_0)
SCALAR_GEMV(gemv_q4_k, SPARK_DTYPE_Q4_K)
SCALAR_GEMV(gemv_q6_k, SPARK_DTYPE_Q6_K)

static void dequant_any(spark_dtype dt, const void *w, size_t row_bytes, int64_t rows, int64_t cols, float *out)
{
    weight_ref m = {.name = "rows", .dtype = dt, .rows = rows, .cols = cols, .data = w};
    ASSERT(dtype_row_bytes(dt, (uint64_t)cols) == row_bytes);
    for (int64_t r = 0; r < rows; r++) weight_row_to_f32(&m, r, out + r * cols);
}

#define SCALAR_DEQUANT(NAME, DT)                                                       \
    static void NAME(const void *w, size_t rb, int64_t rows, int64_t cols, float *out) \
    {                                                                                  \
        dequant_any(DT, w, rb, rows, cols, out);                                       \
    }
SCALAR_DEQUANT(dequant_f32, SPARK_DTYPE_F32)
SCALAR_DEQUANT(dequant_f16, SPARK_DTYPE_F16)
SCALAR_DEQUANT(dequant_bf16, SPARK_DTYPE_BF16)
SCALAR_DEQUANT(dequant_q8_0, SPARK_DTYPE_Q8_0)
SCALAR_DEQUANT(dequant_q4_0, SPARK_DTYPE_Q4_0)
SCALAR_DEQUANT(dequant_q4_k, SPARK_DTYPE_Q4_K)
SCALAR_DEQUANT(dequant_q6_k, SPARK_DTYPE_Q6_K)

enum { SCALAR_TW = 8, SCALAR_TR = 4 };

/* Plain triple loop over the packed layout: one running sum per output. */
static void gemm_tile(const float *xp, const float *w, int64_t ldw, int nr, int64_t cols, float *y, int64_t ys,
                      int nt, int accumulate)
{
    for (int r = 0; r < nr; r++)
        for (int t = 0; t < nt; t++) {
            float s = 0;
            for (int64_t c = 0; c < cols; c++) s += w[r * ldw + c] * xp[c * SCALAR_TW + t];
            y[t * ys + r] = accumulate ? y[t * ys + r] + s : s;
        }
}

static float dot(const float *a, const float *b, int64_t n)
{
    float acc[PARTIALS] = {0};
    int64_t i = 0;
    for (; i + PARTIALS <= n; i += PARTIALS)
        for (int k = 0; k < PARTIALS; k++) acc[k] += a[i + k] * b[i + k];
    float sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < n; i++) sum += a[i] * b[i];
    return sum;
}

static void axpy(float *y, float a, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

static void scale(float *y, float a, int64_t n)
{
    for (int64_t i = 0; i < n; i++) y[i] *= a;
}

static void add(float *y, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) y[i] += x[i];
}

static void gelu_mul(float *a, const float *b, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        float x = a[i];
        a[i] = 0.5f * x * (1.0f + erff(x * (float)M_SQRT1_2)) * b[i];
    }
}

static void rmsnorm(float *out, const float *x, const float *w, int64_t dim, float eps)
{
    double ss = 0;
    for (int64_t i = 0; i < dim; i++) ss += (double)x[i] * x[i];
    float inv = (float)(1.0 / sqrt(ss / (double)dim + eps));
    for (int64_t i = 0; i < dim; i++) out[i] = x[i] * inv * w[i];
}

static void rope_head(float *v, const float *cs, const float *sn, int half)
{
    for (int j = 0; j < half; j++) {
        float a = v[j], b = v[j + half];
        v[j] = a * cs[j] - b * sn[j];
        v[j + half] = b * cs[j] + a * sn[j];
    }
}

static float exp_sum(float *s, float max, int64_t n)
{
    float sum = 0;
    for (int64_t i = 0; i < n; i++) {
        s[i] = expf(s[i] - max);
        sum += s[i];
    }
    return sum;
}

static void axpy_rows(float *y, const float *a, const float *const *rows, int n, int64_t dim)
{
    for (int j = 0; j < n; j++)
        for (int64_t i = 0; i < dim; i++) y[i] += a[j] * rows[j][i];
}

static void qk_block(float *s, int64_t ss, const float *const *q, int nq, const float *const *k, int nk, int64_t dim,
                     float scale)
{
    for (int r = 0; r < nq; r++)
        for (int j = 0; j < nk; j++) s[r * ss + j] = dot(q[r], k[j], dim) * scale;
}

static void pv_block(float *const *o, const float *p, int64_t ps, int nq, const float *const *v, int nk, int64_t dim)
{
    for (int r = 0; r < nq; r++) axpy_rows(o[r], p + r * ps, v, nk, dim);
}

const cpu_kernels cpu_kernels_scalar = {
    .isa = CPU_ISA_SCALAR,
    .gemm_tokens = SCALAR_TW,
    .gemm_rows = SCALAR_TR,
    .gemv = {[SPARK_DTYPE_F32] = gemv_f32,
             [SPARK_DTYPE_F16] = gemv_f16,
             [SPARK_DTYPE_BF16] = gemv_bf16,
             [SPARK_DTYPE_Q8_0] = gemv_q8_0,
             [SPARK_DTYPE_Q4_0] = gemv_q4_0,
             [SPARK_DTYPE_Q4_K] = gemv_q4_k,
             [SPARK_DTYPE_Q6_K] = gemv_q6_k},
    .dequant = {[SPARK_DTYPE_F32] = dequant_f32,
                [SPARK_DTYPE_F16] = dequant_f16,
                [SPARK_DTYPE_BF16] = dequant_bf16,
                [SPARK_DTYPE_Q8_0] = dequant_q8_0,
                [SPARK_DTYPE_Q4_0] = dequant_q4_0,
                [SPARK_DTYPE_Q4_K] = dequant_q4_k,
                [SPARK_DTYPE_Q6_K] = dequant_q6_k},
    .gemm_tile = gemm_tile,
    .dot = dot,
    .axpy = axpy,
    .scale = scale,
    .add = add,
    .gelu_mul = gelu_mul,
    .rmsnorm = rmsnorm,
    .rope_head = rope_head,
    .exp_sum = exp_sum,
    .axpy_rows = axpy_rows,
    .qk_block = qk_block,
    .pv_block = pv_block,
};

/* Columns in runs of one cache line (16 floats): the tokens' rows are xs
 * apart, often a multiple of 4 KB (one L1 set), so a column at a time
 * fetched every token's line again for each of its 16 columns. */
void cpu_pack_tokens(float *xp, const float *x, int64_t xs, int n, int64_t cols, int tw)
{
    enum { RUN = 16 };
    for (int64_t c0 = 0; c0 < cols; c0 += RUN) {
        const int64_t c1 = c0 + RUN < cols ? c0 + RUN : cols;
        for (int t = 0; t < n; t++)
            for (int64_t c = c0; c < c1; c++) xp[c * tw + t] = x[t * xs + c];
        for (int64_t c = c0; c < c1; c++)
            for (int t = n; t < tw; t++) xp[c * tw + t] = 0.0f;
    }
}

static void fill_missing(cpu_kernels *k)
{
    const cpu_kernels *s = &cpu_kernels_scalar;
    for (int d = 0; d < SPARK_DTYPE_COUNT; d++) {
        if (!k->gemv[d]) k->gemv[d] = s->gemv[d];
        if (!k->dequant[d]) k->dequant[d] = s->dequant[d];
    }
#define FILL(f) \
    if (!k->f) k->f = s->f
    FILL(dot);
    FILL(axpy);
    FILL(scale);
    FILL(add);
    FILL(gelu_mul);
    FILL(rmsnorm);
    FILL(rope_head);
    FILL(exp_sum);
    FILL(axpy_rows);
    FILL(qk_block);
    FILL(pv_block);
#undef FILL
    if (!k->gemm_tile) {
        k->gemm_tile = s->gemm_tile;
        k->gemm_tokens = s->gemm_tokens;
        k->gemm_rows = s->gemm_rows;
    }
}

float cpu_f16_table[65536];
int cpu_far_prefetch_nta;

static void fill_f16_table(void)
{
    for (uint32_t h = 0; h < 65536; h++) cpu_f16_table[h] = f16_to_f32((uint16_t)h);
}

int cpu_kernels_resolve(cpu_isa isa, cpu_kernels *out)
{
    static pthread_once_t table_once = PTHREAD_ONCE_INIT;
    pthread_once(&table_once, fill_f16_table);
    const cpu_kernels *k = NULL;
    if (!cpu_isa_supported(isa)) return 0;
    switch (isa) {
    case CPU_ISA_SCALAR: k = &cpu_kernels_scalar; break;
#if defined(__x86_64__)
    case CPU_ISA_AVX2: k = &cpu_kernels_avx2; break;
    case CPU_ISA_AVX512: k = &cpu_kernels_avx512; break;
#endif
#if defined(__aarch64__) && defined(__ARM_NEON)
    case CPU_ISA_NEON: k = &cpu_kernels_neon; break;
#endif
    default: return 0;
    }
    *out = *k;
    fill_missing(out);
    memset(&out->x8, 0, sizeof out->x8); /* scalar and NEON: the float GEMVs */
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (isa == CPU_ISA_AVX512)
        out->x8 = __builtin_cpu_supports("avx512vnni") ? cpu_x8_avx512_vnni : cpu_x8_avx512;
    else if (isa == CPU_ISA_AVX2)
        out->x8 = __builtin_cpu_supports("avxvnni") ? cpu_x8_avx2_vnni : cpu_x8_avx2;
#endif
    return 1;
}

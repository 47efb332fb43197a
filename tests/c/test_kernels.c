/*
 * test_kernels.c — every CPU kernel at every instruction-set level this
 * machine runs (scalar, AVX2, AVX-512 / NEON), on random data with odd
 * sizes, against float64 references built from weight_row_to_f32 (the
 * reference dequantization).
 *
 * Budgets (documented in kernels.h): the kernels multiply the exact
 * dequantized weights in float32, so a dot product of n terms may differ
 * from the float64 value by a few n * 2^-24 * sum|w_i x_i| in the worst
 * case; random signs make it ~sqrt(n) times smaller. We allow
 * DOT_TOL * sum|w_i x_i| with DOT_TOL = 2e-6, far below what a wrong
 * index, scale or nibble would give (>= 1e-2). Dequantization and rope are
 * checked bit for bit; GELU's polynomial erf to 2e-7 absolute; exp to 1e-6
 * relative. Matrix products and attention must be bit-identical for 1, 2
 * and 3 threads (each output is computed by one thread in a fixed order).
 * The int8-activation GEMVs (one token of Q4_K / Q6_K on x86) have their
 * own bound, derived at test_gemv_x8_bound; the int16-activation Q8_0 GEMV
 * the same bound at 32767 levels, and its error must stay far below what
 * rounding x to bf16 (the reference's activations) gives: test_gemv_x16.
 */
#include "check.h"
#include "test_random.h"

#include "backend/cpu/cpu_internal.h"
#include "model/model.h"

#include <stdlib.h>

#define DOT_TOL 2e-6

/* ---- random data ------------------------------------------------------------- */

static void put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

/* A rows x cols matrix in `dt` with random contents (block scales kept in a
 * sane range so products stay finite). Caller frees. */
static uint8_t *random_matrix(spark_dtype dt, int64_t rows, int64_t cols, size_t *row_bytes)
{
    size_t rb = (size_t)dtype_row_bytes(dt, (uint64_t)cols);
    uint8_t *m = malloc(rows * rb + 1);
    *row_bytes = rb;
    int be = dtype_block_elems(dt), bb = dtype_block_bytes(dt);
    for (int64_t r = 0; r < rows; r++) {
        uint8_t *row = m + r * rb;
        for (int64_t b = 0; b < cols / be; b++) {
            uint8_t *blk = row + b * bb;
            for (int i = 0; i < bb; i++) blk[i] = (uint8_t)next_u64();
            switch (dt) {
            case SPARK_DTYPE_F32: {
                float f = gauss();
                memcpy(blk, &f, 4);
            } break;
            case SPARK_DTYPE_F16: put16(blk, f32_to_f16(gauss())); break;
            case SPARK_DTYPE_BF16: put16(blk, f32_to_bf16(gauss())); break;
            case SPARK_DTYPE_Q8_0:
            case SPARK_DTYPE_Q4_0: put16(blk, f32_to_f16(0.01f + 0.02f * uniform())); break;
            case SPARK_DTYPE_Q4_K:
                put16(blk, f32_to_f16(0.002f + 0.001f * uniform()));
                put16(blk + 2, f32_to_f16(0.001f + 0.0005f * uniform()));
                break;
            case SPARK_DTYPE_Q6_K: put16(blk + 208, f32_to_f16(0.0005f + 0.0002f * uniform())); break;
            default: break;
            }
        }
    }
    return m;
}

static float *random_floats(int64_t n)
{
    float *v = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) v[i] = gauss();
    return v;
}

/* ---- references ----------------------------------------------------------------- */

static float *dequant_ref(spark_dtype dt, const uint8_t *m, int64_t rows, int64_t cols)
{
    weight_ref w = {.name = "test", .dtype = dt, .rows = rows, .cols = cols, .data = m};
    float *out = malloc((size_t)(rows * cols) * sizeof(float));
    for (int64_t r = 0; r < rows; r++) weight_row_to_f32(&w, r, out + r * cols);
    return out;
}

/* |got - sum w x| <= DOT_TOL * sum |w x| */
static int dot_close(float got, const float *w, const float *x, int64_t n, double *worst)
{
    double s = 0, a = 0;
    for (int64_t i = 0; i < n; i++) {
        s += (double)w[i] * x[i];
        a += fabs((double)w[i] * x[i]);
    }
    double err = fabs((double)got - s) / (a > 0 ? a : 1);
    if (err > *worst) *worst = err;
    return err <= DOT_TOL;
}

static const cpu_isa all_isas[] = {CPU_ISA_SCALAR, CPU_ISA_AVX2, CPU_ISA_AVX512, CPU_ISA_NEON};
enum { N_ISAS = sizeof all_isas / sizeof all_isas[0] };

static const spark_dtype all_dtypes[] = {SPARK_DTYPE_F32, SPARK_DTYPE_F16, SPARK_DTYPE_BF16, SPARK_DTYPE_Q8_0,
                                         SPARK_DTYPE_Q4_0, SPARK_DTYPE_Q4_K, SPARK_DTYPE_Q6_K};
enum { N_DTYPES = sizeof all_dtypes / sizeof all_dtypes[0] };

/* Odd column counts per format: not multiples of any vector width where allowed. */
static const int64_t *cols_for(spark_dtype dt, int *n)
{
    static const int64_t plain[] = {1, 7, 33, 100, 257, 1031};
    static const int64_t q32[] = {32, 96, 160, 544};
    static const int64_t q256[] = {256, 768, 1280};
    if (dt == SPARK_DTYPE_F32 || dt == SPARK_DTYPE_F16 || dt == SPARK_DTYPE_BF16) {
        *n = 6;
        return plain;
    }
    if (dt == SPARK_DTYPE_Q8_0 || dt == SPARK_DTYPE_Q4_0) {
        *n = 4;
        return q32;
    }
    *n = 3;
    return q256;
}

/* ---- kernels one by one ---------------------------------------------------------- */

static void test_dequant_bit_exact(void)
{
    for (int li = 0; li < N_ISAS; li++) {
        cpu_kernels k;
        if (!cpu_kernels_resolve(all_isas[li], &k)) continue;
        for (int di = 0; di < N_DTYPES; di++) {
            spark_dtype dt = all_dtypes[di];
            int nc;
            const int64_t *cols = cols_for(dt, &nc);
            for (int ci = 0; ci < nc; ci++) {
                int64_t rows = 5, c = cols[ci];
                size_t rb;
                uint8_t *m = random_matrix(dt, rows, c, &rb);
                float *want = dequant_ref(dt, m, rows, c);
                float *got = malloc((size_t)(rows * c) * sizeof(float));
                k.dequant[dt](m, rb, rows, c, got);
                CHECK_MSG(!memcmp(got, want, (size_t)(rows * c) * sizeof(float)), "%s %s cols %lld differ",
                          cpu_isa_name(all_isas[li]), dtype_name(dt), (long long)c);
                free(m);
                free(want);
                free(got);
            }
        }
    }
}

/* ---- int8-activation GEMV (kernels_x8.inc) -----------------------------------
 * x is rounded per 32 values to d * q with d = max|x| / 127, |x - d q| <= d/2,
 * and the integer sums are exact, so
 *     |got - sum_i w_i x_i| <= sum_i |w_i| d(i) / 2          (quantization)
 *                              + X8_ROUND * sum_i |w_i x_i|   (float32 rounding)
 * w the exact dequantized weights, the sum in float64. X8_ROUND covers the
 * float32 products of the factors (d * sc * dx: 2 roundings) and the
 * accumulation of ~cols / 16 terms a lane, like DOT_TOL for the float path.
 * The first term is a worst case (every rounding error aligned with w); the
 * typical error is its random-walk size sqrt(sum_i w_i^2 d(i)^2 / 12), and
 * the RMS of err / that size over all rows must be ~1 (0.5 .. 1.5): a
 * wrong sub-block factor or activation scale, or a dropped min / offset
 * term, shows there long before the worst-case bound. */
#define X8_ROUND 4e-6

typedef struct x8_stats {
    double worst; /* max err / bound */
    double z2;    /* sum of (err / typical)^2 */
    long n;
} x8_stats;

/* levels: 127 (int8) or 32767 (int16). The kernels form q = round(x * fl(levels / max|x|))
 * in float32, so |x - d q| may exceed d/2 by up to levels * 2^-23 d: the bound's
 * d/2 becomes d (1/2 + levels * 2^-22). */
static int xq_close(float got, const float *w, const float *x, int64_t n, double levels, x8_stats *st)
{
    double s = 0, a = 0, qb = 0, var = 0;
    for (int64_t g = 0; g < n; g += 32) {
        double amax = 0;
        for (int i = 0; i < 32; i++) amax = fmax(amax, fabs((double)x[g + i]));
        double d = amax / levels;
        for (int i = 0; i < 32; i++) {
            double wi = w[g + i];
            s += wi * x[g + i];
            a += fabs(wi * x[g + i]);
            qb += fabs(wi) * d * (0.5 + levels * 0x1p-22);
            var += wi * wi * d * d / 12;
        }
    }
    double err = fabs((double)got - s), bound = qb + X8_ROUND * a;
    if (bound > 0 && err / bound > st->worst) st->worst = err / bound;
    if (var > 0) {
        st->z2 += err * err / var;
        st->n++;
    }
    return err <= bound;
}

static int x8_close(float got, const float *w, const float *x, int64_t n, x8_stats *st)
{
    return xq_close(got, w, x, n, 127.0, st);
}

static int x8_rms_ok(const x8_stats *st, double *rms)
{
    *rms = st->n ? sqrt(st->z2 / (double)st->n) : 0;
    return st->n > 0 && *rms > 0.5 && *rms < 1.5;
}

/* Activations with what real ones have: outliers (a 32-group whose max is
 * 30x the rest), an all-zero group (scale 0) and tiny values. */
static float *x8_activations(int64_t n)
{
    float *x = random_floats(n);
    for (int64_t i = 5; i < n; i += 97) x[i] *= 30.0f;
    if (n >= 64)
        for (int i = 32; i < 64; i++) x[i] = 0.0f;
    if (n >= 128)
        for (int i = 96; i < 128; i++) x[i] *= 1e-6f;
    return x;
}

/* The x86 int8-activation tables, and whether this CPU runs each. */
typedef struct x8_table {
    const char *name;
    const cpu_x8_kernels *k;
    int ok;
} x8_table;

#if defined(__x86_64__)
enum { N_X8_TABLES = 4 };

static void x8_tables(x8_table tables[N_X8_TABLES])
{
    tables[0] = (x8_table){"avx2", &cpu_x8_avx2, cpu_isa_supported(CPU_ISA_AVX2)};
    tables[1] = (x8_table){"avx2+vnni", &cpu_x8_avx2_vnni,
                           cpu_isa_supported(CPU_ISA_AVX2) && __builtin_cpu_supports("avxvnni")};
    tables[2] = (x8_table){"avx512", &cpu_x8_avx512, cpu_isa_supported(CPU_ISA_AVX512)};
    tables[3] = (x8_table){"avx512+vnni", &cpu_x8_avx512_vnni,
                           cpu_isa_supported(CPU_ISA_AVX512) && __builtin_cpu_supports("avx512vnni")};
}
#else /* no integer-activation tables off x86 (bench/neon_check.sh builds this file for aarch64) */
enum { N_X8_TABLES = 1 };

static void x8_tables(x8_table tables[N_X8_TABLES]) { tables[0] = (x8_table){"x86 integer tables", NULL, 0}; }
#endif

static void test_gemv_x8_bound(void)
{
    static const spark_dtype dts[] = {SPARK_DTYPE_Q4_K, SPARK_DTYPE_Q6_K};
    static const int64_t cols[] = {256, 768, 2560};
    static const int64_t row_counts[] = {1, 3, 37};
    x8_table tables[N_X8_TABLES];
    x8_tables(tables);
    uint64_t saved = rng; /* the later tests keep the data they had before this one */
    for (int ti = 0; ti < N_X8_TABLES; ti++) {
        if (!tables[ti].ok) {
            printf("  %s: not on this CPU\n", tables[ti].name);
            continue;
        }
        for (size_t di = 0; di < 2; di++) {
            spark_dtype dt = dts[di];
            x8_stats st = {0};
            for (int ci = 0; ci < 3; ci++)
                for (int ri = 0; ri < 3; ri++) {
                    int64_t rows = row_counts[ri], c = cols[ci];
                    size_t rb;
                    uint8_t *m = random_matrix(dt, rows, c, &rb);
                    float *wf = dequant_ref(dt, m, rows, c);
                    float *x = x8_activations(c);
                    q8x_block *xq = malloc((size_t)(c / 256) * sizeof *xq);
                    float *y = malloc((size_t)rows * sizeof(float));
                    tables[ti].k->quant_x(dt, x, c, xq);
                    tables[ti].k->gemv[dt](m, rb, rows, c, xq, y);
                    for (int64_t r = 0; r < rows; r++)
                        CHECK_MSG(x8_close(y[r], wf + r * c, x, c, &st), "%s x8 gemv %s rows %lld cols %lld: row %lld",
                                  tables[ti].name, dtype_name(dt), (long long)rows, (long long)c, (long long)r);
                    free(m);
                    free(wf);
                    free(x);
                    free(xq);
                    free(y);
                }
            double rms;
            CHECK_MSG(x8_rms_ok(&st, &rms), "%s x8 gemv %s: RMS error %.3g x its random-walk size", tables[ti].name,
                      dtype_name(dt), rms);
            printf("  %s %s: worst error %.2f of the bound, RMS %.2f x the typical size (%ld rows)\n",
                   tables[ti].name, dtype_name(dt), st.worst, rms, st.n);
        }
    }
    rng = saved;
}

/* ---- int16-activation Q8_0 GEMV (kernels_x8.inc) ------------------------------
 * Same bound as the int8 kernels at 32767 levels (|x - d q| <= d/2 with
 * d = max|x| / 32767 per 32 values), and the same RMS check against the
 * random-walk size of the rounding. SPEC section 2 allows any activation
 * precision at least that of bf16 (the reference rounds x to bf16 before
 * each product), so the error is also compared with the one bf16 rounding
 * of x gives on the same rows: per element int16 is within max|x|/65534,
 * bf16 within |x| 2^-9 (half an ulp of 8 significant bits), i.e. about
 * |x| 2^-9 / sqrt(3) RMS against max|x| / 113500 for int16; for Gaussian
 * groups (max|x| ~ 2.5 rms) that is ~50x less error, for a group with a 30x
 * outlier still ~3x. The test requires the RMS error over all rows to be at
 * most BF16_MARGIN of bf16's (0.1: the data mixes both kinds of group). */
#define BF16_MARGIN 0.1

static void test_gemv_x16(void)
{
    static const spark_dtype dts[] = {SPARK_DTYPE_Q8_0, SPARK_DTYPE_Q4_K, SPARK_DTYPE_Q6_K};
    static const int64_t cols_q8[] = {32, 96, 160, 544, 2560}, cols_k[] = {256, 768, 1280, 2560, 6912};
    static const int64_t row_counts[] = {1, 3, 9, 37};
    x8_table tables[N_X8_TABLES];
    x8_tables(tables);
    uint64_t saved = rng; /* the later tests keep the data they had before this one */
    for (int ti = 0; ti < N_X8_TABLES; ti++) {
        if (!tables[ti].ok) continue;
        for (int di = 0; di < 3; di++) {
            spark_dtype dt = dts[di];
            const int64_t *cols = dt == SPARK_DTYPE_Q8_0 ? cols_q8 : cols_k;
            CHECK_MSG(tables[ti].k->gemv_x16[dt] != NULL, "%s: no x16 gemv for %s", tables[ti].name, dtype_name(dt));
            if (!tables[ti].k->gemv_x16[dt]) continue;
            x8_stats st = {0};
            double e16 = 0, ebf = 0; /* sums of squared errors: this kernel, bf16 activations */
            for (int ci = 0; ci < 5; ci++)
                for (int ri = 0; ri < 4; ri++) {
                    int64_t rows = row_counts[ri], c = cols[ci];
                    size_t rb;
                    uint8_t *m = random_matrix(dt, rows, c, &rb);
                    float *wf = dequant_ref(dt, m, rows, c);
                    float *x = x8_activations(c);
                    int16_t *xq = malloc((size_t)c * sizeof *xq);
                    float *xd = malloc((size_t)(c / 32) * sizeof *xd), *xs = malloc((size_t)(c / 32) * sizeof *xs);
                    float *y = malloc((size_t)rows * sizeof(float));
                    tables[ti].k->quant_x16(x, c, xq, xd, xs);
                    tables[ti].k->gemv_x16[dt](m, rb, rows, c, xq, xd, xs, y);
                    for (int64_t r = 0; r < rows; r++) {
                        const float *w = wf + r * c;
                        CHECK_MSG(xq_close(y[r], w, x, c, 32767.0, &st), "%s x16 gemv %s rows %lld cols %lld: row %lld",
                                  tables[ti].name, dtype_name(dt), (long long)rows, (long long)c, (long long)r);
                        double s = 0, sb = 0;
                        for (int64_t i = 0; i < c; i++) {
                            s += (double)w[i] * x[i];
                            sb += (double)w[i] * bf16_to_f32(f32_to_bf16(x[i]));
                        }
                        e16 += ((double)y[r] - s) * ((double)y[r] - s);
                        ebf += (sb - s) * (sb - s);
                    }
                    free(m);
                    free(wf);
                    free(x);
                    free(xq);
                    free(xd);
                    free(xs);
                    free(y);
                }
            double rms, ratio = ebf > 0 ? sqrt(e16 / ebf) : 0;
            CHECK_MSG(x8_rms_ok(&st, &rms), "%s x16 gemv %s: RMS error %.3g x its random-walk size", tables[ti].name,
                      dtype_name(dt), rms);
            CHECK_MSG(ebf > 0 && ratio <= BF16_MARGIN, "%s x16 gemv %s: RMS error %.3g x that of bf16 activations",
                      tables[ti].name, dtype_name(dt), ratio);
            printf("  %s x16 %s: worst error %.2f of the bound, RMS %.2f x the typical size, %.4f x bf16's (%ld rows)\n",
                   tables[ti].name, dtype_name(dt), st.worst, rms, ratio, st.n);
        }
    }
    rng = saved;
}

/* gemv at every level, dtype, odd size, token count 1..4, with strides. */
static void test_gemv_all_dtypes(void)
{
    static const int64_t row_counts[] = {1, 3, 13, 37};
    for (int li = 0; li < N_ISAS; li++) {
        cpu_kernels k;
        if (!cpu_kernels_resolve(all_isas[li], &k)) continue;
        double worst = 0;
        for (int di = 0; di < N_DTYPES; di++) {
            spark_dtype dt = all_dtypes[di];
            int nc;
            const int64_t *cols = cols_for(dt, &nc);
            for (int ci = 0; ci < nc; ci++)
                for (int ri = 0; ri < 4; ri++) {
                    int64_t rows = row_counts[ri], c = cols[ci], xs = c + 3, ys = rows + 2;
                    size_t rb;
                    uint8_t *m = random_matrix(dt, rows, c, &rb);
                    float *wf = dequant_ref(dt, m, rows, c);
                    float *x = random_floats(GEMV_MAX_TOKENS * xs);
                    float *y = malloc((size_t)(GEMV_MAX_TOKENS * ys) * sizeof(float));
                    for (int nt = 1; nt <= GEMV_MAX_TOKENS; nt++) {
                        k.gemv[dt](m, rb, rows, c, x, xs, nt, y, ys);
                        for (int t = 0; t < nt; t++)
                            for (int64_t r = 0; r < rows; r++)
                                CHECK_MSG(dot_close(y[t * ys + r], wf + r * c, x + t * xs, c, &worst),
                                          "%s gemv %s rows %lld cols %lld nt %d: row %lld token %d off",
                                          cpu_isa_name(all_isas[li]), dtype_name(dt), (long long)rows,
                                          (long long)c, nt, (long long)r, t);
                    }
                    free(m);
                    free(wf);
                    free(x);
                    free(y);
                }
        }
        printf("  %s gemv: worst relative error %.2g\n", cpu_isa_name(all_isas[li]), worst);
    }
}

/* A row's GEMV result must not depend on which rows share its tile: the
 * lane kernels (plain formats, Q8_0, Q4_K, Q6_K, and the int8-activation
 * Q4_K / Q6_K ones) group rows t, t + q, t + 2q, ... of a call, so the same
 * row lands in different tiles, or in the one-row tail, depending on the
 * call's row range. Every row of a 45-row call must equal, bit for bit, the same row
 * computed alone and inside calls over shifted sub-ranges (which regroup
 * it), for every level, dtype and token count, and for every int8 table. */
/* A GEMV under test over rows [s0, s0 + n) of its matrix, into y (token t's
 * outputs at y[t * n + r]). */
typedef struct rows_gemv {
    void (*run)(const struct rows_gemv *g, int64_t s0, int64_t n, float *y);
    const cpu_kernels *k;
    const cpu_x8_kernels *k8;
    spark_dtype dt;
    const uint8_t *m;
    size_t rb;
    int64_t c;
    int nt;
    const float *x, *xd, *xs;
    const void *xq;
} rows_gemv;

static void run_float(const rows_gemv *g, int64_t s0, int64_t n, float *y)
{
    g->k->gemv[g->dt](g->m + (size_t)s0 * g->rb, g->rb, n, g->c, g->x, g->c, g->nt, y, n);
}

static void run_x8(const rows_gemv *g, int64_t s0, int64_t n, float *y)
{
    g->k8->gemv[g->dt](g->m + (size_t)s0 * g->rb, g->rb, n, g->c, (const q8x_block *)g->xq, y);
}

static void run_x16(const rows_gemv *g, int64_t s0, int64_t n, float *y)
{
    g->k8->gemv_x16[g->dt](g->m + (size_t)s0 * g->rb, g->rb, n, g->c, (const int16_t *)g->xq, g->xd, g->xs, y);
}

/* Outputs that differ, bit for bit, between one pass over all `rows` rows
 * and passes over each single row and over the suffixes from starts[0..3]:
 * a row's result must not depend on the rows it is computed with. */
static int regroup_mismatches(const rows_gemv *g, int64_t rows, const int64_t starts[4], float *all, float *part)
{
    g->run(g, 0, rows, all);
    int bad = 0;
    for (int64_t r = 0; r < rows; r++) {
        g->run(g, r, 1, part);
        for (int t = 0; t < g->nt; t++) bad += memcmp(&part[t], &all[t * rows + r], sizeof(float)) != 0;
    }
    for (int si = 0; si < 4; si++) {
        int64_t s0 = starts[si], n = rows - s0;
        g->run(g, s0, n, part);
        for (int t = 0; t < g->nt; t++)
            for (int64_t r = 0; r < n; r++) bad += memcmp(&part[t * n + r], &all[t * rows + s0 + r], sizeof(float)) != 0;
    }
    return bad;
}

static void test_gemv_grouping_bit_exact(void)
{
    enum { ROWS = 45 };
    static const int64_t starts[] = {1, 6, 13, 29};
    uint64_t saved = rng; /* the later tests keep the data they had before this one */
    for (int li = 0; li < N_ISAS; li++) {
        cpu_kernels k;
        if (!cpu_kernels_resolve(all_isas[li], &k)) continue;
        for (int di = 0; di < N_DTYPES; di++) {
            spark_dtype dt = all_dtypes[di];
            int nc;
            const int64_t *cs = cols_for(dt, &nc);
            int64_t c = cs[nc - 1]; /* the widest: vector tails, several block steps */
            size_t rb;
            uint8_t *m = random_matrix(dt, ROWS, c, &rb);
            float *x = random_floats(GEMV_MAX_TOKENS * c);
            float *all = malloc(sizeof(float) * GEMV_MAX_TOKENS * ROWS), *part = malloc(sizeof(float) * GEMV_MAX_TOKENS * ROWS);
            for (int nt = 1; nt <= GEMV_MAX_TOKENS; nt++) {
                const rows_gemv g = {.run = run_float, .k = &k, .dt = dt, .m = m, .rb = rb, .c = c, .nt = nt, .x = x};
                int bad = regroup_mismatches(&g, ROWS, starts, all, part);
                CHECK_MSG(bad == 0, "%s gemv %s cols %lld nt %d: %d outputs change with the rows' grouping",
                          cpu_isa_name(all_isas[li]), dtype_name(dt), (long long)c, nt, bad);
            }
            free(m);
            free(x);
            free(all);
            free(part);
        }
    }
    x8_table tables[N_X8_TABLES];
    x8_tables(tables);
    static const spark_dtype x8_dts[] = {SPARK_DTYPE_Q4_K, SPARK_DTYPE_Q6_K};
    for (int ti = 0; ti < N_X8_TABLES; ti++) {
        if (!tables[ti].ok) continue;
        for (int di = 0; di < 2; di++) {
            spark_dtype dt = x8_dts[di];
            const int64_t c = 2560;
            size_t rb;
            uint8_t *m = random_matrix(dt, ROWS, c, &rb);
            float *x = x8_activations(c);
            q8x_block *xq = malloc((size_t)(c / 256) * sizeof *xq);
            float *all = malloc(sizeof(float) * ROWS), *part = malloc(sizeof(float) * ROWS);
            tables[ti].k->quant_x(dt, x, c, xq);
            const rows_gemv g = {.run = run_x8, .k8 = tables[ti].k, .dt = dt, .m = m, .rb = rb, .c = c, .nt = 1, .xq = xq};
            int bad = regroup_mismatches(&g, ROWS, starts, all, part);
            CHECK_MSG(bad == 0, "%s x8 gemv %s cols %lld: %d outputs change with the rows' grouping", tables[ti].name,
                      dtype_name(dt), (long long)c, bad);
            free(m);
            free(x);
            free(xq);
            free(all);
            free(part);
        }
        /* the int16-activation kernels (Q8_0, Q4_K, Q6_K) */
        static const spark_dtype x16_dts[] = {SPARK_DTYPE_Q8_0, SPARK_DTYPE_Q4_K, SPARK_DTYPE_Q6_K};
        for (int di = 0; di < 3; di++) {
            spark_dtype dt = x16_dts[di];
            if (!tables[ti].k->gemv_x16[dt]) continue;
            const int64_t c = dt == SPARK_DTYPE_Q8_0 ? 544 : 768;
            size_t rb;
            uint8_t *m = random_matrix(dt, ROWS, c, &rb);
            float *x = x8_activations(c), *xd = malloc((size_t)(c / 32) * sizeof(float));
            float *xs = malloc((size_t)(c / 32) * sizeof(float));
            int16_t *xq = malloc((size_t)c * sizeof *xq);
            float *all = malloc(sizeof(float) * ROWS), *part = malloc(sizeof(float) * ROWS);
            tables[ti].k->quant_x16(x, c, xq, xd, xs);
            const rows_gemv g = {.run = run_x16, .k8 = tables[ti].k, .dt = dt, .m = m, .rb = rb, .c = c, .nt = 1,
                                 .xd = xd, .xs = xs, .xq = xq};
            int bad = regroup_mismatches(&g, ROWS, starts, all, part);
            CHECK_MSG(bad == 0, "%s x16 gemv %s cols %lld: %d outputs change with the rows' grouping", tables[ti].name,
                      dtype_name(dt), (long long)c, bad);
            free(m);
            free(x);
            free(xd);
            free(xs);
            free(xq);
            free(all);
            free(part);
        }
    }
    rng = saved;
}

static void run_float_2l(const rows_gemv *g, int64_t s0, int64_t n, float *y)
{
    g->k->gemv_2l[g->dt](g->m + (size_t)s0 * g->rb, g->rb, n, g->c, g->x, g->c, g->nt, y, n);
}

static void run_float_3l(const rows_gemv *g, int64_t s0, int64_t n, float *y)
{
    g->k->gemv_3l[g->dt](g->m + (size_t)s0 * g->rb, g->rb, n, g->c, g->x, g->c, g->nt, y, n);
}

static void run_x16_2l(const rows_gemv *g, int64_t s0, int64_t n, float *y)
{
    g->k8->gemv_x16_2l[g->dt](g->m + (size_t)s0 * g->rb, g->rb, n, g->c, (const int16_t *)g->xq, g->xd, g->xs, y);
}

/* The 2-lane layouts (x8.gemv_x16_2l and gemv_2l, the default on AMD) and
 * the float formats' 3-lane one (gemv_3l, the default elsewhere) give the
 * same bits as gemv_x16 / gemv for every row (NaN-filled outputs: a row it
 * skips fails too) and regroup exactly; a backend made with
 * SPARK_GEMV_LANES=2 / 3 / 8 / unset takes that layout, with identical
 * matmul results. */
static void test_gemv_lane_layouts(void)
{
    static const int64_t row_counts[] = {1, 2, 3, 17, 301}, cols[] = {32, 544, 2560};
    static const int64_t starts[] = {1, 6, 13, 29};
    x8_table tables[N_X8_TABLES];
    x8_tables(tables);
    uint64_t saved = rng; /* the later tests keep the data they had before this one */
    int checked = 0;
    for (int ti = 0; ti < N_X8_TABLES; ti++) {
        if (!tables[ti].ok) continue;
        for (int dt = 0; dt < SPARK_DTYPE_COUNT; dt++) {
            if (!tables[ti].k->gemv_x16_2l[dt]) continue;
            CHECK_MSG(tables[ti].k->gemv_x16[dt] != NULL, "%s: 2-lane %s without gemv_x16", tables[ti].name,
                      dtype_name((spark_dtype)dt));
            for (int ci = 0; ci < 3; ci++)
                for (int ri = 0; ri < 5; ri++) {
                    int64_t rows = row_counts[ri], c = cols[ci];
                    size_t rb;
                    uint8_t *m = random_matrix((spark_dtype)dt, rows, c, &rb);
                    float *x = x8_activations(c), *xd = malloc((size_t)(c / 32) * sizeof(float));
                    float *xs = malloc((size_t)(c / 32) * sizeof(float));
                    int16_t *xq = malloc((size_t)c * sizeof *xq);
                    float *a = malloc((size_t)rows * sizeof(float)), *b = malloc((size_t)rows * sizeof(float));
                    for (int64_t r = 0; r < rows; r++) a[r] = b[r] = NAN;
                    tables[ti].k->quant_x16(x, c, xq, xd, xs);
                    tables[ti].k->gemv_x16[dt](m, rb, rows, c, xq, xd, xs, a);
                    tables[ti].k->gemv_x16_2l[dt](m, rb, rows, c, xq, xd, xs, b);
                    int bad = 0;
                    for (int64_t r = 0; r < rows; r++) bad += isnan(b[r]) || memcmp(&a[r], &b[r], sizeof(float)) != 0;
                    CHECK_MSG(bad == 0, "%s 2-lane x16 gemv %s rows %lld cols %lld: %d rows differ from gemv_x16",
                              tables[ti].name, dtype_name((spark_dtype)dt), (long long)rows, (long long)c, bad);
                    if (rows == 301) {
                        const rows_gemv g = {.run = run_x16_2l, .k8 = tables[ti].k, .dt = (spark_dtype)dt, .m = m,
                                             .rb = rb, .c = c, .nt = 1, .xd = xd, .xs = xs, .xq = xq};
                        bad = regroup_mismatches(&g, 45, starts, a, b);
                        CHECK_MSG(bad == 0, "%s 2-lane x16 gemv %s cols %lld: %d outputs change with the grouping",
                                  tables[ti].name, dtype_name((spark_dtype)dt), (long long)c, bad);
                    }
                    checked++;
                    free(m);
                    free(x);
                    free(xd);
                    free(xs);
                    free(xq);
                    free(a);
                    free(b);
                }
        }
    }
    /* the float GEMVs' 2- and 3-lane layouts (f32 / f16 / bf16), every token count */
    for (int li = 0; li < N_ISAS; li++) {
        cpu_kernels k;
        if (!cpu_kernels_resolve(all_isas[li], &k)) continue;
        for (int lay = 0; lay < 2; lay++)
            for (int dt = 0; dt < SPARK_DTYPE_COUNT; dt++) {
                gemv_fn alt = lay ? k.gemv_3l[dt] : k.gemv_2l[dt];
                if (!alt) continue;
                for (int ri = 0; ri < 5; ri++)
                    for (int nt = 1; nt <= GEMV_MAX_TOKENS; nt++) {
                        int64_t rows = row_counts[ri], c = 2560 + 17 * (dt == SPARK_DTYPE_F32); /* and a vector tail */
                        size_t rb;
                        uint8_t *m = random_matrix((spark_dtype)dt, rows, c, &rb);
                        float *x = random_floats(GEMV_MAX_TOKENS * c);
                        float *a = malloc((size_t)(rows * nt) * sizeof(float)),
                              *b = malloc((size_t)(rows * nt) * sizeof(float));
                        for (int64_t r = 0; r < rows * nt; r++) a[r] = b[r] = NAN;
                        k.gemv[dt](m, rb, rows, c, x, c, nt, a, rows);
                        alt(m, rb, rows, c, x, c, nt, b, rows);
                        int bad = 0;
                        for (int64_t r = 0; r < rows * nt; r++)
                            bad += isnan(b[r]) || memcmp(&a[r], &b[r], sizeof(float)) != 0;
                        CHECK_MSG(bad == 0, "%s %d-lane gemv %s rows %lld nt %d: %d outputs differ from gemv",
                                  cpu_isa_name(all_isas[li]), 2 + lay, dtype_name((spark_dtype)dt), (long long)rows,
                                  nt, bad);
                        if (rows == 301 && nt == 1) {
                            const rows_gemv g = {.run = lay ? run_float_3l : run_float_2l, .k = &k,
                                                 .dt = (spark_dtype)dt, .m = m, .rb = rb, .c = c, .nt = 1, .x = x};
                            bad = regroup_mismatches(&g, 45, starts, a, b);
                            CHECK_MSG(bad == 0, "%s %d-lane gemv %s: %d outputs change with the grouping",
                                      cpu_isa_name(all_isas[li]), 2 + lay, dtype_name((spark_dtype)dt), bad);
                        }
                        checked++;
                        free(m);
                        free(x);
                        free(a);
                        free(b);
                    }
            }
    }
    /* the backend's choice, and its matmul through either layout */
    cpu_kernels ref;
    if (cpu_kernels_resolve(cpu_isa_active(), &ref) && ref.x8.gemv_x16_2l[SPARK_DTYPE_Q8_0] &&
        !getenv("SPARK_INT8_DOT")) {
        int64_t rows = 301, cols = 2560;
        size_t rb;
        uint8_t *m = random_matrix(SPARK_DTYPE_Q8_0, rows, cols, &rb);
        weight_ref w = {.name = "w", .dtype = SPARK_DTYPE_Q8_0, .rows = rows, .cols = cols, .data = m};
        /* SPARK_GEMV_LANES: 8, 2, 3, and unset (AMD: 2; elsewhere 3 for the
         * float formats, 8 for Q8_0) */
        static const char *lanes_env[4] = {"8", "2", "3", NULL};
        float *x = x8_activations(cols), *y[4];
        for (int k = 0; k < 4; k++) {
            const char *e = lanes_env[k] ? lanes_env[k] : cpu_is_amd() ? "2" : "3";
            if (lanes_env[k]) setenv("SPARK_GEMV_LANES", lanes_env[k], 1);
            backend *be = NULL;
            CHECK(backend_cpu_create(2, &be) == SPARK_OK);
            unsetenv("SPARK_GEMV_LANES");
            const cpu_x8_kernels *t = &cpu_of(be)->k.x8;
            gemv_x16_fn want = *e == '2' ? ref.x8.gemv_x16_2l[SPARK_DTYPE_Q8_0] : ref.x8.gemv_x16[SPARK_DTYPE_Q8_0];
            CHECK_MSG(want != NULL && t->gemv_x16[SPARK_DTYPE_Q8_0] == want,
                      "SPARK_GEMV_LANES=%s: the backend's Q8_0 int16 GEMV is not that layout",
                      lanes_env[k] ? lanes_env[k] : "(unset)");
            gemv_fn want_bf = *e == '2'   ? ref.gemv_2l[SPARK_DTYPE_BF16]
                              : *e == '3' ? ref.gemv_3l[SPARK_DTYPE_BF16]
                                          : ref.gemv[SPARK_DTYPE_BF16];
            CHECK_MSG(want_bf != NULL && cpu_of(be)->k.gemv[SPARK_DTYPE_BF16] == want_bf,
                      "SPARK_GEMV_LANES=%s: the backend's bf16 GEMV is not that layout",
                      lanes_env[k] ? lanes_env[k] : "(unset)");
            y[k] = malloc((size_t)rows * sizeof(float));
            be->ops->matmul(be, y[k], x, &w, 1);
            be->ops->destroy(be);
        }
        for (int k = 1; k < 4; k++)
            CHECK_MSG(!memcmp(y[0], y[k], (size_t)rows * sizeof(float)), "Q8_0 matmul: lane layouts 8 and %s differ",
                      lanes_env[k] ? lanes_env[k] : "(default)");
        free(m);
        free(x);
        for (int k = 0; k < 4; k++) free(y[k]);
    }
    /* the far prefetches' hint: SPARK_GEMV_FAR_NTA=0|1 sets it, else the vendor (AMD: nta) */
    const char *nta_env[3] = {"0", "1", NULL};
    for (int k = 0; k < 3; k++) {
        if (nta_env[k]) setenv("SPARK_GEMV_FAR_NTA", nta_env[k], 1);
        backend *be = NULL;
        CHECK(backend_cpu_create(1, &be) == SPARK_OK);
        unsetenv("SPARK_GEMV_FAR_NTA");
        int want = k < 2 ? k : cpu_is_amd();
        CHECK_MSG(cpu_far_prefetch_nta == want, "SPARK_GEMV_FAR_NTA=%s: the hint is %d, expected %d",
                  nta_env[k] ? nta_env[k] : "(unset)", cpu_far_prefetch_nta, want);
        if (be) be->ops->destroy(be);
    }
    printf("  2- and 3-lane layouts: %d products bit-identical to gemv_x16 / gemv\n", checked);
    rng = saved;
}

static void test_gemm_tile(void)
{
    for (int li = 0; li < N_ISAS; li++) {
        cpu_kernels k;
        if (!cpu_kernels_resolve(all_isas[li], &k)) continue;
        double worst = 0;
        int tw = k.gemm_tokens;
        int64_t cols = 77, ldw = cols + 5;
        int nr_max = k.gemm_rows * 2 + 5;
        float *w = random_floats(nr_max * ldw);
        float *x = random_floats(tw * cols), *xp = malloc((size_t)(tw * cols) * sizeof(float));
        float *y = malloc((size_t)(tw * (nr_max + 1)) * sizeof(float));
        float *xt = malloc((size_t)cols * sizeof(float));
        for (int nt = 1; nt <= tw; nt += (nt < 3 ? 1 : tw / 2 - 1)) {
            cpu_pack_tokens(xp, x, cols, nt, cols, tw);
            for (int nr = 1; nr <= nr_max; nr += 3) {
                /* the columns in two chunks: store, then accumulate */
                int64_t half = cols / 2;
                k.gemm_tile(xp, w, ldw, nr, half, y, nr + 1, nt, 0);
                k.gemm_tile(xp + half * tw, w + half, ldw, nr, cols - half, y, nr + 1, nt, 1);
                for (int t = 0; t < nt; t++)
                    for (int r = 0; r < nr; r++)
                        CHECK_MSG(dot_close(y[t * (nr + 1) + r], w + r * ldw, x + t * cols, cols, &worst),
                                  "%s gemm tile nr %d nt %d: (%d, %d) off", cpu_isa_name(all_isas[li]), nr, nt, t,
                                  r);
            }
        }
        free(w);
        free(x);
        free(xp);
        free(y);
        free(xt);
    }
}

static void test_vector_helpers(void)
{
    enum { N = 1031 };
    for (int li = 0; li < N_ISAS; li++) {
        cpu_kernels k;
        if (!cpu_kernels_resolve(all_isas[li], &k)) continue;
        const char *isa = cpu_isa_name(all_isas[li]);
        float *a = random_floats(N), *b = random_floats(N), *y = malloc(N * sizeof(float));
        double worst = 0;
        for (int n = 0; n <= N; n += n < 40 ? 1 : 97) {
            CHECK_MSG(dot_close(k.dot(a, b, n), a, b, n, &worst), "%s dot n %d", isa, n);
            memcpy(y, b, N * sizeof(float));
            k.axpy(y, 0.37f, a, n);
            for (int i = 0; i < N; i++) {
                double want = i < n ? (double)b[i] + 0.37 * a[i] : b[i];
                CHECK_MSG(fabs(y[i] - want) <= 1e-6 * (fabs(want) + 1), "%s axpy n %d i %d", isa, n, i);
            }
            memcpy(y, b, N * sizeof(float));
            k.add(y, a, n);
            for (int i = 0; i < n; i++) CHECK_MSG(y[i] == b[i] + a[i], "%s add n %d i %d", isa, n, i);
            memcpy(y, b, N * sizeof(float));
            k.scale(y, -1.5f, n);
            for (int i = 0; i < n; i++) CHECK_MSG(y[i] == b[i] * -1.5f, "%s scale n %d i %d", isa, n, i);
        }
        free(a);
        free(b);
        free(y);
    }
}

static void test_gelu_against_erf(void)
{
    enum { N = 4001 };
    float *a = malloc(N * sizeof(float)), *b = malloc(N * sizeof(float)), *x = malloc(N * sizeof(float));
    for (int i = 0; i < N; i++) {
        x[i] = -12.0f + 24.0f * (float)i / (N - 1) + 1e-3f * uniform(); /* crosses 0, +-1, +-4 */
        b[i] = i % 3 ? 1.0f : -0.5f;
    }
    for (int li = 0; li < N_ISAS; li++) {
        cpu_kernels k;
        if (!cpu_kernels_resolve(all_isas[li], &k)) continue;
        memcpy(a, x, N * sizeof(float));
        k.gelu_mul(a, b, N - 3); /* odd length: the tail path too */
        double worst = 0;
        for (int i = 0; i < N - 3; i++) {
            double want = 0.5 * x[i] * (1.0 + erf(x[i] / sqrt(2.0))) * b[i];
            double err = fabs(a[i] - want) / (fabs(x[i] * b[i]) > 1 ? fabs(x[i] * b[i]) : 1);
            if (err > worst) worst = err;
        }
        CHECK_MSG(worst < 4e-7, "%s gelu worst error %.3g", cpu_isa_name(all_isas[li]), worst);
        for (int i = N - 3; i < N; i++) CHECK(a[i] == x[i]); /* untouched past n */
    }
    free(a);
    free(b);
    free(x);
}

static void test_exp_sum_and_axpy_rows(void)
{
    enum { N = 75, D = 200 };
    for (int li = 0; li < N_ISAS; li++) {
        cpu_kernels k;
        if (!cpu_kernels_resolve(all_isas[li], &k)) continue;
        float s[N], orig[N];
        for (int i = 0; i < N; i++) orig[i] = s[i] = 20.0f * uniform() - 5.0f;
        float sum = k.exp_sum(s, 3.0f, N);
        double want_sum = 0;
        for (int i = 0; i < N; i++) {
            double e = exp((double)(orig[i] - 3.0f)); /* the argument as the kernel rounds it */
            want_sum += e;
            CHECK_MSG(fabs(s[i] - e) <= 1e-6 * e + 1e-30, "%s exp %g: %g vs %g", cpu_isa_name(all_isas[li]),
                      orig[i] - 3.0, s[i], e);
        }
        CHECK(fabs(sum - want_sum) <= 1e-5 * want_sum);
        float *rows_data = random_floats(N * D), *y = random_floats(D), y0[D];
        const float *rows[N];
        memcpy(y0, y, sizeof y0);
        for (int j = 0; j < N; j++) rows[j] = rows_data + j * D;
        k.axpy_rows(y, s, rows, N, D - 3);
        for (int i = 0; i < D; i++) {
            double want = y0[i], mag = fabs(y0[i]);
            for (int j = 0; i < D - 3 && j < N; j++) {
                want += (double)s[j] * rows[j][i];
                mag += fabs((double)s[j] * rows[j][i]);
            }
            CHECK_MSG(fabs(y[i] - want) <= DOT_TOL * mag + 1e-30, "%s axpy_rows dim %d", cpu_isa_name(all_isas[li]),
                      i);
        }
        free(rows_data);
        free(y);
    }
}

static void test_rope_head_bit_exact(void)
{
    for (int li = 0; li < N_ISAS; li++) {
        cpu_kernels k;
        if (!cpu_kernels_resolve(all_isas[li], &k)) continue;
        for (int half = 1; half <= 130; half += 43) {
            float *v = random_floats(2 * half), *w = malloc(2 * half * sizeof(float));
            float *cs = random_floats(half), *sn = random_floats(half);
            memcpy(w, v, 2 * half * sizeof(float));
            k.rope_head(v, cs, sn, half);
            cpu_kernels_scalar.rope_head(w, cs, sn, half);
            CHECK_MSG(!memcmp(v, w, 2 * half * sizeof(float)), "%s rope half %d", cpu_isa_name(all_isas[li]), half);
            free(v);
            free(w);
            free(cs);
            free(sn);
        }
    }
}

/* ---- whole ops through the backend: every level, threads 1..3 ----------------- */

static backend *backend_at(cpu_isa isa, int threads)
{
    setenv("SPARK_CPU", cpu_isa_name(isa), 1);
    backend *be = NULL;
    CHECK(backend_cpu_create(threads, &be) == SPARK_OK);
    unsetenv("SPARK_CPU");
    return be;
}

/* n = 3 takes the GEMV path, n = 8 and 45 the GEMM path (packing, panels). */
static void test_matmul_paths_and_threads(void)
{
    static const int token_counts[] = {1, 3, 8, 45};
    for (int li = 0; li < N_ISAS; li++) {
        if (!cpu_isa_supported(all_isas[li])) continue;
        for (int di = 0; di < N_DTYPES; di++) {
            spark_dtype dt = all_dtypes[di];
            int64_t rows = 301, cols = dtype_block_elems(dt) == 256 ? 512 : 160;
            size_t rb;
            uint8_t *m = random_matrix(dt, rows, cols, &rb);
            float *wf = dequant_ref(dt, m, rows, cols);
            weight_ref w = {.name = "w", .dtype = dt, .rows = rows, .cols = cols, .data = m};
            float *x = random_floats(45 * cols);
            float *y[3];
            for (int ti = 0; ti < 4; ti++) {
                int n = token_counts[ti];
                double worst = 0;
                for (int th = 1; th <= 3; th++) {
                    backend *be = backend_at(all_isas[li], th);
                    y[th - 1] = malloc((size_t)(n * rows) * sizeof(float));
                    be->ops->matmul(be, y[th - 1], x, &w, n);
                    be->ops->destroy(be);
                }
                /* one token of a K-quant: the int8-activation kernels (SPARK_KQUANT_X8=1 only) */
                backend *probe = backend_at(all_isas[li], 1);
                int x8 = n == 1 && cpu_of(probe)->k.x8.gemv[dt] != NULL;
                /* one token of Q8_0 / Q4_K / Q6_K: the int16-activation kernels (default) */
                int x16 = n == 1 && cpu_of(probe)->k.x8.gemv_x16[dt] != NULL;
                probe->ops->destroy(probe);
                x8_stats st = {0};
                for (int t = 0; t < n; t++)
                    for (int64_t r = 0; r < rows; r++)
                        CHECK_MSG(x8 ? x8_close(y[0][t * rows + r], wf + r * cols, x + t * cols, cols, &st)
                                  : x16 ? xq_close(y[0][t * rows + r], wf + r * cols, x + t * cols, cols, 32767.0, &st)
                                        : dot_close(y[0][t * rows + r], wf + r * cols, x + t * cols, cols, &worst),
                                  "%s matmul %s n %d (%d, %lld)%s", cpu_isa_name(all_isas[li]), dtype_name(dt), n, t,
                                  (long long)r, x8 ? " (int8 path)" : x16 ? " (int16 path)" : "");
                double rms;
                if (x8 || x16) CHECK_MSG(x8_rms_ok(&st, &rms), "%s matmul %s n 1: RMS error %.3g x its random-walk size",
                                  cpu_isa_name(all_isas[li]), dtype_name(dt), rms);
                CHECK_MSG(!memcmp(y[0], y[1], (size_t)(n * rows) * sizeof(float)) &&
                              !memcmp(y[0], y[2], (size_t)(n * rows) * sizeof(float)),
                          "%s matmul %s n %d: thread counts disagree", cpu_isa_name(all_isas[li]), dtype_name(dt),
                          n);
                for (int th = 0; th < 3; th++) free(y[th]);
            }
            free(m);
            free(wf);
            free(x);
        }
    }
}

/* Attention with a cache (pos0 > 0), GQA 4, window, odd head_dim: float64
 * reference, and identical results for 1..3 threads. N = 2 takes the
 * per-token path (attention.c), N = 9 the tiled one (attention_tiled.c). */
static void check_attention(int N)
{
    enum { H = 8, HK = 2, D = 36, PRIOR = 70, WINDOW = 50, QKV = (H + 2 * HK) * D, KV = HK * D };
    for (int window = 0; window <= WINDOW; window += WINDOW) {
        int64_t slots = window ? window : PRIOR + N;
        kv_layer cache = {.slots = slots, .window = window};
        float *past = random_floats((int64_t)PRIOR * QKV); /* rows of tokens 0..PRIOR-1 */
        float *qkv = random_floats((int64_t)N * QKV);
        cache.k = calloc((size_t)(slots * KV), sizeof(float));
        cache.v = calloc((size_t)(slots * KV), sizeof(float));
        attn_shape sh = {.n_head = H, .n_head_kv = HK, .head_dim = D, .qkv_stride = QKV, .scale = 1.0f / 6};
        for (int li = 0; li < N_ISAS; li++) {
            if (!cpu_isa_supported(all_isas[li])) continue;
            float *out[3];
            for (int th = 1; th <= 3; th++) {
                backend *be = backend_at(all_isas[li], th);
                be->ops->kv_store(be, &cache, past, 0, PRIOR, &sh);
                out[th - 1] = malloc((size_t)N * H * D * sizeof(float));
                be->ops->attention(be, out[th - 1], qkv, &cache, PRIOR, N, &sh);
                be->ops->destroy(be);
            }
            for (int t = 0; t < N; t++)
                for (int h = 0; h < H; h++) {
                    int64_t p = PRIOR + t, lo = window && p - window + 1 > 0 ? p - window + 1 : 0;
                    const float *q = qkv + t * QKV + h * D;
                    double sc[PRIOR + N], mx = -1e300, sum = 0;
                    for (int64_t j = lo; j <= p; j++) {
                        const float *row = j < PRIOR ? past + j * QKV : qkv + (j - PRIOR) * QKV;
                        double s = 0;
                        for (int d = 0; d < D; d++) s += (double)q[d] * row[H * D + (h / (H / HK)) * D + d];
                        sc[j] = s / 6;
                        if (sc[j] > mx) mx = sc[j];
                    }
                    for (int64_t j = lo; j <= p; j++) sum += exp(sc[j] - mx);
                    for (int d = 0; d < D; d++) {
                        double o = 0;
                        for (int64_t j = lo; j <= p; j++) {
                            const float *row = j < PRIOR ? past + j * QKV : qkv + (j - PRIOR) * QKV;
                            o += exp(sc[j] - mx) / sum * row[H * D + KV + (h / (H / HK)) * D + d];
                        }
                        float got = out[0][(t * H + h) * D + d];
                        CHECK_MSG(fabs(got - o) <= 2e-6 * (1 + fabs(o)), "%s n %d window %d t %d h %d d %d: %g vs %g",
                                  cpu_isa_name(all_isas[li]), N, window, t, h, d, got, o);
                    }
                }
            size_t bytes = (size_t)N * H * D * sizeof(float);
            CHECK_MSG(!memcmp(out[0], out[1], bytes) && !memcmp(out[0], out[2], bytes),
                      "%s attention: thread counts disagree", cpu_isa_name(all_isas[li]));
            for (int th = 0; th < 3; th++) free(out[th]);
        }
        free(past);
        free(qkv);
        free(cache.k);
        free(cache.v);
    }
}

static void test_attention_reference_and_threads(void)
{
    check_attention(2);
    check_attention(9);
}

int main(void)
{
    printf("  CPU level here: %s\n", cpu_isa_name(cpu_isa_detect()));
    RUN(test_dequant_bit_exact);
    RUN(test_gemv_all_dtypes);
    RUN(test_gemv_x8_bound);
    RUN(test_gemv_x16);
    RUN(test_gemv_grouping_bit_exact);
    RUN(test_gemv_lane_layouts);
    RUN(test_gemm_tile);
    RUN(test_vector_helpers);
    RUN(test_gelu_against_erf);
    RUN(test_exp_sum_and_axpy_rows);
    RUN(test_rope_head_bit_exact);
    RUN(test_matmul_paths_and_threads);
    RUN(test_attention_reference_and_threads);
    CHECK_EXIT();
}

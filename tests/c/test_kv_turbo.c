/*
 * test_kv_turbo.c — the KV-cache formats (engine/kv_format.h) and the CPU
 * attention that reads them (backend/cpu/kv_turbo.c):
 *   - the Lloyd-Max codebooks are fixed points with the textbook distortions;
 *   - the rotation is orthogonal and R^T undoes it;
 *   - quantize/dequantize MSE on random unit vectors matches the codebook's
 *     distortion (plain scale) and distortion / (1 - distortion) (the
 *     unbiased scale the cache uses);
 *   - inner products <q, k_hat> are unbiased (the plain scale's shrink is
 *     detected by the same test, so the test has teeth);
 *   - every SIMD decoder equals the scalar reference bit for bit;
 *   - attention from packed rows equals float64 attention over the
 *     dequantized rows (<= 1e-5), for every format, GQA, sliding rings,
 *     chunked prefill and threaded decode with split keys; prefill = decode;
 *   - formats a head_dim cannot use are refused with a reason.
 */
#include "check.h"

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/kv_turbo.h"
#include "engine/kv_format.h"
#include "engine/session.h"

#include <stdlib.h>

/* ---- random numbers ------------------------------------------------------------ */

static uint64_t rng_state = 0x1234567;

static double uniform01(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return ((rng_state >> 11) + 0.5) / 9007199254740992.0;
}

static double gauss(void)
{
    return sqrt(-2.0 * log(uniform01())) * cos(2.0 * M_PI * uniform01());
}

static void random_unit(float *x, int d)
{
    double n2 = 0;
    for (int i = 0; i < d; i++) {
        x[i] = (float)gauss();
        n2 += (double)x[i] * x[i];
    }
    for (int i = 0; i < d; i++) x[i] = (float)(x[i] / sqrt(n2));
}

static const spark_kv_type CODED[] = {SPARK_KV_F16, SPARK_KV_BF16, SPARK_KV_TQ2, SPARK_KV_TQ3, SPARK_KV_TQ3_5,
                                      SPARK_KV_TQ4};
enum { N_CODED = sizeof CODED / sizeof CODED[0] };

/* ---- codebooks ------------------------------------------------------------------- */

static double pdf(double x) { return isinf(x) ? 0 : exp(-0.5 * x * x) / sqrt(2 * M_PI); }
static double cdf(double x) { return 0.5 * erfc(-x / sqrt(2.0)); }

static void test_codebooks_are_lloyd_max(void)
{
    /* Max (1960) / Lloyd (1982) for a unit Gaussian */
    const double want[5] = {0, 0.3634, 0.1175, 0.03454, 0.009497};
    for (int bits = 1; bits <= 4; bits++) {
        const kv_codebook *cb = kv_codebook_get(bits);
        CHECK(cb->levels == 1 << bits);
        CHECK_MSG(fabs(cb->distortion - want[bits]) < 2e-4 * (1 << bits), "%d bits: distortion %.6f, expected %.5f",
                  bits, cb->distortion, want[bits]);
        printf("  %d bits: distortion %.6f (%.2f dB), outer centroid %.4f\n", bits, cb->distortion,
               -10 * log10(cb->distortion), cb->centroid_f64[cb->levels - 1]);
        for (int i = 0; i < cb->levels; i++) {
            /* centroid condition: each is its cell's conditional mean, and symmetric */
            double lo = i ? 0.5 * (cb->centroid_f64[i - 1] + cb->centroid_f64[i]) : -INFINITY;
            double hi = i + 1 < cb->levels ? 0.5 * (cb->centroid_f64[i] + cb->centroid_f64[i + 1]) : INFINITY;
            double mean = (pdf(lo) - pdf(hi)) / (cdf(hi) - cdf(lo));
            CHECK_NEAR(cb->centroid_f64[i], mean, 1e-12);
            CHECK_NEAR(cb->centroid_f64[i], -cb->centroid_f64[cb->levels - 1 - i], 1e-12);
        }
    }
    /* the 2-bit quantizer's published centroids */
    CHECK_NEAR(kv_codebook_get(2)->centroid[3], 1.5104, 1e-4);
    CHECK_NEAR(kv_codebook_get(2)->centroid[2], 0.4528, 1e-4);
}

static void test_rotation_is_orthogonal(void)
{
    for (int d = 16; d <= KV_MAX_CODED_HEAD_DIM; d *= 2) {
        float x[KV_MAX_CODED_HEAD_DIM], y[KV_MAX_CODED_HEAD_DIM];
        random_unit(x, d);
        memcpy(y, x, sizeof(float) * (size_t)d);
        kv_rotate(y, d);
        double n2 = 0;
        for (int i = 0; i < d; i++) n2 += (double)y[i] * y[i];
        CHECK_NEAR(n2, 1.0, 1e-5);
        kv_unrotate(y, d);
        double err = 0;
        for (int i = 0; i < d; i++) err = fmax(err, fabs(y[i] - x[i]));
        CHECK_MSG(err < 1e-6, "d %d: R^T R x differs from x by %g", d, err);
        /* a basis vector spreads evenly: every coordinate is +-1/sqrt(d) */
        memset(y, 0, sizeof y);
        y[3] = 1;
        kv_rotate(y, d);
        for (int i = 0; i < d; i++) CHECK_NEAR(fabs(y[i]), 1 / sqrt((double)d), 1e-6);
    }
    int plus = 0;
    for (int i = 0; i < KV_MAX_CODED_HEAD_DIM; i++) plus += kv_tq_sign(i) > 0;
    CHECK_MSG(plus > 200 && plus < 312, "%d of 512 signs positive", plus);
}

/* ---- codec error ------------------------------------------------------------------- */

enum { MSE_TRIALS = 3000, IP_TRIALS = 20000 };

/* Mean |x - x_hat|^2 over random unit vectors; plain: the |x|/sqrt(d) scale. */
static double measured_mse(int bits, int d, int plain)
{
    spark_kv_type t = bits == 2 ? SPARK_KV_TQ2 : bits == 3 ? SPARK_KV_TQ3 : SPARK_KV_TQ4;
    uint8_t row[KV_TQ_SCALE_BYTES + KV_MAX_CODED_HEAD_DIM];
    float x[KV_MAX_CODED_HEAD_DIM], xh[KV_MAX_CODED_HEAD_DIM];
    double sum = 0;
    for (int n = 0; n < MSE_TRIALS; n++) {
        random_unit(x, d);
        for (int i = 0; i < d; i++) x[i] *= 3.0f; /* the scale must not matter */
        if (plain) kv_tq_encode_plain(bits, x, d, row);
        else kv_encode_row(t, 0, x, d, row);
        kv_dequantize_row(t, 0, row, d, xh);
        for (int i = 0; i < d; i++) sum += ((double)x[i] - xh[i]) * ((double)x[i] - xh[i]) / 9.0;
    }
    return sum / MSE_TRIALS;
}

static void test_mse_matches_distortion(void)
{
    for (int d = 128; d <= 256; d *= 2)
        for (int bits = 2; bits <= 4; bits++) {
            double delta = kv_codebook_get(bits)->distortion;
            double plain = measured_mse(bits, d, 1), unbiased = measured_mse(bits, d, 0);
            double want_unbiased = delta / (1 - delta);
            printf("  d %d, %d bits: MSE %.5f (codebook %.5f, %+.1f%%); unbiased scale %.5f (predicted %.5f, %+.1f%%)\n",
                   d, bits, plain, delta, 100 * (plain / delta - 1), unbiased, want_unbiased,
                   100 * (unbiased / want_unbiased - 1));
            CHECK_MSG(fabs(plain / delta - 1) < 0.04, "d %d %d bits: plain MSE %.5f vs distortion %.5f", d, bits,
                      plain, delta);
            CHECK_MSG(fabs(unbiased / want_unbiased - 1) < 0.04, "d %d %d bits: MSE %.5f vs %.5f", d, bits, unbiased,
                      want_unbiased);
        }
}

/* Mean and standard error of (<q, k_hat> - <q, k>) / |q||k| where q = k + noise. */
static void ip_error(spark_kv_type t, int plain, double correlation, int d, double *mean, double *se)
{
    uint8_t row[KV_TQ_SCALE_BYTES + KV_MAX_CODED_HEAD_DIM];
    float q[KV_MAX_CODED_HEAD_DIM], k[KV_MAX_CODED_HEAD_DIM], kh[KV_MAX_CODED_HEAD_DIM], noise[KV_MAX_CODED_HEAD_DIM];
    double s = 0, s2 = 0;
    for (int n = 0; n < IP_TRIALS; n++) {
        random_unit(k, d);
        random_unit(noise, d);
        for (int i = 0; i < d; i++) q[i] = (float)(correlation * k[i] + sqrt(1 - correlation * correlation) * noise[i]);
        if (plain) kv_tq_encode_plain(kv_tq_bits(t, 0), k, d, row);
        else kv_encode_row(t, 0, k, d, row);
        kv_dequantize_row(t, 0, row, d, kh);
        double exact = 0, est = 0;
        for (int i = 0; i < d; i++) {
            exact += (double)q[i] * k[i];
            est += (double)q[i] * kh[i];
        }
        s += est - exact;
        s2 += (est - exact) * (est - exact);
    }
    *mean = s / IP_TRIALS;
    *se = sqrt((s2 / IP_TRIALS - *mean * *mean) / IP_TRIALS);
}

static void test_inner_products_unbiased(void)
{
    const spark_kv_type tq[] = {SPARK_KV_TQ2, SPARK_KV_TQ3, SPARK_KV_TQ4};
    for (int i = 0; i < 3; i++) {
        double delta = kv_codebook_get(kv_tq_bits(tq[i], 0))->distortion;
        for (int c = 0; c < 2; c++) {
            double corr = c ? 0.8 : 0.0, mean, se;
            ip_error(tq[i], 0, corr, 128, &mean, &se);
            printf("  %s, corr %.1f: mean error %+.5f (standard error %.5f, %.1f sigma)\n", spark_kv_type_name(tq[i]),
                   corr, mean, se, mean / se);
            CHECK_MSG(fabs(mean) < 4 * se, "%s corr %.1f: bias %g is %.1f standard errors", spark_kv_type_name(tq[i]),
                      corr, mean, mean / se);
        }
        /* the plain scale shrinks <q, k> by about (1 - distortion): seen here */
        double mean, se;
        ip_error(tq[i], 1, 0.8, 128, &mean, &se);
        CHECK_MSG(mean < -8 * se && fabs(mean / (-0.8 * delta) - 1) < 0.25,
                  "%s plain scale: mean error %g, expected about %g", spark_kv_type_name(tq[i]), mean, -0.8 * delta);
    }
}

static void test_float_formats_round(void)
{
    float x[64], y[64];
    uint8_t row[256];
    for (int i = 0; i < 64; i++) x[i] = (float)(gauss() * 10);
    kv_encode_row(SPARK_KV_F16, 0, x, 64, row);
    kv_dequantize_row(SPARK_KV_F16, 0, row, 64, y);
    for (int i = 0; i < 64; i++) CHECK(fabsf(y[i] - x[i]) <= fabsf(x[i]) * 0x1p-11f + 1e-7f);
    kv_encode_row(SPARK_KV_BF16, 1, x, 64, row);
    kv_dequantize_row(SPARK_KV_BF16, 1, row, 64, y);
    for (int i = 0; i < 64; i++) CHECK(fabsf(y[i] - x[i]) <= fabsf(x[i]) * 0x1p-8f);
    CHECK(kv_row_bytes(SPARK_KV_TQ4, 0, 256) == 132 && kv_row_bytes(SPARK_KV_TQ3_5, 0, 256) == 100 &&
          kv_row_bytes(SPARK_KV_TQ3_5, 1, 256) == 132 && kv_row_bytes(SPARK_KV_TQ2, 1, 128) == 36 &&
          kv_row_bytes(SPARK_KV_F16, 0, 40) == 80);
    CHECK_NEAR(spark_kv_type_bits(SPARK_KV_TQ4, 256), 4.125, 1e-12);
    CHECK_NEAR(spark_kv_type_bits(SPARK_KV_TQ3_5, 256), 3.625, 1e-12);
}

/* ---- decoders ------------------------------------------------------------------- */

static void test_simd_decoders_match_scalar(void)
{
    enum { D = 256, ROWS = 5 };
    uint8_t store[ROWS][2 * D + 8];
    const uint8_t *rows[ROWS];
    float want[ROWS][D], got[ROWS][D], scale[ROWS];
    for (int ti = 0; ti < N_CODED; ti++)
        for (int is_value = 0; is_value < 2; is_value++) {
            spark_kv_type t = CODED[ti];
            for (int r = 0; r < ROWS; r++) {
                float x[D];
                for (int i = 0; i < D; i++) x[i] = (float)gauss();
                kv_encode_row(t, is_value, x, D, store[r]);
                rows[r] = store[r];
                float s = kv_decode_row(t, is_value, store[r], D, want[r]);
                for (int i = 0; i < D; i++) want[r][i] *= s;
            }
            for (int isa = CPU_ISA_SCALAR; isa <= CPU_ISA_AVX512; isa++) {
                if (!cpu_isa_supported((cpu_isa)isa)) continue;
                kv_decode_fn f = kv_decoder(t, is_value, (cpu_isa)isa);
                CHECK(f != NULL);
                if (!f) continue;
                f(rows, ROWS, D, &got[0][0], D, scale);
                int bad = 0;
                for (int r = 0; r < ROWS; r++)
                    for (int i = 0; i < D; i++) bad += got[r][i] * scale[r] != want[r][i];
                CHECK_MSG(!bad, "%s %s, %s: %d values differ from kv_decode_row", spark_kv_type_name(t),
                          is_value ? "values" : "keys", cpu_isa_name((cpu_isa)isa), bad);
            }
        }
}

/* ---- attention from packed rows ---------------------------------------------------- */

typedef struct attn_case {
    int n_head, n_head_kv, head_dim, window, slots, threads;
    const int *chunks;
    int n_chunks;
} attn_case;

/* float64 attention of every query over the DEQUANTIZED rows (what the cache holds). */
static void reference_attention(const attn_case *c, spark_kv_type t, const float *qkv_all, int n_total, double *out)
{
    int D = c->head_dim, Hk = c->n_head_kv, H = c->n_head;
    int64_t stride = (int64_t)(H + 2 * Hk) * D;
    float *kd = malloc(sizeof(float) * (size_t)n_total * Hk * D), *vd = malloc(sizeof(float) * (size_t)n_total * Hk * D);
    uint8_t row[4 * KV_MAX_CODED_HEAD_DIM];
    for (int j = 0; j < n_total; j++)
        for (int kh = 0; kh < Hk; kh++) {
            const float *base = qkv_all + j * stride + (int64_t)H * D;
            kv_encode_row(t, 0, base + (int64_t)kh * D, D, row);
            kv_dequantize_row(t, 0, row, D, kd + ((int64_t)j * Hk + kh) * D);
            kv_encode_row(t, 1, base + (int64_t)(Hk + kh) * D, D, row);
            kv_dequantize_row(t, 1, row, D, vd + ((int64_t)j * Hk + kh) * D);
        }
    double *w = malloc(sizeof(double) * (size_t)n_total);
    for (int p = 0; p < n_total; p++)
        for (int h = 0; h < H; h++) {
            int kh = h / (H / Hk);
            const float *q = qkv_all + p * stride + (int64_t)h * D;
            double m = -INFINITY, sum = 0;
            for (int j = 0; j <= p; j++) {
                w[j] = -INFINITY;
                if (c->window && p - j >= c->window) continue;
                double s = 0;
                for (int d = 0; d < D; d++) s += (double)q[d] * kd[((int64_t)j * Hk + kh) * D + d];
                w[j] = s / sqrt((double)D);
                m = fmax(m, w[j]);
            }
            for (int j = 0; j <= p; j++) sum += w[j] = exp(w[j] - m);
            for (int d = 0; d < D; d++) {
                double acc = 0;
                for (int j = 0; j <= p; j++) acc += w[j] * vd[((int64_t)j * Hk + kh) * D + d];
                out[((int64_t)p * H + h) * D + d] = acc / sum;
            }
        }
    free(w);
    free(kd);
    free(vd);
}

/* Run the chunks through attention + kv_store with a cache of format t;
 * returns the largest error relative to the output row's norm. */
static double run_coded_attention(const attn_case *c, spark_kv_type t, float *got_out)
{
    backend *be;
    CHECK(backend_cpu_create(c->threads, &be) == SPARK_OK);
    int D = c->head_dim, Hk = c->n_head_kv, H = c->n_head;
    int n_total = 0;
    for (int i = 0; i < c->n_chunks; i++) n_total += c->chunks[i];
    int64_t stride = (int64_t)(H + 2 * Hk) * D;
    float *qkv = malloc(sizeof(float) * (size_t)(n_total * stride));
    for (int64_t i = 0; i < n_total * stride; i++) qkv[i] = (float)gauss();
    attn_shape sh = {.n_head = H, .n_head_kv = Hk, .head_dim = D, .qkv_stride = stride, .scale = 1 / sqrtf((float)D)};
    kv_layer kv = {.slots = c->slots, .window = c->window, .type = t};
    kv.k = calloc((size_t)(c->slots * Hk * kv_row_bytes(t, 0, D)), 1);
    kv.v = calloc((size_t)(c->slots * Hk * kv_row_bytes(t, 1, D)), 1);
    int64_t pos = 0;
    for (int i = 0; i < c->n_chunks; i++) {
        const float *chunk = qkv + pos * stride;
        be->ops->attention(be, got_out + pos * H * D, chunk, &kv, pos, c->chunks[i], &sh);
        be->ops->kv_store(be, &kv, chunk, pos, c->chunks[i], &sh);
        pos += c->chunks[i];
    }
    double *want = malloc(sizeof(double) * (size_t)n_total * H * D);
    reference_attention(c, t, qkv, n_total, want);
    double worst = 0;
    for (int64_t r = 0; r < (int64_t)n_total * H; r++) {
        double err = 0, norm = 0;
        for (int d = 0; d < D; d++) {
            double e = got_out[r * D + d] - want[r * D + d];
            err += e * e;
            norm += want[r * D + d] * want[r * D + d];
        }
        worst = fmax(worst, sqrt(err / fmax(norm, 1e-30)));
    }
    free(want);
    free(qkv);
    free(kv.k);
    free(kv.v);
    be->ops->destroy(be);
    return worst;
}

static void check_case(const char *name, const attn_case *c)
{
    int n_total = 0;
    for (int i = 0; i < c->n_chunks; i++) n_total += c->chunks[i];
    float *out = malloc(sizeof(float) * (size_t)n_total * c->n_head * c->head_dim);
    for (int ti = 0; ti < N_CODED; ti++) {
        double err = run_coded_attention(c, CODED[ti], out);
        CHECK_MSG(err <= 1e-5, "%s, %s: relative error %g vs float64 attention over the dequantized rows", name,
                  spark_kv_type_name(CODED[ti]), err);
    }
    free(out);
}

static void test_attention_gqa_chunks(void)
{
    int chunks[] = {37, 1, 64, 5, 1, 1};
    attn_case c = {.n_head = 8, .n_head_kv = 2, .head_dim = 64, .slots = 200, .threads = 3, .chunks = chunks,
                   .n_chunks = 6};
    check_case("full, GQA 4, chunks", &c);
}

static void test_attention_sliding_ring(void)
{
    int chunks[] = {20, 3, 1, 30, 1, 1, 12}; /* chunks longer than the ring, and wraps */
    attn_case c = {.n_head = 4, .n_head_kv = 1, .head_dim = 128, .window = 16, .slots = 16, .threads = 2,
                   .chunks = chunks, .n_chunks = 7};
    check_case("sliding 16, MQA", &c);
}

static void test_attention_decode_split_keys(void)
{
    /* one query over 1500 cached keys with 4 threads: the keys are split */
    int chunks[] = {500, 1000, 1, 1};
    attn_case c = {.n_head = 2, .n_head_kv = 1, .head_dim = 32, .slots = 1502, .threads = 4, .chunks = chunks,
                   .n_chunks = 4};
    check_case("decode at depth, split keys", &c);
    int big[] = {200, 1}; /* many query heads per kv head: several head groups per item */
    attn_case g = {.n_head = 40, .n_head_kv = 1, .head_dim = 16, .slots = 201, .threads = 2, .chunks = big,
                   .n_chunks = 2};
    check_case("40 heads on one kv head", &g);
}

static void test_prefill_equals_decode(void)
{
    int one[40], whole[] = {40};
    for (int i = 0; i < 40; i++) one[i] = 1;
    for (int ti = 0; ti < N_CODED; ti++) {
        attn_case a = {.n_head = 4, .n_head_kv = 2, .head_dim = 64, .slots = 40, .threads = 2, .chunks = whole,
                       .n_chunks = 1};
        attn_case b = a;
        b.chunks = one;
        b.n_chunks = 40;
        float *x = malloc(sizeof(float) * 40 * 4 * 64), *y = malloc(sizeof(float) * 40 * 4 * 64);
        uint64_t seed = rng_state;
        run_coded_attention(&a, CODED[ti], x);
        rng_state = seed; /* the same qkv */
        run_coded_attention(&b, CODED[ti], y);
        double worst = 0;
        for (int i = 0; i < 40 * 4 * 64; i++) worst = fmax(worst, fabs(x[i] - y[i]));
        CHECK_MSG(worst < 2e-6, "%s: prefill and decode differ by %g", spark_kv_type_name(CODED[ti]), worst);
        free(x);
        free(y);
    }
}

static void test_refusals(void)
{
    CHECK(kv_type_check(SPARK_KV_TQ4, 40) == SPARK_ERR_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("power of two");
    CHECK(kv_type_check(SPARK_KV_TQ3_5, 8) == SPARK_ERR_UNSUPPORTED);
    CHECK(kv_type_check(SPARK_KV_F16, 40) == SPARK_OK);
    CHECK(kv_type_check(SPARK_KV_BF16, 1024) == SPARK_ERR_UNSUPPORTED);
    CHECK(kv_type_check(SPARK_KV_F32, 1024) == SPARK_OK);
    CHECK(kv_type_check((spark_kv_type)99, 64) == SPARK_ERR_ARG);
    CHECK(!strcmp(spark_kv_type_name(SPARK_KV_TQ3_5), "tq3.5") && !strcmp(spark_kv_type_name((spark_kv_type)-1), "invalid"));
}

int main(void)
{
    RUN(test_codebooks_are_lloyd_max);
    RUN(test_rotation_is_orthogonal);
    RUN(test_mse_matches_distortion);
    RUN(test_inner_products_unbiased);
    RUN(test_float_formats_round);
    RUN(test_simd_decoders_match_scalar);
    RUN(test_attention_gqa_chunks);
    RUN(test_attention_sliding_ring);
    RUN(test_attention_decode_split_keys);
    RUN(test_prefill_equals_decode);
    RUN(test_refusals);
    CHECK_EXIT();
}

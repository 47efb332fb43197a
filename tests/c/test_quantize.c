/*
 * test_quantize.c — the quantizers (model/quantize.h): every format's round
 * trip within the error bound quantize.h documents, on blocks of several
 * shapes (gaussian, an outlier, one sign, constant, zero, tiny values);
 * relative RMS error on gaussian rows, what model weights look like; and
 * Q8_0 / Q4_0 / bf16 / f16 re-quantizing their own output to the same bytes.
 */
#include "check.h"
#include "test_random.h"

#include "model/model.h"
#include "model/quantize.h"

#include <math.h>
#include <stdlib.h>

/* Block contents of several shapes: gaussian, uniform, one outlier, all
 * positive, all negative, constant, zero, tiny values near f16's floor. */
static void fill_block(float *x, int n, int kind)
{
    for (int i = 0; i < n; i++) {
        float g = gauss();
        switch (kind % 8) {
        case 0: x[i] = g; break;
        case 1: x[i] = uniform(); break;
        case 2: x[i] = i == n / 3 ? 40 * g : 0.1f * g; break;
        case 3: x[i] = fabsf(g) + 0.5f; break;
        case 4: x[i] = -fabsf(g) - 0.2f; break;
        case 5: x[i] = 0.75f; break;
        case 6: x[i] = 0; break;
        default: x[i] = 1e-6f * g; break;
        }
    }
}

static float rd_f16(const uint8_t *p) { return f16_to_f32((uint16_t)(p[0] | (p[1] << 8))); }

/* Worst |error| / bound over many blocks, where bound is the format's
 * documented one (quantize.h); must stay <= 1. */
static double round_trip_ratio(spark_dtype dt, int kind)
{
    enum { N = 4096 };
    float x[N], y[N];
    uint8_t q[N * 4];
    double worst = 0;
    for (int rep = 0; rep < 4; rep++) {
        for (int b = 0; b < N; b += 256) fill_block(x + b, 256, kind + rep);
        quantize_row(dt, x, N, q);
        weight_ref w = {.name = "q", .dtype = dt, .rows = 1, .cols = N, .data = q};
        weight_row_to_f32(&w, 0, y);
        int be = dt == SPARK_DTYPE_Q4_K ? 32 : dt == SPARK_DTYPE_Q6_K ? 16 : dtype_block_elems(dt);
        for (int s = 0; s < N; s += be) { /* per sub-block */
            float lo = 0, hi = 0, amax = 0;
            for (int i = s; i < s + be; i++) {
                lo = fminf(lo, x[i]);
                hi = fmaxf(hi, x[i]);
                amax = fmaxf(amax, fabsf(x[i]));
            }
            const uint8_t *blk = q + (size_t)(s / dtype_block_elems(dt)) * dtype_block_bytes(dt);
            for (int i = s; i < s + be; i++) {
                double bound, e = fabs((double)y[i] - x[i]);
                switch (dt) {
                case SPARK_DTYPE_Q8_0: bound = 0.5 * rd_f16(blk) + 1e-7 * fabs(x[i]); break;
                case SPARK_DTYPE_Q4_0: bound = fabs(rd_f16(blk)) + 1e-7 * fabs(x[i]); break;
                case SPARK_DTYPE_Q4_K: /* a step of the sub-block plus the 6-bit scale/min rounding */
                    bound = (hi - lo) / 15.0 + 8 * rd_f16(blk) + rd_f16(blk + 2) + 1e-7 * fabs(x[i]);
                    break;
                case SPARK_DTYPE_Q6_K:
                    /* the scale is a least-squares fit over candidates that include
                     * the clip-free amax/31, so the sub-block's squared error is at
                     * most 16 * (step/2)^2 and one value's error at most
                     * sqrt(16)/2 = 2 steps (an outlier may be clipped on purpose);
                     * plus the 8-bit scale's rounding (at most d/2 per unit of a
                     * |q| <= 32: 16 d) — the two add, they are not alternatives
                     * (with a maximum instead, one data draw measured 1.05x); a
                     * sub-block whose scale rounds to 0 decodes to zeros, off by
                     * at most its amax */
                    bound = ((const int8_t *)(blk + 192))[(s % 256) / 16] == 0
                                ? amax
                                : 2 * amax / 31.0 + 16 * rd_f16(blk + 208) + 1e-7 * fabs(x[i]);
                    break;
                case SPARK_DTYPE_BF16: bound = ldexp(fabs(x[i]), -8); break;
                case SPARK_DTYPE_F16: bound = ldexp(fabs(x[i]), -11) + ldexp(1.0, -25); break;
                default: bound = 0; break;
                }
                double ratio = e == 0 ? 0 : bound > 0 ? e / bound : INFINITY;
                if (ratio > worst) worst = ratio;
            }
        }
    }
    return worst;
}

/* Relative RMS error on gaussian rows: what a model's weights look like. */
static void test_quantize_rms_on_gaussian(void)
{
    static const struct {
        spark_dtype dt;
        double max_rel_rms;
    } cases[] = {{SPARK_DTYPE_Q8_0, 0.006}, {SPARK_DTYPE_Q4_0, 0.09}, {SPARK_DTYPE_Q4_K, 0.075}, {SPARK_DTYPE_Q6_K, 0.018},
                 {SPARK_DTYPE_BF16, 0.003}, {SPARK_DTYPE_F16, 0.0004}};
    enum { N = 8192 };
    static float x[N], y[N];
    static uint8_t q[N * 4];
    for (int i = 0; i < N; i++) x[i] = gauss();
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        quantize_row(cases[c].dt, x, N, q);
        weight_ref w = {.name = "q", .dtype = cases[c].dt, .rows = 1, .cols = N, .data = q};
        weight_row_to_f32(&w, 0, y);
        double se = 0, sx = 0;
        for (int i = 0; i < N; i++) {
            se += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
            sx += (double)x[i] * x[i];
        }
        double rel = sqrt(se / sx);
        printf("  %s: relative RMS error %.4f on gaussian data\n", dtype_name(cases[c].dt), rel);
        CHECK_MSG(rel <= cases[c].max_rel_rms, "%s: %.4f > %.4f", dtype_name(cases[c].dt), rel, cases[c].max_rel_rms);
    }
}

static void test_quantize_round_trip_bounds(void)
{
    static const spark_dtype types[] = {SPARK_DTYPE_F32, SPARK_DTYPE_F16, SPARK_DTYPE_BF16, SPARK_DTYPE_Q8_0,
                                        SPARK_DTYPE_Q4_0, SPARK_DTYPE_Q4_K, SPARK_DTYPE_Q6_K};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        double worst = 0;
        for (int kind = 0; kind < 8; kind++) {
            double r = round_trip_ratio(types[ti], kind);
            CHECK_MSG(r <= 1.0, "%s, data kind %d: error %.9g x the bound", dtype_name(types[ti]), kind, r);
            if (r > worst) worst = r;
        }
        printf("  %s: worst error / bound = %.3f\n", dtype_name(types[ti]), worst);
    }
}

/* The quantizers are deterministic and idempotent on their own output
 * (dequantized values re-quantize to the same bytes) for Q8_0 and Q4_0. */
static void test_quantize_idempotent(void)
{
    static const spark_dtype types[] = {SPARK_DTYPE_Q8_0, SPARK_DTYPE_Q4_0, SPARK_DTYPE_BF16, SPARK_DTYPE_F16};
    enum { N = 512 };
    float x[N], y[N];
    uint8_t a[N * 2], b[N * 2];
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        spark_dtype dt = types[ti];
        for (int i = 0; i < N; i++) x[i] = gauss();
        quantize_row(dt, x, N, a);
        weight_ref w = {.name = "q", .dtype = dt, .rows = 1, .cols = N, .data = a};
        weight_row_to_f32(&w, 0, y);
        quantize_row(dt, y, N, b);
        CHECK_MSG(!memcmp(a, b, (size_t)dtype_row_bytes(dt, N)), "%s: re-quantizing changed the bytes", dtype_name(dt));
    }
}

int main(void)
{
    RUN(test_quantize_round_trip_bounds);
    RUN(test_quantize_rms_on_gaussian);
    RUN(test_quantize_idempotent);
    CHECK_EXIT();
}

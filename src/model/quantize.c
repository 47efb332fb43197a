/*
 * quantize.c — float32 rows to each storage format (GGML block layouts,
 * the inverse of quant.c's decoders).
 *
 * Every quantizer stores its f16 scales first (rounded up in magnitude) and
 * then chooses the integer codes against the scale AS STORED, so rounding of
 * the scale never leaves a value further off than half a step. The
 * K-quants fit each sub-block by least squares over a handful of candidate
 * grids (a small search: the candidates differ in how far the range is
 * stretched), then quantize the sub-block scales against one f16 block scale.
 */
#include "model/quantize.h"

#include "base/error.h"

#include <math.h>
#include <string.h>

static void wr16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

/* A scale as f16, rounded AWAY from zero (the value the decoder will see
 * goes to *back): a stored scale at least as large as the wanted one means
 * the largest value still fits the code range, so rounding the scale never
 * forces a clamp. Matters for small blocks, whose scales are f16 subnormals. */
static uint16_t f16_stored(float v, float *back)
{
    uint16_t h = f32_to_f16(v);
    float f = f16_to_f32(h);
    if (fabsf(f) < fabsf(v) && (h & 0x7fff) < 0x7bff) h++; /* next magnitude up (same sign) */
    *back = f16_to_f32(h);
    return h;
}

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

static int round_to_int(float v) { return (int)lrintf(v); }

/* ---- Q8_0 / Q4_0: one scale per 32 values ----------------------------------------- */

static void q8_0_block(const float *x, uint8_t *out)
{
    float amax = 0, d;
    for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[i]));
    wr16(out, f16_stored(amax / 127.0f, &d));
    int8_t *q = (int8_t *)(out + 2);
    for (int i = 0; i < 32; i++) q[i] = (int8_t)(d > 0 ? clampi(round_to_int(x[i] / d), -127, 127) : 0);
}

/* The value of largest magnitude maps to code -8 (the end the 4-bit range
 * has one more step on), so it is exact up to the f16 scale. */
static void q4_0_block(const float *x, uint8_t *out)
{
    float vmax = 0, d;
    for (int i = 0; i < 32; i++)
        if (fabsf(x[i]) > fabsf(vmax)) vmax = x[i];
    wr16(out, f16_stored(vmax / -8.0f, &d));
    uint8_t *q = out + 2;
    for (int i = 0; i < 16; i++) {
        int a = d != 0 ? clampi(round_to_int(x[i] / d) + 8, 0, 15) : 8;
        int b = d != 0 ? clampi(round_to_int(x[i + 16] / d) + 8, 0, 15) : 8;
        q[i] = (uint8_t)(a | (b << 4));
    }
}

/* ---- least-squares fits of one sub-block ------------------------------------------- */

/* x ~ a*q + b with q = clamp(round((x - lo) * iscale), 0, nmax); b <= 0.
 * Returns the squared error; a, b receive the fitted line. */
static double fit_affine(const float *x, int n, float lo, float iscale, int nmax, float *a, float *b)
{
    double sq = 0, sqq = 0, sx = 0, sqx = 0;
    int q[32];
    for (int i = 0; i < n; i++) {
        q[i] = clampi(round_to_int((x[i] - lo) * iscale), 0, nmax);
        sq += q[i];
        sqq += (double)q[i] * q[i];
        sx += x[i];
        sqx += (double)q[i] * x[i];
    }
    double det = n * sqq - sq * sq, fa, fb;
    if (det <= 0) { /* every code equal: the mean is the best constant */
        fa = 0;
        fb = sx / n;
    } else {
        fa = (n * sqx - sq * sx) / det;
        fb = (sx - fa * sq) / n;
    }
    if (fb > 0) { /* the format's offset is -dmin*m with m >= 0 */
        fb = 0;
        fa = sqq > 0 ? sqx / sqq : 0;
    }
    if (fa < 0) fa = 0;
    double err = 0;
    for (int i = 0; i < n; i++) {
        double e = x[i] - fa * q[i] - fb;
        err += e * e;
    }
    *a = (float)fa;
    *b = (float)fb;
    return err;
}

/* Best (scale, min >= 0) for x ~ scale*q - min, q in [0, nmax]: the plain
 * min/max grid and grids stretched by up to +-0.5 step, each refit twice. */
static void fit_sub_block_affine(const float *x, int n, int nmax, float *scale, float *min)
{
    float lo = 0, hi = x[0];
    for (int i = 0; i < n; i++) {
        lo = fminf(lo, x[i]);
        hi = fmaxf(hi, x[i]);
    }
    *scale = 0;
    *min = -lo;
    if (!(hi > lo)) return;
    double best = INFINITY;
    for (int k = -4; k <= 4; k++) {
        float a, b, cur_lo = lo, iscale = ((float)nmax + 0.125f * (float)k) / (hi - lo);
        double err = 0;
        for (int pass = 0; pass < 2; pass++) {
            err = fit_affine(x, n, cur_lo, iscale, nmax, &a, &b);
            if (a <= 0) break;
            cur_lo = b; /* re-grid on the fitted line */
            iscale = 1.0f / a;
        }
        if (err < best && a > 0) {
            best = err;
            *scale = a;
            *min = -b;
        }
    }
}

/* Best signed scale for x ~ s*q, q in [-32, 31]. */
static float fit_sub_block_symmetric(const float *x, int n)
{
    float vmax = 0;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > fabsf(vmax)) vmax = x[i];
    if (vmax == 0) return 0;
    double best = INFINITY;
    float best_s = vmax / -32.0f;
    for (int k = 0; k <= 8; k++) {
        float s = vmax / (-32.0f + 0.5f * (float)k);
        double sqq = 0, sqx = 0;
        int q[16];
        for (int i = 0; i < n; i++) {
            q[i] = clampi(round_to_int(x[i] / s), -32, 31);
            sqq += (double)q[i] * q[i];
            sqx += (double)q[i] * x[i];
        }
        if (sqq <= 0) continue;
        float fitted = (float)(sqx / sqq);
        double err = 0;
        for (int i = 0; i < n; i++) {
            int qi = clampi(round_to_int(x[i] / fitted), -32, 31);
            double e = x[i] - (double)fitted * qi;
            err += e * e;
        }
        if (err < best) {
            best = err;
            best_s = fitted;
        }
    }
    return best_s;
}

/* ---- Q4_K: 256 values, 8 sub-blocks of 32 with 6-bit scale and min -------------------- */

static void q4_k_pack_scales(const int *sc, const int *m, uint8_t *s)
{
    for (int j = 0; j < 4; j++) {
        s[j] = (uint8_t)((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
        s[j + 4] = (uint8_t)((m[j] & 63) | ((m[j + 4] >> 4) << 6));
        s[j + 8] = (uint8_t)((sc[j + 4] & 0x0F) | ((m[j + 4] & 0x0F) << 4));
    }
}

static void q4_k_block(const float *x, uint8_t *out)
{
    float scale[8], mins[8], max_scale = 0, max_min = 0, d, dmin;
    for (int j = 0; j < 8; j++) {
        fit_sub_block_affine(x + 32 * j, 32, 15, &scale[j], &mins[j]);
        max_scale = fmaxf(max_scale, scale[j]);
        max_min = fmaxf(max_min, mins[j]);
    }
    wr16(out, f16_stored(max_scale / 63.0f, &d));
    wr16(out + 2, f16_stored(max_min / 63.0f, &dmin));
    int sc[8], m[8];
    for (int j = 0; j < 8; j++) {
        sc[j] = d > 0 ? clampi(round_to_int(scale[j] / d), 0, 63) : 0;
        m[j] = dmin > 0 ? clampi(round_to_int(mins[j] / dmin), 0, 63) : 0;
    }
    q4_k_pack_scales(sc, m, out + 4);
    uint8_t *q = out + 16;
    for (int c = 0; c < 4; c++) {
        int code[2][32];
        for (int h = 0; h < 2; h++) {
            int j = 2 * c + h;
            float s = d * (float)sc[j], mn = dmin * (float)m[j]; /* as the decoder forms them */
            for (int l = 0; l < 32; l++)
                code[h][l] = s > 0 ? clampi(round_to_int((x[32 * j + l] + mn) / s), 0, 15) : 0;
        }
        for (int l = 0; l < 32; l++) q[32 * c + l] = (uint8_t)(code[0][l] | (code[1][l] << 4));
    }
}

/* ---- Q6_K: 256 values, 16 sub-blocks of 16 with int8 scales ------------------------- */

static void q6_k_block(const float *x, uint8_t *out)
{
    float scale[16], amax = 0, d;
    for (int j = 0; j < 16; j++) {
        scale[j] = fit_sub_block_symmetric(x + 16 * j, 16);
        amax = fmaxf(amax, fabsf(scale[j]));
    }
    wr16(out + 208, f16_stored(amax / 127.0f, &d));
    int8_t *sc = (int8_t *)(out + 192);
    int code[256];
    for (int j = 0; j < 16; j++) {
        sc[j] = (int8_t)(d > 0 ? clampi(round_to_int(scale[j] / d), -127, 127) : 0);
        float s = d * (float)sc[j];
        for (int i = 0; i < 16; i++) code[16 * j + i] = (s != 0 ? clampi(round_to_int(x[16 * j + i] / s), -32, 31) : 0) + 32;
    }
    uint8_t *ql = out, *qh = out + 128;
    for (int half = 0; half < 2; half++) {
        const int *c = code + 128 * half;
        for (int l = 0; l < 32; l++) {
            ql[64 * half + l] = (uint8_t)((c[l] & 0x0F) | ((c[l + 64] & 0x0F) << 4));
            ql[64 * half + l + 32] = (uint8_t)((c[l + 32] & 0x0F) | ((c[l + 96] & 0x0F) << 4));
            qh[32 * half + l] =
                (uint8_t)((c[l] >> 4) | ((c[l + 32] >> 4) << 2) | ((c[l + 64] >> 4) << 4) | ((c[l + 96] >> 4) << 6));
        }
    }
}

/* ---- rows ---------------------------------------------------------------------------- */

void quantize_row(spark_dtype dtype, const float *x, int64_t n, void *dst)
{
    uint8_t *out = dst;
    switch (dtype) {
    case SPARK_DTYPE_F32: memcpy(out, x, (size_t)n * sizeof(float)); return;
    case SPARK_DTYPE_F16:
        for (int64_t i = 0; i < n; i++) wr16(out + 2 * i, f32_to_f16(x[i]));
        return;
    case SPARK_DTYPE_BF16:
        for (int64_t i = 0; i < n; i++) wr16(out + 2 * i, f32_to_bf16(x[i]));
        return;
    default: break;
    }
    int be = dtype_block_elems(dtype), bb = dtype_block_bytes(dtype);
    ASSERT(be > 0 && n % be == 0);
    for (int64_t b = 0; b < n / be; b++) {
        const float *xb = x + b * be;
        uint8_t *ob = out + b * bb;
        switch (dtype) {
        case SPARK_DTYPE_Q8_0: q8_0_block(xb, ob); break;
        case SPARK_DTYPE_Q4_0: q4_0_block(xb, ob); break;
        case SPARK_DTYPE_Q4_K: q4_k_block(xb, ob); break;
        case SPARK_DTYPE_Q6_K: q6_k_block(xb, ob); break;
        default: ASSERT(!"quantize_row: unhandled dtype");
        }
    }
}

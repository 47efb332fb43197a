/*
 * kv_format.c — the KV-cache row formats (see kv_format.h): sizes, the
 * Lloyd-Max codebooks, the seeded Hadamard rotation, and the scalar
 * reference encoder / decoder. Backends encode with kv_encode_row (so every
 * backend stores the same bytes) and may decode with their own SIMD code,
 * which tests/c/test_kv_turbo.c checks against kv_decode_row.
 */
#include "engine/kv_format.h"

#include "base/error.h"
#include "io/dtype.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

/* The seed of the rotation's signs ("SPKTQUNT"): fixed, so a cache written
 * by one build decodes in any other and tools/ref.py can simulate it. */
#define KV_TQ_SEED 0x53504B5451554E54ull

enum { LLOYD_MAX_ITERS = 200000 };

/* ---- formats ------------------------------------------------------------- */

int kv_tq_bits(spark_kv_type t, int is_value)
{
    switch (t) {
    case SPARK_KV_TQ2: return 2;
    case SPARK_KV_TQ3: return 3;
    case SPARK_KV_TQ3_5: return is_value ? 4 : 3; /* values carry the output: they get the extra bit */
    case SPARK_KV_TQ4: return 4;
    default: return 0;
    }
}

int64_t kv_row_bytes(spark_kv_type t, int is_value, int32_t head_dim)
{
    int bits = kv_tq_bits(t, is_value);
    if (bits) return KV_TQ_SCALE_BYTES + (int64_t)head_dim * bits / 8;
    return (int64_t)head_dim * (t == SPARK_KV_F32 ? 4 : 2);
}

const char *spark_kv_type_name(spark_kv_type t)
{
    static const char *const names[SPARK_KV_TYPE_COUNT] = {"f32", "f16", "bf16", "tq2", "tq3", "tq3.5", "tq4"};
    return (unsigned)t < SPARK_KV_TYPE_COUNT ? names[t] : "invalid";
}

double spark_kv_type_bits(spark_kv_type t, int32_t head_dim)
{
    if ((unsigned)t >= SPARK_KV_TYPE_COUNT || head_dim <= 0) return 0;
    return 8.0 * (double)(kv_row_bytes(t, 0, head_dim) + kv_row_bytes(t, 1, head_dim)) / (2.0 * head_dim);
}

spark_status kv_type_check(spark_kv_type t, int32_t head_dim)
{
    if ((unsigned)t >= SPARK_KV_TYPE_COUNT) return spark_fail(SPARK_ERR_ARG, "KV cache type %d is not a spark_kv_type", t);
    if (t == SPARK_KV_F32) return SPARK_OK;
    if (head_dim > KV_MAX_CODED_HEAD_DIM)
        return spark_fail(SPARK_ERR_UNSUPPORTED, "a %s KV cache needs head_dim <= %d; this model has %d",
                          spark_kv_type_name(t), KV_MAX_CODED_HEAD_DIM, head_dim);
    /* the Walsh-Hadamard transform is defined for powers of two; 16 values
     * make whole bytes of indices at every bit width */
    if (kv_tq_bits(t, 0) && (head_dim < 16 || (head_dim & (head_dim - 1))))
        return spark_fail(SPARK_ERR_UNSUPPORTED,
                          "TurboQuant KV (%s) rotates each head with a Hadamard transform, which needs head_dim to "
                          "be a power of two >= 16; this model has head_dim %d (use --kv-type f16 or bf16)",
                          spark_kv_type_name(t), head_dim);
    return SPARK_OK;
}

kv_cost kv_cost_of(const spark_model_config *c, int64_t n_ctx, spark_kv_type full, spark_kv_type sliding)
{
    kv_cost k = {0};
    for (int i = 0; i < c->n_layer; i++) {
        int is_sliding = c->layer_kind[i] == SPARK_LAYER_SLIDING;
        spark_kv_type t = is_sliding ? sliding : full;
        uint64_t row = (uint64_t)c->n_head_kv * (uint64_t)(kv_row_bytes(t, 0, c->head_dim) + kv_row_bytes(t, 1, c->head_dim));
        if (is_sliding) {
            k.n_sliding++;
            k.sliding += row * (uint64_t)(c->sliding_window < n_ctx ? c->sliding_window : n_ctx);
        } else {
            k.n_full++;
            k.per_token += row;
        }
    }
    return k;
}

/* ---- Lloyd-Max codebooks for N(0, 1) --------------------------------------- */

static kv_codebook codebooks[5]; /* [bits], 1..4 */
static float signs[KV_MAX_CODED_HEAD_DIM];
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static double gauss_pdf(double x) { return isinf(x) ? 0.0 : exp(-0.5 * x * x) / sqrt(2.0 * M_PI); }
static double gauss_cdf(double x) { return 0.5 * erfc(-x / sqrt(2.0)); }

/* Lloyd's algorithm: alternate boundaries = midpoints and centroids =
 * conditional means E[Y | cell] = (pdf(lo) - pdf(hi)) / (cdf(hi) - cdf(lo))
 * until nothing moves; the distortion is then 1 - sum_i P(cell i) c_i^2
 * (E[Y^2] = 1 and, at a fixed point, E[Y Q(Y)] = E[Q(Y)^2]). */
static double lloyd_max_gaussian(int levels, double *c)
{
    for (int i = 0; i < levels; i++) c[i] = -3.0 + 6.0 * (i + 0.5) / levels;
    double p[KV_TQ_MAX_LEVELS];
    for (int it = 0; it < LLOYD_MAX_ITERS; it++) {
        double moved = 0;
        for (int i = 0; i < levels; i++) {
            double lo = i ? 0.5 * (c[i - 1] + c[i]) : -INFINITY;
            double hi = i + 1 < levels ? 0.5 * (c[i] + c[i + 1]) : INFINITY;
            p[i] = gauss_cdf(hi) - gauss_cdf(lo);
            double next = (gauss_pdf(lo) - gauss_pdf(hi)) / p[i];
            moved = fmax(moved, fabs(next - c[i]));
            c[i] = next; /* Gauss-Seidel: the next cell sees the moved centroid */
        }
        if (moved < 1e-15) break;
    }
    double kept = 0;
    for (int i = 0; i < levels; i++) kept += p[i] * c[i] * c[i];
    return 1.0 - kept;
}

/* splitmix64: a well-mixed 64-bit hash of i (one sign per index). */
static uint64_t mix64(uint64_t x)
{
    uint64_t z = x + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void build_tables(void)
{
    for (int bits = 1; bits <= 4; bits++) {
        kv_codebook *cb = &codebooks[bits];
        cb->bits = bits;
        cb->levels = 1 << bits;
        cb->distortion = lloyd_max_gaussian(cb->levels, cb->centroid_f64);
        for (int i = 0; i < cb->levels; i++) cb->centroid[i] = (float)cb->centroid_f64[i];
        for (int i = 0; i + 1 < cb->levels; i++)
            cb->boundary[i] = (float)(0.5 * (cb->centroid_f64[i] + cb->centroid_f64[i + 1]));
    }
    for (int i = 0; i < KV_MAX_CODED_HEAD_DIM; i++) signs[i] = mix64(KV_TQ_SEED + (uint64_t)i) >> 63 ? -1.0f : 1.0f;
}

const kv_codebook *kv_codebook_get(int bits)
{
    ASSERT(bits >= 1 && bits <= 4);
    pthread_once(&tables_once, build_tables);
    return &codebooks[bits];
}

/* ---- the rotation R = H S / sqrt(d) ----------------------------------------- */

float kv_tq_sign(int i)
{
    ASSERT(i >= 0 && i < KV_MAX_CODED_HEAD_DIM);
    pthread_once(&tables_once, build_tables);
    return signs[i];
}

/* Unnormalised fast Walsh-Hadamard transform (H H = d I), in place. */
static void fwht(float *x, int32_t d)
{
    for (int32_t h = 1; h < d; h *= 2)
        for (int32_t i = 0; i < d; i += 2 * h)
            for (int32_t j = i; j < i + h; j++) {
                float a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
}

void kv_rotate(float *x, int32_t d)
{
    pthread_once(&tables_once, build_tables);
    for (int32_t i = 0; i < d; i++) x[i] *= signs[i];
    fwht(x, d);
    float norm = 1.0f / sqrtf((float)d);
    for (int32_t i = 0; i < d; i++) x[i] *= norm;
}

void kv_unrotate(float *x, int32_t d)
{
    pthread_once(&tables_once, build_tables);
    fwht(x, d);
    float norm = 1.0f / sqrtf((float)d);
    for (int32_t i = 0; i < d; i++) x[i] *= norm * signs[i];
}

/* ---- TurboQuant rows ---------------------------------------------------------- */

/* Index of the centroid nearest to z: the number of boundaries below it. */
static int nearest(const kv_codebook *cb, float z)
{
    int k = 0;
    while (k + 1 < cb->levels && cb->boundary[k] < z) k++;
    return k;
}

/* Write index k of `bits` bits at position i of the little-endian bit stream. */
static void put_index(uint8_t *packed, int bits, int32_t i, int k)
{
    int64_t bit = (int64_t)i * bits;
    uint32_t v = (uint32_t)k << (bit & 7);
    packed[bit >> 3] |= (uint8_t)v;
    if ((bit & 7) + bits > 8) packed[(bit >> 3) + 1] |= (uint8_t)(v >> 8);
}

static int get_index(const uint8_t *packed, int bits, int32_t i)
{
    int64_t bit = (int64_t)i * bits;
    uint32_t v = packed[bit >> 3];
    if ((bit & 7) + bits > 8) v |= (uint32_t)packed[(bit >> 3) + 1] << 8;
    return (int)((v >> (bit & 7)) & ((1u << bits) - 1));
}

static void tq_encode(int bits, int unbiased, const float *x, int32_t d, uint8_t *out)
{
    ASSERT(d >= 16 && d <= KV_MAX_CODED_HEAD_DIM && !(d & (d - 1)));
    const kv_codebook *cb = kv_codebook_get(bits);
    uint8_t *packed = out + KV_TQ_SCALE_BYTES;
    memset(packed, 0, (size_t)d * (size_t)bits / 8);
    float y[KV_MAX_CODED_HEAD_DIM];
    double n2 = 0;
    for (int32_t i = 0; i < d; i++) {
        y[i] = x[i];
        n2 += (double)x[i] * x[i];
    }
    float scale = 0;
    if (n2 > 0) {
        kv_rotate(y, d);
        double norm = sqrt(n2);
        float to_std = (float)(sqrt((double)d) / norm); /* rotated unit-vector coords have variance 1/d */
        double zc = 0;
        for (int32_t i = 0; i < d; i++) {
            float z = y[i] * to_std;
            int k = nearest(cb, z);
            zc += (double)z * cb->centroid[k];
            put_index(packed, bits, i, k);
        }
        scale = (float)(unbiased ? norm * sqrt((double)d) / zc : norm / sqrt((double)d));
    }
    memcpy(out, &scale, sizeof scale);
}

void kv_tq_encode_plain(int bits, const float *x, int32_t d, uint8_t *out) { tq_encode(bits, 0, x, d, out); }

void kv_encode_row(spark_kv_type t, int is_value, const float *x, int32_t d, uint8_t *out)
{
    int bits = kv_tq_bits(t, is_value);
    if (bits) {
        tq_encode(bits, 1, x, d, out);
        return;
    }
    if (t == SPARK_KV_F32) {
        memcpy(out, x, (size_t)d * sizeof(float));
        return;
    }
    for (int32_t i = 0; i < d; i++) {
        uint16_t h = t == SPARK_KV_F16 ? f32_to_f16(x[i]) : f32_to_bf16(x[i]);
        memcpy(out + 2 * i, &h, 2);
    }
}

float kv_decode_row(spark_kv_type t, int is_value, const uint8_t *row, int32_t d, float *out)
{
    int bits = kv_tq_bits(t, is_value);
    if (bits) {
        const kv_codebook *cb = kv_codebook_get(bits);
        for (int32_t i = 0; i < d; i++) out[i] = cb->centroid[get_index(row + KV_TQ_SCALE_BYTES, bits, i)];
        float scale;
        memcpy(&scale, row, sizeof scale);
        return scale;
    }
    if (t == SPARK_KV_F32) {
        memcpy(out, row, (size_t)d * sizeof(float));
        return 1.0f;
    }
    for (int32_t i = 0; i < d; i++) {
        uint16_t h;
        memcpy(&h, row + 2 * i, 2);
        out[i] = t == SPARK_KV_F16 ? f16_to_f32(h) : bf16_to_f32(h);
    }
    return 1.0f;
}

void kv_dequantize_row(spark_kv_type t, int is_value, const uint8_t *row, int32_t d, float *out)
{
    float scale = kv_decode_row(t, is_value, row, d, out);
    for (int32_t i = 0; i < d; i++) out[i] *= scale;
    if (kv_tq_bits(t, is_value)) kv_unrotate(out, d);
}

/*
 * kv_format.h — how one KV-cache row (one kv head's head_dim values of a
 * key or a value) is stored, in every format a cache can use, and the
 * scalar reference codec every backend must agree with.
 *
 * Formats (spark_kv_type): F32 (the exact default), F16 and BF16 (rounded
 * to nearest even), and TurboQuant at 2, 3, 3.5 (3-bit keys, 4-bit values)
 * and 4 bits. A TurboQuant row is
 *
 *     [f32 scale][head_dim indices of `bits` bits, little-endian bit stream]
 *
 * made like this (SPEC §7): rotate the row with the fixed random-sign
 * Hadamard transform R = H S / sqrt(D) (S: seeded signs, H: Walsh-Hadamard,
 * D = head_dim, a power of two), standardise the rotated coordinates
 * (z = y sqrt(D) / |x|, close to N(0, 1) for any x because of the
 * rotation), and replace each by the index of its nearest Lloyd-Max centroid
 * for N(0, 1) at that bit width. The row decodes, IN THE ROTATED BASIS, to
 * scale * centroid[index]; the original row is R^T of that. Attention never
 * de-rotates a key: it rotates the query once (<R q, R k> = <q, k>), sums
 * values in the rotated basis and de-rotates the output once.
 *
 * The scale is |x| sqrt(D) / sum_i z_i c_i rather than the plain
 * |x| / sqrt(D): it makes the decoded row's component along x exact
 * (<x_hat, x> = |x|^2), so inner products with a query are unbiased instead
 * of shrunk by the codebook's (1 - distortion) — a shrink that would cool
 * every softmax. The cost is a slightly higher MSE, distortion / (1 -
 * distortion) instead of distortion (tests/c/test_kv_turbo.c measures both).
 */
#ifndef SPARK_ENGINE_KV_FORMAT_H
#define SPARK_ENGINE_KV_FORMAT_H

#include "spark.h"

#include <stdint.h>

enum {
    KV_MAX_CODED_HEAD_DIM = 512, /* non-f32 formats: attention keeps per-thread rows on the stack */
    KV_TQ_SCALE_BYTES = 4,       /* the f32 scale in front of a TurboQuant row */
    KV_TQ_MAX_LEVELS = 16,       /* 4 bits */
};

/* Index bits of a format's key (is_value = 0) or value rows; 0 for F32/F16/BF16. */
int kv_tq_bits(spark_kv_type t, int is_value);

/* Bytes of one row of head_dim values. */
int64_t kv_row_bytes(spark_kv_type t, int is_value, int32_t head_dim);

/* SPARK_OK if a cache of format t works for heads of head_dim values, else
 * SPARK_ERR_UNSUPPORTED / SPARK_ERR_ARG with a message naming the reason. */
spark_status kv_type_check(spark_kv_type t, int32_t head_dim);

/* Lloyd-Max quantizer of N(0, 1) at 1..4 bits: centroids ascending,
 * boundaries the midpoints between neighbours, distortion E[(Y - Q(Y))^2]. */
typedef struct kv_codebook {
    int bits, levels;
    float centroid[KV_TQ_MAX_LEVELS];
    float boundary[KV_TQ_MAX_LEVELS - 1];
    double centroid_f64[KV_TQ_MAX_LEVELS];
    double distortion;
} kv_codebook;

/* The codebook for `bits` (1..4), computed once (thread-safe) in double by
 * Lloyd's iteration on the Gaussian density. */
const kv_codebook *kv_codebook_get(int bits);

/* The fixed rotation: sign i of S is +1 or -1 from a seeded hash of i
 * (tools/ref.py reproduces it). */
float kv_tq_sign(int i);
/* x <- R x and x <- R^T x for x[d], d a power of two. */
void kv_rotate(float *x, int32_t d);
void kv_unrotate(float *x, int32_t d);

/* Encode row x[d] into out[kv_row_bytes(t, is_value, d)]. F32 is a copy. */
void kv_encode_row(spark_kv_type t, int is_value, const float *x, int32_t d, uint8_t *out);

/* TurboQuant encoding with the plain scale |x| / sqrt(d) instead of the
 * unbiased one (for the codec tests: its MSE is the codebook distortion). */
void kv_tq_encode_plain(int bits, const float *x, int32_t d, uint8_t *out);

/* Decode a row into out[d] in the format's attention basis (rotated for
 * TurboQuant) WITHOUT its scale; returns the scale (1 for the float
 * formats). value = scale * out[i]. */
float kv_decode_row(spark_kv_type t, int is_value, const uint8_t *row, int32_t d, float *out);

/* Decode a row back to the original basis (scale applied, de-rotated). */
void kv_dequantize_row(spark_kv_type t, int is_value, const uint8_t *row, int32_t d, float *out);

/* Bytes of the KV cache of one model configuration: full layers grow by
 * per_token each position, sliding layers hold fixed rings. */
typedef struct kv_cost {
    uint64_t per_token; /* all full layers, keys and values */
    uint64_t sliding;   /* all sliding rings at this context */
    int32_t n_full, n_sliding;
} kv_cost;

kv_cost kv_cost_of(const spark_model_config *c, int64_t n_ctx, spark_kv_type full, spark_kv_type sliding);

#endif

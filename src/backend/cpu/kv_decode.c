/*
 * kv_decode.c — decoding KV-cache rows to float32 for attention: f16,
 * bf16 and TurboQuant at 2, 3 and 4 bits, each in scalar C, AVX2 and
 * AVX-512 (selected at run time like the other CPU kernels).
 *
 * A TurboQuant row decodes to codebook centroids in the rotated basis; the
 * scale is returned apart so attention can fold it into the score or the
 * softmax weight (one multiply per key instead of per value). Sixteen
 * indices of b bits are 2b bytes of the little-endian bit stream: two words
 * of 8 indices, each a b-byte little-endian integer, so a lane finds its
 * index with one variable shift — no table of byte offsets, one code path
 * for every width. The centroid lookup is a register permute.
 */
#include "backend/cpu/kv_turbo.h"

#include "engine/kv_format.h"
#include "io/dtype.h"

#include <string.h>

/* ---- scalar ----------------------------------------------------------------- */

static float row_scale(const uint8_t *row)
{
    float s;
    memcpy(&s, row, sizeof s);
    return s;
}

/* Eight b-bit indices from b bytes. */
static inline uint32_t load_word(const uint8_t *p, int bits)
{
    uint32_t w = 0;
    memcpy(&w, p, (size_t)bits);
    return w;
}

static inline void tq_rows_scalar(int bits, const uint8_t *const *rows, int n, int32_t d, float *out, int64_t ld,
                                  float *scale)
{
    const float *lut = kv_codebook_get(bits)->centroid;
    uint32_t mask = (1u << bits) - 1;
    for (int r = 0; r < n; r++) {
        const uint8_t *p = rows[r] + KV_TQ_SCALE_BYTES;
        float *o = out + r * ld;
        scale[r] = row_scale(rows[r]);
        for (int32_t i = 0; i < d; i += 8, p += bits) {
            uint32_t w = load_word(p, bits);
            for (int k = 0; k < 8; k++) o[i + k] = lut[(w >> (k * bits)) & mask];
        }
    }
}

/* f16 / bf16 values [i, d) of a row: the vector loops' tails, and the scalar level */
static inline void half_tail(int bf16, const uint8_t *p, int32_t i, int32_t d, float *o)
{
    for (; i < d; i++) {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        o[i] = bf16 ? bf16_to_f32(h) : f16_to_f32(h);
    }
}

static inline void half_rows_scalar(int bf16, const uint8_t *const *rows, int n, int32_t d, float *out, int64_t ld,
                                    float *scale)
{
    for (int r = 0; r < n; r++) {
        scale[r] = 1.0f;
        half_tail(bf16, rows[r], 0, d, out + r * ld);
    }
}

/* The five decoders of one ISA level (kv_decode_fn each) from its
 * tq_rows_<LEVEL> and half_rows_<LEVEL>. */
#define KV_DECODERS(LEVEL, TARGET)                                                                          \
    static TARGET void tq2_##LEVEL(const uint8_t *const *rows, int n, int32_t d, float *out, int64_t ld,   \
                                   float *scale)                                                            \
    {                                                                                                       \
        tq_rows_##LEVEL(2, rows, n, d, out, ld, scale);                                                     \
    }                                                                                                       \
    static TARGET void tq3_##LEVEL(const uint8_t *const *rows, int n, int32_t d, float *out, int64_t ld,   \
                                   float *scale)                                                            \
    {                                                                                                       \
        tq_rows_##LEVEL(3, rows, n, d, out, ld, scale);                                                     \
    }                                                                                                       \
    static TARGET void tq4_##LEVEL(const uint8_t *const *rows, int n, int32_t d, float *out, int64_t ld,   \
                                   float *scale)                                                            \
    {                                                                                                       \
        tq_rows_##LEVEL(4, rows, n, d, out, ld, scale);                                                     \
    }                                                                                                       \
    static TARGET void f16_##LEVEL(const uint8_t *const *rows, int n, int32_t d, float *out, int64_t ld,   \
                                   float *scale)                                                            \
    {                                                                                                       \
        half_rows_##LEVEL(0, rows, n, d, out, ld, scale);                                                   \
    }                                                                                                       \
    static TARGET void bf16_##LEVEL(const uint8_t *const *rows, int n, int32_t d, float *out, int64_t ld,  \
                                    float *scale)                                                           \
    {                                                                                                       \
        half_rows_##LEVEL(1, rows, n, d, out, ld, scale);                                                   \
    }

KV_DECODERS(scalar, )

#if defined(__x86_64__)
#include <immintrin.h>

/* ---- AVX2: 8 lanes ------------------------------------------------------------ */

#define AVX2_TARGET __attribute__((target("avx2,fma,f16c")))

static inline AVX2_TARGET void tq_rows_avx2(int bits, const uint8_t *const *rows, int n, int32_t d, float *out,
                                            int64_t ld, float *scale)
{
    const float *c = kv_codebook_get(bits)->centroid;
    /* centroids 0..7 and 8..15; permutevar8x32 reads the low 3 bits of an
     * index, bit 3 picks the table */
    __m256 lut_lo = _mm256_loadu_ps(c), lut_hi = bits == 4 ? _mm256_loadu_ps(c + 8) : lut_lo;
    __m256i shifts = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(bits));
    __m256i mask = _mm256_set1_epi32((1 << bits) - 1);
    for (int r = 0; r < n; r++) {
        const uint8_t *p = rows[r] + KV_TQ_SCALE_BYTES;
        float *o = out + r * ld;
        scale[r] = row_scale(rows[r]);
        for (int32_t i = 0; i < d; i += 8, p += bits) {
            __m256i idx = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)load_word(p, bits)), shifts), mask);
            __m256 v = _mm256_permutevar8x32_ps(lut_lo, idx);
            if (bits == 4) {
                __m256 hi = _mm256_permutevar8x32_ps(lut_hi, idx);
                v = _mm256_blendv_ps(v, hi, _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));
            }
            _mm256_storeu_ps(o + i, v);
        }
    }
}

static AVX2_TARGET void half_rows_avx2(int bf16, const uint8_t *const *rows, int n, int32_t d, float *out, int64_t ld,
                                       float *scale)
{
    for (int r = 0; r < n; r++) {
        const uint8_t *p = rows[r];
        float *o = out + r * ld;
        scale[r] = 1.0f;
        int32_t i = 0;
        for (; i + 8 <= d; i += 8) {
            __m128i h = _mm_loadu_si128((const __m128i *)(p + 2 * i));
            __m256 v = bf16 ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)) : _mm256_cvtph_ps(h);
            _mm256_storeu_ps(o + i, v);
        }
        half_tail(bf16, p, i, d, o);
    }
}

KV_DECODERS(avx2, AVX2_TARGET)

/* ---- AVX-512: 16 lanes ---------------------------------------------------------- */

#define AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))

static inline AVX512_TARGET void tq_rows_avx512(int bits, const uint8_t *const *rows, int n, int32_t d, float *out,
                                                int64_t ld, float *scale)
{
    __m512 lut = _mm512_loadu_ps(kv_codebook_get(bits)->centroid); /* 16 entries, unused ones 0 */
    __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7);
    __m512i shifts = _mm512_mullo_epi32(lane, _mm512_set1_epi32(bits));
    __m512i mask = _mm512_set1_epi32((1 << bits) - 1);
    for (int r = 0; r < n; r++) {
        const uint8_t *p = rows[r] + KV_TQ_SCALE_BYTES;
        float *o = out + r * ld;
        scale[r] = row_scale(rows[r]);
        for (int32_t i = 0; i < d; i += 16, p += 2 * bits) {
            /* lanes 0-7 take the first word of 8 indices, lanes 8-15 the second */
            __m512i w = _mm512_mask_set1_epi32(_mm512_set1_epi32((int)load_word(p, bits)), 0xFF00,
                                               (int)load_word(p + bits, bits));
            __m512i idx = _mm512_and_si512(_mm512_srlv_epi32(w, shifts), mask);
            _mm512_storeu_ps(o + i, _mm512_permutexvar_ps(idx, lut));
        }
    }
}

static AVX512_TARGET void half_rows_avx512(int bf16, const uint8_t *const *rows, int n, int32_t d, float *out,
                                           int64_t ld, float *scale)
{
    for (int r = 0; r < n; r++) {
        const uint8_t *p = rows[r];
        float *o = out + r * ld;
        scale[r] = 1.0f;
        int32_t i = 0;
        for (; i + 16 <= d; i += 16) {
            __m256i h = _mm256_loadu_si256((const __m256i *)(p + 2 * i));
            __m512 v = bf16 ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)) : _mm512_cvtph_ps(h);
            _mm512_storeu_ps(o + i, v);
        }
        half_tail(bf16, p, i, d, o);
    }
}

KV_DECODERS(avx512, AVX512_TARGET)
#endif /* __x86_64__ */

/* ---- selection ------------------------------------------------------------------- */

/* [isa level][f16, bf16, tq2, tq3, tq4] */
enum { DEC_F16, DEC_BF16, DEC_TQ2, DEC_TQ3, DEC_TQ4, DEC_COUNT };

static const kv_decode_fn decoders[3][DEC_COUNT] = {
    {f16_scalar, bf16_scalar, tq2_scalar, tq3_scalar, tq4_scalar},
#if defined(__x86_64__)
    {f16_avx2, bf16_avx2, tq2_avx2, tq3_avx2, tq4_avx2},
    {f16_avx512, bf16_avx512, tq2_avx512, tq3_avx512, tq4_avx512},
#endif
};

kv_decode_fn kv_decoder(spark_kv_type t, int is_value, cpu_isa isa)
{
    int which;
    int bits = kv_tq_bits(t, is_value);
    if (bits) which = DEC_TQ2 + bits - 2;
    else if (t == SPARK_KV_F16) which = DEC_F16;
    else if (t == SPARK_KV_BF16) which = DEC_BF16;
    else return NULL;
    int level = 0;
#if defined(__x86_64__)
    if (isa == CPU_ISA_AVX2) level = 1;
    if (isa == CPU_ISA_AVX512) level = 2;
#endif
    return decoders[level][which];
}

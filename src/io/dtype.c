/*
 * dtype.c — storage formats: names, block geometry, GGML type numbers, and
 * the scalar 16-bit float conversions every backend builds on.
 *
 * Two tables live here. `dtypes` describes the formats this runtime computes
 * with (spark_dtype). `ggml_types` describes every GGML type number a GGUF file
 * may carry, so the GGUF reader can bounds-check tensors it will never read;
 * block sizes there follow ggml's block structs (e.g. q8_1 = two f16 + 32
 * int8 = 36 bytes). Numbers ggml removed from the format (4, 5, 31-33, 36-38)
 * have no entry and count as unknown.
 *
 * The conversions are written with integer bit manipulation so they are exact
 * and identical on every compiler, including subnormals, infinities and NaN.
 */
#include "io/dtype.h"

#include <string.h>

typedef struct dtype_desc {
    const char *name;
    int block_elems;
    int block_bytes;
    uint32_t ggml;
    const char *safetensors; /* NULL: not a safetensors dtype we read */
} dtype_desc;

static const dtype_desc dtypes[SPARK_DTYPE_COUNT] = {
    [SPARK_DTYPE_F32] = {"f32", 1, 4, 0, "F32"},
    [SPARK_DTYPE_F16] = {"f16", 1, 2, 1, "F16"},
    [SPARK_DTYPE_BF16] = {"bf16", 1, 2, 30, "BF16"},
    [SPARK_DTYPE_Q8_0] = {"q8_0", 32, 34, 8, NULL},
    [SPARK_DTYPE_Q4_0] = {"q4_0", 32, 18, 2, NULL},
    [SPARK_DTYPE_Q4_K] = {"q4_K", 256, 144, 12, NULL},
    [SPARK_DTYPE_Q6_K] = {"q6_K", 256, 210, 14, NULL},
};

typedef struct ggml_desc {
    const char *name; /* NULL: not a GGML type number */
    uint32_t block_elems;
    uint32_t block_bytes;
} ggml_desc;

static const ggml_desc ggml_types[] = {
    [0] = {"f32", 1, 4},
    [1] = {"f16", 1, 2},
    [2] = {"q4_0", 32, 18},
    [3] = {"q4_1", 32, 20},
    [6] = {"q5_0", 32, 22},
    [7] = {"q5_1", 32, 24},
    [8] = {"q8_0", 32, 34},
    [9] = {"q8_1", 32, 36},
    [10] = {"q2_K", 256, 84},
    [11] = {"q3_K", 256, 110},
    [12] = {"q4_K", 256, 144},
    [13] = {"q5_K", 256, 176},
    [14] = {"q6_K", 256, 210},
    [15] = {"q8_K", 256, 292},
    [16] = {"iq2_xxs", 256, 66},
    [17] = {"iq2_xs", 256, 74},
    [18] = {"iq3_xxs", 256, 98},
    [19] = {"iq1_s", 256, 50},
    [20] = {"iq4_nl", 32, 18},
    [21] = {"iq3_s", 256, 110},
    [22] = {"iq2_s", 256, 82},
    [23] = {"iq4_xs", 256, 136},
    [24] = {"i8", 1, 1},
    [25] = {"i16", 1, 2},
    [26] = {"i32", 1, 4},
    [27] = {"i64", 1, 8},
    [28] = {"f64", 1, 8},
    [29] = {"iq1_m", 256, 56},
    [30] = {"bf16", 1, 2},
    [34] = {"tq1_0", 256, 54},
    [35] = {"tq2_0", 256, 66},
    [39] = {"mxfp4", 32, 17},
    [40] = {"nvfp4", 64, 36},
};
enum { GGML_TABLE_LEN = sizeof ggml_types / sizeof ggml_types[0] };

static int dtype_valid(spark_dtype dtype) { return (unsigned)dtype < SPARK_DTYPE_COUNT; }

const char *dtype_name(spark_dtype dtype) { return dtype_valid(dtype) ? dtypes[dtype].name : "invalid"; }

int dtype_block_elems(spark_dtype dtype) { return dtype_valid(dtype) ? dtypes[dtype].block_elems : 0; }

int dtype_block_bytes(spark_dtype dtype) { return dtype_valid(dtype) ? dtypes[dtype].block_bytes : 0; }

uint64_t dtype_row_bytes(spark_dtype dtype, uint64_t n)
{
    if (!dtype_valid(dtype)) return 0;
    uint64_t elems = (uint64_t)dtypes[dtype].block_elems, bytes;
    if (n % elems != 0) return 0;
    if (__builtin_mul_overflow(n / elems, (uint64_t)dtypes[dtype].block_bytes, &bytes)) return 0;
    return bytes;
}

int dtype_from_ggml(uint32_t ggml_type)
{
    for (int d = 0; d < SPARK_DTYPE_COUNT; d++)
        if (dtypes[d].ggml == ggml_type) return d;
    return -1;
}

uint32_t dtype_to_ggml(spark_dtype dtype)
{
    /* Callers pass our own enum values; anything else is a bug. */
    return dtype_valid(dtype) ? dtypes[dtype].ggml : UINT32_MAX;
}

const char *ggml_type_name(uint32_t ggml_type)
{
    return ggml_type < GGML_TABLE_LEN ? ggml_types[ggml_type].name : NULL;
}

bool ggml_type_block(uint32_t ggml_type, uint32_t *block_elems, uint32_t *block_bytes)
{
    if (ggml_type >= GGML_TABLE_LEN || !ggml_types[ggml_type].name) return false;
    *block_elems = ggml_types[ggml_type].block_elems;
    *block_bytes = ggml_types[ggml_type].block_bytes;
    return true;
}

int dtype_from_safetensors(const char *name)
{
    for (int d = 0; d < SPARK_DTYPE_COUNT; d++)
        if (dtypes[d].safetensors && strcmp(dtypes[d].safetensors, name) == 0) return d;
    return -1;
}

/* ---- scalar conversions ------------------------------------------------- */

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (man << 13)); /* inf, NaN keeps payload */
    if (exp != 0) return bits_f32(sign | ((exp + 127 - 15) << 23) | (man << 13));
    if (man == 0) return bits_f32(sign); /* +-0 */
    /* Subnormal: man * 2^-24. Shift the leading 1 up to the implicit bit. */
    int shift = 0;
    while (!(man & 0x400u)) {
        man <<= 1;
        shift++;
    }
    return bits_f32(sign | ((uint32_t)(127 - 15 + 1 - shift) << 23) | ((man & 0x3ffu) << 13));
}

/* Round `value >> shift` to nearest, ties to even. */
static uint32_t shift_round_even(uint32_t value, int shift)
{
    uint32_t kept = value >> shift;
    uint32_t rest = value & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rest > half || (rest == half && (kept & 1u))) kept++;
    return kept;
}

uint16_t f32_to_f16(float f)
{
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return sign | 0x7e00u | (uint16_t)((ax >> 13) & 0x3ffu); /* NaN, quiet */
    if (ax >= 0x477ff000u) return sign | 0x7c00u; /* >= 65520 rounds to inf (65504 is the max) */
    if (ax >= 0x38800000u) {                      /* normal half: >= 2^-14 */
        /* Rebias the exponent; a mantissa carry correctly bumps the exponent. */
        uint32_t rebased = ax - ((uint32_t)(127 - 15) << 23);
        return sign | (uint16_t)shift_round_even(rebased, 13);
    }
    if (ax <= 0x33000000u) return sign; /* <= 2^-25: rounds to zero (2^-25 is a tie to even 0) */
    /* Subnormal half: the result counts units of 2^-24. */
    uint32_t exp = ax >> 23;
    uint32_t man = (ax & 0x7fffffu) | 0x800000u;
    return sign | (uint16_t)shift_round_even(man, (int)(126 - exp));
}

float bf16_to_f32(uint16_t b) { return bits_f32((uint32_t)b << 16); }

uint16_t f32_to_bf16(float f)
{
    uint32_t x = f32_bits(f);
    /* Rounding could carry a NaN's payload into inf; force the quiet bit instead. */
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x0040u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

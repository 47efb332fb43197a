/*
 * dtype.h — the storage formats a tensor can have on disk, and their sizes.
 *
 * Block formats (Q8_0, Q4_K, ...) store `block_elems` values in `block_bytes`
 * bytes; plain formats are blocks of one element. The enum is ours; the GGML
 * type numbers used in GGUF files are mapped in dtype_from_ggml().
 */
#ifndef SPARK_IO_DTYPE_H
#define SPARK_IO_DTYPE_H

#include <stdbool.h>
#include <stdint.h>

typedef enum spark_dtype {
    SPARK_DTYPE_F32 = 0,
    SPARK_DTYPE_F16,
    SPARK_DTYPE_BF16,
    SPARK_DTYPE_Q8_0, /* 32 values: f16 scale + 32 int8 */
    SPARK_DTYPE_Q4_0, /* 32 values: f16 scale + 16 bytes of nibbles */
    SPARK_DTYPE_Q4_K, /* 256 values, 144 bytes */
    SPARK_DTYPE_Q6_K, /* 256 values, 210 bytes */
    SPARK_DTYPE_COUNT
} spark_dtype;

/* Name ("f32", "bf16", "q4_K", ...); "invalid" for a value outside the enum. */
const char *dtype_name(spark_dtype dtype);
/* Block geometry; 0 for a value outside the enum. */
int dtype_block_elems(spark_dtype dtype);
int dtype_block_bytes(spark_dtype dtype);

/* Bytes of a row of n elements; 0 when n is not a multiple of the block size
 * (or the byte count would not fit in 64 bits). */
uint64_t dtype_row_bytes(spark_dtype dtype, uint64_t n);

/* GGML type number -> our dtype; returns -1 for a type we do not read. */
int dtype_from_ggml(uint32_t ggml_type);
/* Our dtype -> GGML type number. */
uint32_t dtype_to_ggml(spark_dtype dtype);
/* The GGML name of any GGML type number ("q5_1", ...) or NULL if unknown. */
const char *ggml_type_name(uint32_t ggml_type);
/* Block geometry of any known GGML type number, including the ones we cannot
 * compute with (q5_1, iq2_xxs, ...), so a GGUF reader can size and bounds-check
 * every tensor. Returns false (outputs untouched) for numbers that are not a
 * GGML type: never assigned, or removed from the format (4, 5, 31-33, 36-38). */
bool ggml_type_block(uint32_t ggml_type, uint32_t *block_elems, uint32_t *block_bytes);

/* safetensors dtype string ("F32", "F16", "BF16") -> dtype, or -1. */
int dtype_from_safetensors(const char *name);

/* Scalar conversions: exact for every input class (normals, subnormals, +-0,
 * +-inf); NaN stays NaN (quiet) with its sign. f32_to_f16 rounds to nearest
 * even and overflows to inf like a hardware conversion. */
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
float bf16_to_f32(uint16_t b);
uint16_t f32_to_bf16(float f); /* round to nearest even */

#endif

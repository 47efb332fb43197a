/*
 * quantize.h — float32 rows to every storage format the runtime reads, and
 * whole checkpoints (HF directory or GGUF) to a GGUF file of another type.
 *
 * The row quantizers write GGML's block layouts (see quant.c), so the output
 * reads back through weight_row_to_f32 and through any GGUF reader. Their
 * round-trip error bounds, per value x (tests/c/test_kernels.c checks them on
 * gaussian, uniform, outlier, one-signed, constant, zero and tiny blocks;
 * d, dmin are the block's stored f16 scales):
 *   f32   exact          bf16  |e| <= 2^-8 |x|       f16  |e| <= 2^-11 |x| + 2^-25
 *   q8_0  |e| <= d/2                  (d >= max|x| / 127)
 *   q4_0  |e| <= |d|                  (d = signed max / -8: only the far end clamps)
 *   q4_k  |e| <= (max - min(min, 0)) / 15 + 8 d + dmin   (sub-block of 32; the
 *         d, dmin terms are the 6-bit sub-scale rounding, which only matters
 *         when one sub-block's range dwarfs another's)
 *   q6_k  |e| <= max(max|x| / 31, 16 d)                   (sub-block of 16)
 * and relative RMS errors of about 0.5% (q8_0), 1.6% (q6_k), 6.8% (q4_k) and
 * 8% (q4_0) on near-gaussian rows (0.4 / 1.2 / 5.2 / 6.3% on tools/mkmodel.py
 * weights).
 * The K-quant searches minimise the squared error of each sub-block over a
 * few candidate scales, then round the sub-block scales to 6 (Q4_K) or 8 bits
 * (Q6_K) against the block's f16 super-scale.
 */
#ifndef SPARK_MODEL_QUANTIZE_H
#define SPARK_MODEL_QUANTIZE_H

#include "io/dtype.h"
#include "spark.h"

#include <stdint.h>

/* Quantize n values (a multiple of dtype's block size) into dst, which holds
 * dtype_row_bytes(dtype, n) bytes. Non-finite inputs are the caller's problem
 * (the converter rejects them). */
void quantize_row(spark_dtype dtype, const float *x, int64_t n, void *dst);

typedef enum quant_recipe {
    QUANT_RECIPE_NONE = 0, /* every matrix in the requested type */
    QUANT_RECIPE_Q4_K_M,   /* Q4_K, with Q6_K where llama.cpp's Q4_K_M spends more bits (quantize_file.c) */
    QUANT_RECIPE_COUNT
} quant_recipe;

typedef struct quantize_options {
    spark_dtype type;    /* matrices' type (norms always stay F32) */
    quant_recipe recipe;
    int n_threads;       /* <= 0: all cores */
    int verbose;         /* print one line per tensor to stderr */
} quantize_options;

typedef struct quantize_report {
    int64_t n_tensors;
    uint64_t bytes_in, bytes_out;     /* tensor data */
    int64_t count[SPARK_DTYPE_COUNT]; /* output tensors per dtype */
    int64_t n_fallback;               /* matrices whose rows do not fit the type's blocks: kept in Q8_0 / F16 */
} quantize_report;

/* Convert the checkpoint at `in` (HF directory or GGUF) to a GGUF v3 file at
 * `out`. GGUF input: every metadata key is copied (general.file_type is
 * updated). HF input: the spark2_5 keys and the tokenizer (tokenizer.json,
 * tokenizer_config.json / chat_template.jinja) are written as
 * tools/sparkgguf.py does. Norm vectors are stored as F32. */
spark_status quantize_model_file(const char *in, const char *out, const quantize_options *opt,
                                 quantize_report *report);

#endif

/*
 * kernels.h — the CPU compute kernels, one table per instruction-set level.
 *
 * kernels_scalar.c is the portable reference; kernels_avx2.c,
 * kernels_avx512.c and kernels_neon.c instantiate the same SIMD templates
 * (kernels_simd.inc) for their vector width. A SIMD table may leave an entry
 * NULL; cpu_kernels_resolve() fills it from the scalar table, so callers
 * never check. Every kernel takes plain pointers (no alignment required)
 * and is single-threaded: threads/matmul.c split the work.
 *
 * Numerics: all products are float32 multiply-adds of the dequantized weight
 * and float32 activations (no activation quantization) — except the
 * single-token Q8_0 / Q4_K / Q6_K GEMVs of the x86 levels (`x8`,
 * kernels_x8.inc), which by default round the activations to int16 per 32
 * values (more precise than the reference's bf16 activations, SPEC section
 * 2; error bounds there). SPARK_KQUANT_X8=1 puts Q4_K / Q6_K on the older
 * int8-activation kernels instead (int8 per 32 values: LESS precise than
 * bf16, below what SPEC section 2 allows; kept only for comparison), and
 * SPARK_INT8_DOT=0 turns all of them off (exact float path; cpu_backend.c).
 * Otherwise a SIMD result
 * differs from the scalar one only by rounding: summation order, and in the
 * K-quant GEMVs a fused multiply-subtract forming scale*q - min (relative
 * error ~1e-7 per product, ~1e-6 for rows of thousands). dequant[] is
 * bit-exact with weight_row_to_f32.
 */
#ifndef SPARK_BACKEND_CPU_KERNELS_H
#define SPARK_BACKEND_CPU_KERNELS_H

#include "backend/cpu/cpu_features.h"
#include "io/dtype.h"

#include <stddef.h>
#include <stdint.h>

enum {
    GEMV_MAX_TOKENS = 4, /* tokens one GEMV call shares each weight load between */
    GEMM_MAX_TOKENS = 32, /* widest packed token group of any level */
    GEMM_MAX_ROWS = 12,  /* most rows of any level's GEMM micro-tile */
};

/* y[t*ys + r] = sum_c W[r, c] * x[t*xs + c] for r < rows, t < nt (1..GEMV_MAX_TOKENS).
 * w: the first row's bytes, rows row_bytes apart; cols a multiple of the block size. */
typedef void (*gemv_fn)(const void *w, size_t row_bytes, int64_t rows, int64_t cols, const float *x, int64_t xs,
                        int nt, float *y, int64_t ys);

/* rows x cols dequantized into out (row-major, cols floats per row). */
typedef void (*dequant_fn)(const void *w, size_t row_bytes, int64_t rows, int64_t cols, float *out);

/* One 256-value block of an activation row quantized to int8 for the
 * integer-domain K-quant GEMVs (kernels_x8.inc): per 32 values j, scale
 * d32[j] = max|x| / 127 and q = round(x / d32[j]). q is stored in the order
 * the level's kernels read (value order, except AVX-512 Q4_K); the float
 * side tables let a kernel apply a block's factors in one vector op:
 * ds32[j] = -d32[j] * (sum of q over the 32), d16[k] = d32[k / 2],
 * b16[k] = -32 * (sum of q over the 16 values k) (Q6_K's offset, scaled
 * by the kernel's d * sc[k] * d16[k]). */
typedef struct q8x_block {
    int8_t q[256];
    float d32[8], ds32[8]; /* adjacent: Q4_K reads them as one 16-lane vector */
    float d16[16], b16[16];
} q8x_block;

/* y[r] = sum_c W[r, c] * x[c] for r < rows from the quantized x (one token). */
typedef void (*gemv_x8_fn)(const void *w, size_t row_bytes, int64_t rows, int64_t cols, const q8x_block *x,
                           float *y);

/* y[r] = sum_c W[r, c] * x[c] for r < rows, W in Q8_0, Q4_K or Q6_K, from
 * x in int16 per 32 values: x[c] ~ xd[c / 32] * xq[c], xs[j] = xd[j] * the
 * sum of xq over values [32j, 32j + 32) (quant_x16; Q4_K's mins use it). */
typedef void (*gemv_x16_fn)(const void *w, size_t row_bytes, int64_t rows, int64_t cols, const int16_t *xq,
                            const float *xd, const float *xs, float *y);

/* The integer-domain single-token GEMVs of one level (entries NULL where a
 * format or level has none: the float gemv is used).
 *
 * gemv_x16 (Q8_0, Q4_K, Q6_K; the default): x is rounded to int16 per 32
 * values: xd[j] = max|x| / 32767 over values [32j, 32j + 32), xq =
 * round(x / xd[j]) (cols a multiple of 32; 256 for the K-quants). Each
 * element is then within xd/2 = max|x|/65534 of x, at least as close as its
 * bf16 rounding (half an ulp, up to |x|/256) for every element above
 * max|x|/256 of its group, and the dot product's error is 24-80x below the
 * one bf16 activations give (what the reference computes; SPEC section 2):
 * Q8_0 RMS 1.2-2.3 % of it on spark-tiny's decode activations (2026-11-30);
 * Q8_0 / Q4_K / Q6_K 2-4.5 % on test_gemv_x16's random ones with outliers
 * (bench/RESULTS.md, 2026-11-30). The weight x activation products and
 * their sums are exact int32 (vpmaddwd), converted to float exactly
 * (|sum| < 2^24). Q4_K's min term uses xs (the rounded x's sums), so a
 * row's result is the exact dot product of its dequantized weights with the
 * rounded x, up to float32 rounding of the per-sub-block terms.
 *
 * gemv (Q4_K, Q6_K; only with SPARK_KQUANT_X8=1): quant_x fills cols / 256
 * int8 blocks for weights of format dt (cols a multiple of 256): x rounded
 * to int8 per 32 values, below SPEC section 2's precision. */
typedef struct cpu_x8_kernels {
    void (*quant_x)(spark_dtype dt, const float *x, int64_t cols, q8x_block *out);
    gemv_x8_fn gemv[SPARK_DTYPE_COUNT];
    void (*quant_x16)(const float *x, int64_t cols, int16_t *xq, float *xd, float *xs);
    gemv_x16_fn gemv_x16[SPARK_DTYPE_COUNT];
    /* gemv_x16's products with each call's rows read as 2 long lanes
     * prefetched 4 KB ahead instead of 8 (Q8_0) at 1 KB: fewer concurrent
     * memory streams, bit-identical results. NULL where a format has no
     * such form; backend_cpu_create picks one layout (SPARK_GEMV_LANES). */
    gemv_x16_fn gemv_x16_2l[SPARK_DTYPE_COUNT];
} cpu_x8_kernels;

typedef struct cpu_kernels {
    cpu_isa isa;
    int gemm_tokens; /* TW: tokens per packed group (a multiple of the vector width) */
    int gemm_rows;   /* TR: weight rows per GEMM micro-tile */

    gemv_fn gemv[SPARK_DTYPE_COUNT];
    /* gemv's products with one token's rows read as 2 long lanes
     * prefetched 4 KB ahead instead of 8 at 1 KB (f32 / f16 / bf16; more
     * tokens as gemv): bit-identical results, fewer memory streams. NULL
     * where a format or level has none; backend_cpu_create picks one
     * layout (SPARK_GEMV_LANES), as for x8.gemv_x16_2l. */
    gemv_fn gemv_2l[SPARK_DTYPE_COUNT];
    /* the same with one token's rows in 3 lanes prefetched 3 KB ahead into
     * L1 (the default outside AMD): bit-identical results */
    gemv_fn gemv_3l[SPARK_DTYPE_COUNT];
    dequant_fn dequant[SPARK_DTYPE_COUNT];
    /* single-token Q8_0 / K-quant GEMVs with int16 (default) or int8
     * (SPARK_KQUANT_X8=1) activations: filled by cpu_kernels_resolve from the
     * level and the CPU's VNNI support; backend_cpu_create keeps one kind */
    cpu_x8_kernels x8;

    /* GEMM over a row panel: y[t*ys + r] (+)= sum_c w[r*ldw + c] * xp[c*TW + t] for
     * r < nr, t < nt (<= TW); xp is a packed token group (cpu_pack_tokens).
     * accumulate: add to y (a later chunk of the columns) instead of storing. */
    void (*gemm_tile)(const float *xp, const float *w, int64_t ldw, int nr, int64_t cols, float *y, int64_t ys,
                      int nt, int accumulate);

    float (*dot)(const float *a, const float *b, int64_t n);
    void (*axpy)(float *y, float a, const float *x, int64_t n); /* y += a x */
    void (*scale)(float *y, float a, int64_t n);                /* y *= a */
    void (*add)(float *y, const float *x, int64_t n);           /* y += x */
    /* a = gelu_erf(a) * b; SIMD levels use a polynomial erf (|error| < 2e-7) */
    void (*gelu_mul)(float *a, const float *b, int64_t n);
    /* out = x / sqrt(mean(x^2) + eps) * w, the sum of squares in double */
    void (*rmsnorm)(float *out, const float *x, const float *w, int64_t dim, float eps);
    /* NeoX rotation of pairs (j, j + half) of one head: cs/sn hold half angles */
    void (*rope_head)(float *v, const float *cs, const float *sn, int half);
    /* s[i] = exp(s[i] - max) for i < n; returns their sum (fixed order) */
    float (*exp_sum)(float *s, float max, int64_t n);
    /* y += sum_j a[j] * rows[j] (dim floats each), j < n: attention's P.V */
    void (*axpy_rows)(float *y, const float *a, const float *const *rows, int n, int64_t dim);
    /* Attention score block: s[r*ss + j] = scale * dot(q[r], k[j]) for r < nq, j < nk */
    void (*qk_block)(float *s, int64_t ss, const float *const *q, int nq, const float *const *k, int nk, int64_t dim,
                     float scale);
    /* Attention value block: o[r] += sum_j p[r*ps + j] * v[j] for r < nq (dim floats each) */
    void (*pv_block)(float *const *o, const float *p, int64_t ps, int nq, const float *const *v, int nk,
                     int64_t dim);
} cpu_kernels;

/* The table of one level with NULL entries filled from the scalar table.
 * Returns 0 (and leaves *out alone) when `isa` is not compiled in or this
 * CPU cannot run it. */
int cpu_kernels_resolve(cpu_isa isa, cpu_kernels *out);

/* Pack n (<= TW) token rows x[t*xs + c] into xp[c*TW + t], zero-filling
 * tokens n..TW-1 (the layout gemm_tile reads). */
void cpu_pack_tokens(float *xp, const float *x, int64_t xs, int n, int64_t cols, int tw);

/* f16 bit pattern -> float, all 65536 of them (filled by cpu_kernels_resolve):
 * block scales are read through it so the SIMD kernels broadcast a scale
 * straight from memory (a load) instead of converting it (vector ALU work). */
extern float cpu_f16_table[65536];

/* The 2-lane GEMVs' far prefetches (4 KB ahead) are non-temporal
 * (prefetchnta) when this is set, to L2 (prefetcht1) otherwise; set by the
 * CPU backend when it is created: on AMD, or as SPARK_GEMV_FAR_NTA=0|1 says.
 * On the Zen 5 VM nta decoded the 4B model 2-5 % faster; on the Intel
 * (Sapphire Rapids) VM it made the same kernels 2.6x slower
 * (bench/RESULTS.md, 2026-12-02, "Non-temporal far prefetches"). */
extern int cpu_far_prefetch_nta;

/* Per-level tables (NULL-entry fields are filled by cpu_kernels_resolve). */
extern const cpu_kernels cpu_kernels_scalar;
#if defined(__x86_64__)
extern const cpu_kernels cpu_kernels_avx2;
extern const cpu_kernels cpu_kernels_avx512;
/* int8 GEMVs: vpmaddubsw + vpmaddwd, and vpdpbusd (AVX_VNNI / AVX512_VNNI) */
extern const cpu_x8_kernels cpu_x8_avx2, cpu_x8_avx2_vnni;
extern const cpu_x8_kernels cpu_x8_avx512, cpu_x8_avx512_vnni;
#endif
#if defined(__aarch64__) && defined(__ARM_NEON)
extern const cpu_kernels cpu_kernels_neon;
#endif

#endif

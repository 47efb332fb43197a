/*
 * kernels_avx2.c — the SIMD kernels at 8 float lanes (AVX2 + FMA + F16C).
 *
 * Compiled for AVX2 through a target pragma, run only after
 * cpu_isa_detect() has seen the instructions. 16 vector registers: a
 * 6-row x 16-token GEMM tile (12 accumulators) and GEMV tiles of at most
 * 8 accumulators.
 */
#if defined(__x86_64__)

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

#include "backend/cpu/kernels.h"

#include <immintrin.h>

#define VL 8
typedef __m256 vf;
typedef __m256i vi;

static inline float hsum256(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

#define VF_ZERO() _mm256_setzero_ps()
#define VF_SET1(a) _mm256_set1_ps(a)
#define VF_LOADU(p) _mm256_loadu_ps(p)
#define VF_STOREU(p, v) _mm256_storeu_ps(p, v)
#define VF_ADD(a, b) _mm256_add_ps(a, b)
#define VF_SUB(a, b) _mm256_sub_ps(a, b)
#define VF_MUL(a, b) _mm256_mul_ps(a, b)
#define VF_DIV(a, b) _mm256_div_ps(a, b)
#define VF_MIN(a, b) _mm256_min_ps(a, b)
#define VF_MAX(a, b) _mm256_max_ps(a, b)
#define VF_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define VF_FMS(a, b, c) _mm256_fmsub_ps(a, b, c)
#define VF_ABS(v) _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v)
#define VF_ROUND(v) _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define VF_REDUCE(v) hsum256(v)
#define VF_SELECT_LT(x, y, a, b) _mm256_blendv_ps(b, a, _mm256_cmp_ps(x, y, _CMP_LT_OQ))
#define VF_LOAD_BF16(p) \
    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p))), 16))
#define VF_LOAD_F16(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define VI_LOAD_U8(p) _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p)))
#define VI_LOAD_S8(p) _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p)))
#define VI_AND(a, b) _mm256_and_si256(a, b)
#define VI_OR(a, b) _mm256_or_si256(a, b)
#define VI_ADD(a, b) _mm256_add_epi32(a, b)
#define VI_SUB(a, b) _mm256_sub_epi32(a, b)
#define VI_SET1(n) _mm256_set1_epi32(n)
#define VI_SRL(a, n) _mm256_srli_epi32(a, n)
#define VI_SLL(a, n) _mm256_slli_epi32(a, n)
#define VI_TO_VF(a) _mm256_cvtepi32_ps(a)
#define VF_TO_VI(v) _mm256_cvtps_epi32(v)
#define VI_AS_VF(a) _mm256_castsi256_ps(a)
#define F16_TO_F32(h) _cvtsh_ss(h)

#define TILE_TW 16
#define TILE_TR 6
#define GEMV_R(nt) ((nt) == 1 ? 4 : (nt) == 2 ? 2 : 1)
#define QK_R 2
#define QK_C 4
#define PV_R 2
#define KERNEL_TABLE cpu_kernels_avx2
#define KERNEL_ISA CPU_ISA_AVX2

#include "backend/cpu/kernels_simd.inc"

/* int8 GEMVs without VNNI: vpmaddubsw + vpmaddwd (exact, see kernels_avx512.c) */
#define X8_VL 8
#define X8_DPBUSD(u, s) _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
#define X8_TABLE cpu_x8_avx2
#include "backend/cpu/kernels_x8.inc"

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#else
typedef int kernels_avx2_unused; /* not an x86-64 build */
#endif

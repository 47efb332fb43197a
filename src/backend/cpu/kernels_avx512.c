/*
 * kernels_avx512.c — the SIMD kernels at 16 float lanes (AVX-512 F/BW/VL/DQ).
 *
 * The functions are compiled for AVX-512 through a target pragma (the rest
 * of the program stays baseline x86-64); they only run after
 * cpu_isa_detect() has seen the instructions. 32 vector registers allow a
 * 12-row x 32-token GEMM tile (24 accumulators) and 4x4 GEMV tiles.
 */
#if defined(__x86_64__)

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#endif

#include "backend/cpu/kernels.h"

#include <immintrin.h>

#define VL 16
typedef __m512 vf;
typedef __m512i vi;

#define VF_ZERO() _mm512_setzero_ps()
#define VF_SET1(a) _mm512_set1_ps(a)
#define VF_LOADU(p) _mm512_loadu_ps(p)
#define VF_STOREU(p, v) _mm512_storeu_ps(p, v)
#define VF_ADD(a, b) _mm512_add_ps(a, b)
#define VF_SUB(a, b) _mm512_sub_ps(a, b)
#define VF_MUL(a, b) _mm512_mul_ps(a, b)
#define VF_DIV(a, b) _mm512_div_ps(a, b)
#define VF_MIN(a, b) _mm512_min_ps(a, b)
#define VF_MAX(a, b) _mm512_max_ps(a, b)
#define VF_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define VF_FMS(a, b, c) _mm512_fmsub_ps(a, b, c)
#define VF_ABS(v) _mm512_abs_ps(v)
#define VF_ROUND(v) _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define VF_REDUCE(v) _mm512_reduce_add_ps(v)
#define VF_SELECT_LT(x, y, a, b) _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, y, _CMP_LT_OQ), b, a)
#define VF_LOAD_BF16(p) \
    _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p))), 16))
#define VF_LOAD_F16(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define VI_LOAD_U8(p) _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p)))
#define VI_LOAD_S8(p) _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p)))
#define VI_AND(a, b) _mm512_and_si512(a, b)
#define VI_OR(a, b) _mm512_or_si512(a, b)
#define VI_ADD(a, b) _mm512_add_epi32(a, b)
#define VI_SUB(a, b) _mm512_sub_epi32(a, b)
#define VI_SET1(n) _mm512_set1_epi32(n)
#define VI_SRL(a, n) _mm512_srli_epi32(a, n)
#define VI_SLL(a, n) _mm512_slli_epi32(a, n)
#define VI_TO_VF(a) _mm512_cvtepi32_ps(a)
#define VF_TO_VI(v) _mm512_cvtps_epi32(v)
#define VI_AS_VF(a) _mm512_castsi512_ps(a)
#define F16_TO_F32(h) _cvtsh_ss(h)

#define TILE_TW 32
#define TILE_TR 12
#define GEMV_R(nt) 4
#define QK_R 4
#define QK_C 4
#define PV_R 4
#define KERNEL_TABLE cpu_kernels_avx512
#define KERNEL_ISA CPU_ISA_AVX512

#include "backend/cpu/kernels_simd.inc"

/* int8 GEMVs without VNNI (Skylake-X): u8 x s8 pairs by vpmaddubsw, then
 * pairs of pairs by vpmaddwd (no saturation: |q x| <= 63 * 127 * 2 < 2^15) */
#define X8_VL 16
#define X8_DPBUSD(u, s) _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1))
#define X8_TABLE cpu_x8_avx512
#include "backend/cpu/kernels_x8.inc"

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#else
typedef int kernels_avx512_unused; /* not an x86-64 build */
#endif

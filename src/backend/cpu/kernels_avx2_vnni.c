/*
 * kernels_avx2_vnni.c — the int8 K-quant GEMVs (kernels_x8.inc) at 256
 * bits with AVX_VNNI's VEX-encoded vpdpbusd (Alder Lake and later cores
 * without AVX-512). Chosen by cpu_kernels_resolve for the avx2 level when
 * the CPU reports avxvnni.
 */
#if defined(__x86_64__)

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avxvnni"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avxvnni")
#endif

#include "backend/cpu/kernels.h"

#define X8_VL 8
#define X8_DPBUSD(u, s) _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s)
#define X8_DPWSSD(acc, a, b) _mm256_dpwssd_avx_epi32(acc, a, b)
#define X8_TABLE cpu_x8_avx2_vnni
#include "backend/cpu/kernels_x8.inc"

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#else
typedef int kernels_avx2_vnni_unused; /* not an x86-64 build */
#endif

/*
 * kernels_avx512_vnni.c — the int8 K-quant GEMVs (kernels_x8.inc) at 512
 * bits with AVX512_VNNI's vpdpbusd (Ice Lake, Sapphire Rapids, Zen 4):
 * one instruction per 64 weight x activation products. Chosen by
 * cpu_kernels_resolve when the CPU reports avx512vnni.
 */
#if defined(__x86_64__)

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")
#endif

#include "backend/cpu/kernels.h"

#define X8_VL 16
#define X8_DPBUSD(u, s) _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, s)
#define X8_TABLE cpu_x8_avx512_vnni
#include "backend/cpu/kernels_x8.inc"

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#else
typedef int kernels_avx512_vnni_unused; /* not an x86-64 build */
#endif

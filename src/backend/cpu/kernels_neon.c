/*
 * kernels_neon.c — the SIMD kernels at 4 float lanes (aarch64 Advanced SIMD).
 *
 * NEON is part of every aarch64 CPU, so no run-time check is needed beyond
 * the build target. 32 vector registers: a 12-row x 8-token GEMM tile
 * (24 accumulators). Byte widening loads 4 bytes at a time through a
 * 32-bit lane, so no read passes the end of a block.
 */
#if defined(__aarch64__) && defined(__ARM_NEON)

#include "backend/cpu/kernels.h"

#include <arm_neon.h>
#include <string.h>

#define VL 4
typedef float32x4_t vf;
typedef int32x4_t vi;

static inline vi neon_load_u8(const void *p)
{
    uint32_t bits;
    memcpy(&bits, p, 4);
    uint8x8_t b = vreinterpret_u8_u32(vdup_n_u32(bits));
    return vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(vmovl_u8(b))));
}

static inline vi neon_load_s8(const void *p)
{
    uint32_t bits;
    memcpy(&bits, p, 4);
    int8x8_t b = vreinterpret_s8_u32(vdup_n_u32(bits));
    return vmovl_s16(vget_low_s16(vmovl_s8(b)));
}

static inline float neon_f16(uint16_t h)
{
    __fp16 f;
    memcpy(&f, &h, sizeof f);
    return (float)f;
}

#define VF_ZERO() vdupq_n_f32(0.0f)
#define VF_SET1(a) vdupq_n_f32(a)
#define VF_LOADU(p) vld1q_f32(p)
#define VF_STOREU(p, v) vst1q_f32(p, v)
#define VF_ADD(a, b) vaddq_f32(a, b)
#define VF_SUB(a, b) vsubq_f32(a, b)
#define VF_MUL(a, b) vmulq_f32(a, b)
#define VF_DIV(a, b) vdivq_f32(a, b)
#define VF_MIN(a, b) vminq_f32(a, b)
#define VF_MAX(a, b) vmaxq_f32(a, b)
#define VF_FMA(a, b, c) vfmaq_f32(c, a, b)
#define VF_FMS(a, b, c) vnegq_f32(vfmsq_f32(c, a, b))
#define VF_ABS(v) vabsq_f32(v)
#define VF_ROUND(v) vrndnq_f32(v)
#define VF_REDUCE(v) vaddvq_f32(v)
#define VF_SELECT_LT(x, y, a, b) vbslq_f32(vcltq_f32(x, y), a, b)
#define VF_LOAD_BF16(p) vreinterpretq_f32_u32(vshll_n_u16(vld1_u16((const uint16_t *)(p)), 16))
#define VF_LOAD_F16(p) vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)(p))))
#define VI_LOAD_U8(p) neon_load_u8(p)
#define VI_LOAD_S8(p) neon_load_s8(p)
#define VI_AND(a, b) vandq_s32(a, b)
#define VI_OR(a, b) vorrq_s32(a, b)
#define VI_ADD(a, b) vaddq_s32(a, b)
#define VI_SUB(a, b) vsubq_s32(a, b)
#define VI_SET1(n) vdupq_n_s32(n)
#define VI_SRL(a, n) vreinterpretq_s32_u32(vshrq_n_u32(vreinterpretq_u32_s32(a), n))
#define VI_SLL(a, n) vshlq_n_s32(a, n)
#define VI_TO_VF(a) vcvtq_f32_s32(a)
#define VF_TO_VI(v) vcvtnq_s32_f32(v)
#define VI_AS_VF(a) vreinterpretq_f32_s32(a)
#define F16_TO_F32(h) neon_f16(h)

#define TILE_TW 8
#define TILE_TR 12
#define GEMV_R(nt) 4
#define QK_R 4
#define QK_C 4
#define PV_R 4
#define KERNEL_TABLE cpu_kernels_neon
#define KERNEL_ISA CPU_ISA_NEON

#include "backend/cpu/kernels_simd.inc"

#else
typedef int kernels_neon_unused; /* not an aarch64 build */
#endif

/*
 * cuda_fgemv.cuh — what the two single-token GEMV kernels share: a bf16
 * unit's product with x, the folded phase stamp and a row's epilogue
 * (cuda_fgemv.cu streams rows through registers; cuda_fgemv_stage.cu
 * stages them in shared memory first).
 */
#ifndef SPARK_CUDA_FGEMV_CUH
#define SPARK_CUDA_FGEMV_CUH

#include "backend/cuda/cuda_internal.h"

namespace spark_dev {

/* 8 bf16 weights (a 16-byte unit, element 0 in the low half of w.x) times
 * x0 (elements 0..3) and x1 (4..7), accumulated in order into acc (x0 / x1
 * by value: as references into shared memory they changed fgemv_kernel's
 * register counts, up to 116 -> 136 for a bf16 shape) */
__device__ __forceinline__ float bf16x8_fma(uint4 w, float4 x0, float4 x1, float acc)
{
    acc = fmaf(__uint_as_float(w.x << 16), x0.x, acc);
    acc = fmaf(__uint_as_float(w.x & 0xffff0000u), x0.y, acc);
    acc = fmaf(__uint_as_float(w.y << 16), x0.z, acc);
    acc = fmaf(__uint_as_float(w.y & 0xffff0000u), x0.w, acc);
    acc = fmaf(__uint_as_float(w.z << 16), x1.x, acc);
    acc = fmaf(__uint_as_float(w.z & 0xffff0000u), x1.y, acc);
    acc = fmaf(__uint_as_float(w.w << 16), x1.z, acc);
    acc = fmaf(__uint_as_float(w.w & 0xffff0000u), x1.w, acc);
    return acc;
}

/* the folded phase stamp (cuda_hooks.cu), right after the dependency wait */
__device__ __forceinline__ void fg_stamp(const cu_fgemv_args &a)
{
    if (a.stamps && blockIdx.x == 0 && threadIdx.x == 0) {
        unsigned long long t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        if (a.stamp_phase >= 0) a.stamps[1 + a.stamp_phase] += t - a.stamps[0];
        a.stamps[0] = t;
    }
}

/* the residual row h = resid[r] + a product, with the steering add when
 * folded in (the same operations as steer_kernel) */
__device__ __forceinline__ float fg_steer(const cu_fgemv_args &a, int64_t r, float h)
{
    return a.steer_dir ? __fadd_rn(h, __fmul_rn(a.steer_alpha, a.steer_dir[r])) : h;
}

/* row r (< rows0) of a single matrix: its output, and the residual add and
 * steering add when fused in (resid[r] read after out0[r] is written, as
 * the kernels always did: reordering them changed register counts) */
__device__ __forceinline__ void fg_store(const cu_fgemv_args &a, int64_t r, float acc)
{
    a.out0[r] = acc;
    if (a.resid) a.resid[r] = fg_steer(a, r, a.resid[r] + acc);
}

} // namespace spark_dev

#endif

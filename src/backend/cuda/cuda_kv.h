/*
 * cuda_kv.h — the CUDA backend's KV caches in the coded formats (issue 7):
 * f16, bf16 and TurboQuant rows, the CPU's bytes (engine/kv_format.h).
 * Kernels in cuda_kv.cu; cuda_backend.cu dispatches attention and kv_store
 * of a layer whose cache type is not f32 here. Like cuda_internal.h: every
 * launcher enqueues on `st`, returns the launch's error code and never
 * synchronizes; positions are read from device memory (`pos`), so a
 * captured decode step replays unchanged.
 */
#ifndef SPARK_BACKEND_CUDA_KV_H
#define SPARK_BACKEND_CUDA_KV_H

#include <cuda_runtime.h>
#include <stdint.h>

/* spark_kv_type's values, repeated so this header needs no C include */
enum { CU_KV_F32 = 0, CU_KV_F16, CU_KV_BF16, CU_KV_TQ2, CU_KV_TQ3, CU_KV_TQ3_5, CU_KV_TQ4 };

/* 1 when the kernels take caches of format fmt for heads of head_dim values. */
int cu_kv_supported(int fmt, int head_dim);
int64_t cu_kv_row_bytes(int fmt, int is_value, int head_dim);

/* Upload the rotation's signs and the codebooks (kv_format.c's tables) to
 * the current device. Once per backend, before any other launcher. */
cudaError_t cu_kv_init(void);

/* Encode the k | v rows of n tokens of qkv: slots > 0: into cache slot
 * (*pos + t) % slots (a ring keeps the newest `slots`); slots == 0: into
 * stage row t. Row r of kv head kh lives at (r * n_head_kv + kh) * row_bytes. */
cudaError_t cu_kv_encode(cudaStream_t st, void *kdst, void *vdst, int64_t slots, const float *qkv, const int64_t *pos,
                         int n, int n_head, int n_head_kv, int head_dim, int64_t qkv_stride, int fmt);

/* Attention over a coded cache for n queries at *pos..: first the chunk's
 * own rows are encoded into the stage (ks / vs: n * n_head_kv rows each),
 * then keys j < *pos are read from the cache, j >= *pos from the stage; each
 * query's key range is cut into `splits` parts whose partial states go to
 * ws (n * n_head * splits * (head_dim + 2) floats) and are merged into out
 * ([n, n_head * head_dim]), times sigmoid(gate) per head when gate != NULL. */
typedef struct cu_kv_attn_args {
    float *out, *ws;
    const float *qkv, *gate;
    const uint8_t *kc, *vc;
    uint8_t *ks, *vs;
    const int64_t *pos;
    int64_t slots, qkv_stride;
    int n, n_head, n_head_kv, head_dim, window, splits, fmt;
    float scale;
    int step_ok, pdl_early; /* one token, few keys: the fusion may run it as cu_attn_step if that takes the format */
} cu_kv_attn_args;
cudaError_t cu_kv_attention(cudaStream_t st, const cu_kv_attn_args *a);

/* Attention blocks one multiprocessor holds at once for this format and
 * grouping (0 when unknown): the launcher sizes the splits to whole waves. */
int cu_kv_attn_blocks_per_sm(int fmt, int n_head, int n_head_kv);

/* Benchmarks only: cache rows [0, rows) get seeded pseudo-random vectors
 * (coordinates ~ N(0, 1)) encoded in format fmt. */
cudaError_t cu_kv_fill(cudaStream_t st, void *kc, void *vc, int64_t rows, int n_head_kv, int head_dim, int fmt,
                       uint64_t seed);

#endif

/*
 * kv_turbo.h — the CPU backend's attention and cache writes for KV caches
 * that are not float32: f16, bf16 and TurboQuant rows (engine/kv_format.h).
 *
 * cpu_attention() and cpu_kv_store() hand a layer to these when its
 * cache->type is not SPARK_KV_F32; the contracts are backend.h's attention
 * and kv_store ops. kv_turbo.c holds the attention driver, kv_decode.c the
 * per-format row decoders (scalar, AVX2, AVX-512).
 */
#ifndef SPARK_BACKEND_CPU_KV_TURBO_H
#define SPARK_BACKEND_CPU_KV_TURBO_H

#include "backend/cpu/cpu_features.h"
#include "engine/backend.h"

#include <stdint.h>

void cpu_kv_coded_attention(backend *be, float *out, const float *qkv, const kv_layer *cache, int64_t pos0, int n,
                            const attn_shape *sh);
void cpu_kv_coded_store(backend *be, kv_layer *cache, const float *qkv, int64_t pos0, int n, const attn_shape *sh);

/* Decode n encoded rows (rows[r], each one kv head's d values) into
 * out[r * ld + i] in the format's attention basis, without the row scale,
 * which goes to scale[r]: the same numbers as kv_decode_row, bit for bit. */
typedef void (*kv_decode_fn)(const uint8_t *const *rows, int n, int32_t d, float *out, int64_t ld, float *scale);

/* The decoder of format t's key (is_value = 0) or value rows at SIMD level
 * isa (a level this CPU runs; falls back to narrower code). F32 has none. */
kv_decode_fn kv_decoder(spark_kv_type t, int is_value, cpu_isa isa);

#endif

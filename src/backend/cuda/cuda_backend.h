/*
 * cuda_backend.h — the whole C-side view of the CUDA backend: two functions
 * and no CUDA type. Built from the .cu files beside it when nvcc is found at
 * build time, else from cuda_stub.c (which answers "not built").
 */
#ifndef SPARK_BACKEND_CUDA_BACKEND_H
#define SPARK_BACKEND_CUDA_BACKEND_H

#include "engine/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when this build has the CUDA backend and a usable device is present. */
int backend_cuda_available(void);

/* A backend on CUDA device `device` that holds every weight of `model` in
 * device memory (uploaded here, once, in the stored format; the model must
 * outlive the backend). Errors: SPARK_ERR_UNSUPPORTED (no device, not built
 * with CUDA, a config the kernels do not handle), SPARK_ERR_ARG (no such
 * device), SPARK_ERR_NOMEM (the weights do not fit). */
spark_status backend_cuda_create(const spark_model *model, int device, backend **out);

/* Free and total bytes of device memory on CUDA device `device` and its
 * name (for the session's up-front memory check). SPARK_ERR_UNSUPPORTED
 * without such a device. */
spark_status backend_cuda_memory(int device, uint64_t *free_bytes, uint64_t *total_bytes, char *name, size_t name_len);

/* Benchmarks only (spark bench --gpu): the device's own ceilings, measured
 * now: copy_gb_s = 2 x bytes / time of a device-to-device copy of `bytes`
 * (read + write, median of 10), bf16_tflop_s = a cuBLAS bf16 GEMM of
 * 8192^3 with fp32 accumulation (median of 5). */
spark_status backend_cuda_probe(int device, size_t bytes, double *copy_gb_s, double *bf16_tflop_s);

/* Benchmarks only (engine/session.c's session_bench_fill): slots [0, rows)
 * of a layer's cache on a CUDA backend get seeded pseudo-random rows encoded
 * in the cache's format. */
spark_status backend_cuda_fill_kv(backend *be, kv_layer *layer, int64_t rows, int32_t n_head_kv, int32_t head_dim,
                                  uint64_t seed);

#ifdef __cplusplus
}
#endif

#endif

/*
 * cuda_stub.c — the CUDA backend's entry points in a build made without
 * nvcc: no device is ever available, and asking for one says why. The
 * Makefile compiles this file only when nvcc is not on PATH.
 */
#include "backend/cuda/cuda_backend.h"

#include "base/error.h"

int backend_cuda_available(void) { return 0; }

int spark_cuda_available(void) { return 0; }

spark_status backend_cuda_create(const spark_model *model, int device, backend **out)
{
    (void)model;
    (void)device;
    *out = NULL;
    return spark_fail(SPARK_ERR_UNSUPPORTED,
                      "no CUDA device: this spark was built without CUDA (nvcc was not on PATH at build time)");
}

spark_status backend_cuda_probe(int device, size_t bytes, double *copy_gb_s, double *bf16_tflop_s)
{
    (void)device;
    (void)bytes;
    *copy_gb_s = *bf16_tflop_s = 0;
    return spark_fail(SPARK_ERR_UNSUPPORTED, "no CUDA device: this spark was built without CUDA");
}

spark_status backend_cuda_memory(int device, uint64_t *free_bytes, uint64_t *total_bytes, char *name, size_t name_len)
{
    (void)device;
    (void)name;
    (void)name_len;
    *free_bytes = *total_bytes = 0;
    return spark_fail(SPARK_ERR_UNSUPPORTED, "no CUDA device: this spark was built without CUDA");
}

spark_status backend_cuda_fill_kv(backend *be, kv_layer *layer, int64_t rows, int32_t n_head_kv, int32_t head_dim,
                                  uint64_t seed)
{
    (void)be;
    (void)layer;
    (void)rows;
    (void)n_head_kv;
    (void)head_dim;
    (void)seed;
    return spark_fail(SPARK_ERR_UNSUPPORTED, "no CUDA device: this spark was built without CUDA");
}

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

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

#ifdef __cplusplus
}
#endif

#endif

/*
 * npy.h — NumPy .npy files (format 1.0/2.0/3.0), the exchange format of
 * the logits, capture and steering tools.
 */
#ifndef SPARK_IO_NPY_H
#define SPARK_IO_NPY_H

#include "spark.h"

#include <stdint.h>

enum { NPY_MAX_DIMS = 4 };

/* Write a float32 C-order array. SPARK_ERR_IO (naming the path) on failure. */
spark_status npy_write_f32(const char *path, const float *data, const int64_t *shape, int ndim);

/* Write a float64 C-order array. */
spark_status npy_write_f64(const char *path, const double *data, const int64_t *shape, int ndim);

/* Read a little-endian float32 or float64 C-order array, converted to a
 * malloc'd float32 buffer. Errors name the path and what is wrong (dtype,
 * Fortran order, truncated data, more than NPY_MAX_DIMS dims). */
spark_status npy_read_f32(const char *path, float **data, int64_t *shape, int *ndim);

#endif

/*
 * tensor_dir.h — the list of named tensors a checkpoint holds, whatever the
 * file format. Both the GGUF and the safetensors readers produce one.
 *
 * Shapes are outermost-first (PyTorch order): a matrix that maps `in` to
 * `out` features has shape {out, in}, rows of `in` elements stored
 * contiguously. GGUF's `ne` order ([in, out]) is reversed on reading.
 */
#ifndef SPARK_IO_TENSOR_DIR_H
#define SPARK_IO_TENSOR_DIR_H

#include "io/dtype.h"
#include "io/mapped_file.h"

#include <stdint.h>

enum { TENSOR_MAX_DIMS = 4 };

typedef struct tensor_info {
    char *name;                       /* owned */
    spark_dtype dtype;
    int n_dims;
    int64_t shape[TENSOR_MAX_DIMS];   /* outermost first */
    const void *data;                 /* into a mapping owned by the dir */
    uint64_t nbytes;
    const char *file;                 /* path of the file holding it (owned by the dir) */
} tensor_info;

typedef struct tensor_dir {
    tensor_info *tensors;
    int64_t n_tensors;
    mapped_file *files;               /* every mapping the tensors point into */
    int n_files;
} tensor_dir;

/* Lookup by exact name; NULL when absent. */
const tensor_info *tensor_dir_find(const tensor_dir *dir, const char *name);

/* Number of elements of a tensor (product of its shape). */
int64_t tensor_numel(const tensor_info *t);

/* Unmap every file and free every name; safe on a zeroed struct. */
void tensor_dir_free(tensor_dir *dir);

#endif

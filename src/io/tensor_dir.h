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

/* ---- for the format readers that build a dir ---------------------------- */

/* Make room for `extra` more tensors: dir->tensors gets n_tensors + extra
 * entries, those past n_tensors zeroed; n_tensors is unchanged (the reader
 * fills the new entries, then raises n_tensors). SPARK_ERR_NOMEM on failure,
 * with the dir unchanged. */
spark_status tensor_dir_reserve(tensor_dir *dir, int64_t extra);

/* Move the mapping `*file` into dir->files (the dir then owns and unmaps it;
 * *file is zeroed). Paths stay at the same address, so tensor_info.file may
 * point at dir->files[i].path across later calls. SPARK_ERR_NOMEM on failure,
 * with *file untouched. */
spark_status tensor_dir_adopt_file(tensor_dir *dir, mapped_file *file);

/* SPARK_OK when no two of the first n_tensors names are equal; otherwise
 * SPARK_ERR_FORMAT naming the tensor and the file(s) holding both copies.
 * O(n log n), so a hostile file with millions of names cannot stall it. */
spark_status tensor_dir_check_unique(const tensor_dir *dir);

#endif

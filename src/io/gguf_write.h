/*
 * gguf_write.h — a streaming writer for GGUF v3 files.
 *
 * Use: create, set metadata (any order, keys unique), declare every tensor
 * (name, dtype, shape), begin_data (writes header, metadata and tensor infos),
 * then write each tensor's bytes in declaration order, in as many pieces as
 * convenient, and finish. Tensor data is padded to the alignment between
 * tensors automatically; offsets are computed from the declared shapes, so a
 * multi-gigabyte model never has to be in memory at once.
 *
 * On any error the writer stays in a failed state (later calls return the
 * same status) and gguf_writer_free removes the partial file.
 */
#ifndef SPARK_IO_GGUF_WRITE_H
#define SPARK_IO_GGUF_WRITE_H

#include "io/gguf.h"

#include <stddef.h>
#include <stdint.h>

typedef struct gguf_writer gguf_writer;

/* Open `path` for writing (truncating it). alignment: a power of two, 0 =
 * the default 32 (a different one is recorded as general.alignment). */
spark_status gguf_writer_create(const char *path, uint32_t alignment, gguf_writer **out);

/* Close; if gguf_writer_finish did not succeed, delete the file. NULL is fine. */
void gguf_writer_free(gguf_writer *w);

/* ---- metadata (before begin_data) ---- */

spark_status gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t v);
spark_status gguf_writer_set_i32(gguf_writer *w, const char *key, int32_t v);
spark_status gguf_writer_set_f32(gguf_writer *w, const char *key, float v);
spark_status gguf_writer_set_bool(gguf_writer *w, const char *key, int v);
spark_status gguf_writer_set_str(gguf_writer *w, const char *key, const char *s, size_t len);
/* An array of a scalar type: n elements packed little-endian in `data`
 * (bool as one byte 0/1). */
spark_status gguf_writer_set_array(gguf_writer *w, const char *key, gguf_type elem, const void *data, uint64_t n);
/* An array of strings. */
spark_status gguf_writer_set_str_array(gguf_writer *w, const char *key, const gguf_str *items, uint64_t n);
/* Copy one entry of a file opened with gguf_open (any type; nested arrays
 * are refused with SPARK_ERR_UNSUPPORTED). */
spark_status gguf_writer_copy_kv(gguf_writer *w, const gguf_kv *kv);
/* Is `key` already set? */
int gguf_writer_has_key(const gguf_writer *w, const char *key);

/* ---- tensors ---- */

/* Declare a tensor: shape outermost first (PyTorch order, as tensor_dir
 * holds it); the innermost dimension must be a multiple of the block size. */
spark_status gguf_writer_add_tensor(gguf_writer *w, const char *name, spark_dtype dtype, int n_dims,
                                    const int64_t *shape);

/* Write header, metadata and tensor infos; after this only data follows. */
spark_status gguf_writer_begin_data(gguf_writer *w);

/* Append bytes of the current tensor (the first declared one not yet
 * complete). Writing more than the tensor holds is SPARK_ERR_ARG. */
spark_status gguf_writer_write(gguf_writer *w, const void *data, size_t bytes);

/* Check every tensor was written in full, flush and close. */
spark_status gguf_writer_finish(gguf_writer *w);

#endif

/*
 * mapped_file.h — a whole file mapped read-only into memory.
 *
 * Weights are never copied at load: tensors point into these mappings, so a
 * mapping must outlive every tensor_info that refers to it.
 */
#ifndef SPARK_IO_MAPPED_FILE_H
#define SPARK_IO_MAPPED_FILE_H

#include "spark.h"

#include <stddef.h>
#include <stdint.h>

typedef struct mapped_file {
    char *path;          /* owned copy, for error messages */
    const uint8_t *data; /* size bytes, read-only; NULL for an empty file */
    uint64_t size;
} mapped_file;

/* Map `path` read-only. Errors (SPARK_ERR_IO) name the path and errno text. */
spark_status mapped_file_open(const char *path, mapped_file *out);

/* Unmap and free; safe on a zeroed struct. */
void mapped_file_close(mapped_file *file);

#endif

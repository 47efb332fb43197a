/*
 * mapped_file.h — a whole file held read-only in memory: either mapped
 * (pages shared with the page cache, nothing copied) or read once into an
 * anonymous, 2 MiB-aligned mapping with transparent huge pages requested.
 *
 * Tensors point into these buffers, so a mapped_file must outlive every
 * tensor_info that refers to it.
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
    void *region;        /* what to munmap (data, or the aligned copy's whole mapping) */
    size_t region_len;
    int copied;          /* 1: read into anonymous memory; 0: the file is mapped */
    int huge;            /* copied with MADV_HUGEPAGE accepted */
} mapped_file;

/* How to hold a file. Zero-initialised = map it. */
typedef struct mapped_file_opts {
    int copy;            /* read the file into anonymous memory instead of mapping it */
    int no_huge;         /* with copy: do not ask for transparent huge pages */
    /* called after every chunk read (copy only), done <= total = file size */
    void (*progress)(uint64_t done, uint64_t total, void *user);
    void *user;
} mapped_file_opts;

/* Map `path` read-only. Errors (SPARK_ERR_IO) name the path and errno text. */
spark_status mapped_file_open(const char *path, mapped_file *out);

/* Map or copy `path` as `opts` says (NULL = map). A copy that cannot get its
 * memory fails with SPARK_ERR_NOMEM, a short read (the file shrank) or a read
 * error with SPARK_ERR_IO; both name the file. */
spark_status mapped_file_open_ex(const char *path, const mapped_file_opts *opts, mapped_file *out);

/* Unmap and free; safe on a zeroed struct. */
void mapped_file_close(mapped_file *file);

/* The system's transparent-huge-page setting for anonymous memory, read from
 * /sys/kernel/mm/transparent_hugepage/enabled ($SPARK_THP_ENABLED_FILE
 * overrides the path, for tests). */
typedef enum thp_setting { THP_UNKNOWN = 0, THP_ALWAYS, THP_MADVISE, THP_NEVER } thp_setting;
thp_setting mapped_file_thp_setting(void);
const char *thp_setting_name(thp_setting s);

#endif

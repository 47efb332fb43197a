/*
 * gguf.h — a validating reader for GGUF v2/v3 files (llama.cpp's format).
 *
 * The whole file is mapped; metadata is parsed into an array of key/value
 * entries and the tensor infos into a tensor_dir whose data pointers point
 * into the mapping. Every length, count and offset is checked against the
 * file size before it is used, so a truncated or hostile file yields
 * SPARK_ERR_FORMAT naming the file and the key/tensor, never a crash.
 */
#ifndef SPARK_IO_GGUF_H
#define SPARK_IO_GGUF_H

#include "io/tensor_dir.h"

#include <stdbool.h>
#include <stdint.h>

typedef enum gguf_type {
    GGUF_TYPE_UINT8 = 0,
    GGUF_TYPE_INT8 = 1,
    GGUF_TYPE_UINT16 = 2,
    GGUF_TYPE_INT16 = 3,
    GGUF_TYPE_UINT32 = 4,
    GGUF_TYPE_INT32 = 5,
    GGUF_TYPE_FLOAT32 = 6,
    GGUF_TYPE_BOOL = 7,
    GGUF_TYPE_STRING = 8,
    GGUF_TYPE_ARRAY = 9,
    GGUF_TYPE_UINT64 = 10,
    GGUF_TYPE_INT64 = 11,
    GGUF_TYPE_FLOAT64 = 12,
    GGUF_TYPE_COUNT
} gguf_type;

/* A string inside the mapping: NOT NUL-terminated. */
typedef struct gguf_str {
    const char *ptr;
    uint64_t len;
} gguf_str;

typedef struct gguf_kv {
    char *key;          /* owned, NUL-terminated */
    gguf_type type;
    union {             /* scalars, widened */
        uint64_t u64;   /* UINT8/16/32/64, BOOL */
        int64_t i64;    /* INT8/16/32/64 */
        double f64;     /* FLOAT32/64 */
        gguf_str str;   /* STRING */
    } v;
    /* ARRAY only: */
    gguf_type arr_type;
    uint64_t arr_len;
    const uint8_t *arr_data;  /* first element, in the mapping */
    uint64_t *str_offsets;    /* owned; for arrays of STRING: offset of element i from arr_data */
} gguf_kv;

typedef struct gguf_file {
    mapped_file file;   /* moved into tensors.files[0] on open and left zeroed; use tensors.files[0] */
    uint32_t version;
    gguf_kv *kvs;
    int64_t n_kvs;
    uint64_t alignment; /* general.alignment, default 32 */
    uint64_t data_offset; /* start of the tensor data section */
    tensor_dir tensors;
    /* GGML type number per tensor, also for types tensor_dir cannot hold
     * (those tensors are still listed, with nbytes computed and bounds-checked
     * from the GGML block size; their dtype is then SPARK_DTYPE_COUNT and
     * ggml_types[i] says what it was). */
    uint32_t *ggml_types;
} gguf_file;

/* Open and validate `path`. On failure *out is left zeroed and the error
 * names the file. Tensors of a GGML type we do not read are NOT an error
 * here (they get flagged in ggml_types); the model loader refuses them by name.
 * A GGML type number that is not a GGML type at all is SPARK_ERR_FORMAT.
 * Status: SPARK_ERR_IO (cannot open/map), SPARK_ERR_UNSUPPORTED (version 1,
 * versions above 3, big-endian files), SPARK_ERR_FORMAT (anything malformed,
 * including duplicate keys or tensor names). Nested arrays are validated and
 * skipped (depth limit 16); their kv has arr_type ARRAY and no accessors. */
spark_status gguf_open(const char *path, gguf_file *out);
/* The same, holding the file as `opts` says (NULL = mapped; see mapped_file.h). */
spark_status gguf_open_ex(const char *path, const mapped_file_opts *opts, gguf_file *out);
void gguf_close(gguf_file *g);

/* Lookup by key; NULL when absent. */
const gguf_kv *gguf_find(const gguf_file *g, const char *key);

/* Typed getters: SPARK_OK, SPARK_ERR_MISSING (absent) or SPARK_ERR_FORMAT
 * (present with a type that cannot convert; integers of any width convert to
 * each other when the value fits, floats accept any numeric type). Errors
 * name the file and key. */
spark_status gguf_get_i64(const gguf_file *g, const char *key, int64_t *out);
spark_status gguf_get_f64(const gguf_file *g, const char *key, double *out);
spark_status gguf_get_bool(const gguf_file *g, const char *key, bool *out);
spark_status gguf_get_str(const gguf_file *g, const char *key, gguf_str *out);

/* Array element access (the caller checks arr_type / arr_len; a wrong type
 * or index is an ASSERT, not an error). */
gguf_str gguf_arr_str(const gguf_kv *kv, uint64_t i);
int64_t gguf_arr_i64(const gguf_kv *kv, uint64_t i);   /* any integer / bool array; uint64 > INT64_MAX wraps */
double gguf_arr_f64(const gguf_kv *kv, uint64_t i);    /* any numeric array */

const char *gguf_type_name(gguf_type t);

#endif
